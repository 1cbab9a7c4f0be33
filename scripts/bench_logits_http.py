#!/usr/bin/env python3
"""The label-logit read through HTTP: the requests `logits-bench --dump-requests` wrote, sent to
`hunch serve` one after the other (docs/benchmarks.md, "Label-logit read against llama.cpp").

    python3 scripts/bench_logits_http.py HUNCH_BIN MODEL REQUESTS.jsonl ROUNDS

Each round starts a fresh `hunch serve --model bench=MODEL` (its sidecar's prefix cache empty, as
logits-bench reloads its engine and llama.cpp drops its KV cache each round), waits until the
model answers, then times every request from sending its body to reading the whole answer.
Round 0 warms (the page cache, the first reads) and is not counted. Prints one JSON object:
per-request seconds per round and the prompt tokens the answers report, if any.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes, timeout: float = 600.0):
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def wait_ready(url: str, proc: subprocess.Popen, log: str, deadline_s: float = 300.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"hunch serve exited ({proc.returncode}); its log:\n{open(log).read()}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    sys.exit(f"hunch serve was not ready within {deadline_s:.0f} s; its log:\n{open(log).read()}")


def main() -> None:
    hunch, model, requests_path, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    bodies = [line.encode() for line in open(requests_path) if line.strip()]
    out = {"rounds": []}
    for _ in range(rounds + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = tempfile.NamedTemporaryFile(prefix="bench-http-", suffix=".log", delete=False).name
        with open(log, "w") as log_file:
            proc = subprocess.Popen(
                [hunch, "serve", "--model", f"bench={model}", "--listen", f"127.0.0.1:{port}"],
                stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc, log)
            rows = []
            for body in bodies:
                start = time.perf_counter()
                status, answer = post(url + "/v1/systemone", body)
                seconds = time.perf_counter() - start
                if status != 200:
                    sys.exit(f"/v1/systemone answered {status}: {answer[:300]!r}")
                rows.append({"seconds": seconds})
            out["rounds"].append(rows)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            os.unlink(log)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
