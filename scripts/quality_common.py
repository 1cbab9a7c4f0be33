"""What scripts/quality.py and scripts/quality_jevbench.py share: where the suites are, the
error a run stops on, the progress line, and the bootstrap intervals (docs/quality.md)."""

from __future__ import annotations

import math
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABELLED = ROOT / "tests/quality/labelled.jsonl"
JEVBENCH_SUITE = ROOT / "tests/quality/jevbench"
BOOTSTRAP = 1000
ECE_BINS = 10


class QualityError(Exception):
    """A run that cannot go on (no server, no binary): its message is the whole story."""


# ------------------------------------------------------------------ progress


class Progress:
    """One line on stderr: requests done / planned, errors, time spent and left."""

    def __init__(self, total: int):
        self.total, self.done, self.errors = max(total, 1), 0, 0
        self.started = time.monotonic()
        self.last = 0.0
        self.tty = sys.stderr.isatty()
        self.lock = threading.Lock()
        self.stage = ""

    def tick(self, n: int = 1, error: bool = False):
        with self.lock:
            self.done += n
            self.errors += int(error)
            self.show()

    def show(self, force: bool = False):
        now = time.monotonic()
        if not force and now - self.last < (1.0 if self.tty else 15.0):
            return
        self.last = now
        spent = now - self.started
        left = spent / self.done * max(self.total - self.done, 0) if self.done else float("nan")
        line = (f"quality: {self.done}/{self.total} requests, {self.errors} errors, "
                f"{fmt_time(spent)} spent, ~{fmt_time(left)} left  [{self.stage}]")
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def finish(self):
        self.show(force=True)
        if self.tty:
            print(file=sys.stderr)


def fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s"


# ------------------------------------------------------------------ statistics


def percentile_interval(values: list[float]) -> tuple[float, float]:
    v = sorted(values)
    return v[int(0.025 * (len(v) - 1))], v[int(0.975 * (len(v) - 1))]


def estimate(items: list, stat, seed: int = 0) -> dict:
    """{"value", "low", "high", "n"}: `stat` over `items` and its 95% bootstrap interval (items
    resampled with replacement, fixed seed). Empty: nulls."""
    if not items:
        return {"value": None, "low": None, "high": None, "n": 0}
    value = stat(items)
    rng = random.Random(seed)
    draws = [stat([rng.choice(items) for _ in items]) for _ in range(BOOTSTRAP)]
    low, high = percentile_interval(draws)
    return {"value": value, "low": low, "high": high, "n": len(items)}


