#!/usr/bin/env python3
"""A tiny llama.cpp `laya` decision GGUF (a ModernBERT encoder with a decision head) and what
llama.cpp and llama-server's rules answer on it (laya-goldens.json), for the laya tests.

The file (tiny-modernbert.laya.gguf) is laid out the way llama.cpp's converter writes a laya
model, `general.architecture = "modern-bert"`: random weights (fixed seed), 3 encoder blocks and 2
decision blocks (`modern-bert.block_count` 5 counts both, `modern-bert.decision.block_count` 2 the
head's, the last ones), `feed_forward_length` one per block ([96, 96, 96, 128, 128], as the real
Julia-1 file stores it), a symmetric sliding window of 8 (`attention.sliding_window`, the full
width: a local layer's query sees keys within 4) on the layers that are not multiples of 3, RoPE
bases 160000 (global) and 10000 (local), `decision.max_head_tokens` 32 (so the head budget cuts
most prompts here), fitted temperatures (float32 and one string) and the real Julia-1
`tokenizer.chat_template.systemone` (with `tokenizer.chat_templates` listing it, as gguf-py's
GGUFWriter writes a named template). The encoder's matrices and the head's are Q8_0 (gguf.quants);
norms, biases, `token_types` (`[d, 3]`: choice, score, noul) and `cls.output.*` (`[d]` and `[1]`)
are float32. tiny-modernbert.laya-no-head.gguf is the same without `cls.output.weight` and
`cls.output.bias`, which Hunch refuses at load.

The vocabulary is the tiny byte-level BPE ("gpt2", 320 ids) of ../causal/tiny-gemma3.f16.gguf,
every tokenizer.* key copied, with `<bos>` (320), `<eos>` (321) and `<mask>` (322) appended as
control tokens (that file has none of them: it is not a SentencePiece vocabulary) so the template
is Julia-1's as written; bos = 320, eos = sep (`tokenizer.ggml.seperator_token_id`, llama.cpp's
spelling) = 321, mask = 322, `add_bos_token` false (the template writes `<bos>`).

The reference:
- tokens: llama.cpp's tokenizer (llama-cpp-python 0.3.36) on the laya file itself, loaded
  vocab-only, `llama_tokenize(prompt, add_special=False, parse_special=True)`, llama-server's
  `common_tokenize(vocab, prompt, false, true)`; mask and sep from `llama_vocab_mask` and
  `llama_vocab_sep`, the mask's text from `llama_token_to_piece(mask, special=True)`.
- the prompt: llama-server's laya read (tools/server/server-decision.cpp: `render`,
  `decision_replace_text`, `fill_task_laya`, reimplemented below from that source): the template
  is given {id, type, instructions, state, options: [{key, description}]} as raw JSON values, every
  string value in it (not object keys) with the mask's text replaced by " ", rendered with Jinja2
  (make_decision_goldens.jinja_env), tokenised, then cut to the head budget: [cls] question [sep]
  ([mask] option)* [sep] state [sep], each option to 48 + 1 tokens, then, when the options and 16
  pass max_head_tokens, to max(4, (max_head_tokens - 16) / n) each, the question to
  max(8, max_head_tokens - options) tokens; the markers are where the options start. Options:
  choice in the request's order, score levels "0".., noul false then true; the column is the
  question type (choice 0, score 1, noul 2).
- the encoder's hidden states: llama.cpp 0.3.36 knows `modern-bert` but not laya (its loader
  takes the head's blocks for encoder blocks and refuses the file: blk.3.ffn_up.weight has the
  wrong shape), so it runs an encoder-only copy (block_count 3, feed_forward_length 96, no
  decision.* keys, no head, token_types or cls.* tensors; in a temporary folder) with
  `embedding=True, pooling_type=LLAMA_POOLING_TYPE_NONE`, one `llama_decode` of the whole cut
  prompt with every position an output, and keeps its per-token states after the final norm
  (`get_embeddings_ith`: its `t_embd`, `final_norm_out`) at the markers (`hidden`). That release
  applies the window (LLAMA_SWA_TYPE_SYMMETRIC, dense first, pattern 3, freq_base_swa on the
  local layers): its states match this script's numpy encoder with the window and not without it
  (every prompt here is longer than the window; measured with ggml's arithmetic, below: at most
  0.032 with the window, at least 2.0 without it on every prompt). Its arithmetic differs from
  laya's in two known ways, both reproduced by the numpy encoder's ggml variant: its modern-bert
  FFN is `ggml_geglu`, GELU's tanh form through ggml's fp16 table (ModernBERT and laya use the
  erf form), and its CPU matmuls round each activation row to Q8_0 first. Measured here, max
  |numpy - llama.cpp| over every state: 0.032 (ggml's arithmetic; most prompts 0.0000), 0.073
  (float64, Q8_0 weights only, either GELU: the rounding of the activations is nearly all of it;
  the two GELUs differ by about 0.002). The goldens keep llama.cpp's states and the head over
  them (`scores`), with the head over numpy's float64 erf encoder beside them (`scores_erf`, at
  most 0.10 from `scores`), all in `encoder_check`. The weights' seed is one where every choice
  and score question has a best option clear of both (the two best scores at least 0.51 apart,
  the same option over either encoder; checked).
- the head: numpy, float64, over llama.cpp's encoder states at every position of the cut prompt
  (the state's too: the head's keys and values are every token, as in Julia-1's own runtime):
  the `token_types` row of the column added everywhere, then per head block PyTorch's
  `nn.TransformerEncoderLayer(norm_first=True, activation=relu)` (biased LayerNorms, biased fused
  qkv and output, the encoder's head count, no RoPE, no mask; biased ReLU FFN), then at each
  marker `cls.output.weight · gelu_erf(cls.weight · LayerNorm(cls.norm)(x) + cls.bias) +
  cls.output.bias`, the score (kept as float32, as llama-server reads it).
- the answer: llama-server's `format_answer`: the softmax of the scores at the temperature
  (buckets by option count 2 / 3_5 / 6_10 / 11, then the type's name, else 1.0; float32 keys read
  back through `%f` and strtof), noul = p(true), choice and score as make_decision_goldens'
  `choice_or_score_answer`.

Run in the venv scripts/bench-logits.sh builds (.venv-llama-cpp), with gguf and jinja2:
    .venv-llama-cpp/bin/pip install gguf jinja2
    .venv-llama-cpp/bin/python accelerator/tests/data/decision/make_laya_goldens.py
"""

import copy
import ctypes
import json
import math
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import llama_cpp
from gguf import quants
from llama_cpp import LLAMA_POOLING_TYPE_NONE, Llama, _internals

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_decision_goldens import CASES, choice_or_score_answer, hunch_request, jinja_env  # noqa: E402

BASE = HERE.parent / "causal" / "tiny-gemma3.f16.gguf"
NAME = "tiny-modernbert.laya.gguf"
BROKEN = "tiny-modernbert.laya-no-head.gguf"
ARCH = "modern-bert"
SPECIALS = ["<bos>", "<eos>", "<mask>"]  # appended to the base vocabulary as control tokens

N_EMBD = 64
N_HEAD = 4
N_ENCODER = 3
N_DECISION = 2
FFN = [96, 96, 96, 128, 128]
N_CTX = 512
EPS = 1e-5
SLIDING_WINDOW = 8  # the full width: |i - j| <= 4
ROPE_BASE = 160000.0
ROPE_BASE_SWA = 10000.0
GLOBAL_EVERY = 3  # layers 0, 3, 6.. attend globally
MAX_HEAD_TOKENS = 32
SEED = 76  # the weights': one where every choice and score question here has a clear best option
MAX_OPTION_TOKENS = 48  # llama-server's server_decision_context::max_option_tokens
TEMPERATURES = {"choice.3_5": (1.3, "f32"), "noul": (0.8, "f32"), "score": (1.1, "str")}
COLUMNS = {"choice": 0, "score": 1, "noul": 2}

# Julia-1's tokenizer.chat_template.systemone, as its GGUF carries it.
TEMPLATE = (
    "<bos>{{ type }} question: {{ instructions if instructions is string else instructions | tojson }}<eos>"
    "{% for o in options %}<mask> {% if o.description %}"
    "{{ o.description if o.description is string else o.description | tojson }}"
    "{% else %}{{ o.key }}{% endif %}{% endfor %}"
    "<eos>{{ state if state is string else state | tojson }}<eos>"
)

LONG = ("The courier left the parcel at the side door in the rain; the cardboard is soaked through, "
        "the corner is torn open, and the glass vase inside has a long crack along its base. "
        "The customer has photos and wants this sorted before the weekend.")

# The shared cases, and: options long enough to be cut (each to the per-option cap, the question to
# its cap); a state far longer than the window; the mask's text in the texts (in a state string, an
# instruction, a description, a choice key shown for want of a description, a value inside a
# state object), which llama-server replaces by a space; and one short prompt that is not cut.
LAYA_CASES = CASES + [
    {
        "state": LONG,
        "questions": {
            "action": {"type": "choice",
                       "instructions": "Given everything the customer wrote about the delivery, the damage and the deadline, which single action should the support team take first?",
                       "criteria": {"refund": "Refund the full price of the vase to the original payment method within three days.",
                                    "reship": "Send a replacement vase by express courier with a signature required on delivery.",
                                    "claim": "Open a damage claim with the courier and ask the customer to keep the packaging and photos."}},
            "damage": {"type": "score", "instructions": "How bad is the damage to the item itself, not the box?",
                       "criteria": ["No damage at all to the item", "Cosmetic marks that do not affect use",
                                    "A crack that makes the item unusable or unsafe", "The item is in pieces"]},
        },
    },
    {
        "state": {"ticket": "I typed <mask> in the form and it broke", "log": ["<mask>", "ok"], "tries": 2},
        "questions": {
            "bug": {"type": "noul", "instructions": "Is <mask> a bug report?",
                    "criteria": {"true": "Yes: <mask> broke it", "false": None}},
            "team": {"type": "choice", "instructions": "Who takes it?",
                     "criteria": {"web<mask>team": None, "api": "The <mask> API team", "ops": None}},
        },
    },
    {
        "state": "Short <mask> note.",
        "questions": {
            "ok": {"type": "noul", "instructions": "Ok?"},
        },
    },
]


# llama-server's laya read (tools/server/server-decision.cpp)

def replace_text(v, search, replace):
    """decision_replace_text: in every string of a JSON value, not in object keys."""
    if isinstance(v, str):
        return v.replace(search, replace)
    if isinstance(v, list):
        return [replace_text(x, search, replace) for x in v]
    if isinstance(v, dict):
        return {k: replace_text(x, search, replace) for k, x in v.items()}
    return v


def options_of(q):
    criteria = q.get("criteria")
    if q["type"] == "choice":
        return [(k, v) for k, v in criteria.items()]
    if q["type"] == "score":
        return [(str(i), v) for i, v in enumerate(criteria)]
    c = criteria or {}
    return [("false", c.get("false")), ("true", c.get("true"))]


def cut(tokens, n_options, mask, sep, max_head_tokens):
    """fill_task_laya: the prompt cut to the head budget, and the option markers in it."""
    markers = [i for i, t in enumerate(tokens) if t == mask]
    if len(markers) != n_options or markers[0] < 2 or tokens[markers[0] - 1] != sep or tokens[-1] != sep:
        raise ValueError("unexpected layout of the decision prompt")
    head_end = markers[0] - 1
    opts_end = next(i for i in range(markers[-1], len(tokens) + 1) if i == len(tokens) or tokens[i] == sep)
    if opts_end + 1 >= len(tokens):
        raise ValueError("unexpected layout of the decision prompt")
    options = [tokens[markers[i]: markers[i + 1] if i + 1 < n_options else opts_end] for i in range(n_options)]

    def set_max(n_max):
        for i, o in enumerate(options):
            options[i] = o[:n_max]
        return sum(len(o) for o in options)

    n_options_tokens = set_max(MAX_OPTION_TOKENS + 1)
    if n_options_tokens + 16 > max_head_tokens:
        n_options_tokens = set_max(max(4, (max_head_tokens - min(max_head_tokens, 16)) // n_options))
    n_question_max = max(8, max_head_tokens - min(max_head_tokens, n_options_tokens))
    out = [tokens[0]] + tokens[1:min(head_end, 1 + n_question_max)] + [sep]
    starts = []
    for o in options:
        starts.append(len(out))
        out += o
    out += tokens[opts_end:]
    return out, starts


# The numpy model

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * w
    return y + b if b is not None else y


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def gelu_tanh_fp16(x):
    """ggml's CPU GELU in llama.cpp 0.3.36: the tanh form, looked up by the input's fp16 value in a
    table of fp16 results (GGML_GELU_FP16); 0 below -10, the identity above 10."""
    x16 = x.astype(np.float16).astype(np.float32)
    y = 0.5 * x16 * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * x16 * (1.0 + np.float32(0.044715) * x16 * x16)))
    y = y.astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def q8_round(x):
    """x through Q8_0 and back, row by row (blocks of 32: one scale, int8 values)."""
    x = np.asarray(x, dtype=np.float32)
    q8 = gguf.GGMLQuantizationType.Q8_0
    return quants.dequantize(quants.quantize(x, q8), q8).astype(np.float64).reshape(x.shape)


def rope_neox(x, base):
    """NeoX / rotate-half RoPE over the whole head, positions from 0: x [n, heads, head_dim]."""
    n, _, hd = x.shape
    half = hd // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attention(q, k, v, heads, mask=None):
    n, d = q.shape
    hd = d // heads
    q, k, v = (t.reshape(n, heads, hd) for t in (q, k, v))
    return attend(q, k, v, mask)


def attend(q, k, v, mask=None):
    n, heads, hd = q.shape
    s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
    if mask is not None:
        s = np.where(mask[None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, v).reshape(n, heads * hd)


class Model:
    """The laya model in numpy, float64, over the file's dequantised weights."""

    def __init__(self, path):
        reader = gguf.GGUFReader(str(path))
        self.t = {}
        for t in reader.tensors:
            data = quants.dequantize(t.data, t.tensor_type) if t.tensor_type != gguf.GGMLQuantizationType.F32 else np.array(t.data)
            self.t[t.name] = np.asarray(data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)] if len(t.shape) > 1 else [int(t.shape[0])])

    def encoder(self, tokens, gelu="erf", window=SLIDING_WINDOW, q8_activations=False):
        """The final-norm hidden states [n, d]; `window` 0 attends globally everywhere;
        `q8_activations` rounds each matrix's input to Q8_0 first, as ggml's CPU matmul does."""
        t, d = self.t, N_EMBD
        act = gelu_erf if gelu == "erf" else gelu_tanh_fp16
        q8 = q8_round if q8_activations else (lambda a: a)
        n = len(tokens)
        x = layer_norm(t["token_embd.weight"][tokens], t["token_embd_norm.weight"], None, EPS)
        pos = np.arange(n)
        local_mask = np.abs(pos[:, None] - pos[None, :]) <= window // 2
        for il in range(N_ENCODER):
            p = f"blk.{il}."
            h = layer_norm(x, t[p + "attn_norm.weight"], None, EPS) if il > 0 else x
            qkv = q8(h) @ t[p + "attn_qkv.weight"].T
            local = window > 0 and il % GLOBAL_EVERY != 0
            base = ROPE_BASE_SWA if local else ROPE_BASE
            q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(n, N_HEAD, d // N_HEAD) for i in range(3))
            a = attend(rope_neox(q, base), rope_neox(k, base), v, local_mask if local else None)
            x = x + q8(a) @ t[p + "attn_output.weight"].T
            h = layer_norm(x, t[p + "ffn_norm.weight"], None, EPS)
            u = q8(h) @ t[p + "ffn_up.weight"].T
            f = u.shape[1] // 2
            x = x + q8(act(u[:, :f]) * u[:, f:]) @ t[p + "ffn_down.weight"].T
        return layer_norm(x, t["output_norm.weight"], None, EPS)

    def head(self, hidden, column, markers):
        """The scores at the markers, over encoder states [n, d]."""
        t, d = self.t, N_EMBD
        x = np.asarray(hidden, dtype=np.float64) + t["token_types.weight"][column]
        for il in range(N_ENCODER, N_ENCODER + N_DECISION):
            p = f"blk.{il}."
            h = layer_norm(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"], EPS)
            qkv = h @ t[p + "attn_qkv.weight"].T + t[p + "attn_qkv.bias"]
            a = attention(qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:], N_HEAD)
            x = x + a @ t[p + "attn_output.weight"].T + t[p + "attn_output.bias"]
            h = layer_norm(x, t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"], EPS)
            u = np.maximum(h @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"], 0.0)
            x = x + u @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"]
        s = layer_norm(x[markers], t["cls.norm.weight"], t["cls.norm.bias"], EPS)
        s = gelu_erf(s @ t["cls.weight"].T + t["cls.bias"])
        return s @ t["cls.output.weight"] + t["cls.output.bias"][0]


# The fixture

def random_tensors(n_vocab):
    """name -> (float32 array in PyTorch's [out, in] order, Q8_0 or F32)."""
    rng = np.random.default_rng(SEED)
    q8, f32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    d = N_EMBD

    def mat(rows, cols):
        return (rng.normal(0.0, 1.0 / math.sqrt(cols), size=(rows, cols)).astype(np.float32), q8)

    def norm():
        return ((1.0 + 0.1 * rng.normal(size=d)).astype(np.float32), f32)

    def bias(n, scale=0.02):
        return ((scale * rng.normal(size=n)).astype(np.float32), f32)

    out = {"token_embd.weight": (rng.normal(0.0, 1.0, size=(n_vocab, d)).astype(np.float32), q8),
           "token_embd_norm.weight": norm()}
    for il in range(N_ENCODER):
        p = f"blk.{il}."
        if il > 0:
            out[p + "attn_norm.weight"] = norm()
        out[p + "attn_qkv.weight"] = mat(3 * d, d)
        out[p + "attn_output.weight"] = mat(d, d)
        out[p + "ffn_norm.weight"] = norm()
        out[p + "ffn_up.weight"] = mat(2 * FFN[il], d)
        out[p + "ffn_down.weight"] = mat(d, FFN[il])
    out["output_norm.weight"] = norm()
    out["token_types.weight"] = (rng.normal(0.0, 0.5, size=(3, d)).astype(np.float32), f32)
    for il in range(N_ENCODER, N_ENCODER + N_DECISION):
        p = f"blk.{il}."
        out[p + "attn_norm.weight"], out[p + "attn_norm.bias"] = norm(), bias(d, 0.05)
        out[p + "attn_qkv.weight"], out[p + "attn_qkv.bias"] = mat(3 * d, d), bias(3 * d)
        out[p + "attn_output.weight"], out[p + "attn_output.bias"] = mat(d, d), bias(d)
        out[p + "ffn_norm.weight"], out[p + "ffn_norm.bias"] = norm(), bias(d, 0.05)
        out[p + "ffn_up.weight"], out[p + "ffn_up.bias"] = mat(FFN[il], d), bias(FFN[il])
        out[p + "ffn_down.weight"], out[p + "ffn_down.bias"] = mat(d, FFN[il]), bias(d)
    out["cls.norm.weight"], out["cls.norm.bias"] = norm(), bias(d, 0.05)
    out["cls.weight"], out["cls.bias"] = mat(d, d), bias(d)
    out["cls.output.weight"] = ((6.0 * rng.normal(size=d) / math.sqrt(d)).astype(np.float32), f32)
    out["cls.output.bias"] = (np.array([0.1], dtype=np.float32), f32)
    return out


def write_gguf(target, tensors, decision=True, with_head=True):
    """The laya file (decision=True) or llama.cpp 0.3.36's encoder-only copy of it."""
    reader = gguf.GGUFReader(str(BASE))
    writer = gguf.GGUFWriter(str(target), ARCH)
    writer.add_string("general.name", "tiny-modernbert-laya" if decision else "tiny-modernbert")
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_uint32(f"{ARCH}.context_length", N_CTX)
    writer.add_uint32(f"{ARCH}.embedding_length", N_EMBD)
    writer.add_uint32(f"{ARCH}.block_count", N_ENCODER + (N_DECISION if decision else 0))
    if decision:
        writer.add_array(f"{ARCH}.feed_forward_length", FFN)
    else:
        writer.add_uint32(f"{ARCH}.feed_forward_length", FFN[0])
    writer.add_uint32(f"{ARCH}.attention.head_count", N_HEAD)
    writer.add_float32(f"{ARCH}.attention.layer_norm_epsilon", EPS)
    writer.add_uint32(f"{ARCH}.attention.sliding_window", SLIDING_WINDOW)
    writer.add_float32(f"{ARCH}.rope.freq_base", ROPE_BASE)
    writer.add_float32(f"{ARCH}.rope.freq_base_swa", ROPE_BASE_SWA)
    if decision:
        writer.add_string(f"{ARCH}.decision.type", "laya")
        writer.add_uint32(f"{ARCH}.decision.block_count", N_DECISION)
        writer.add_uint32(f"{ARCH}.decision.max_head_tokens", MAX_HEAD_TOKENS)
        for tname, (value, kind) in TEMPERATURES.items():
            key = f"{ARCH}.decision.temperature.{tname}"
            if kind == "f32":
                writer.add_float32(key, value)
            else:
                writer.add_string(key, f"{value}")
    ids = special_ids()
    override = {"tokenizer.ggml.bos_token_id": ids["<bos>"], "tokenizer.ggml.eos_token_id": ids["<eos>"]}
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        contents = field.contents()
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        if field.name == "tokenizer.ggml.tokens":
            contents = contents + SPECIALS
        elif field.name == "tokenizer.ggml.token_type":
            contents = contents + [int(gguf.TokenType.CONTROL)] * len(SPECIALS)
        elif field.name in override:
            contents = override[field.name]
        elif field.name == "tokenizer.ggml.add_bos_token":
            contents = False
        writer.add_key_value(field.name, contents, val_type, sub_type=sub_type)
    writer.add_uint32("tokenizer.ggml.seperator_token_id", ids["<eos>"])
    writer.add_uint32("tokenizer.ggml.mask_token_id", ids["<mask>"])
    if decision:
        writer.add_chat_template([{"name": "systemone", "template": TEMPLATE}])

    def keep(name):
        if decision:
            return with_head or not name.startswith("cls.output.")
        if name.startswith("blk."):
            return int(name.split(".")[1]) < N_ENCODER
        return not (name.startswith("cls") or name.startswith("token_types"))

    written = []
    for name, (data, ttype) in tensors.items():
        if not keep(name):
            continue
        if ttype == gguf.GGMLQuantizationType.Q8_0:
            data = quants.quantize(data, ttype)
        written.append(data)
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in written:
        writer.write_tensor_data(data)
    writer.close()
    return ids


# llama.cpp

class Vocab:
    """llama.cpp's tokenizer over the laya file, loaded vocab-only."""

    def __init__(self, path):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
        self.mask = llama_cpp.llama_vocab_mask(self.model.vocab)
        self.sep = llama_cpp.llama_vocab_sep(self.model.vocab)
        self.bos = llama_cpp.llama_vocab_bos(self.model.vocab)
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.model.vocab, self.mask, buf, len(buf), 0, True)
        self.text_marker = buf.raw[:n].decode()

    def tokenize(self, text):
        return self.model.tokenize(text.encode(), False, True)


class Encoder:
    """llama.cpp's modern-bert encoder: the final-norm state at every position."""

    def __init__(self, path):
        self.llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2,
                         embedding=True, pooling_type=LLAMA_POOLING_TYPE_NONE, verbose=False, seed=0)

    def hidden(self, tokens):
        assert len(tokens) <= N_CTX
        self.llm._batch.set_batch(tokens, 0, True)  # every position an output
        self.llm._ctx.decode(self.llm._batch)
        return np.array([np.ctypeslib.as_array(self.llm._ctx.get_embeddings_ith(i), shape=(N_EMBD,))
                         for i in range(len(tokens))], dtype=np.float32)


# The numpy encoders compared with llama.cpp's: ggml's arithmetic (its GELU, Q8_0 activations),
# the same in float64 with Q8_0 weights only, and laya's (the erf GELU).
ENCODER_VARIANTS = {
    "ggml": {"gelu": "tanh-fp16", "q8_activations": True},
    "tanh_fp16": {"gelu": "tanh-fp16"},
    "erf": {"gelu": "erf"},
}


class Server:
    """llama-server's laya read over llama.cpp's tokenizer and encoder and the numpy head."""

    def __init__(self, vocab, encoder, model):
        self.vocab, self.encoder, self.model = vocab, encoder, model
        self.template = jinja_env().from_string(TEMPLATE)
        # llama_model_meta_val_str writes a float32 as %f, then strtof reads it back.
        self.temps = {k: float(np.float32(float(f"{v:f}" if kind == "f32" else v)))
                      for k, (v, kind) in TEMPERATURES.items()}
        # max |numpy - llama.cpp| over every state of every prompt, per numpy variant; for the one
        # without the window, the smallest such max over the prompts
        self.check = {name: 0.0 for name in ENCODER_VARIANTS}
        self.check["ggml_unwindowed"] = math.inf
        self.check["scores_erf"] = 0.0
        self.check["top_two_gap"] = math.inf  # the smallest, over choice and score questions
        self.cut_seen = {"options": False, "question": False, "uncut": False}

    def render(self, state, qid, q):
        options = [{"key": key, "description": desc} for key, desc in options_of(q)]
        inp = {"id": qid, "type": q["type"], "instructions": q["instructions"], "state": state, "options": options}
        inp = replace_text(inp, self.vocab.text_marker, " ")
        inp["images"] = []
        return self.template.render(**inp)

    def temperature(self, q):
        n = len(options_of(q))
        bucket = "2" if n <= 2 else "3_5" if n <= 5 else "6_10" if n <= 10 else "11"
        for name in (f"{q['type']}.{bucket}", q["type"]):
            if name in self.temps:
                return self.temps[name]
        return 1.0

    def answer(self, state, qid, q):
        opts = options_of(q)
        prompt = self.render(state, qid, q)
        rendered = self.vocab.tokenize(prompt)
        tokens, markers = cut(rendered, len(opts), self.vocab.mask, self.vocab.sep, MAX_HEAD_TOKENS)
        self.note_cut(rendered, tokens, markers)
        column = COLUMNS[q["type"]]

        hidden = self.encoder.hidden(tokens)
        assert len(tokens) > SLIDING_WINDOW // 2 + 1  # the window masks something in every prompt
        mine = {name: self.model.encoder(tokens, **kw) for name, kw in ENCODER_VARIANTS.items()}
        for name, states in mine.items():
            self.check[name] = max(self.check[name], float(np.abs(states - hidden).max()))
        flat = self.model.encoder(tokens, window=0, **ENCODER_VARIANTS["ggml"])
        self.check["ggml_unwindowed"] = min(self.check["ggml_unwindowed"], float(np.abs(flat - hidden).max()))

        scores = [float(np.float32(s)) for s in self.model.head(hidden, column, markers)]
        scores_erf = [float(np.float32(s)) for s in self.model.head(mine["erf"], column, markers)]
        self.check["scores_erf"] = max(self.check["scores_erf"], max(abs(a - b) for a, b in zip(scores, scores_erf)))
        if q["type"] != "noul":
            # a clear best option, the same over either encoder (the answer's choice and mode)
            assert int(np.argmax(scores)) == int(np.argmax(scores_erf)), (qid, scores, scores_erf)
            for s in (scores, scores_erf):
                top = sorted(s, reverse=True)
                self.check["top_two_gap"] = min(self.check["top_two_gap"], top[0] - top[1])

        t = self.temperature(q)
        s = np.array(scores, dtype=np.float32)
        top = np.float32(s.max())
        p = [math.exp(float(np.float32(x - top)) / t) for x in s]
        total = sum(p)
        probs = [x / total for x in p]
        if q["type"] == "noul":
            at = [k for k, _ in opts].index("true")
            dist = [probs[at], probs[1 - at]]
            answer = {"type": "noul", "noul": dist[0]}
        else:
            dist = probs
            answer = choice_or_score_answer(q["type"], opts, probs)
        return {"temperature": t, "column": column, "prompt": prompt, "rendered_tokens": rendered,
                "tokens": tokens, "markers": markers,
                "hidden": [[round(float(x), 6) for x in hidden[m]] for m in markers],
                "scores": scores, "scores_erf": scores_erf, "distribution": dist, "answer": answer}

    def note_cut(self, rendered, tokens, markers):
        """Which of the budget's cuts this prompt shows."""
        first = [i for i, t in enumerate(rendered) if t == self.vocab.mask][0]
        opts_end = next(i for i in range(first, len(rendered)) if rendered[i] == self.vocab.sep)
        tail = len(rendered) - opts_end
        self.cut_seen["question"] |= markers[0] < first
        self.cut_seen["options"] |= len(tokens) - tail - markers[0] < opts_end - first
        self.cut_seen["uncut"] |= tokens == rendered


def self_check():
    # the cut, on made-up ids: cls 1, sep 2, mask 3
    toks = [1] + [10] * 20 + [2] + [3, 11, 12] + [3] + [13] * 30 + [2, 14, 15, 2]
    out, starts = cut(toks, 2, 3, 2, 32)
    # options 3 + 31 = 34 > 16: each to max(4, 16 // 2) = 8 tokens, 3 + 8 = 11; the question to 32 - 11 = 21
    assert out == [1] + [10] * 20 + [2] + [3, 11, 12] + [3] + [13] * 7 + [2, 14, 15, 2], out
    assert starts == [22, 25]
    out, starts = cut([1, 10, 2, 3, 11, 3, 12, 2, 14, 2], 2, 3, 2, 32)
    assert out == [1, 10, 2, 3, 11, 3, 12, 2, 14, 2] and starts == [3, 5]
    assert replace_text({"a<m>": ["x<m>y", 1, None]}, "<m>", " ") == {"a<m>": ["x y", 1, None]}


def special_ids():
    n_base = len(gguf.GGUFReader(str(BASE)).fields["tokenizer.ggml.tokens"].contents())
    return {s: n_base + i for i, s in enumerate(SPECIALS)}


def main():
    self_check()
    ids = special_ids()
    tensors = random_tensors(max(ids.values()) + 1)
    write_gguf(HERE / NAME, tensors)
    write_gguf(HERE / BROKEN, tensors, with_head=False)
    spread = []
    with tempfile.TemporaryDirectory() as tmp:
        encoder_only = Path(tmp) / "encoder-only.gguf"
        write_gguf(encoder_only, tensors, decision=False)
        vocab = Vocab(HERE / NAME)
        assert (vocab.bos, vocab.sep, vocab.mask) == (ids["<bos>"], ids["<eos>"], ids["<mask>"]), (vocab.bos, vocab.sep, vocab.mask)
        assert vocab.text_marker == "<mask>", vocab.text_marker
        for s in SPECIALS:
            assert vocab.tokenize(s) == [ids[s]], s
        server = Server(vocab, Encoder(encoder_only), Model(HERE / NAME))
        cases = []
        for case in LAYA_CASES:
            state = copy.deepcopy(case["state"])
            answers = [server.answer(state, qid, q) for qid, q in case["questions"].items()]
            cases.append({"wire": case, "request": hunch_request(case), "questions": answers})
            spread += [max(a["scores"]) - min(a["scores"]) for a in answers]
    check = server.check
    # llama.cpp applies the window: its states are numpy's with it, and far from numpy's without it.
    assert check["ggml"] < 0.05 and check["ggml_unwindowed"] > 10 * check["tanh_fp16"], check
    assert all(server.cut_seen.values()), server.cut_seen
    assert check["top_two_gap"] > 3 * check["scores_erf"], check
    out = {"files": [{"file": NAME, "type": "laya", "bos": vocab.bos, "mask": vocab.mask, "sep": vocab.sep,
                      "max_head_tokens": MAX_HEAD_TOKENS,
                      "encoder_check": {
                          "llama_cpp": "llama-cpp-python 0.3.36 (GGML_NATIVE, CPU), the encoder-only copy",
                          "max_abs_difference": {
                              "numpy_ggml_arithmetic": check["ggml"],
                              "numpy_float64_tanh_fp16_gelu": check["tanh_fp16"],
                              "numpy_float64_erf_gelu": check["erf"],
                              "numpy_ggml_arithmetic_without_window_smallest_over_prompts": check["ggml_unwindowed"],
                              "scores_vs_scores_erf": check["scores_erf"]},
                          "smallest_top_two_score_gap": check["top_two_gap"]},
                      "cases": cases}]}
    (HERE / "laya-goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{NAME}: bos {vocab.bos}, sep {vocab.sep}, mask {vocab.mask} ({vocab.text_marker!r})")
    print("llama.cpp's encoder states against numpy's, max |difference| over every state:")
    print(f"  ggml's arithmetic (tanh GELU via fp16 table, Q8_0 activations): {check['ggml']:.6f}")
    print(f"  float64, tanh GELU via fp16 table:                               {check['tanh_fp16']:.6f}")
    print(f"  float64, erf GELU (laya's):                                      {check['erf']:.6f}")
    print(f"  ggml's arithmetic without the window (smallest over prompts):    {check['ggml_unwindowed']:.6f}")
    print(f"scores: head over llama.cpp's states vs over numpy's erf encoder: {check['scores_erf']:.6f}")
    print(f"smallest gap between the two best scores of a choice or score question: {check['top_two_gap']:.6f}")
    print(f"score spread per question (max - min): min {min(spread):.3f}, max {max(spread):.3f}")


if __name__ == "__main__":
    main()
