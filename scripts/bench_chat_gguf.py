#!/usr/bin/env python3
"""Writes a random-weight GGUF chat model of a real model's shapes, for timing the label-logit read
against llama.cpp at a 1-4B size where no real checkpoint can be fetched (docs/benchmarks.md,
"Label-logit read against llama.cpp"). Speed does not depend on what the weights are.

    scripts/bench_chat_gguf.py --tokenizer-from SmolLM2.gguf --out M.gguf [--shape llama-1b]
                               [--type Q4_0|Q8_0] [--seed 0]

The file is a `llama` architecture GGUF as llama.cpp's converter writes one: the model's shapes
(llama-1b: Llama 3.2 1B's layers, 16 x 2048 wide, 8192 feed-forward, 32 heads, 8 KV heads),
weights drawn normal (std 0.02; norms 1) and quantised with gguf-py's reference quantisers, the
embedding tied. The tokenizer (vocabulary, merges, special ids, chat template) is copied from
`--tokenizer-from`, so the vocabulary is that file's (SmolLM2's 49,152 ids instead of Llama's
128,256): the embedding table is narrower, which changes only the gather of a chunk's rows and the
few label rows the read takes from the head, not the per-token work of the layers.

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
    ap.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q8_0"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    qtype = GGMLQuantizationType[args.type]
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
    writer.add_file_type({"Q4_0": 2, "Q8_0": 7}[args.type])

    def matrix(name: str, rows: int, cols: int) -> None:
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        writer.add_tensor(name, quants.quantize(w, qtype), raw_dtype=qtype)

    def norm(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", vocab, s["hidden"])
    kv = s["kv_heads"] * head_dim
    for i in range(s["layers"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", s["hidden"])
        matrix(p + "attn_q.weight", s["hidden"], s["hidden"])
        matrix(p + "attn_k.weight", kv, s["hidden"])
        matrix(p + "attn_v.weight", kv, s["hidden"])
        matrix(p + "attn_output.weight", s["hidden"], s["hidden"])
        norm(p + "ffn_norm.weight", s["hidden"])
        matrix(p + "ffn_gate.weight", s["ffn"], s["hidden"])
        matrix(p + "ffn_up.weight", s["ffn"], s["hidden"])
        matrix(p + "ffn_down.weight", s["hidden"], s["ffn"])
        print(f"layer {i + 1}/{s['layers']}", file=sys.stderr)
    norm("output_norm.weight", s["hidden"])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(args.out)


if __name__ == "__main__":
    main()
