#!/usr/bin/env python3
"""Writes a random-weight GGUF chat model of a real model's shapes, for timing the label-logit read
against llama.cpp at a 1-4B size where no real checkpoint can be fetched (docs/benchmarks.md,
"Label-logit read against llama.cpp"). Speed does not depend on what the weights are.

    scripts/bench_chat_gguf.py --tokenizer-from SmolLM2.gguf --out M.gguf [--shape llama-1b]
                               [--type Q4_0|Q4_1|Q8_0|Q5_0|Q5_1|Q4_K|Q5_K|Q6_K|Q4_K_M] [--seed 0]

The file is a `llama` architecture GGUF as llama.cpp's converter writes one: the model's shapes
(llama-1b: Llama 3.2 1B's layers, 16 x 2048 wide, 8192 feed-forward, 32 heads, 8 KV heads),
weights drawn normal (std 0.02; norms 1) and quantised with gguf-py's reference quantisers, the
embedding tied. The tokenizer (vocabulary, merges, special ids, chat template) is copied from
`--tokenizer-from`, so the vocabulary is that file's (SmolLM2's 49,152 ids instead of Llama's
128,256): the embedding table is narrower, which changes only the gather of a chunk's rows and the
few label rows the read takes from the head, not the per-token work of the layers.

Q4_K_M is llama-quantize's mix: Q6_K for the (tied) embedding and for attn_v and ffn_down in the
layers its `use_more_bits` picks (the first and last eighth, and every third between), Q4_K for
the rest. gguf-py has no K-quant quantisers, so Q4_K, Q5_K and Q6_K blocks are written here
(`quantize_k` below: each sub-block's scale and min from its range, not llama.cpp's error search;
speed does not depend on it).

Needs: pip install gguf numpy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

SHAPES = {
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B-Instruct's config.json), rope scaling left out.
    "llama-1b": dict(hidden=2048, ffn=8192, layers=16, heads=32, kv_heads=8, rope_theta=500000.0),
    # Qwen3-1.7B's layer shapes (a Llama-style stack here: speed does not depend on q/k norms).
    "qwen3-1.7b-shaped": dict(hidden=2048, ffn=6144, layers=28, heads=16, kv_heads=8,
                              rope_theta=1000000.0),
    # Small enough for a test.
    "tiny": dict(hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, rope_theta=10000.0),
}


# llama.cpp's `general.file_type` (enum llama_ftype) of each choice.
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 14, "Q5_K": 16,
              "Q6_K": 18, "Q4_K_M": 15}


def f16_bytes(x: np.ndarray) -> np.ndarray:
    """`x` (n,) as n little-endian f16 pairs of bytes, (n, 2)."""
    return x.astype("<f2").view(np.uint8).reshape(-1, 2)


def quantize_k(w: np.ndarray, kind: str) -> np.ndarray:
    """Q4_K, Q5_K or Q6_K blocks of `w` [rows, cols] (cols a multiple of 256), [rows, bytes]."""
    rows, cols = w.shape
    x = w.reshape(-1, 256).astype(np.float32)
    n = x.shape[0]
    if kind == "Q6_K":
        sub = x.reshape(n, 16, 16)
        scale = np.abs(sub).max(axis=2) / 31.0
        d = (scale.max(axis=1) / 127.0).astype(np.float16).astype(np.float32)
        inv_d = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
        sc = np.clip(np.round(scale * inv_d[:, None]), -127, 127).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        inv = np.divide(1.0, step, out=np.zeros_like(step), where=step != 0)
        q = np.clip(np.round(sub * inv[:, :, None]) + 32, 0, 63).astype(np.uint8).reshape(n, 256)
        ql = np.zeros((n, 128), np.uint8)
        qh = np.zeros((n, 64), np.uint8)
        for a in range(2):
            for r in range(128):
                e = 128 * a + r
                ql[:, 64 * a + r % 64] |= (q[:, e] & 0x0F) << (4 * (r // 64))
                qh[:, 32 * a + r % 32] |= (q[:, e] >> 4) << (2 * (r // 32))
        out = np.concatenate([ql, qh, sc.view(np.uint8), f16_bytes(d)], axis=1)
        return out.reshape(rows, -1)
    top = 15 if kind == "Q4_K" else 31
    sub = x.reshape(n, 8, 32)
    low = np.minimum(sub.min(axis=2), 0.0)
    scale = (sub.max(axis=2) - low) / top
    d = (scale.max(axis=1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-low).max(axis=1) / 63.0).astype(np.float16).astype(np.float32)

    def six(v: np.ndarray, unit: np.ndarray) -> np.ndarray:
        inv = np.divide(1.0, unit, out=np.zeros_like(unit), where=unit > 0)
        return np.clip(np.round(v * inv[:, None]), 0, 63).astype(np.uint8)

    sc, m = six(scale, d), six(-low, dmin)
    packed = np.zeros((n, 12), np.uint8)
    for j in range(4):
        packed[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        packed[:, j + 4] = m[:, j] | ((m[:, j + 4] >> 4) << 6)
        packed[:, j + 8] = (sc[:, j + 4] & 0x0F) | ((m[:, j + 4] & 0x0F) << 4)
    step = d[:, None] * sc.astype(np.float32)
    bias = dmin[:, None] * m.astype(np.float32)
    inv = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
    q = np.clip(np.round((sub + bias[:, :, None]) * inv[:, :, None]), 0, top).astype(np.uint8)
    q = q.reshape(n, 256)
    parts = [f16_bytes(d), f16_bytes(dmin), packed]
    if kind == "Q5_K":
        qh = np.zeros((n, 32), np.uint8)
        for e in range(256):
            qh[:, e % 32] |= (q[:, e] >> 4) << (e // 32)
        parts.append(qh)
    chunks = q.reshape(n, 4, 64)
    qs = (chunks[:, :, :32] & 0x0F) | ((chunks[:, :, 32:] & 0x0F) << 4)
    parts.append(qs.reshape(n, 128))
    return np.concatenate(parts, axis=1).reshape(rows, -1)


def quantize(w: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    if kind.name in ("Q4_K", "Q5_K", "Q6_K"):
        return quantize_k(w, kind.name)
    return quants.quantize(w, kind)


def copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    """Copies every `tokenizer.*` key; returns the vocabulary size."""
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            inner = field.types[1]
            if inner == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape")
                          for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
            if name == "tokenizer.ggml.tokens":
                vocab = len(values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            value = field.parts[field.data[0]].tolist()[0]
            writer.add_key_value(name, value, kind)
    if vocab == 0:
        sys.exit(f"{reader} has no tokenizer.ggml.tokens")
    return vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-from", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="Q4_0", choices=sorted(FILE_TYPES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    mix = args.type == "Q4_K_M"
    qtype = GGMLQuantizationType["Q4_K" if mix else args.type]
    rng = np.random.default_rng(args.seed)
    head_dim = s["hidden"] // s["heads"]

    reader = GGUFReader(args.tokenizer_from)
    writer = GGUFWriter(args.out, "llama")
    writer.add_name(f"random {args.shape} {args.type}")
    vocab = copy_tokenizer(reader, writer)
    writer.add_context_length(8192)
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_file_type(FILE_TYPES[args.type])

    def matrix(name: str, rows: int, cols: int, kind: GGMLQuantizationType | None = None) -> None:
        kind = kind or qtype
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        writer.add_tensor(name, quantize(w, kind), raw_dtype=kind)

    q6 = GGMLQuantizationType.Q6_K

    def more_bits(i: int) -> bool:
        # llama.cpp's use_more_bits(i_layer, n_layers).
        n = s["layers"]
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    def norm(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", vocab, s["hidden"], q6 if mix else None)
    kv = s["kv_heads"] * head_dim
    for i in range(s["layers"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", s["hidden"])
        matrix(p + "attn_q.weight", s["hidden"], s["hidden"])
        matrix(p + "attn_k.weight", kv, s["hidden"])
        matrix(p + "attn_v.weight", kv, s["hidden"], q6 if mix and more_bits(i) else None)
        matrix(p + "attn_output.weight", s["hidden"], s["hidden"])
        norm(p + "ffn_norm.weight", s["hidden"])
        matrix(p + "ffn_gate.weight", s["ffn"], s["hidden"])
        matrix(p + "ffn_up.weight", s["ffn"], s["hidden"])
        matrix(p + "ffn_down.weight", s["hidden"], s["ffn"], q6 if mix and more_bits(i) else None)
        print(f"layer {i + 1}/{s['layers']}", file=sys.stderr)
    norm("output_norm.weight", s["hidden"])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(args.out)


if __name__ == "__main__":
    main()
