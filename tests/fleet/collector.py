#!/usr/bin/env python3
"""The fleet test's decision-log collector (tests/fleet/): what Hunch's HTTP decision-log sink
POSTs to (host/src/decision/sink/http.rs: a JSON array of events per request, gzipped with
`content-encoding: gzip`).

Every event is appended, as one JSON line, to a file on a volume, before the batch is answered
200, so a batch that was answered is on disk when the collector is stopped and started again.
Delivery from Hunch is at-least-once (a replica killed before the collector's answer reached it
sends the batch again), so the collector counts events by `decision_id`:

  GET /stats   {"raw": events received, "distinct": distinct decision ids,
                "duplicates": raw - distinct, "batches": batches taken, "refused": batches refused}
  GET /events  the JSON lines file as it is

Standard library only. Usage: collector.py [--port 8686] [--file /data/events.jsonl]
"""

import argparse
import gzip
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Store:
    """The JSON lines file and the counts over it, rebuilt from the file at start."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.raw = 0
        self.ids = set()
        self.batches = 0
        self.refused = 0
        try:
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        self._count(json.loads(line))
        except FileNotFoundError:
            pass
        self.out = open(path, "ab")

    def _count(self, event):
        self.raw += 1
        self.ids.add(event.get("decision_id"))

    def take(self, events):
        lines = b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)
        with self.lock:
            self.out.write(lines)
            self.out.flush()
            for e in events:
                self._count(e)
            self.batches += 1

    def stats(self):
        with self.lock:
            return {
                "raw": self.raw,
                "distinct": len(self.ids),
                "duplicates": self.raw - len(self.ids),
                "batches": self.batches,
                "refused": self.refused,
            }


class Handler(BaseHTTPRequestHandler):
    store = None
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # one line per batch would drown the test's output
        pass

    def _answer(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        try:
            if self.headers.get("content-encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            events = json.loads(body)
            if not isinstance(events, list) or not all(
                isinstance(e, dict) and isinstance(e.get("decision_id"), str) for e in events
            ):
                raise ValueError("not a JSON array of events with a decision_id")
        except (OSError, EOFError, ValueError) as e:
            with self.store.lock:
                self.store.refused += 1
            print(f"collector: refused a batch: {e}", file=sys.stderr, flush=True)
            return self._answer(400, json.dumps({"error": str(e)}).encode())
        self.store.take(events)
        self._answer(200, b'{"ok":true}')

    def do_GET(self):
        if self.path == "/stats":
            return self._answer(200, json.dumps(self.store.stats()).encode())
        if self.path == "/events":
            with self.store.lock:
                with open(self.store.path, "rb") as f:
                    data = f.read()
            return self._answer(200, data, "application/x-ndjson")
        if self.path == "/healthz":
            return self._answer(200, b"ok")
        self._answer(404, b'{"error":"not found"}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8686)
    parser.add_argument("--file", default="/data/events.jsonl")
    args = parser.parse_args()
    Handler.store = Store(args.file)
    server = ThreadingHTTPServer(("0.0.0.0", args.port), Handler)
    server.daemon_threads = True
    # PID 1 in its container: without a handler SIGTERM would be ignored until `docker stop`
    # gives up and kills it.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"collector: on :{args.port}, {Handler.store.stats()} from {args.file}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
