#!/usr/bin/env python3
"""Runs a benchmark command and samples its anonymous resident memory (`RssAnon` of
/proc/PID/status, Linux) every 20 ms: what the process must have free at its worst moment.

The command appends JSON lines to OUT (accel-bench and mlx_vlm's ref_bench.py both do, tagged
TAG). The line whose "event" is "load" splits the run: the peak before it is the load's, the
memory when it appears is the steady state (the loaded model), the peak after it the reads'.
Appends one line to OUT: {"event": "anon", "tag": TAG, "steady_mb", "load_peak_over_mb",
"read_peak_over_mb"} (peaks above the steady state, MiB).

    scripts/sample_anon.py --out RESULTS.jsonl --tag TAG -- COMMAND [ARGS...]
"""
import json
import subprocess
import sys
import time


def anon_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def loaded(out, tag, seen):
    """Whether OUT has gained a "load" line with TAG since `seen` bytes."""
    try:
        with open(out) as f:
            f.seek(seen[0])
            text = f.read()
    except OSError:
        return False
    seen[0] += len(text.encode())
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "load" and record.get("tag") == tag:
            return True
    return False


def main(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    out = opts[opts.index("--out") + 1]
    tag = opts[opts.index("--tag") + 1]
    try:
        with open(out) as f:
            seen = [len(f.read().encode())]
    except OSError:
        seen = [0]
    proc = subprocess.Popen(command)
    peak, steady, load_peak = 0, None, None
    while proc.poll() is None:
        now = anon_kib(proc.pid)
        if now is not None:
            peak = max(peak, now)
            if steady is None and loaded(out, tag, seen):
                steady, load_peak, peak = now, peak, now
        time.sleep(0.02)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    if steady is not None:
        mib = lambda kib: round(kib / 1024, 1)
        with open(out, "a") as f:
            f.write(json.dumps({"event": "anon", "tag": tag, "steady_mb": mib(steady),
                                "load_peak_over_mb": mib(load_peak - steady),
                                "read_peak_over_mb": mib(peak - steady)}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
