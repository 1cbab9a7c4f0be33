#!/usr/bin/env python3
"""Tiny llama.cpp decision GGUFs and what llama.cpp answers on them (decision-goldens.json), for
tests/decision_model.rs.

Each file is a tiny causal GGUF of this folder's parent (random weights, a real byte-level BPE
vocabulary with <|im_start|>/<|im_end|>) copied with the keys llama.cpp's converters write for a
decision model: `<arch>.decision.type` (a string), `<arch>.decision.temperature.<name>` (float32;
one file also a string, which llama-server reads the same) and the named chat template
`tokenizer.chat_template.systemone` (with `tokenizer.chat_templates` listing it), the way
gguf-py's GGUFWriter writes a named template. The lev and pplx-decider templates are the ones
those converters write; openjev's is written in the same style (its converter is not public).

The reference answers come from llama.cpp itself (llama-cpp-python 0.3.36, the file as is): its
tokenizer (`tokenize(prompt, add_bos=False, special=True)`, as llama-server's
`common_tokenize(vocab, prompt, false, true)`), its labels (`tokenize(code, add_bos=False,
special=False)`, one token each) and its forward pass (the logits at the prompt's last token).
The prompt is rendered with Jinja2 (trim_blocks and lstrip_blocks, a `tojson` that is
`json.dumps(ensure_ascii=False)`, as llama.cpp's own Jinja engine writes it) from the request's
raw JSON values, per llama-server's decision read (tools/server/server-decision.cpp: option
order, labels given to the template, lev's sorted keys and reversed second variant, the
temperature buckets, the softmax and the answer formulas), which docs/models.md describes.
llama-server itself is not built: the released llama-cpp-python 0.3.36 vendors llama.cpp from
2026-10-01, a day before its decision read was merged.

nimble (decision-goldens-nimble.json, its own file so the others stay as they were made): the
template is given the question's `id` and `questions`, every question of the request with its
options as first given, and the request Hunch's host hands the reader carries them (`asked`).
Its cases have ids a renaming would change, and one that JSON must escape.

Run in the venv scripts/bench-logits.sh builds (.venv-llama-cpp), with gguf and jinja2:
    .venv-llama-cpp/bin/pip install gguf jinja2
    .venv-llama-cpp/bin/python accelerator/tests/data/decision/make_decision_goldens.py
(`... make_decision_goldens.py nimble` makes the nimble file and its goldens alone.)
"""

import copy
import json
import math
import sys
from pathlib import Path

import jinja2
import numpy as np
from llama_cpp import Llama

HERE = Path(__file__).resolve().parent
CAUSAL = HERE.parent / "causal"
sys.path.insert(0, str(HERE.parents[3] / "scripts"))
from decision_gguf import (  # noqa: E402
    lev_template,
    nimble_template,
    openjev_template,
    pplx_template,
    write_decision_gguf,
)


FIXTURES = [
    # (file, base tiny GGUF, type, template, temperatures {name: (value, type)})
    ("tiny-llama.openjev.gguf", "tiny-llama.q8_0.gguf", "openjev", openjev_template(),
     {"choice": (1.5, "f32"), "noul.2": (0.8, "f32"), "score.3_5": (1.25, "f32")}),
    ("tiny-qwen3.lev.gguf", "tiny-qwen3.q8_0.gguf", "lev", lev_template(),
     {"choice.small": (0.7, "f32"), "noul.small": (1.3, "f32"), "score": (0.9, "str")}),
    ("tiny-qwen3.pplx-decider.gguf", "tiny-qwen3.q8_0.gguf", "pplx-decider", pplx_template(),
     {"choice": (1.1, "f32"), "score": (1.1, "f32"), "noul": (1.1, "f32")}),
]

# Refused at load by name: a laya type on a causal model (laya is a ModernBERT encoder's: see
# make_laya_goldens.py), a type no one has, and a served type whose template does not compile.
REFUSED = [
    ("tiny-llama.laya.gguf", "tiny-llama.q8_0.gguf", "laya", openjev_template(), {}),
    ("tiny-llama.future.gguf", "tiny-llama.q8_0.gguf", "future-decision", openjev_template(), {}),
    ("tiny-llama.broken-template.gguf", "tiny-llama.q8_0.gguf", "openjev",
     "{% for o in options %}{{ o.key }}", {}),
]

CASES = [
    {
        "state": "The package was marked delivered yesterday, but the box arrived crushed and the lamp inside is broken.",
        "questions": {
            "damaged": {"type": "noul", "instructions": "Did the item arrive damaged?",
                        "criteria": {"true": "The item is broken or dented.", "false": "The item is intact."}},
            "intent": {"type": "choice", "instructions": "What does the customer most likely want?",
                       "criteria": {"refund": "Money back for the broken lamp.", "replacement": "A new lamp.",
                                    "track_order": None, "cancel_order": "Stop an order not yet shipped."}},
            "severity": {"type": "score", "instructions": "How severe is the problem?",
                         "criteria": ["none", "minor", "serious", "total loss"]},
        },
    },
    {
        "state": {"customer": "Ana Núñez", "order": {"id": 7, "items": ["lamp", "desk <oak>"]}, "note": None,
                  "paid": True, "amount": 129.5},
        "questions": {
            "route": {"type": "choice", "instructions": "Which team handles this order?",
                      "criteria": {"billing": None, "shipping": None, "returns": None, "sales": None,
                                   "support": None}},
            "vip": {"type": "noul", "instructions": "Is the customer a repeat buyer?"},
            "rating": {"type": "score", "instructions": {"rule": "rate the order's value", "scale": [0, 1]},
                       "criteria": ["low", "high"]},
        },
    },
]


NIMBLE = ("tiny-qwen3.nimble.gguf", "tiny-qwen3.q8_0.gguf", "nimble", nimble_template(),
          {"choice.3_5": (0.9, "f32"), "noul": (1.2, "f32"), "score": (0.8, "f32")})

NIMBLE_CASES = [
    CASES[0],
    {
        "state": {"ticket": "My invoice #4411 charged me twice; I want one charge back and to keep the plan.",
                  "plan": "pro", "months": 14},
        "questions": {
            "billing \"dup\"": {"type": "noul", "instructions": "Is this a duplicate charge?",
                                 "criteria": {"true": "Two charges for one thing.", "false": None}},
            "next_step": {"type": "choice", "instructions": "What should support do first?",
                          "criteria": {"refund_one": "Refund the duplicate.", "cancel": "Cancel the plan.",
                                       "escalate": None}},
            "urgency": {"type": "score", "instructions": "How urgent is it?",
                        "criteria": ["low", "medium", "high"]},
            "churn": {"type": "noul", "instructions": {"ask": "Will the customer leave?", "horizon": "30 days"}},
        },
    },
]


def render_value(value):
    """Hunch's host renders values to text this way (hunch_core::text::render_value)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False)


def hunch_request(case):
    """The ReadRequest Hunch's host hands the reader for this wire request (its serde form)."""
    questions = []
    for q in case["questions"].values():
        instructions = render_value(q.get("instructions"))
        criteria = q.get("criteria")
        if q["type"] == "noul":
            c = criteria or {}
            questions.append({"instructions": instructions, "type": "noul",
                              "yes": render_value(c["true"]) if c.get("true") is not None else None,
                              "no": render_value(c["false"]) if c.get("false") is not None else None})
        elif q["type"] == "choice":
            questions.append({"instructions": instructions, "type": "choice",
                              "options": [{"name": k, "description": None if v is None else render_value(v)}
                                          for k, v in criteria.items()]})
        else:
            questions.append({"instructions": instructions, "type": "score",
                              "levels": [render_value(v) for v in criteria]})
    return {"state": render_value(case["state"]), "questions": questions}


def hunch_request_with_ids(case):
    """hunch_request, with the caller's ids and the whole set as the host sends them to a model
    that reads ids (ReadRequest.asked): every question here needs a read."""
    request = hunch_request(case)
    listed = [dict(id=qid, **q) for qid, q in zip(case["questions"], request["questions"])]
    request["asked"] = {"questions": listed, "positions": list(range(len(listed)))}
    return request


def write_fixture(name, base, dtype, template, temperatures):
    write_decision_gguf(CAUSAL / base, HERE / name, dtype, template, temperatures)


def jinja_env():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                             undefined=jinja2.Undefined)

    def tojson(x, indent=None, separators=None):
        return json.dumps(x, ensure_ascii=False, indent=indent, separators=separators)

    env.filters["tojson"] = tojson
    return env


def sort_keys(v):
    if isinstance(v, dict):
        return {k: sort_keys(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [sort_keys(x) for x in v]
    return v


class Server:
    """llama-server's decision read of the label types, over llama.cpp's tokenizer and forward."""

    def __init__(self, path, dtype, template, temperatures):
        self.llm = Llama(model_path=str(path), n_ctx=4096, n_threads=2, n_batch=512,
                         logits_all=True, verbose=False, seed=0)
        self.type = dtype
        self.template = jinja_env().from_string(template)
        # llama_model_meta_val_str writes a float32 as %f, then strtof reads it back.
        self.temps = {k: float(np.float32(float(f"{v:f}" if kind == "f32" else v)))
                      for k, (v, kind) in temperatures.items()}
        if dtype == "openjev":
            letters = [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
            self.labels = [self.single(c) for c in letters]
            assert all(x is not None for x in self.labels), "openjev labels must be single tokens"
            self.label_texts = []
        else:
            codes = [chr(a) for a in range(65, 91)] + [chr(a) + chr(b) for a in range(65, 91) for b in range(65, 91)]
            self.labels, self.label_texts = [], []
            for c in codes:
                t = self.single(c)
                if t is not None and len(self.labels) < 255:
                    self.labels.append(t)
                    self.label_texts.append(c)
        self.true_first = dtype == "openjev"

    def single(self, text):
        toks = self.llm.tokenize(text.encode(), add_bos=False, special=False)
        return toks[0] if len(toks) == 1 else None

    def options(self, q):
        criteria = q.get("criteria")
        if q["type"] == "choice":
            return [(k, v) for k, v in criteria.items()]
        if q["type"] == "score":
            return [(str(i), v) for i, v in enumerate(criteria)]
        c = criteria or {}
        pair = [("false", c.get("false")), ("true", c.get("true"))]
        return pair[::-1] if self.true_first else pair

    def variants(self, q):
        return 2 if self.type == "lev" and q["type"] == "choice" and len(q["criteria"]) > 1 else 1

    def outputs(self, q):
        return 9 if self.type == "lev" and q["type"] == "noul" else len(self.options(q))

    def labelled(self, opts):
        options = []
        for i, (key, desc) in enumerate(opts):
            o = {"key": key, "description": desc}
            if self.label_texts:
                o["label"] = self.label_texts[i]
            options.append(o)
        return options

    def render(self, state, qid, q, variant, questions=None):
        opts = self.options(q)
        if variant == 1:
            opts = opts[::-1]
        inp = {"id": qid, "type": q["type"], "instructions": q["instructions"], "state": state,
               "options": self.labelled(opts)}
        if self.type == "nimble":
            # Every question of the request, its options as first given (variant 0).
            inp["questions"] = [{"id": i, "type": x["type"], "instructions": x["instructions"],
                                 "options": self.labelled(self.options(x))}
                                for i, x in questions.items()]
        if self.type == "lev":
            inp = sort_keys(inp)
        inp["images"] = []
        return self.template.render(**inp)

    def temperature(self, q):
        n = len(self.options(q))
        if self.type == "lev":
            bucket = "small" if n <= 8 else "mid" if n <= 26 else "large"
        else:
            bucket = "2" if n <= 2 else "3_5" if n <= 5 else "6_10" if n <= 10 else "11"
        for name in (f"{q['type']}.{bucket}", q["type"]):
            if name in self.temps:
                return self.temps[name]
        return 1.0

    def logits(self, tokens, labels):
        self.llm.reset()
        self.llm.eval(tokens)
        last = np.array(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)
        return [float(last[i]) for i in labels]

    def answer(self, state, qid, q, questions=None):
        n = self.outputs(q)
        t = self.temperature(q)
        variants = []
        probs = [0.0] * n
        for v in range(self.variants(q)):
            prompt = self.render(state, qid, q, v, questions)
            tokens = self.llm.tokenize(prompt.encode(), add_bos=False, special=True)
            labels = self.labels[:n]
            s = np.array(self.logits(tokens, labels), dtype=np.float32)
            top = np.float32(s.max())
            p = [math.exp(float(np.float32(x - top)) / t) for x in s]
            total = sum(p)
            for i in range(n):
                probs[i if v == 0 else n - 1 - i] += p[i] / total / self.variants(q)
            variants.append({"prompt": prompt, "tokens": tokens, "labels": labels,
                             "label_logits": [float(x) for x in s]})
        opts = self.options(q)
        if q["type"] == "noul":
            if self.type == "lev":
                yes = sum(probs[i] * i / (n - 1) for i in range(n))
                dist = [yes, 1.0 - yes]
            else:
                at = [k for k, _ in opts].index("true")
                dist = [probs[at], probs[1 - at]]
            answer = {"type": "noul", "noul": dist[0]}
        else:
            dist = probs
            answer = choice_or_score_answer(q["type"], opts, probs)
        return {"temperature": t, "variants": variants, "distribution": dist, "answer": answer}


def choice_or_score_answer(qtype, opts, probs):
    """llama-server's answer to a choice or score from its distribution: the argmax (first of
    equal maxima) with confidence (p_max - 1/N) / (1 - 1/N), or the expected level with the
    distance-to-mode confidence."""
    n = len(probs)
    best = max(range(n), key=lambda i: (probs[i], -i))
    if qtype == "choice":
        u = 1.0 / n
        return {"type": "choice", "choice": opts[best][0],
                "probabilities": {opts[i][0]: probs[i] for i in range(n)},
                "confidence": max(0.0, (probs[best] - u) / (1.0 - u))}
    dist_mode = sum(probs[i] * abs(i - best) for i in range(n))
    dist_u = sum(abs(i - (n - 1) / 2.0) / n for i in range(n))
    return {"type": "score", "score": sum(i * probs[i] for i in range(n)),
            "probabilities": {str(i): probs[i] for i in range(n)},
            "confidence": max(0.0, 1.0 - dist_mode / dist_u)}


def main():
    out = {"files": []}
    for name, base, dtype, template, temps in FIXTURES:
        write_fixture(name, base, dtype, template, temps)
        server = Server(HERE / name, dtype, template, temps)
        cases = []
        for case in CASES:
            state = copy.deepcopy(case["state"])
            answers = {qid: server.answer(state, qid, q) for qid, q in case["questions"].items()}
            cases.append({"wire": case, "request": hunch_request(case),
                          "questions": list(answers.values())})
        out["files"].append({"file": name, "type": dtype, "labels": len(server.labels), "cases": cases})
        print(f"{name}: {len(server.labels)} labels")
    for name, base, dtype, template, temps in REFUSED:
        write_fixture(name, base, dtype, template, temps)
    (HERE / "decision-goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    nimble()
    smollm2()


def nimble():
    name, base, dtype, template, temps = NIMBLE
    write_fixture(name, base, dtype, template, temps)
    server = Server(HERE / name, dtype, template, temps)
    cases = []
    for case in NIMBLE_CASES:
        answers = {qid: server.answer(copy.deepcopy(case["state"]), qid, q, case["questions"])
                   for qid, q in case["questions"].items()}
        cases.append({"wire": case, "request": hunch_request_with_ids(case),
                      "questions": list(answers.values())})
    out = {"files": [{"file": name, "type": dtype, "labels": len(server.labels), "cases": cases}]}
    (HERE / "decision-goldens-nimble.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{name}: {len(server.labels)} labels")


def smollm2():
    """The same cases on the default model's real file (SmolLM2-135M-Instruct Q4_1: a 49,152-id
    BPE vocabulary, so lev's and pplx-decider's labels run past A..Z into the two-letter codes
    that are one token) made a decision model, for the engine's unit test
    (`engine/decision_tests.rs`, which makes the same copy itself). Not committed: the copies."""
    import os
    import tempfile
    p = os.environ.get("HUNCH_SMOLLM2_GGUF")
    source = Path(p) if p else Path.home() / ".cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    out = {"source_bytes": source.stat().st_size, "files": []}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype, template, temps in (("lev", lev_template(), SMOLLM2_TEMPERATURES),
                                       ("pplx-decider", pplx_template(), SMOLLM2_TEMPERATURES)):
            path = Path(tmp) / f"smollm2.{dtype}.gguf"
            write_decision_gguf(source, path, dtype, template, temps)
            server = Server(path, dtype, template, temps)
            cases = []
            for case in CASES:
                answers = {qid: server.answer(copy.deepcopy(case["state"]), qid, q)
                           for qid, q in case["questions"].items()}
                cases.append({"request": hunch_request(case), "questions": list(answers.values())})
            out["files"].append({"type": dtype, "template": template,
                                 "temperatures": {k: v for k, (v, _) in temps.items()},
                                 "label_ids": server.labels,
                                 "label_texts": server.label_texts, "cases": cases})
            print(f"SmolLM2 {dtype}: {len(server.labels)} labels")
    (HERE / "decision-goldens-smollm2.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


# The temperatures the engine test writes into its copies (float32 keys).
SMOLLM2_TEMPERATURES = {"choice": (1.2, "f32"), "score": (0.8, "f32"), "noul": (1.0, "f32")}


if __name__ == "__main__":
    if sys.argv[1:] == ["nimble"]:
        nimble()
    else:
        main()
