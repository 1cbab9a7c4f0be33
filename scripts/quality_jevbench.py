"""JevBench on the frozen subset tests/quality/jevbench for scripts/quality.py: the subset
(trimmed proportionally across dimensions for --max-requests), the run against a server beside
jevbench's toy models, and the score per dimension with bootstrap intervals over cases
(docs/quality.md)."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import time
from pathlib import Path

from quality_common import BOOTSTRAP, JEVBENCH_SUITE, Progress, percentile_interval



def jevbench_requests(suite: Path) -> int:
    return int(json.loads((suite / "manifest.json").read_text())["plan"]["requests"])


def trimmed_suite(budget: int | None, work: Path) -> Path:
    """The frozen subset, or a copy trimmed to about `budget` requests: rows taken round-robin over
    the dimensions (then their relations), so each dimension keeps its share; min_n 1, since a
    trimmed run has too few tests per relation to score them otherwise."""
    if budget is None or budget >= jevbench_requests(JEVBENCH_SUITE):
        return JEVBENCH_SUITE
    from jevbench import taxonomy
    from jevbench.plan import decode_requests
    from jevbench.schema import load_cases

    cases = {c.id: c for c in load_cases(JEVBENCH_SUITE / "cases.jsonl")}
    with gzip.open(JEVBENCH_SUITE / "tests.jsonl.gz", "rt", encoding="utf-8") as f:
        head = json.loads(f.readline())
        rows = [json.loads(l) for l in f if l.strip()]
    by_dim: dict = {}
    for r in rows:
        group = taxonomy.entry(r["relation"]).group
        by_dim.setdefault(group.split(".")[0], {}).setdefault(r["relation"], []).append(r)
    queues = []
    for rels in by_dim.values():
        lists = list(rels.values())
        queues.append([x for tier in range(max(map(len, lists))) for l in lists if tier < len(l) for x in [l[tier]]])
    chosen, seen_cases, cost = [], set(), 0
    tier, progress_made = 0, True
    while progress_made:
        progress_made = False
        for q in queues:
            if tier >= len(q):
                continue
            progress_made = True
            r = q[tier]
            extra = len(decode_requests(cases[r["case"]], r["requests"])) + (r["case"] not in seen_cases)
            if cost + extra > budget and len(chosen) >= len(queues):
                continue
            chosen.append(r)
            seen_cases.add(r["case"])
            cost += extra
        tier += 1
    out = work / "jevbench-trimmed"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ids = [c for c in head["cases"] if c in seen_cases]
    write_suite(out, [cases[c] for c in ids], chosen, head, min_n=1,
                description=f"tests/quality/jevbench trimmed to about {budget} requests")
    return out


def write_suite(path: Path, cases, rows, head: dict, min_n: int, description: str, extra: dict | None = None):
    """A self-contained suite directory (cases, plan, manifest with the files' hashes)."""
    from jevbench.suites import _requests

    with (path / "cases.jsonl").open("w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(case_json(c), ensure_ascii=False) + "\n")
    # The plan keeps every relation of the suite it came from: jevbench builds trials of its own
    # for a relation a plan does not list, so a relation without rows here must still be listed
    # (it then has no tests, rather than fresh ones).
    plan_head = dict(head, cases=[c.id for c in cases])
    raw = "\n".join(json.dumps(x, ensure_ascii=False) for x in [plan_head, *rows]) + "\n"
    # mtime 0: the same rows give the same bytes, so the manifest's hash is reproducible.
    with open(path / "tests.jsonl.gz", "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as g:
            g.write(raw.encode("utf-8"))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(path.iterdir()) if p.name.endswith((".jsonl", ".jsonl.gz"))}
    manifest = {"name": path.name, "version": "1", "description": description, "min_n": min_n,
                "files": files,
                "plan": {"file": "tests.jsonl.gz", "trials": len(rows), "relations": len(plan_head["relations"]),
                         "seed": head["seed"], "trials_per_target": head["trials"],
                         "requests": _requests(cases, {"rows": rows})},
                **(extra or {})}
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def case_json(c) -> dict:
    return {"id": c.id, "state": c.state, "questions": c.questions, **({"meta": c.meta} if c.meta else {})}


class Counting:
    """A jevbench backend that counts its requests (for the progress line) and lists failures."""

    def __init__(self, inner, progress: Progress):
        self._inner, self._progress, self.failures = inner, progress, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def ask(self, *args, **kwargs):
        try:
            out = self._inner.ask(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - listed, then re-raised for jevbench to record
            self.failures.append(f"{type(e).__name__}: {str(e)[:300]}")
            self._progress.tick(error=True)
            raise
        self._progress.tick()
        return out


def dimension_scores(result: dict, min_n: int = 5) -> dict:
    """Overall and per-dimension scores with 95% bootstrap intervals over cases, computed as
    jevbench's own `scores` computes the overall one (same judging, same aggregation)."""
    from collections import defaultdict
    from statistics import mean

    from jevbench import taxonomy
    from jevbench.relations import REGISTRY
    from jevbench.score import _aggregate, _judge, _test_target, scores

    official = scores(result, bootstrap=0, min_n=min_n)
    tests = defaultdict(list)
    for o in result["outcomes"]:
        if o["relation"] in REGISTRY:
            tests[(o["relation"], o["check"], o["case_id"], _test_target(o))].append(_judge(o, result))
    cells = defaultdict(lambda: defaultdict(list))
    for (rel, check, case_id, _t), js in tests.items():
        cells[(rel, check)][case_id].append(any(v for v, _ in js))
    included = [tuple(k.split("/", 1)) for k, row in official["checks"].items() if "excluded" not in row]
    case_ids = sorted({c for k in included for c in cells[k]})
    draws = defaultdict(list)
    rng = random.Random(0)
    for _ in range(BOOTSTRAP if len(case_ids) > 1 else 0):
        sample = [rng.choice(case_ids) for _ in case_ids]
        vals = {}
        for k in included:
            js = [v for c in sample for v in cells[k].get(c, [])]
            if js:
                vals[k] = 1.0 - sum(js) / len(js)
        agg = _aggregate(vals)
        if agg["overall"] is not None and not official["incomplete"]:
            draws["overall"].append(agg["overall"])
        for p, v in agg["pillars"].items():
            if v is not None:
                draws[p].append(v)

    def entry(value, name):
        if value is None or not draws.get(name):
            return {"value": value, "low": None, "high": None}
        low, high = percentile_interval(draws[name])
        return {"value": value, "low": low, "high": high}

    return {
        "score": entry(official["overall"], "overall"),
        "dimensions": {p.id: dict(entry(official["pillars"].get(p.id), p.id), title=p.title)
                       for p in taxonomy.PILLARS},
        "groups": official["groups"], "cases": len(case_ids), "checks": official["n_checks"],
        "incomplete": official["incomplete"],
        "excluded": {k: row["excluded"] for k, row in official["checks"].items() if "excluded" in row},
    }


def jevbench_part(url: str | None, model: str, suite: Path, progress: Progress, work: Path) -> dict:
    import jevbench as jb

    def run(backend, name):
        return jb.evaluate(backend, suite=str(suite), cache=None, name=name)

    min_n = int(json.loads((suite / "manifest.json").read_text()).get("min_n", 5))
    out = {}
    for kind in ("coherent", "biased"):
        progress.stage = f"jevbench fake:{kind}"
        report = run(jb.fake(kind), f"fake:{kind}")
        out[f"fake:{kind}"] = (dimension_scores(report.result, min_n), report.result)
    progress.stage = "jevbench model"
    backend = Counting(jb.systemone(url + "/v1/systemone", model=model, timeout=600), progress)
    started = time.monotonic()
    report = run(backend, model)
    seconds = time.monotonic() - started
    result = report.result
    (work / "jevbench-model.json").write_text(json.dumps(result))
    errors = [json.dumps(e)[:400] for e in result.get("errors", [])] + backend.failures
    return {"model": dimension_scores(result, min_n), "ceiling": out["fake:coherent"][0], "floor": out["fake:biased"][0],
            "requests": result.get("requests", 0), "errors": errors, "seconds": seconds,
            "backend_down": result.get("backend_down"), "truncated": result.get("truncated_by_budget")}


# ------------------------------------------------------------------ the report
