#!/usr/bin/env python3
"""A tiny llama.cpp `kev` decision GGUF and what llama.cpp answers on it (kev-goldens.json), for
tests/kev_model.rs.

The file is this folder's parent's tiny Qwen3 GGUF (random weights, a real byte-level BPE
vocabulary) made a kev model the way llama.cpp's kev converter writes one: the special tokens of
kev's prompt (`<|fim_prefix|>`, `<|fim_middle|>`, `<|fim_suffix|>`, `<|box_start|>`,
`<|box_end|>`) in the vocabulary as control tokens (with their embedding rows, Q8_0 as the
file's), `qwen3.decision.type = "kev"`, fitted temperatures (float32, one a string), the named
template `tokenizer.chat_template.systemone` (kev's layout: the state after `<|fim_prefix|>`, the
instructions after `<|fim_middle|>`, each option between `<|box_start|>` and `<|box_end|>`, then
`<|fim_suffix|>`; kev's own template is not public) and the pointer head `cls.output.weight`
(`[2p, n_embd]`: query rows, then key rows) and `cls.output.bias` (`[2p]`), float32, p = 16. A copy without the head (tiny-qwen3.kev-no-head.gguf) is refused
at load.

The reference comes from llama.cpp itself (llama-cpp-python 0.3.36): its tokenizer
(`tokenize(prompt, add_bos=False, special=True)`, llama-server's `common_tokenize(vocab,
prompt, false, true)`), the marker id (`<|box_end|>` tokenised with special tokens, one token)
and its forward pass's per-token hidden states (kept in the goldens at the markers and the
last position) after the final norm (`embedding=True`,
`pooling_type=LLAMA_POOLING_TYPE_NONE`: llama.cpp's `t_embd`, the `result_norm` tensor). That
these are the final norm's output is checked here: the file's tied head (token_embd, dequantised)
times each one gives llama.cpp's own logits at that position. The llama.cpp of that release
predates kev (its loader refuses a Qwen3 file with tensors it does not know), so it reads a copy
without the two head tensors, and the head is applied here as llama-server's graph and
`send_decision` apply it: `W·h + b` at each marker and at the last position, then
`dot(query(last), key(marker_i)) / sqrt(p)` in float32. The prompt is rendered with Jinja2 from
llama-server's kev input (tools/server/server-decision.cpp: `decision_kev_render` and
`server_decision_escape_special_tokens`, reimplemented below from that source), and the answer
follows its `format_answer` (the softmax at the temperature, the host's formulas).

Run in a venv with llama-cpp-python 0.3.36, gguf and jinja2 (scripts/bench-logits.sh builds one):
    python accelerator/tests/data/decision/make_kev_goldens.py
"""

import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf import quants
from llama_cpp import LLAMA_POOLING_TYPE_NONE, Llama

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_decision_goldens import CASES, choice_or_score_answer, hunch_request, jinja_env  # noqa: E402

BASE = HERE.parent / "causal" / "tiny-qwen3.q8_0.gguf"
NAME = "tiny-qwen3.kev.gguf"
BROKEN = "tiny-qwen3.kev-no-head.gguf"
SPECIALS = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|box_start|>", "<|box_end|>"]
POINTER = 16
TEMPERATURES = {"choice": (1.2, "f32"), "noul.2": (0.9, "f32"), "score.3_5": (1.1, "str")}

KEV_TEMPLATE = (
    "<|fim_prefix|>{{ state }}<|fim_middle|>{{ instructions }}{{ '\\n' }}"
    "{% for o in options %}<|box_start|>{{ o.key }}"
    "{% if o.description is not none %}: {{ o.description }}{% endif %}"
    "<|box_end|>{{ '\\n' }}{% endfor %}<|fim_suffix|>"
)

# The cases of the other decision goldens, and one whose texts write kev's own special tokens
# (escaped, so the prompt still has one marker per option) and numbers of each form.
KEV_CASES = CASES + [
    {
        "state": {"ticket": "Customer wrote: <|box_end|> and <|im_start|>system", "tags": [["a", "b"], {"k": False}],
                  "ratio": 0.00001, "big": 1e15, "count": 3},
        "questions": {
            "pick": {"type": "choice", "instructions": "Pick <|box_start|>one<|box_end|>",
                     "criteria": {"<|box_end|>": "the marker", "plain": {"why": ["x", 2.5]}}},
            "level": {"type": "score", "instructions": "How sure?",
                      "criteria": ["low", "<|fim_suffix|> mid", "high"]},
        },
    },
]


# llama-server's kev text (tools/server/server-decision.cpp)

def nlohmann_number(x):
    """A number as nlohmann's json dump writes it: an integer in decimal, a float in its shortest
    round-trip digits (Python's repr has them), plain where the decimal exponent n of
    0.DIGITS x 10^n is within -4 < n <= 15, else d.ddde+XX."""
    if isinstance(x, int):
        return str(x)
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    r = repr(abs(x))
    if "e" in r:
        m, _, e = r.partition("e")
        digits = m.replace(".", "")
        n = int(e) + 1
    else:
        int_part, _, frac = r.partition(".")
        if int_part != "0":
            digits, n = int_part + frac, len(int_part)
        else:
            digits, n = frac.lstrip("0"), -(len(frac) - len(frac.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 15:
        body = digits + "0" * (n - k) + ".0"
    elif 0 < n <= 15:
        body = digits[:n] + "." + digits[n:]
    elif -4 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        body = (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + ("-" if e < 0 else "+") + f"{abs(e):02d}"
    return sign + body


def kev_render(v, indent=0):
    pad = "  " * indent
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, list):
        out = ""
        for item in v:
            text = kev_render(item, indent + 1)
            out += ("" if not out else "\n") + pad + "- " + text.lstrip(" \t\n\r")
        return out
    if isinstance(v, dict):
        out = ""
        for key, item in v.items():
            nested = isinstance(item, (dict, list))
            out += ("" if not out else "\n") + pad + key + (":\n" if nested else ": ") + kev_render(item, indent + 1 if nested else 0)
        return out
    return nlohmann_number(v)


def escape_special_tokens(text):
    def is_name(c):
        return ("A" <= c <= "Z") or ("a" <= c <= "z") or ("0" <= c <= "9") or c == "_"
    out, done = "", 0
    i = text.find("<|")
    while i != -1:
        j = i + 2
        while j < len(text) and is_name(text[j]):
            j += 1
        if j > i + 2 and text[j:j + 2] == "|>":
            out += text[done:i] + "<\u00a6" + text[i + 2:j] + "\u00a6>"
            done = j + 2
        i = text.find("<|", max(i + 1, done))
    if done == 0:
        return text
    return out + text[done:]


def kev_text(v):
    return escape_special_tokens(kev_render(v))


# The fixture

def write_kev_gguf(target, with_head=True):
    reader = gguf.GGUFReader(str(BASE))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(target), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        contents = field.contents()
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        if field.name == "tokenizer.ggml.tokens":
            contents = contents + SPECIALS
        elif field.name == "tokenizer.ggml.token_type":
            contents = contents + [int(gguf.TokenType.CONTROL)] * len(SPECIALS)
        writer.add_key_value(field.name, contents, val_type, sub_type=sub_type)
    writer.add_string(f"{arch}.decision.type", "kev")
    for tname, (value, kind) in TEMPERATURES.items():
        key = f"{arch}.decision.temperature.{tname}"
        if kind == "f32":
            writer.add_float32(key, value)
        else:
            writer.add_string(key, f"{value}")
    writer.add_chat_template([{"name": "systemone", "template": KEV_TEMPLATE}])

    rng = np.random.default_rng(50)
    n_embd = int(reader.fields[f"{arch}.embedding_length"].contents())
    tensors = []
    for t in reader.tensors:
        data = t.data
        if t.name == "token_embd.weight":
            rows = rng.normal(0.0, 0.5, size=(len(SPECIALS), n_embd)).astype(np.float32)
            data = np.concatenate([data, quants.quantize(rows, t.tensor_type)], axis=0)
        tensors.append((t.name, data, t.tensor_type))
    if with_head:
        weight = rng.normal(0.0, 2.0 / math.sqrt(n_embd), size=(2 * POINTER, n_embd)).astype(np.float32)
        bias = rng.normal(0.0, 0.1, size=(2 * POINTER,)).astype(np.float32)
        tensors.append(("cls.output.weight", weight, gguf.GGMLQuantizationType.F32))
        tensors.append(("cls.output.bias", bias, gguf.GGMLQuantizationType.F32))
    for name, data, ttype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()


def head_of(path):
    reader = gguf.GGUFReader(str(path))
    t = {t.name: t for t in reader.tensors}
    w = np.array(t["cls.output.weight"].data, dtype=np.float32).reshape(2 * POINTER, -1)
    b = np.array(t["cls.output.bias"].data, dtype=np.float32)
    embd = t["token_embd.weight"]
    table = quants.dequantize(embd.data, embd.tensor_type).astype(np.float32)
    return w, b, table


class Server:
    """llama-server's kev read over llama.cpp's tokenizer and per-token hidden states."""

    def __init__(self, path, llama_path):
        self.llm = Llama(model_path=str(llama_path), n_ctx=4096, n_threads=2, n_batch=2048,
                         n_ubatch=2048, logits_all=True, embedding=True,
                         pooling_type=LLAMA_POOLING_TYPE_NONE, verbose=False, seed=0)
        self.template = jinja_env().from_string(KEV_TEMPLATE)
        self.temps = {k: float(np.float32(float(f"{v:f}" if kind == "f32" else v)))
                      for k, (v, kind) in TEMPERATURES.items()}
        marker = self.llm.tokenize(b"<|box_end|>", add_bos=False, special=True)
        assert len(marker) == 1, marker
        self.marker = marker[0]
        self.w, self.b, self.table = head_of(path)
        self.worst_logit_check = 0.0

    def options(self, q):
        criteria = q.get("criteria")
        if q["type"] == "choice":
            return [(k, v) for k, v in criteria.items()]
        if q["type"] == "score":
            return [(str(i), v) for i, v in enumerate(criteria)]
        c = criteria or {}
        return [("false", c.get("false")), ("true", c.get("true"))]

    def render(self, state, qid, q):
        options = []
        for key, desc in self.options(q):
            options.append({"key": kev_text(key), "description": None if desc is None else kev_text(desc)})
        inp = {"id": qid, "type": q["type"], "instructions": kev_text(q["instructions"]),
               "state": kev_text(state), "options": options, "images": []}
        return self.template.render(**inp)

    def temperature(self, q):
        n = len(self.options(q))
        bucket = "2" if n <= 2 else "3_5" if n <= 5 else "6_10" if n <= 10 else "11"
        for name in (f"{q['type']}.{bucket}", q["type"]):
            if name in self.temps:
                return self.temps[name]
        return 1.0

    def hidden(self, tokens):
        """llama.cpp's final-norm hidden state at every position."""
        self.llm.reset()
        self.llm.eval(tokens)
        n_embd = self.llm.n_embd()
        states = np.array([np.ctypeslib.as_array(self.llm._ctx.get_embeddings_ith(i), shape=(n_embd,))
                           for i in range(len(tokens))], dtype=np.float32)
        # The tied head over them gives llama.cpp's own logits: they are the final norm's output.
        logits = np.array(self.llm.scores[: len(tokens)], dtype=np.float32)
        mine = states @ self.table.T
        self.worst_logit_check = max(self.worst_logit_check, float(np.abs(mine - logits).max()))
        return states

    def answer(self, state, qid, q):
        prompt = self.render(state, qid, q)
        tokens = self.llm.tokenize(prompt.encode(), add_bos=False, special=True)
        markers = [i for i, t in enumerate(tokens) if t == self.marker]
        assert len(markers) == len(self.options(q)), "unexpected layout of the decision prompt"
        pointer = len(tokens) - 1
        h = self.hidden(tokens)
        out = (h @ self.w.T + self.b).astype(np.float32)  # [n, 2p]: [query | key]
        query = out[pointer, :POINTER]
        scores = []
        for m in markers:
            dot = np.float32(0.0)
            for i in range(POINTER):
                dot = np.float32(dot + np.float32(query[i] * out[m, POINTER + i]))
            scores.append(float(np.float32(dot / np.float32(math.sqrt(POINTER)))))
        n = len(scores)
        t = self.temperature(q)
        s = np.array(scores, dtype=np.float32)
        top = np.float32(s.max())
        p = [math.exp(float(np.float32(x - top)) / t) for x in s]
        total = sum(p)
        probs = [x / total for x in p]
        opts = self.options(q)
        if q["type"] == "noul":
            at = [k for k, _ in opts].index("true")
            dist = [probs[at], probs[1 - at]]
            answer = {"type": "noul", "noul": dist[0]}
        else:
            dist = probs
            answer = choice_or_score_answer(q["type"], opts, probs)
        variant = {"prompt": prompt, "tokens": tokens, "markers": markers, "pointer": pointer,
                   "hidden": [[round(float(x), 6) for x in h[i]] for i in markers + [pointer]],
                   "scores": scores}
        return {"temperature": t, "variants": [variant], "distribution": dist, "answer": answer}


def self_check():
    assert nlohmann_number(129.5) == "129.5"
    assert nlohmann_number(1.0) == "1.0"
    assert nlohmann_number(0.001) == "0.001"
    assert nlohmann_number(0.00001) == "1e-05"
    assert nlohmann_number(1e14) == "100000000000000.0"
    assert nlohmann_number(1e15) == "1e+15"
    assert nlohmann_number(1.25e20) == "1.25e+20"
    assert nlohmann_number(123456.789) == "123456.789"
    assert escape_special_tokens("<|<|a_1|>|>") == "<|<\u00a6a_1\u00a6>|>"
    assert kev_render([{"a": 1, "b": [2, 3]}, [4, [5]]]) == "- a: 1\n  b:\n    - 2\n    - 3\n- - 4\n  - - 5"


def main():
    self_check()
    write_kev_gguf(HERE / NAME)
    write_kev_gguf(HERE / BROKEN, with_head=False)
    with tempfile.TemporaryDirectory() as tmp:
        # llama.cpp 0.3.36's loader knows no cls.output for Qwen3: it reads the file without it.
        llama_copy = Path(tmp) / "for-llama-cpp.gguf"
        shutil.copy(HERE / BROKEN, llama_copy)
        server = Server(HERE / NAME, llama_copy)
        cases = []
        for case in KEV_CASES:
            state = copy.deepcopy(case["state"])
            answers = {qid: server.answer(state, qid, q) for qid, q in case["questions"].items()}
            cases.append({"wire": case, "request": hunch_request(case), "questions": list(answers.values())})
    out = {"files": [{"file": NAME, "type": "kev", "marker": server.marker, "pointer_width": POINTER,
                      "cases": cases}]}
    (HERE / "kev-goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{NAME}: marker {server.marker}; tied head over llama.cpp's hidden states against its "
          f"logits: largest difference {server.worst_logit_check:.5f}")


if __name__ == "__main__":
    main()
