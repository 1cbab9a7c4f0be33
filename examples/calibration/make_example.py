"""Writes the example labelled set: decisions.ndjson (a decision log) and labels.jsonl.

The model's distributions are synthetic and the labels are drawn from a *known* miscalibration,
so the report has something to find: the noul's labels follow the model's distribution flattened
by T = 2 (the model is over-confident), the score's follow it sharpened by T = 0.5
(under-confident). Run: python3 examples/calibration/make_example.py
"""

import hashlib
import json
import math
import random
from pathlib import Path

HERE = Path(__file__).parent
rng = random.Random(23)

URGENT = {"instructions": "Is this ticket urgent?", "type": "noul", "yes": None, "no": None}
LEVELS = ["trivial", "minor", "major", "critical"]
SEVERITY = {"instructions": "How severe is the problem?", "type": "score", "levels": LEVELS}


def softmax(logits):
    m = max(logits)
    e = [math.exp(z - m) for z in logits]
    s = sum(e)
    return [x / s for x in e]


def tempered(p, t):
    return softmax([math.log(x) / t for x in p])


def draw(p):
    u = rng.random()
    for i, x in enumerate(p):
        if u < x:
            return i
        u -= x
    return len(p) - 1


events, labels = [], []
for i in range(300):
    state = f"ticket {i}"
    urgent = softmax([rng.uniform(-4, 4), rng.uniform(-4, 4)])
    severity = softmax([rng.uniform(-3, 3) for _ in LEVELS])
    decision_id = f"example-{i:04d}"
    events.append({
        "decision_id": decision_id,
        "timestamp": f"2026-11-{1 + i % 28:02d}T12:00:00.000Z",
        "route": "/v1/systemone",
        "read_algorithm": "djev-read/1",
        "input": {"model": "dg", "state": state, "questions": {
            "urgent": {"type": "noul", "instructions": URGENT["instructions"]},
            "severity": {"type": "score", "instructions": SEVERITY["instructions"],
                         "criteria": LEVELS},
        }},
        "reads": [{
            "state_sha256": hashlib.sha256(state.encode()).hexdigest(),
            "questions": [URGENT, SEVERITY],
            "distributions": [urgent, severity],
            "elapsed_ms": 1.0,
        }],
        "status": 200,
    })
    labels.append({"decision_id": decision_id, "labels": {
        "urgent": draw(tempered(urgent, 2.0)) == 0,
        "severity": draw(tempered(severity, 0.5)),
    }})

(HERE / "decisions.ndjson").write_text("".join(json.dumps(e) + "\n" for e in events))
(HERE / "labels.jsonl").write_text("".join(json.dumps(l) + "\n" for l in labels))
