#!/usr/bin/env python3
"""Writes a random-weight chat checkpoint of a real model's shapes, for timing the label-logit read
where no real checkpoint can be fetched (scripts/gpu-check.sh runs it on the GPU machine).

    scripts/gpu_chat_ckpt.py --out DIR [--shape llama-1b|tiny] [--seed 0]

A Hugging Face folder as the sidecar loads it (docs/models.md): `config.json` with the shapes of
the named model (llama-1b: Llama 3.2 1B, 1.24 B parameters, tied embeddings, 2.47 GB in
bfloat16), `model.safetensors` in bfloat16 (normal weights, std 0.02; norms 1), and the tokenizer
files of the repository's tiny Llama test checkpoint (accelerator/tests/data/causal/tiny-llama: a
320-id byte-level BPE with a chat template). Its ids are a subset of the 128,256 rows, so reads
run over the real vocabulary width; the answers mean nothing, the time does. Needs numpy only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import time

import numpy as np

SHAPES = {
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B-Instruct's config.json), rope scaling left out.
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                     vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True),
    # The same layout at a size a CPU reads in seconds (scripts/gpu-check.sh --cpu).
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=1024, rope_theta=10000.0, tie_word_embeddings=True),
}
TOKENIZER_FROM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "accelerator",
                              "tests", "data", "causal", "tiny-llama")


def tensors(c: dict) -> list[tuple[str, list[int], float]]:
    """(name, shape, std; 0 = ones) in the Llama layout, in file order."""
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", [c["vocab_size"], h], 0.02)]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", [h], 0.0),
            (p + "self_attn.q_proj.weight", [q, h], 0.02),
            (p + "self_attn.k_proj.weight", [kv, h], 0.02),
            (p + "self_attn.v_proj.weight", [kv, h], 0.02),
            (p + "self_attn.o_proj.weight", [h, q], 0.02),
            (p + "post_attention_layernorm.weight", [h], 0.0),
            (p + "mlp.gate_proj.weight", [i, h], 0.02),
            (p + "mlp.up_proj.weight", [i, h], 0.02),
            (p + "mlp.down_proj.weight", [h, i], 0.02),
        ]
    out.append(("model.norm.weight", [h], 0.0))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [c["vocab_size"], h], 0.02))
    return out


def bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even."""
    u = values.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.monotonic()
    shape = SHAPES[args.shape]
    specs = tensors(shape)
    header, offset = {}, 0
    for name, dims, _std in specs:
        size = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)

    tmp = args.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(args.seed)
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for _name, dims, std in specs:
            n = int(np.prod(dims))
            if std == 0.0:
                f.write(np.full(n, 0x3F80, dtype=np.uint16).tobytes())  # 1.0 in bfloat16
                continue
            for start in range(0, n, 1 << 26):  # 64 Mi values at a time: bounded memory
                count = min(1 << 26, n - start)
                values = rng.standard_normal(count, dtype=np.float32) * np.float32(std)
                f.write(bf16(values).tobytes())
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "initializer_range": 0.02, "max_position_embeddings": 131072, "mlp_bias": False,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "torch_dtype": "bfloat16", "use_cache": True, **shape,
    }
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(TOKENIZER_FROM, name), tmp)
    shutil.rmtree(args.out, ignore_errors=True)
    os.rename(tmp, args.out)
    params = sum(int(np.prod(d)) for _n, d, _s in specs)
    print(f"gpu_chat_ckpt: {args.shape}, {params / 1e9:.2f} B parameters, {offset / 1e9:.2f} GB "
          f"bfloat16 in {args.out} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
