#!/usr/bin/env python3
"""Reference data for the families and config dialects added after `make_goldens.py`:

* tiny-qwen2/        qwen2: q/k/v biases, no q/k norms, yarn rope (factor 4 over an original
                     context of 16), tied; and tiny-qwen2.q8_0.gguf in llama.cpp's converter layout
                     (arch qwen2, biases as blk.N.attn_{q,k,v}.bias, rope.scaling.type yarn)
* tiny-mistral/      mistral: Llama layers that all attend over a sliding window of 8 tokens
* tiny-*-v5/         the tiny folders of make_goldens.py (qwen3, llama3-tied, gemma3, and the
                     mlx-community qwen3-mlx8) and this file's (qwen2, mistral) with config.json
                     as transformers 5 saves it
                     (`rope_parameters`, `layer_types`: AutoConfig round trip) and every other
                     file a symbolic link to the original folder's: tests/causal_model.rs holds
                     them to the original folder's goldens.
* tiny-llama3-tied.q8_0.gguf: make_goldens.py's tiny-llama3-tied as llama.cpp's converter writes
  a llama3-scaled model (the adjustment as a `rope_freqs` tensor; reference: mlx_lm)
* family-goldens.json: cases as goldens.json has them, for tiny-qwen2, tiny-qwen2.q8_0.gguf,
  tiny-mistral and tiny-llama3-tied.q8_0.gguf.

Reference: a float64 numpy forward written to transformers' semantics (this file's `forward`:
biases, yarn as transformers' `_compute_yarn_parameters` computes it, Mistral's window on every
layer), cross-checked against mlx_lm 0.32.2 in float32 where mlx_lm implements the model
(qwen2 with yarn; mlx_lm's llama cannot make every layer sliding, so Mistral has the numpy
forward alone). GGUF: the file read back with gguf-py and dequantised, as make_goldens.py does.

Run from the repository root (same venv as make_goldens.py, plus transformers 5.x):
    .venv-chatref/bin/python accelerator/tests/data/causal/make_family_goldens.py
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gguf  # noqa: E402
import mlx.core as mx  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

import make_goldens as base  # noqa: E402

QWEN2_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 64,
    "max_window_layers": 2,
    "model_type": "qwen2",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    # factor = max_position_embeddings / original, as transformers recomputes it.
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "rope_theta": 10000.0,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "transformers_version": "4.51.3",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": base.VOCAB,
}

MISTRAL_CONFIG = {
    "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "model_type": "mistral",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.51.3",
    "use_cache": True,
    "vocab_size": base.VOCAB,
}


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    shaped = dict(cfg, head_dim=head_dim(cfg))
    w = base.random_weights(shaped, seed)
    if cfg["model_type"] == "qwen2":
        rng = np.random.default_rng(seed + 77)
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn."
            w[p + "q_proj.bias"] = (rng.standard_normal(nh * hd) * 0.3).astype(np.float32)
            w[p + "k_proj.bias"] = (rng.standard_normal(nkv * hd) * 0.3).astype(np.float32)
            w[p + "v_proj.bias"] = (rng.standard_normal(nkv * hd) * 0.3).astype(np.float32)
    return w


def yarn_inv_freq(d, theta, rs, max_pos):
    """transformers' _compute_yarn_parameters, in float64."""
    factor = rs["factor"]
    original = rs.get("original_max_position_embeddings")
    if original:
        factor = max_pos / original
    else:
        original = max_pos

    def mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    attention = rs.get("attention_factor") or mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def corr(rot):
        return (d * math.log(original / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = math.floor(corr(beta_fast)), math.ceil(corr(beta_slow))
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    pos = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    extra, inter = 1.0 / pos, 1.0 / (factor * pos)
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return inter * (1 - keep) + extra * keep, attention


def forward(cfg: dict, weights: dict, tokens) -> np.ndarray:
    """The last position's logits, float64, transformers' semantics for llama/mistral/qwen2."""
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps, L = cfg["rms_norm_eps"], len(tokens)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("type", rs.get("rope_type")) == "yarn":
        inv, attention = yarn_inv_freq(hd, cfg["rope_theta"], rs, cfg["max_position_embeddings"])
    else:
        inv, attention = base.np_inv_freq(hd, cfg["rope_theta"], rs), 1.0
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x):
        ang = np.arange(L)[:, None] * inv[None, :]
        cos = np.cos(np.concatenate([ang, ang], -1)) * attention
        sin = np.sin(np.concatenate([ang, ang], -1)) * attention
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def proj(h, name):
        y = h @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    x = W["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = proj(h, p + "self_attn.q_proj").reshape(L, nh, hd).transpose(1, 0, 2)
        k = proj(h, p + "self_attn.k_proj").reshape(L, nkv, hd).transpose(1, 0, 2)
        v = proj(h, p + "self_attn.v_proj").reshape(L, nkv, hd).transpose(1, 0, 2)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
        s = (q @ k.transpose(0, 2, 1)) * hd ** -0.5
        qi, kj = np.arange(L)[:, None], np.arange(L)[None, :]
        allowed = kj <= qi
        if window:
            allowed &= (qi - kj) < window
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(1, 0, 2).reshape(L, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return (x @ head.T)[-1]


def write_qwen2_gguf(path: Path, cfg: dict, weights: dict, tok_fields, extra=None):
    """llama.cpp's Qwen2Model conversion: no q/k permutation, biases as `.bias` tensors, yarn
    as rope.scaling.{type,factor,original_context_length}; Q8_0 for 2-D tensors."""
    arch = gguf.MODEL_ARCH.QWEN2
    nmap = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(path.name.split(".")[0])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rs = cfg["rope_scaling"]
    if extra and "rope.scaling.type" in extra:
        w.add_string("qwen2.rope.scaling.type", extra.pop("rope.scaling.type"))
    else:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rs["factor"])
    w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in (extra or {}).items():
        if isinstance(value, str):
            w.add_string(f"qwen2.{key}", value)
        else:
            w.add_float32(f"qwen2.{key}", value)
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
    w.add_chat_template(base.CHATML_TEMPLATE)
    for name in sorted(weights):
        data = weights[name].astype(np.float32)
        gname = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        if data.ndim <= 1:
            w.add_tensor(gname, data)
        else:
            q = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(gname, gguf.quants.quantize(data, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_weights(path: Path, cfg: dict) -> dict:
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg["num_hidden_layers"])
    reverse = {nmap.get_name(n, try_suffixes=(".weight", ".bias")): n
               for n in random_weights(cfg, 0)}
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        out[reverse[t.name]] = data.reshape(tuple(int(x) for x in reversed(t.shape)))
    return out


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """What llama.cpp's LlamaModel.generate_extra_tensors writes as `rope_freqs`: per rotary
    pair, the factor the llama3 adjustment divides its frequency by."""
    rs = cfg["rope_scaling"]
    dim = head_dim(cfg)
    freqs = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama3_gguf(path: Path, cfg: dict, weights: dict, tok_fields):
    """make_goldens.py's llama GGUF (q8_0) plus the `rope_freqs` tensor llama.cpp's converter
    adds for llama3 rope scaling (it writes no rope.scaling.* keys then)."""
    original = base.hf_to_gguf_tensors
    factors = llama3_rope_factors(cfg)

    def with_factors(c, w):
        tensors = original(c, w)
        tensors["rope_freqs.weight"] = factors
        return tensors

    base.hf_to_gguf_tensors = with_factors
    try:
        plain = dict(cfg, rope_scaling=None)  # write_gguf adds scaling keys for linear only
        base.write_gguf(path, plain, weights, "q8_0", tok_fields)
    finally:
        base.hf_to_gguf_tensors = original


def llama_gguf_weights(path: Path, cfg: dict) -> dict:
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    reverse = {nmap.get_name(n, try_suffixes=(".weight",)): n for n in random_weights(cfg, 0)}
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == "rope_freqs.weight":
            continue
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        data = data.reshape(tuple(int(x) for x in reversed(t.shape)))
        name = reverse[t.name]
        if name.endswith("q_proj.weight"):
            data = base.llama_unpermute(data, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            data = base.llama_unpermute(data, cfg["num_key_value_heads"])
        out[name] = data
    return out


def transformers5_copy(src: str):
    """`src-v5/`: src's config.json as transformers 5 saves it, every other file a link."""
    from transformers import AutoConfig

    folder, out = HERE / src, HERE / f"{src}-v5"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        AutoConfig.from_pretrained(folder).save_pretrained(tmp)
        saved = json.loads((Path(tmp) / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_theta" not in saved, saved
    (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    for f in sorted(folder.iterdir()):
        if f.name != "config.json":
            os.symlink(os.path.join("..", src, f.name), out / f.name)


def main():
    mx.set_default_device(mx.cpu)
    tok = base.build_tokenizer()
    tok_fields = base.tokenizer_gguf_fields(tok)
    cases = []
    worst = {}
    for name, cfg, seed, seq_seed in (("tiny-qwen2", QWEN2_CONFIG, 1005, 2005),
                                      ("tiny-mistral", MISTRAL_CONFIG, 1006, 2006)):
        weights = random_weights(cfg, seed)
        folder = base.write_hf_folder(name, cfg, weights, tok)
        seqs = base.token_sequences(seq_seed)
        mlx_model = None
        if cfg["model_type"] == "qwen2":
            mlx_model, _ = load_model(folder)
            mlx_model = base.to_f32(mlx_model)
        for toks in seqs:
            ref = forward(cfg, weights, toks).astype(np.float32)
            cases.append(base.case(name, toks, ref))
            if mlx_model is not None:
                other = base.last_logits(mlx_model, toks)
                worst[name] = max(worst.get(name, 0.0), float(np.max(np.abs(other - ref))))
        if cfg["model_type"] == "qwen2":
            path = HERE / "tiny-qwen2.q8_0.gguf"
            write_qwen2_gguf(path, cfg, weights, tok_fields)
            # Files that must be refused by name (tests/causal_model.rs): a key llama.cpp's
            # qwen2 does not have, a rope type Hunch does not implement, and a decision model.
            refused = HERE / "refused"
            refused.mkdir(exist_ok=True)
            for fname, extra in (("unknown-key", {"attention.zoom": 2.0}),
                                 ("longrope", {"rope.scaling.type": "longrope"}),
                                 ("decision", {"decision.type": "openjev"})):
                write_qwen2_gguf(refused / f"tiny-qwen2.{fname}.gguf", cfg, weights, tok_fields,
                                 dict(extra))
            deq = gguf_weights(path, cfg)
            for toks in seqs:
                cases.append(base.case(path.name, toks,
                                       forward(cfg, deq, toks).astype(np.float32)))
        # The features the configs exist for must matter on the 41-token case.
        plain = dict(cfg, rope_scaling=None, sliding_window=None)
        d = float(np.max(np.abs(forward(plain, weights, seqs[-1]) - forward(cfg, weights, seqs[-1]))))
        assert d > 1e-2, (name, d)
        print(f"{name}: window/yarn off changes logits by {d:.3f}")
    for name, w in worst.items():
        print(f"{name}: numpy f64 vs mlx_lm f32 max |diff| {w:.2e}")
        assert w < 1e-4, (name, w)
    # Llama 3's scaled rope as llama.cpp writes it (rope_freqs), with make_goldens.py's weights
    # of tiny-llama3-tied; the reference is mlx_lm on the dequantised weights under the HF
    # config's llama3 scaling.
    cfg = base.llama_config(True, base.LLAMA3_SCALING)
    weights = base.random_weights(cfg, 1002)
    path = HERE / "tiny-llama3-tied.q8_0.gguf"
    write_llama3_gguf(path, cfg, weights, tok_fields)
    model = base.model_from_weights(cfg, llama_gguf_weights(path, cfg))
    for toks in base.token_sequences(2001):
        cases.append(base.case(path.name, toks, base.last_logits(model, toks)))
    for src in ("tiny-qwen3", "tiny-llama3-tied", "tiny-gemma3", "tiny-qwen3-mlx8", "tiny-qwen2",
                "tiny-mistral"):
        transformers5_copy(src)
    golden = {
        "reference": "float64 numpy forward to transformers' semantics (make_family_goldens.py "
                     "`forward`), cross-checked against mlx_lm float32 where it implements the "
                     f"model (max |diff| {worst}); GGUF: dequantised by gguf-py",
        "generator": "accelerator/tests/data/causal/make_family_goldens.py",
        "label_ids": base.LABEL_IDS,
        "cases": cases,
    }
    (HERE / "family-goldens.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
