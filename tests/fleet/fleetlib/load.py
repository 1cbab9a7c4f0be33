"""The fleet test's clients: a bounded load through the balancer, every request recorded."""

import http.client
import json
import random
import threading
import time

from .harness import request


class Load:
    """Clients sending decisions through the balancer at a bounded rate. Every 6th request of a
    client is one that can never succeed (bad JSON, an input the schema refuses, an unknown
    policy): it must get its 4xx, never a 5xx. Nobody here retries: the balancer must."""

    def __init__(self, balancer, policy, clients, rate):
        self.balancer = balancer
        self.path = f"/v1/policies/{policy}"
        self.invalid = [
            ("bad_json", self.path, b"{not json", (400,)),
            ("bad_input", self.path, b'{"id": "one", "message": 7}', (422,)),
            ("no_policy", "/v1/policies/no-such-policy", b'{"id": 1, "message": "hi"}', (404,)),
        ]
        self.clients = clients
        self.interval = 1.0 / rate
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.results = []
        self.phase = "start"
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(clients)]

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)

    def _client(self, index):
        rng = random.Random(index)
        n = 0
        while not self.stop.is_set():
            began = time.monotonic()
            n += 1
            if n % 6 == 0:
                kind, path, body, expect = self.invalid[(n // 6 + index) % len(self.invalid)]
            else:
                kind, path, expect = "valid", self.path, (200,)
                body = json.dumps({"id": n, "message": f"client {index} message {n}: the"
                                   " invoice was charged twice, please refund"}).encode()
            headers = {"content-type": "application/json",
                       "x-hunch-route-key": f"subject-{rng.randrange(32)}"}
            self.results.append(self._send(kind, path, body, headers, expect, index))
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def _send(self, kind, path, body, headers, expect, client):
        record = {"client": client, "kind": kind, "expect": expect, "phase": self.phase,
                  "status": None, "error": None, "decision_id": None, "revision": None,
                  "version": None, "replica": None}
        try:
            status, h, data = request("POST", self.balancer, path, body=body, headers=headers)
            record["status"] = status
            record["replica"] = h.get("x-fleet-replica")
            record["revision"] = h.get("x-hunch-bundle-revision")
            record["decision_id"] = h.get("x-hunch-decision-id")
            try:
                doc = json.loads(data)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                if status == 200:
                    record["version"] = doc.get("version")
                    record["decision_id"] = record["decision_id"] or doc.get("decision_id")
                elif isinstance(doc.get("detail"), dict):
                    record["decision_id"] = record["decision_id"] or doc["detail"].get("decision_id")
                    record["error"] = doc["detail"].get("error_type")
            if status not in expect and record["error"] is None:
                record["error"] = data[:200].decode(errors="replace")
        except (OSError, http.client.HTTPException) as e:
            record["error"] = f"{type(e).__name__}: {e}"
        return record

