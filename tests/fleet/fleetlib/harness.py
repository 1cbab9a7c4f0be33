"""What every part of the fleet test uses: running commands, one HTTP request, waiting for a state
(bounded, never a timed assertion), and the checks' tally."""

import http.client
import subprocess
import sys
import time


def log(*args):
    print("fleet:", *args, flush=True)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, what, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok: {what}", flush=True)
        else:
            self.failed += 1
            print(f"FAILED: {what}" + (f"\n  {detail}" if detail else ""), file=sys.stderr,
                  flush=True)
        return ok


def run(cmd, check=True, env=None, capture=True, timeout=600):
    proc = subprocess.run(cmd, env=env, text=True, timeout=timeout,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr or ''}")
    return proc


def request(method, base, path, body=None, headers=None, timeout=60.0):
    """One request on a fresh connection: (status, headers dict lower-cased, body bytes)."""
    host, port = base
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def wait_for(what, predicate, bound, interval=0.25):
    """Polls until predicate() is truthy; returns (value, seconds) or (None, seconds)."""
    start = time.monotonic()
    while True:
        try:
            value = predicate()
        except (OSError, http.client.HTTPException, ValueError, RuntimeError):
            value = None
        except TimeoutError as e:
            log(f"stopped waiting for {what}: {e}")
            return None, time.monotonic() - start
        elapsed = time.monotonic() - start
        if value:
            return value, elapsed
        if elapsed > bound:
            log(f"gave up waiting for {what} after {elapsed:.0f} s")
            return None, elapsed
        time.sleep(interval)

