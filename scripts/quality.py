"""Decision quality of a System One server, measured (issue 51; docs/quality.md).

Run by scripts/quality.sh with the repository's .venv python (it needs jevbench). Two parts:

1. JevBench on the frozen subset tests/quality/jevbench (every dimension and group), scored
   overall and per dimension with 95% bootstrap intervals over cases, beside jevbench's toy
   models fake:coherent (ceiling) and fake:biased (floor) on the same subset.
2. The labelled suite tests/quality/labelled.jsonl: accuracy and ECE with 95% bootstrap
   intervals over items, per question type against chance, the share of choice answers that
   change when the options are reversed (and shifted by one), and the held-out split raw and
   after a calibration that `hunch calibrate` fits on the fit split — for each remedy asked
   (`--remedies`: x_prior / x_order combinations).

Writes OUT/quality.json and OUT/quality.md. Requests that fail are counted and listed in both,
never dropped. Without --url it starts `hunch serve` on the default model and stops it after.

The report is also stored in the quality directory, keyed by the measured model's fingerprint
(`x_fingerprint` in GET /v1/models), where `hunch serve` finds it for that exact model
(GET /v1/models/NAME/quality, the console's models page): scripts/quality_store.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import quality_store as store
from quality_common import (BOOTSTRAP, ECE_BINS, JEVBENCH_SUITE, LABELLED, ROOT, Progress,
                            QualityError, estimate)
from quality_jevbench import jevbench_part, jevbench_requests, trimmed_suite


# What each remedy sends (docs/read.md, "Prior correction and order debiasing"). `default` sends
# nothing: the server's (or the model's) own settings.
REMEDIES = {
    "default": {},
    "none": {"x_prior": "none", "x_order": "as_given"},
    "prior": {"x_prior": "divide", "x_order": "as_given"},
    "order": {"x_prior": "none", "x_order": "reversed_average"},
    "cyclic": {"x_prior": "none", "x_order": "cyclic_average"},
    "both": {"x_prior": "divide", "x_order": "reversed_average"},
}


def accuracy(rows: list[dict]) -> float:
    return sum(r["correct"] for r in rows) / len(rows)


def ece(rows: list[dict]) -> float:
    """Expected calibration error over 10 equal-mass bins of the top probability (as
    `hunch calibrate` computes it: docs/calibration.md, "The metrics")."""
    ordered = sorted(rows, key=lambda r: r["confidence"])
    n = len(ordered)
    bins = min(ECE_BINS, n)
    total = 0.0
    for b in range(bins):
        part = ordered[b * n // bins:(b + 1) * n // bins]
        if part:
            right = sum(r["correct"] for r in part) / len(part)
            conf = sum(r["confidence"] for r in part) / len(part)
            total += len(part) / n * abs(right - conf)
    return total


def share(rows: list[bool]) -> float:
    return sum(rows) / len(rows)


# ------------------------------------------------------------------ the server


class Server:
    """`hunch serve` on the default model, on a free port, stopped on exit."""

    def __init__(self, hunch: str, extra: list[str], log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = log.open("w")
        try:
            self.process = subprocess.Popen(
                [hunch, "serve", "--listen", f"127.0.0.1:{port}", *extra],
                stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise QualityError(f"cannot start {hunch} serve: {e}") from e
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise QualityError(f"hunch serve exited with {self.process.returncode}; its log: {log}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise QualityError(f"hunch serve was not ready in 300 s; its log: {log}")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def get_json(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post(url: str, body: dict, timeout: float = 300) -> tuple[int, dict | str]:
    data = json.dumps(body, ensure_ascii=False).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        return e.code, text
    except (urllib.error.URLError, OSError) as e:
        return 0, f"{type(e).__name__}: {e}"


def check_reachable(url: str) -> dict:
    try:
        return get_json(url + "/v1/models")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise QualityError(f"the server at {url} is unreachable ({e}); start one (scripts/serve.sh) "
                           "or leave --url out to let this script start the default model") from e


# ------------------------------------------------------------------ the labelled suite


def load_labelled(path: Path = LABELLED) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def trim_items(items: list[dict], budget: int | None) -> list[dict]:
    """At most `budget` items, taken evenly from every question and split, answers interleaved."""
    if budget is None or budget >= len(items):
        return items
    groups: dict = {}
    for it in items:
        groups.setdefault((it["question"], it["split"]), {}).setdefault(json.dumps(it["answer"]), []).append(it)
    # Within a group, round-robin over the answers; across groups, round-robin too, the held-out
    # groups first (so a small budget still asks every question once).
    queues = []
    for g, (_, by_answer) in enumerate(sorted(groups.items(), key=lambda kv: kv[0][1] != "held_out")):
        lists = list(by_answer.values())
        # Each group starts at another answer, so a small budget does not take every question's
        # first option.
        lists = lists[g % len(lists):] + lists[:g % len(lists)]
        q = [x for tier in range(max(map(len, lists))) for l in lists if tier < len(l) for x in [l[tier]]]
        queues.append(q)
    out = []
    tier = 0
    while len(out) < budget:
        for q in queues:
            if tier < len(q) and len(out) < budget:
                out.append(q[tier])
        tier += 1
    keep = {id(x) for x in out}
    return [it for it in items if id(it) in keep]


def question_of(item: dict, criteria=None) -> dict:
    q = {"type": item["type"], "instructions": item["instructions"]}
    c = item.get("criteria") if criteria is None else criteria
    if c is not None:
        q["criteria"] = c
    return q


def labels_of(item: dict) -> list:
    if item["type"] == "noul":
        return [True, False]
    if item["type"] == "choice":
        return list(item["criteria"])
    return list(range(len(item["criteria"])))


def distribution(item: dict, answer: dict) -> list[float]:
    """The answer's probabilities in the item's label order."""
    if item["type"] == "noul":
        p = float(answer["noul"])
        return [p, 1.0 - p]
    probs = answer["probabilities"]
    if item["type"] == "choice":
        return [float(probs[name]) for name in item["criteria"]]
    return [float(probs[str(i)]) for i in range(len(item["criteria"]))]


def scored(item: dict, dist: list[float]) -> dict:
    top = max(range(len(dist)), key=lambda i: (dist[i], -i))   # first wins ties
    right = labels_of(item).index(item["answer"])
    return {"id": item["id"], "type": item["type"], "question": item["question"], "split": item["split"],
            "dist": dist, "top": top, "correct": top == right, "confidence": dist[top],
            "chance": 1.0 / len(dist)}


def body_of(item: dict, model: str, remedy: dict, criteria=None) -> dict:
    return {"model": model, "state": item["state"],
            "questions": {item["question"]: question_of(item, criteria)},
            "x_calibration": "off", **remedy}


def ask_item(url: str, item: dict, model: str, remedy: dict, criteria=None):
    status, body = post(url + "/v1/systemone", body_of(item, model, remedy, criteria))
    if status != 200 or not isinstance(body, dict):
        return None, f"{item['id']}: HTTP {status}: {str(body)[:300]}"
    try:
        answer = body["answers"][item["question"]]
        if criteria is not None:
            return answer, None
        return distribution(item, answer), None
    except (KeyError, TypeError, ValueError) as e:
        return None, f"{item['id']}: malformed answer ({e}): {str(body)[:300]}"


def run_batch(hunch: str, url: str, items: list[dict], model: str, remedy: dict, work: Path,
              progress: Progress):
    """The fit split through `hunch batch` (its output is what `hunch calibrate` reads)."""
    inp, out = work / "fit.jsonl", work / "fit-out.jsonl"
    with inp.open("w") as f:
        for it in items:
            f.write(json.dumps({"custom_id": it["id"], "method": "POST", "url": "/v1/systemone",
                                "body": body_of(it, model, remedy)}, ensure_ascii=False) + "\n")
    if out.exists():
        out.unlink()
    proc = subprocess.Popen([hunch, "batch", "-i", str(inp), "-o", str(out), "--server", url,
                             "--concurrency", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    while proc.poll() is None:
        time.sleep(1)
        n = sum(1 for _ in out.open()) if out.exists() else 0
        if n > seen:
            progress.tick(n - seen)
            seen = n
    stdout, stderr = proc.communicate()
    lines = [json.loads(l) for l in out.read_text().splitlines() if l.strip()] if out.exists() else []
    if len(lines) > seen:
        progress.tick(len(lines) - seen)
    by_id = {l["custom_id"]: l for l in lines}
    results, errors = {}, []
    for it in items:
        line = by_id.get(it["id"])
        response = (line or {}).get("response") or {}
        if line is None or response.get("status_code") != 200:
            errors.append(f"{it['id']}: {'not answered by hunch batch' if line is None else line.get('error') or response}"[:400])
            continue
        try:
            results[it["id"]] = distribution(it, response["body"]["answers"][it["question"]])
        except (KeyError, TypeError, ValueError) as e:
            errors.append(f"{it['id']}: malformed batch answer ({e})")
    if proc.returncode not in (0, 1) and not lines:
        raise QualityError(f"hunch batch failed ({proc.returncode}): {stderr.strip()[-500:]}")
    return results, errors, out


def fit_calibration(hunch: str, batch_out: Path, items: list[dict], work: Path):
    """`hunch calibrate` on the fit split: {question id: (temperature, offsets)}, refused, problems."""
    labels = work / "labels.jsonl"
    with labels.open("w") as f:
        for it in items:
            f.write(json.dumps({"custom_id": it["id"], "labels": {it["question"]: it["answer"]}},
                               ensure_ascii=False) + "\n")
    cal = work / "calibration.json"
    proc = subprocess.run([hunch, "calibrate", "--log", str(batch_out), "--labels", str(labels), "-o", str(cal),
                           "--json"], capture_output=True, text=True)
    if proc.returncode != 0 or not cal.exists():
        return None, f"hunch calibrate exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
    doc = json.loads(cal.read_text())
    fitted = {}
    for q in doc.get("questions", []):
        for qid in q.get("ids", []):
            fitted[qid] = (q["temperature"], q.get("offsets"))
    return {"fitted": fitted, "refused": [{"ids": r["ids"], "reason": r["reason"]} for r in doc.get("refused", [])],
            "problems": len(doc.get("problems", []))}, None


def calibrated(dist: list[float], temperature: float, offsets) -> list[float]:
    """softmax(ln p / T + b), a zero staying zero: what the server applies (core/src/calibration/fit.rs)."""
    logits = [(math.log(p) / temperature + (offsets[i] if offsets else 0.0)) if p > 0 else -math.inf
              for i, p in enumerate(dist)]
    m = max(logits)
    if not math.isfinite(m):
        return dist
    e = [math.exp(z - m) if math.isfinite(z) else 0.0 for z in logits]
    s = sum(e)
    return [x / s for x in e]


def reversed_criteria(item: dict) -> dict:
    return dict(reversed(list(item["criteria"].items())))


def shifted_criteria(item: dict) -> dict:
    pairs = list(item["criteria"].items())
    return dict(pairs[1:] + pairs[:1])


def labelled_part(url: str, model: str, remedy_name: str, items: list[dict], hunch: str | None,
                  progress: Progress, work: Path) -> dict:
    remedy = REMEDIES[remedy_name]
    fit = [it for it in items if it["split"] == "fit"]
    held = [it for it in items if it["split"] == "held_out"]
    errors: list[str] = []
    dists: dict = {}
    seconds = time.monotonic()
    progress.stage = f"labelled {remedy_name}: fit split"
    batch_out = None
    if fit and hunch:
        got, errs, batch_out = run_batch(hunch, url, fit, model, remedy, work, progress)
        dists.update(got)
        errors += errs
    else:
        held = items if not hunch else held
    progress.stage = f"labelled {remedy_name}: held-out split"
    for it in held:
        d, err = ask_item(url, it, model, remedy)
        progress.tick(error=err is not None)
        if err:
            errors.append(err)
        else:
            dists[it["id"]] = d
    read_items = len(fit) + len(held) if hunch else len(held)
    seconds = time.monotonic() - seconds
    rows = [scored(it, dists[it["id"]]) for it in items if it["id"] in dists]

    # Position bias: choice answers asked again with the options reversed, and shifted by one.
    progress.stage = f"labelled {remedy_name}: options reordered"
    flips: dict = {"reversed": [], "shifted": []}
    for it in [i for i in items if i["type"] == "choice" and i["id"] in dists]:
        first = labels_of(it)[scored(it, dists[it["id"]])["top"]]
        for kind, criteria in (("reversed", reversed_criteria(it)), ("shifted", shifted_criteria(it))):
            answer, err = ask_item(url, it, model, remedy, criteria)
            progress.tick(error=err is not None)
            if err:
                errors.append(f"{kind} {err}")
                continue
            flips[kind].append(answer.get("choice") != first)

    per_type = {}
    for t in ("noul", "choice", "score"):
        mine = [r for r in rows if r["type"] == t]
        chance = sum(r["chance"] for r in mine) / len(mine) if mine else None
        per_type[t] = {"accuracy": estimate(mine, accuracy), "ece": estimate(mine, ece), "chance": chance}
    per_question = {}
    for q in sorted({r["question"] for r in rows}):
        mine = [r for r in rows if r["question"] == q]
        per_question[q] = {"accuracy": estimate(mine, accuracy), "chance": mine[0]["chance"]}
    first_option = [r for r in rows if r["type"] == "choice"]
    out = {
        "remedy": remedy_name, "sent": remedy, "items": len(items), "answered": len(rows),
        "accuracy": estimate(rows, accuracy), "ece": estimate(rows, ece),
        "per_type": per_type, "per_question": per_question,
        "first_option_share": (sum(r["top"] == 0 for r in first_option) / len(first_option)) if first_option else None,
        "position_bias": {k: estimate(v, share) for k, v in flips.items()},
        "seconds_per_item": seconds / read_items if read_items else None,
        "errors": errors,
    }
    # Calibration: fitted by `hunch calibrate` on the fit split, measured on the held-out split.
    held_rows = [r for r in rows if r["split"] == "held_out"]
    cal = {"held_out_raw": {"accuracy": estimate(held_rows, accuracy), "ece": estimate(held_rows, ece)}}
    if batch_out is not None:
        fitted, err = fit_calibration(hunch, batch_out, fit, work)
        if err:
            cal["error"] = err
        else:
            after = []
            for r in held_rows:
                t = fitted["fitted"].get(r["question"])
                it = next(i for i in items if i["id"] == r["id"])
                after.append(scored(it, calibrated(r["dist"], *t)) if t else r)
            cal.update({"held_out_calibrated": {"accuracy": estimate(after, accuracy), "ece": estimate(after, ece)},
                        "temperatures": {k: v[0] for k, v in fitted["fitted"].items()},
                        "offsets": sorted(k for k, v in fitted["fitted"].items() if v[1]),
                        "refused": fitted["refused"]})
    else:
        cal["error"] = "no hunch binary to run hunch batch and hunch calibrate (--hunch)"
    out["calibration"] = cal
    return out


# ------------------------------------------------------------------ JevBench


def fmt(e: dict | None, pct: bool = True) -> str:
    if not e or e.get("value") is None:
        return "–"
    k = 100.0 if pct else 1.0
    if e.get("low") is None:
        return f"{e['value'] * k:.1f}"
    return f"{e['value'] * k:.1f} [{e['low'] * k:.1f}, {e['high'] * k:.1f}]"


def markdown(doc: dict) -> str:
    L = [f"# Decision quality: {doc['model']}", "",
         f"{doc['date']}, commit {doc['commit']}, {doc['hardware']}. Command: `{doc['command']}`.", "",
         f"Model fingerprint: `{doc.get('fingerprint') or 'unknown'}`; measured at {doc.get('measured_at', '?')}.", "",
         f"Requests: {doc['requests']}, errors: {doc['errors']}. Intervals: 95% bootstrap "
         f"({BOOTSTRAP} draws; JevBench over cases, the labelled suite over items).", ""]
    jb = doc.get("jevbench")
    if jb:
        L += [f"## JevBench ({doc['suite']['jevbench']}, {jb['model']['cases']} cases"
              f"{', trimmed: a demonstration, not a result' if doc['suite'].get('jevbench_trimmed') else ''})", "",
              "| | model | floor (fake:biased) | ceiling (fake:coherent) |", "|---|---|---|---|",
              f"| overall | {fmt(doc['score'])} | {fmt(doc['floor'])} | {fmt(doc['ceiling'])} |"]
        for d, e in doc["dimensions"].items():
            L.append(f"| {d} {e.get('title', '')} | {fmt(e)} | {fmt(doc['floor']['dimensions'][d])} | "
                     f"{fmt(doc['ceiling']['dimensions'][d])} |")
        L += ["", f"{jb['seconds']:.0f} s for {jb['requests']} requests.", ""]
    for name, r in doc.get("labelled", {}).items():
        L += [f"## Labelled suite, remedy `{name}` {json.dumps(r['sent'])}", "",
              f"{r['answered']}/{r['items']} items answered; {r['seconds_per_item'] or 0:.2f} s per item.", "",
              "| | accuracy % | ECE % | chance % |", "|---|---|---|---|",
              f"| all | {fmt(r['accuracy'])} | {fmt(r['ece'])} | |"]
        for t, e in r["per_type"].items():
            L.append(f"| {t} | {fmt(e['accuracy'])} | {fmt(e['ece'])} | "
                     f"{(e['chance'] or 0) * 100:.1f} |")
        pb = r["position_bias"]
        L += ["", f"Choice answers that change with the options reversed: {fmt(pb['reversed'])} %; "
              f"shifted by one: {fmt(pb['shifted'])} %. First option chosen: "
              f"{(r['first_option_share'] or 0) * 100:.0f} % (right answers are spread evenly).", ""]
        cal = r["calibration"]
        if "held_out_calibrated" in cal:
            L += [f"Held-out split: raw accuracy {fmt(cal['held_out_raw']['accuracy'])} %, ECE "
                  f"{fmt(cal['held_out_raw']['ece'])} %; calibrated (hunch calibrate on the fit split) accuracy "
                  f"{fmt(cal['held_out_calibrated']['accuracy'])} %, ECE {fmt(cal['held_out_calibrated']['ece'])} %. "
                  f"Temperatures: {', '.join(f'{k} {v:.2f}' for k, v in cal['temperatures'].items())}.", ""]
        elif cal.get("error"):
            L += [f"Calibration not fitted: {cal['error']}", ""]
    if doc["error_list"]:
        L += ["## Errors", ""] + [f"- {e}" for e in doc["error_list"]] + [""]
    return "\n".join(L)


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hardware() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def find_hunch(given: str | None) -> str | None:
    for c in [given, os.environ.get("HUNCH_BIN"), str(ROOT / "target/release/hunch"), shutil.which("hunch")]:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/quality.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start hunch serve on the default model)")
    ap.add_argument("--model", default="jev-latest", help="the model asked (default jev-latest)")
    ap.add_argument("--max-requests", type=int, help="at most about this many requests to the server, "
                    "the JevBench subset and the labelled suite trimmed proportionally")
    ap.add_argument("--out", default="quality-report", help="where quality.json and quality.md go")
    ap.add_argument("--remedies", default="default",
                    help=f"comma-separated remedies to run the labelled suite with: {', '.join(REMEDIES)}")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: jevbench, labelled")
    ap.add_argument("--hunch", help="the hunch binary (default $HUNCH_BIN, target/release/hunch, PATH)")
    ap.add_argument("--serve-arg", action="append", default=[], help="an argument for the hunch serve "
                    "this script starts (repeatable)")
    ap.add_argument("--quality-dir", help="where the report is kept for the server to find, under its model's "
                    "fingerprint (default $HUNCH_QUALITY_DIR, else quality/ beside the models cache: "
                    "~/.cache/hunch/quality)")
    ap.add_argument("--no-answer-cache", action="store_true", help="start hunch serve without its answer "
                    "cache (on by default here: the remedies' common reads are then read once; off, each "
                    "remedy's seconds per item are its own cost)")
    args = ap.parse_args(argv)
    remedies = [r for r in args.remedies.split(",") if r]
    unknown = [r for r in remedies if r not in REMEDIES]
    skip = {s for s in args.skip.split(",") if s}
    if unknown or skip - {"jevbench", "labelled"}:
        ap.error(f"unknown remedies {unknown} or parts {sorted(skip - {'jevbench', 'labelled'})}")
    # A terminated run still stops the server it started (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hunch-quality-"))
    hunch = find_hunch(args.hunch)
    server = None
    try:
        if args.url:
            url = args.url.rstrip("/")
            check_reachable(url)
        else:
            if not hunch:
                raise QualityError("no hunch binary: build it (cargo build --release -p hunch -p hunch-accelerator) "
                                   "or pass --hunch, or --url a running server")
            print(f"quality: starting {hunch} serve on the default model", file=sys.stderr)
            # The answer cache makes the remedies' shared reads (and repeated runs) cheap; it
            # never changes an answer (docs/read.md, "The answer cache").
            cache = [] if args.no_answer_cache else ["--answer-cache-mb", "64"]
            server = Server(hunch, [*cache, *args.serve_arg], out / "server.log")
            url = server.url
        models = check_reachable(url)
        return measure(args, url, models, remedies, skip, hunch, out, work)
    except (QualityError, store.StoreError) as e:
        print(f"quality: error: {e}", file=sys.stderr)
        return 1
    finally:
        if server:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def measure(args, url, models, remedies, skip, hunch, out: Path, work: Path) -> int:
    items = load_labelled() if "labelled" not in skip else []
    jb_full = jevbench_requests(JEVBENCH_SUITE) if "jevbench" not in skip else 0
    per_item = {r: 1 for r in remedies}
    choice_share = sum(i["type"] == "choice" for i in items) / len(items) if items else 0
    labelled_cost = sum(len(items) * (1 + 2 * choice_share) for _ in remedies)
    jb_budget = item_budget = None
    if args.max_requests is not None:
        total = jb_full + labelled_cost
        ratio = min(1.0, args.max_requests / total) if total else 1.0
        jb_budget = int(jb_full * ratio) if jb_full else None
        item_budget = max(len(remedies) and 7, int(len(items) * ratio)) if items else None
    suite = trimmed_suite(jb_budget, work) if jb_full else None
    items = trim_items(items, item_budget)
    planned = (jevbench_requests(suite) if suite else 0) + sum(
        len(items) + 2 * sum(i["type"] == "choice" for i in items) for _ in per_item)
    progress = Progress(planned)
    doc = {"model": None, "url": url, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
           "commit": commit(), "hardware": hardware(),
           "command": "scripts/quality.sh " + " ".join(sys.argv[1:]),
           "suite": {"labelled": str(LABELLED.relative_to(ROOT)), "labelled_items": len(items),
                     "jevbench": str(JEVBENCH_SUITE.relative_to(ROOT)) if suite else None,
                     "jevbench_trimmed": bool(suite and suite != JEVBENCH_SUITE)}}
    names = [m.get("name") for m in models.get("models", [])]
    errors: list[str] = []
    requests = 0
    if suite:
        jb = jevbench_part(url, args.model, suite, progress, work)
        doc["jevbench"] = jb
        requests += jb["requests"]
        errors += [f"jevbench: {e}" for e in jb["errors"]]
        doc["score"] = jb["model"]["score"]
        doc["dimensions"] = jb["model"]["dimensions"]
        # Each an estimate of its own ({"value", "low", "high"}: the overall score) with its
        # dimensions beside it.
        doc["floor"] = dict(jb["floor"]["score"], dimensions=jb["floor"]["dimensions"])
        doc["ceiling"] = dict(jb["ceiling"]["score"], dimensions=jb["ceiling"]["dimensions"])
    doc["labelled"] = {}
    # `--skip labelled`: no labelled figures at all (not a section of empty rows per remedy).
    for r in remedies if items else []:
        part = labelled_part(url, args.model, r, items, hunch, progress, work)
        doc["labelled"][r] = part
        requests += len(items) + 2 * sum(i["type"] == "choice" for i in items)
        errors += [f"labelled {r}: {e}" for e in part["errors"]]
    progress.finish()
    # The model's real name, from one answer (jev-latest is an alias).
    status, body = post(url + "/v1/systemone", {"model": args.model, "state": "ok",
                                                "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    doc["model"] = body.get("model") if isinstance(body, dict) else args.model
    doc["models_listed"] = names
    first = doc["labelled"].get(remedies[0]) if remedies and items else None
    if first:
        doc["accuracy"] = first["accuracy"]
        doc["ece"] = first["ece"]
    # Every request this run sent to the server (jevbench's and the labelled suite's, failed ones
    # included), as counted while they were sent.
    doc["requests"] = progress.done
    doc["errors"] = len(errors)
    doc["error_list"] = errors
    doc["measured_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        after = get_json(url + "/v1/models")
    except (urllib.error.URLError, OSError, ValueError) as e:
        after = None
        print(f"quality: GET /v1/models failed after the run: {e}", file=sys.stderr)
    doc["fingerprint"], not_kept = store.measured_fingerprint(doc["model"], models, after)
    doc = store.finite(doc)
    (out / "quality.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    (out / "quality.md").write_text(markdown(doc))
    print(f"quality: wrote {out / 'quality.json'} and {out / 'quality.md'} ({requests} requests, "
          f"{len(errors)} errors)", file=sys.stderr)
    # Stored after the files above, so a directory that cannot be written loses nothing.
    print(f"quality: {not_kept or store.keep_report(doc, args.quality_dir)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
