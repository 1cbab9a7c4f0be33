"""Freezes tests/quality/jevbench: a stratified subset of jevbench-mini, JevBench's default suite
(run from the repository root: `.venv/bin/python tests/quality/jevbench/build_subset.py [N]`).

Every relation of the default suite (so every group and dimension) keeps N of its tests (default
5, jevbench's least to score a relation), taken from cases spread over the twelve domains: cases
are picked round-robin over the domains, each the one whose tests most relations still need. A
picked case brings only the tests still needed. The subset's trials are mini's own rows, byte for
byte; `trial_ids.txt` lists them. Cases and plan are written into this directory (self-contained,
so a run sends one base request per picked case, not per case of jevbench-240)."""

import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

from jevbench.suites import load_suite  # noqa: E402

import quality_jevbench as quality  # noqa: E402

per_relation = int(sys.argv[1]) if len(sys.argv) > 1 else 5
mini = load_suite("jevbench-mini")
base = {c.id: c for c in mini.cases}
path = Path(mini.path) / "tests.jsonl.gz"
with gzip.open(path, "rt", encoding="utf-8") as f:
    head = json.loads(f.readline())
    rows = [json.loads(l) for l in f if l.strip()]

by_case = defaultdict(list)
for r in rows:
    by_case[r["case"]].append(r)
domains = defaultdict(list)
for cid in head["cases"]:
    if cid in by_case:
        domains[base[cid].meta.get("domain", "")].append(cid)

need = {rel: per_relation for rel in {r["relation"] for r in rows}}
chosen_cases, chosen_rows = [], []
while any(need.values()):
    progressed = False
    for d in sorted(domains):
        left = [c for c in domains[d] if c not in chosen_cases]
        if not left or not any(need.values()):
            continue
        best = max(left, key=lambda c: sum(need[r["relation"]] > 0 for r in by_case[c]))
        mine = [r for r in by_case[best] if need[r["relation"]] > 0]
        if not mine:
            continue
        chosen_cases.append(best)
        for r in mine:
            need[r["relation"]] -= 1
            chosen_rows.append(r)
        progressed = True
    if not progressed:
        sys.exit(f"cannot give every relation {per_relation} tests: {need}")

out = Path(__file__).resolve().parent
order = [c for c in head["cases"] if c in chosen_cases]
rows_out = sorted(chosen_rows, key=lambda r: (order.index(r["case"]), r["relation"], r["key"], r["v"], r["t"]))
quality.write_suite(
    out, [base[c] for c in order], rows_out, head, min_n=5,
    description=f"tests/quality/jevbench: jevbench-mini's tests, {per_relation} per relation "
                f"({len(rows_out)} trials on {len(order)} cases over every domain), for scripts/quality.sh",
    extra={"drawn_from": f"{mini.name} v{mini.version}", "per_relation": per_relation,
           "drawn_from_files": mini.files})
(out / "trial_ids.txt").write_text("".join(f"{r['relation']}:{r['case']}:{r['key']}:{r['t']}" + (f":v{r['v']}" if r["v"] else "") + "\n" for r in rows_out))
m = json.loads((out / "manifest.json").read_text())
print(f"{len(rows_out)} trials on {len(order)} cases, {m['plan']['requests']} requests")
