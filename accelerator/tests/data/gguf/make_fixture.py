#!/usr/bin/env python3
"""Writes blocks.gguf and blocks.expected.json, the fixture of tests/gguf_blocks.rs.

An independent reference for the Rust GGUF reader: gguf-py (llama.cpp's own Python package)
writes the file and computes the expected values with its dequantisers.

    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf numpy
    /tmp/venv-gguf/bin/python accelerator/tests/data/gguf/make_fixture.py

Each tensor is [4, 256] (row-major; GGUF stores dims [256, 4]). Types gguf-py can quantise
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantised from one seeded normal matrix; the K-quants, which
gguf-py only dequantises, are seeded random blocks with their f16 super-block scales replaced by
small finite values (random bits could be inf or NaN).
"""

import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, COLS = 4, 256
rng = np.random.default_rng(20250101)
source = rng.standard_normal((ROWS, COLS)).astype(np.float32)

# (byte offset, count) of the f16 scales in each K-quant's block, set to small finite values.
K_SCALES = {
    T.Q2_K: [(80, 2)],
    T.Q3_K: [(108, 1)],
    T.Q4_K: [(0, 2)],
    T.Q5_K: [(0, 2)],
    T.Q6_K: [(208, 1)],
}


def random_blocks(qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for at, count in K_SCALES[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=(n_blocks, count)).astype(np.float16)
        raw[:, at:at + 2 * count] = scales.view(np.uint8)
    return raw.reshape(ROWS, -1)


def f32_text(x):
    # The shortest text that reads back as this float32.
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def main():
    path = os.path.join(HERE, "blocks.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    meta = {
        "test.u8": ("uint8", 250),
        "test.i8": ("int8", -100),
        "test.u16": ("uint16", 65000),
        "test.i16": ("int16", -32000),
        "test.u32": ("uint32", 4000000000),
        "test.i32": ("int32", -2000000000),
        "test.u64": ("uint64", 1 << 50),
        "test.i64": ("int64", -(1 << 50)),
        "test.f32": ("float32", 0.125),
        "test.f64": ("float64", 1e-300),
        "test.bool": ("bool", True),
        "test.string": ("string", "héllo ▁wörld"),
        "test.strings": ("strings", ["<s>", "</s>", "", "▁the", "日本"]),
        "test.ints": ("ints", [1, -2, 3]),
        "test.floats": ("floats", [0.5, -1.25]),
    }
    w.add_uint8("test.u8", 250)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -32000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 1 << 50)
    w.add_int64("test.i64", -(1 << 50))
    w.add_float32("test.f32", 0.125)
    w.add_float64("test.f64", 1e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo ▁wörld")
    w.add_array("test.strings", ["<s>", "</s>", "", "▁the", "日本"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25])

    tensors = {}
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        tensors[qtype] = gguf.quants.quantize(source, qtype)
    for qtype in K_SCALES:
        tensors[qtype] = random_blocks(qtype)

    values = {}
    for qtype, raw in tensors.items():
        name = f"t.{qtype.name.lower()}"
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, raw)
            raw_bytes = raw.view(np.uint8)
        else:
            # The element shape follows from the byte shape and the type.
            w.add_tensor(name, raw, raw_dtype=qtype)
            raw_bytes = raw
        values[name] = {
            "type": qtype.name,
            "shape": [ROWS, COLS],
            "values": [f32_text(x) for x in gguf.quants.dequantize(raw_bytes, qtype).reshape(-1)],
        }

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    with open(os.path.join(HERE, "blocks.expected.json"), "w") as f:
        json.dump({"metadata": {k: {"type": t, "value": v} for k, (t, v) in meta.items()},
                   "tensors": values}, f, separators=(",", ":"), ensure_ascii=False)


if __name__ == "__main__":
    main()
