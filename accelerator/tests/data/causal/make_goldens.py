#!/usr/bin/env python3
"""Reference data for the causal chat-model forward pass (Llama, Qwen3, Gemma 3 text).

What it writes (all under this directory, deterministic: fixed seeds, no network):

* Tiny random-weight Hugging Face folders, config.json written the way the published checkpoints
  of that model_type have it (transformers 4.5x spelling: `rope_theta` / `rope_scaling`, not the
  transformers-5 `rope_parameters`), `model.safetensors` in float32, plus a byte-level BPE
  `tokenizer.json` (trained here, 320 ids) so the folders load like real ones:
    - tiny-llama/          llama, untied lm_head
    - tiny-llama-bf16/     the same weights rounded to bfloat16 (model.safetensors in BF16)
    - tiny-llama3-tied/    llama, tied embeddings, rope_scaling llama3
    - tiny-qwen3/          qwen3, q_norm/k_norm, head_dim 32 != hidden/heads, tied
    - tiny-gemma3/         gemma3_text, 7 layers, sliding window 8, pattern 6 (layers 0-4 and 6
                           sliding, layer 5 full), linear rope scaling x8 on the full layer, tied
* mlx-community style affine-quantised folders made by `mlx_lm.convert`:
    - tiny-llama-mlx4/     4 bits, group 32
    - tiny-qwen3-mlx8/     8 bits, group 64
* GGUF files written with gguf-py's GGUFWriter in llama.cpp's convert_hf_to_gguf.py layout
  (names, `{arch}.*` keys, Llama q/k row permutation, Gemma norms stored as 1 + w, Qwen3/Gemma
  not permuted) and, for Q4_0/Q4_1, llama-quantize's type choice (see GGUF_TYPE_RULES below):
    tiny-llama.{f32,f16,q8_0,q4_0,q4_1}.gguf, tiny-qwen3.q8_0.gguf, tiny-gemma3.{f16,q4_0}.gguf
* goldens.json: for every model above, 4 token sequences (lengths 1, 7, 23, 41), the last
  position's logits at 6 fixed label ids, and the argmax and logsumexp of the full last-position
  logits.

Reference used: mlx_lm 0.32.2 (mlx 0.32.2, CPU) in float32. HF folders: mlx_lm's model class
with the folder's weights cast to float32. mlx-quantised folders: mlx_lm as it loads them
(quantized matmuls; scales/biases and activations float32). GGUF files: the file read back with
gguf-py, every tensor dequantised to float32 (gguf.quants.dequantize), the Llama permutation
undone and 1 subtracted from Gemma norms, then run through the same mlx_lm class in float32 —
so a correct implementation differs from the reference by float rounding only.

How to run (from the repository root):
    .venv-chatref/bin/python accelerator/tests/data/causal/make_goldens.py
Needs mlx==0.32.2, mlx_lm==0.32.2, gguf==0.19.0, numpy, tokenizers, transformers (tokenizer
loading in mlx_lm.convert). Takes well under a minute on CPU.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguf
import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import _get_classes, load_model

HERE = Path(__file__).resolve().parent

VOCAB = 320
SEQ_LENGTHS = (1, 7, 23, 41)
LABEL_IDS = [0, 3, 42, 100, 257, 319]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2

# A fixed corpus for the tiny BPE tokenizer (only its determinism matters).
CORPUS = [
    "Is the door open? The state says the door is closed and locked.",
    "Answer yes or no. The light is on in the kitchen, the oven is off.",
    '{"answer": "A"} {"answer": 7} {"answer": "yes"} state question choice score',
    "The quick brown fox jumps over the lazy dog. 0123456789 +-*/=()[]{}",
    "Hunch answers typed questions about a state with calibrated probabilities.",
] * 4


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------

def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_tokenizer(tok, folder: Path):
    tok.save(str(folder / "tokenizer.json"))
    cfg = {
        "add_prefix_space": False,
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 2048,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def tokenizer_gguf_fields(tok):
    """tokenizer.ggml.* as llama.cpp's _set_vocab_gpt2 writes them for a byte-level BPE."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = [None] * VOCAB
    for t, i in vocab.items():
        tokens[i] = t
    for a in data["added_tokens"]:
        tokens[a["id"]] = a["content"]
    assert all(t is not None for t in tokens)
    special = {a["id"] for a in data["added_tokens"] if a["special"]}
    toktypes = [int(gguf.TokenType.CONTROL) if i in special else int(gguf.TokenType.NORMAL)
                for i in range(VOCAB)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, toktypes, merges


# --------------------------------------------------------------------------------------------
# configs (spelled as the published checkpoints of each model_type spell them)
# --------------------------------------------------------------------------------------------

def llama_config(tied: bool, rope_scaling):
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 2048,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": rope_scaling,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


LLAMA3_SCALING = {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    # 32 (not 16): with head_dim 16 and theta 1e4 the wavelengths are 2*pi*10000^(k/16) =
    # 6.28, 19.9, 62.8, ...; with 32 one pair is below high_freq_wavelen (8, unchanged), one is
    # between (smoothed) and the rest above low_freq_wavelen (32, divided by 8) - all three
    # branches of the llama3 adjustment are exercised.
    "original_max_position_embeddings": 32,
    "rope_type": "llama3",
}

QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 40960,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "transformers_version": "4.51.3",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB,
}

GEMMA3_LAYERS = 7
GEMMA3_PATTERN = 6  # llama.cpp hard-codes 6 for gemma3 (set_swa_pattern(6)): il % 6 < 5 slides
GEMMA3_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 0,
    "cache_implementation": "hybrid",
    "eos_token_id": 2,
    "final_logit_softcapping": None,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "layer_types": [
        "sliding_attention" if (i + 1) % GEMMA3_PATTERN else "full_attention"
        for i in range(GEMMA3_LAYERS)
    ],
    "max_position_embeddings": 131072,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": GEMMA3_LAYERS,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    # = head_dim, as Gemma 3 1B/4B/12B: llama.cpp does not store it and uses 1/sqrt(head_dim)
    # (hidden/heads only for the 62-layer 27B).
    "query_pre_attn_scalar": 32,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000.0,
    "sliding_window": 8,
    "sliding_window_pattern": GEMMA3_PATTERN,
    "torch_dtype": "float32",
    "transformers_version": "4.53.0",
    "use_cache": True,
    "vocab_size": VOCAB,
}


# --------------------------------------------------------------------------------------------
# random weights
# --------------------------------------------------------------------------------------------

def random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """HF-named float32 tensors. Projections ~N(0, 0.08^2) (q/k 0.12 so attention is not
    uniform), embeddings/lm_head 0.2; RMSNorm weights 1 + N(0, 0.1^2) (Gemma: N(0, 0.1^2), its
    norm multiplies by 1 + w)."""
    rng = np.random.default_rng(seed)
    mt = cfg["model_type"]
    h = cfg["hidden_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ff = cfg["intermediate_size"]
    gemma = mt == "gemma3_text"

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n):
        w = rng.standard_normal(n) * 0.1
        return (w if gemma else 1.0 + w).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((VOCAB, h), 0.2)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = normal((nh * hd, h), 0.12)
        w[p + "self_attn.k_proj.weight"] = normal((nkv * hd, h), 0.12)
        w[p + "self_attn.v_proj.weight"] = normal((nkv * hd, h), 0.08)
        w[p + "self_attn.o_proj.weight"] = normal((h, nh * hd), 0.08)
        if mt in ("qwen3", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(h)
            w[p + "post_feedforward_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = normal((ff, h), 0.08)
        w[p + "mlp.up_proj.weight"] = normal((ff, h), 0.08)
        w[p + "mlp.down_proj.weight"] = normal((h, ff), 0.08)
    w["model.norm.weight"] = norm(h)
    if not cfg.get("tie_word_embeddings", gemma):
        w["lm_head.weight"] = normal((VOCAB, h), 0.2)
    return w


def save_safetensors(path: Path, weights: dict[str, np.ndarray], dtype=mx.float32):
    arrays = {k: mx.array(v).astype(dtype) for k, v in sorted(weights.items())}
    mx.save_safetensors(str(path), arrays, metadata={"format": "pt"})


def write_hf_folder(name: str, cfg: dict, weights, tok, dtype=mx.float32):
    folder = HERE / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    cfg = copy.deepcopy(cfg)
    if dtype == mx.bfloat16:
        cfg["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({
        "_from_model_config": True, "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"], "transformers_version": cfg["transformers_version"],
    }, indent=2) + "\n")
    save_safetensors(folder / "model.safetensors", weights, dtype)
    write_tokenizer(tok, folder)
    return folder


# --------------------------------------------------------------------------------------------
# GGUF (llama.cpp convert_hf_to_gguf.py layout)
# --------------------------------------------------------------------------------------------

ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen3": gguf.MODEL_ARCH.QWEN3,
        "gemma3_text": gguf.MODEL_ARCH.GEMMA3}
FILE_TYPE = {
    "f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
}
Q = gguf.GGMLQuantizationType

GGUF_TYPE_RULES = """
1-D tensors (every norm) F32 in all files. f32/f16/q8_0 files (convert_hf_to_gguf.py --outtype):
every 2-D tensor in that type, token_embd and output included. q4_0/q4_1 files (llama-quantize):
every 2-D tensor Q4_0/Q4_1 except the output matrix (`output`, or `token_embd` when embeddings are
tied and there is no `output`), which llama-quantize makes Q6_K and, its 64 columns not being a
multiple of 256, falls back to Q8_0.
"""


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # LlamaModel.permute in convert_hf_to_gguf.py (n_head = n_kv_head for attn_k)
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_tensor_type(gname: str, ndim: int, ftype: str, has_output: bool):
    if ndim <= 1:
        return Q.F32
    if ftype in ("f32", "f16", "q8_0"):
        return {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}[ftype]
    is_output = gname == "output.weight" or (not has_output and gname == "token_embd.weight")
    if is_output:
        return Q.Q8_0  # Q6_K -> Q8_0 fallback (ncols % 256 != 0)
    return {"q4_0": Q.Q4_0, "q4_1": Q.Q4_1}[ftype]


def hf_to_gguf_tensors(cfg: dict, weights: dict) -> dict[str, np.ndarray]:
    mt = cfg["model_type"]
    arch = ARCH[mt]
    nmap = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    out = {}
    for name in sorted(weights):  # safetensors order, as the converter iterates it
        data = weights[name].astype(np.float32)
        if mt == "llama":
            if name.endswith("q_proj.weight"):
                data = llama_permute(data, cfg["num_attention_heads"])
            elif name.endswith("k_proj.weight"):
                data = llama_permute(data, cfg["num_key_value_heads"])
        if mt == "gemma3_text" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # Gemma3Model.norm_shift
        gname = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        out[gname] = data
    return out


def write_gguf(path: Path, cfg: dict, weights: dict, ftype: str, tok_fields):
    mt = cfg["model_type"]
    arch = ARCH[mt]
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    tensors = hf_to_gguf_tensors(cfg, weights)
    has_output = "output.weight" in tensors

    w = gguf.GGUFWriter(str(path), arch_name)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(path.name.split(".")[0])
    # TextModel.set_gguf_parameters
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    if (rs := cfg.get("rope_scaling")) and rs.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])
    w.add_file_type(FILE_TYPE[ftype])
    if mt == "llama":  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(cfg["head_dim"])
    if mt == "gemma3_text":  # Gemma3Model.set_gguf_parameters
        w.add_sliding_window(cfg["sliding_window"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # tokenizer (_set_vocab_gpt2)
    tokens, toktypes, merges = tok_fields
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    for gname, data in tensors.items():
        qt = gguf_tensor_type(gname, data.ndim, ftype, has_output)
        if qt == Q.F32:
            w.add_tensor(gname, data)
        elif qt == Q.F16:
            w.add_tensor(gname, data.astype(np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(data, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_to_hf_weights(path: Path, cfg: dict) -> tuple[dict, dict]:
    """Read a GGUF back, dequantise every tensor to float32 and map it to HF names, undoing the
    converter's transforms. Returns (weights, {gguf name: type name})."""
    mt = cfg["model_type"]
    nmap = gguf.get_tensor_name_map(ARCH[mt], cfg["num_hidden_layers"])
    reverse = {}
    for name in random_weights(cfg, 0):
        reverse[nmap.get_name(name, try_suffixes=(".weight",))] = name
    if cfg.get("tie_word_embeddings", mt == "gemma3_text") is False:
        reverse["output.weight"] = "lm_head.weight"
    r = gguf.GGUFReader(str(path))
    out, types = {}, {}
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(x) for x in reversed(t.shape))
        data = data.reshape(shape)
        name = reverse[t.name]
        if mt == "llama":
            if name.endswith("q_proj.weight"):
                data = llama_unpermute(data, cfg["num_attention_heads"])
            elif name.endswith("k_proj.weight"):
                data = llama_unpermute(data, cfg["num_key_value_heads"])
        if mt == "gemma3_text" and name.endswith("norm.weight"):
            data = data - np.float32(1.0)
        out[name] = data
        types[t.name] = t.tensor_type.name
    return out, types


# --------------------------------------------------------------------------------------------
# mlx_lm reference
# --------------------------------------------------------------------------------------------

def to_f32(model):
    model.update(tree_map(
        lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
        model.parameters()))
    return model


def model_from_weights(cfg: dict, weights: dict[str, np.ndarray]):
    model_class, args_class = _get_classes(config=cfg)
    model = model_class(args_class.from_dict(cfg))
    mxw = {k: mx.array(v, dtype=mx.float32) for k, v in weights.items()}
    if hasattr(model, "sanitize"):
        mxw = model.sanitize(mxw)
    model.eval()
    model.load_weights(list(mxw.items()), strict=True)
    mx.eval(model.parameters())
    return model


def last_logits(model, tokens) -> np.ndarray:
    logits = model(mx.array([tokens], dtype=mx.int32))
    last = logits[0, -1].astype(mx.float32)
    mx.eval(last)
    return np.array(last)


def case(model_name: str, tokens, logits: np.ndarray, **extra) -> dict:
    lse = float(np.logaddexp.reduce(logits.astype(np.float64)))
    top2 = np.sort(logits.astype(np.float64))[-2:]
    return {
        "model": model_name,
        "tokens": [int(t) for t in tokens],
        "label_ids": LABEL_IDS,
        "label_logits": [float(logits[i]) for i in LABEL_IDS],
        "argmax": int(np.argmax(logits)),
        # top-1 minus top-2 logit: an argmax check is only meaningful when this exceeds the
        # comparison tolerance
        "argmax_margin": float(top2[1] - top2[0]),
        "logsumexp": lse,
        **extra,
    }


# --------------------------------------------------------------------------------------------
# independent float64 numpy forward (transformers' semantics), used only as a cross-check of
# the mlx_lm reference: it catches a config field mlx_lm might read differently than
# transformers does (window, layer pattern, rope scaling, query_pre_attn_scalar, ...).
# --------------------------------------------------------------------------------------------

def np_inv_freq(d: int, theta: float, scaling) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":  # transformers _compute_llama3_parameters
        f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / lo, inv / f, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / f + smooth * out
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, smoothed, out)
    raise ValueError(kind)


def np_forward(cfg: dict, weights: dict, tokens, window_off=False, scaling_off=False):
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    mt = cfg["model_type"]
    gemma = mt == "gemma3_text"
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    L = len(tokens)

    def rms(x, w):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y * ((1.0 + w) if gemma else w)

    def rope(x, inv):  # x [heads, L, hd], rotate_half (NeoX / HF) convention
        ang = np.arange(L)[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    x = W["model.embed_tokens.weight"][tokens]
    if gemma:
        x = x * math.sqrt(cfg["hidden_size"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(L, nh, hd).transpose(1, 0, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(L, nkv, hd).transpose(1, 0, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(L, nkv, hd).transpose(1, 0, 2)
        if mt in ("qwen3", "gemma3_text"):
            q, k = rms(q, W[p + "self_attn.q_norm.weight"]), rms(k, W[p + "self_attn.k_norm.weight"])
        sliding = gemma and cfg["layer_types"][i] == "sliding_attention"
        if gemma and sliding:
            inv = np_inv_freq(hd, cfg["rope_local_base_freq"], None)
        else:
            inv = np_inv_freq(hd, cfg["rope_theta"], None if scaling_off else cfg["rope_scaling"])
        q, k = rope(q, inv), rope(k, inv)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else hd ** -0.5
        s = (q @ k.transpose(0, 2, 1)) * scale
        qi, kj = np.arange(L)[:, None], np.arange(L)[None, :]
        allowed = kj <= qi
        if sliding and not window_off:
            allowed &= (qi - kj) < cfg["sliding_window"]
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        o = a.transpose(1, 0, 2).reshape(L, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        if gemma:
            x = x + rms(o, W[p + "post_attention_layernorm.weight"])
            h = rms(x, W[p + "pre_feedforward_layernorm.weight"])
        else:
            x = x + o
            h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        if gemma:
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1 + np.exp(-g))
        m = (act * u) @ W[p + "mlp.down_proj.weight"].T
        x = x + (rms(m, W[p + "post_feedforward_layernorm.weight"]) if gemma else m)
    x = rms(x, W["model.norm.weight"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return (x @ head.T)[-1]


def cross_check(name, cfg, weights, model_cases):
    """mlx_lm float32 vs the float64 numpy forward; and proof that the features the tiny
    configs exist for (sliding window, rope scaling) change the 41-token logits."""
    worst = 0.0
    for c in model_cases:
        ref = np_forward(cfg, weights, c["tokens"])
        worst = max(worst, float(np.max(np.abs(ref[LABEL_IDS] - np.array(c["label_logits"])))))
        lse = float(np.logaddexp.reduce(ref))
        assert abs(lse - c["logsumexp"]) < 1e-4 and int(np.argmax(ref)) == c["argmax"], name
    assert worst < 1e-4, (name, worst)
    msg = f"{name}: mlx_lm f32 vs numpy f64 max |diff| {worst:.2e}"
    toks = model_cases[-1]["tokens"]
    base = np_forward(cfg, weights, toks)
    if cfg["model_type"] == "gemma3_text":
        d = np.max(np.abs(np_forward(cfg, weights, toks, window_off=True) - base))
        msg += f"; window off changes logits by {d:.3f}"
        assert d > 1e-2
    if cfg.get("rope_scaling"):
        d = np.max(np.abs(np_forward(cfg, weights, toks, scaling_off=True) - base))
        msg += f"; rope scaling off changes logits by {d:.3f}"
        assert d > 1e-2
    print(msg)


def token_sequences(seed: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=n).tolist() for n in SEQ_LENGTHS]


def main():
    mx.set_default_device(mx.cpu)
    tok = build_tokenizer()
    tok_fields = tokenizer_gguf_fields(tok)

    models = {
        "tiny-llama": (llama_config(False, None), 1001),
        "tiny-llama3-tied": (llama_config(True, LLAMA3_SCALING), 1002),
        "tiny-qwen3": (QWEN3_CONFIG, 1003),
        "tiny-gemma3": (GEMMA3_CONFIG, 1004),
    }
    weights = {name: random_weights(cfg, seed) for name, (cfg, seed) in models.items()}
    cases = []
    gguf_types = {}

    def add_cases(model_name, model, seq_seed):
        for toks in token_sequences(seq_seed):
            cases.append(case(model_name, toks, last_logits(model, toks)))

    # HF folders -------------------------------------------------------------------------
    for i, (name, (cfg, _)) in enumerate(models.items()):
        folder = write_hf_folder(name, cfg, weights[name], tok)
        model, _ = load_model(folder)
        add_cases(name, to_f32(model), 2000 + i)
        cross_check(name, cfg, weights[name], cases[-len(SEQ_LENGTHS):])
    folder = write_hf_folder("tiny-llama-bf16", models["tiny-llama"][0], weights["tiny-llama"],
                             tok, dtype=mx.bfloat16)
    model, _ = load_model(folder)
    add_cases("tiny-llama-bf16", to_f32(model), 2000)

    # mlx-community affine quantisation ---------------------------------------------------
    from mlx_lm.convert import convert
    for src, dst, bits, group in (("tiny-llama", "tiny-llama-mlx4", 4, 32),
                                  ("tiny-qwen3", "tiny-qwen3-mlx8", 8, 64)):
        out = HERE / dst
        if out.exists():
            shutil.rmtree(out)
        convert(str(HERE / src), str(out), quantize=True, q_bits=bits, q_group_size=group)
        (out / "README.md").unlink(missing_ok=True)
        # mlx_lm re-saves the tokenizer through the installed transformers (5.x spelling,
        # tokenizer_class "TokenizersBackend"); keep the source folder's files instead.
        (out / "chat_template.jinja").unlink(missing_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(HERE / src / f, out / f)
        model, _ = load_model(out)
        seq_seed = 2000 + list(models).index(src)
        add_cases(dst, model, seq_seed)

    # GGUF --------------------------------------------------------------------------------
    for src, ftype in (("tiny-llama", "f32"), ("tiny-llama", "f16"), ("tiny-llama", "q8_0"),
                       ("tiny-llama", "q4_0"), ("tiny-llama", "q4_1"), ("tiny-qwen3", "q8_0"),
                       ("tiny-gemma3", "f16"), ("tiny-gemma3", "q4_0")):
        cfg = models[src][0]
        path = HERE / f"{src}.{ftype}.gguf"
        write_gguf(path, cfg, weights[src], ftype, tok_fields)
        deq, types = gguf_to_hf_weights(path, cfg)
        gguf_types[path.name] = types
        model = model_from_weights(cfg, deq)
        add_cases(path.name, model, 2000 + list(models).index(src))

    golden = {
        "reference": f"mlx_lm {mlx_lm.__version__} (mlx {mx.__version__}, CPU) float32; "
                     "HF folders: weights cast to float32; mlx-quantised folders: as loaded "
                     "(affine quantized matmuls, float32 scales/biases/activations); GGUF: the "
                     "file's tensors dequantised to float32 by gguf-py "
                     f"{gguf_version()}, Llama q/k permutation undone, Gemma norms minus 1",
        "generator": "accelerator/tests/data/causal/make_goldens.py",
        "label_ids": LABEL_IDS,
        "gguf_tensor_types": gguf_types,
        "gguf_type_rules": " ".join(GGUF_TYPE_RULES.split()),
        "cases": cases,
    }
    (HERE / "goldens.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {len(cases)} cases")


def gguf_version():
    from importlib.metadata import version
    return version("gguf")


if __name__ == "__main__":
    main()
