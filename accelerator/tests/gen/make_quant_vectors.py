#!/usr/bin/env python3
"""Write accelerator/tests/data/quant_vectors.safetensors: inputs and MLX 0.32.2 (mlx-cpu) outputs of
mx.quantize / mx.dequantize in nvfp4 and affine modes, so the Rust quantisers are pinned bit-exact
without Python at test time. Also asserts that the numpy model of each algorithm (documented in
docs/checkpoint-layouts.md and implemented in accelerator/src/checkpoint/quant.rs) matches MLX exactly.

    python3 -m venv v && v/bin/pip install mlx==0.32.2 mlx-cpu==0.32.2 numpy
    v/bin/python accelerator/tests/gen/make_quant_vectors.py accelerator/tests/data/quant_vectors.safetensors
"""
import json, struct, sys
import numpy as np
import mlx.core as mx

f32 = np.float32


def rbf(x):
    """float32 -> nearest-even bfloat16, returned as float32."""
    u = np.asarray(x, dtype=f32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(f32)


def bf16_bits(x):
    return (np.asarray(x, f32).view(np.uint32) >> 16).astype(np.uint16)


E4 = []
for b in range(256):
    s = -1 if b & 0x80 else 1
    e, m = (b >> 3) & 0xF, b & 7
    E4.append(np.nan if (e == 15 and m == 7) else s * ((m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)))
E4 = np.array(E4)
FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])


def to_e4m3(v):  # v >= 0 float, nearest, ties to even, saturating at 448
    pos = E4[:127]
    out = np.zeros(v.shape, np.uint8)
    for i, x in np.ndenumerate(v):
        x = float(x)
        if x >= 448: out[i] = 126; continue
        j = np.searchsorted(pos, x)
        if pos[j] == x: out[i] = j; continue
        dl, dh = x - pos[j - 1], pos[j] - x
        out[i] = j - 1 if dl < dh else j if dh < dl else (j - 1 if (j - 1) % 2 == 0 else j)
    return out


def to_fp4(v):  # nearest, ties toward zero, saturating at 6; -0 -> code 0
    out = np.zeros(v.shape, np.uint8)
    for i, x in np.ndenumerate(v):
        x = float(x)
        if x != x: continue
        s, a = (8 if x < 0 else 0), abs(x)
        if a >= 6: out[i] = 7 | s; continue
        j = np.searchsorted(FP4, a)
        c = j if FP4[j] == a else (j - 1 if a - FP4[j - 1] <= FP4[j] - a else j)
        out[i] = (c | s) if c else 0
    return out


def pack(codes, bits):
    per = 32 // bits
    c = codes.astype(np.uint32).reshape(codes.shape[:-1] + (-1, per))
    r = np.zeros(c.shape[:-1], np.uint32)
    for k in range(per): r |= c[..., k] << (bits * k)
    return r


def model_nvfp4(W, gs, rnd):
    """rnd: rounding to the input dtype (identity for f32, rbf for bf16)."""
    G = W.reshape(W.shape[0], -1, 16)
    amax = np.abs(G).max(-1)
    sc = rnd(amax / f32(6))
    if gs is not None: sc = (sc * (f32(2688) / f32(gs))).astype(f32)
    enc = to_e4m3(sc)
    e = E4[enc].astype(f32)[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        # MLX writes code 0 for every element of a block whose E4M3 scale is 0 (no inf/NaN codes)
        x = np.where(e == 0, f32(0), rnd((G / e).astype(f32)))
        if gs is not None: x = (x * (f32(2688) / f32(gs))).astype(f32)
    return pack(to_fp4(x).reshape(W.shape[0], -1), 4), enc


def model_affine(W, bits, gsz, rnd):
    G = W.reshape(W.shape[0], -1, gsz)
    wmax, wmin = G.max(-1), G.min(-1)
    nb = f32((1 << bits) - 1)
    mask = np.abs(wmin) > np.abs(wmax)
    scale = np.maximum(((wmax - wmin) / nb).astype(f32), f32(1e-7))
    scale = np.where(mask, scale, -scale).astype(f32)
    edge = np.where(mask, wmin, wmax).astype(f32)
    q0 = np.rint((edge / scale).astype(f32))
    scale = np.where(q0 != 0, (edge / np.where(q0 != 0, q0, 1)).astype(f32), scale).astype(f32)
    bias = np.where(q0 != 0, edge, f32(0)).astype(f32)
    q = np.rint(((G - bias[..., None]) / scale[..., None]).astype(f32))
    q = np.clip(q, 0, nb).astype(np.uint32)
    return pack(q.reshape(W.shape[0], -1), bits), rnd(scale), rnd(bias)


tensors = {}


def put(name, arr, dtype):
    tensors[name] = (dtype, list(arr.shape), np.ascontiguousarray(arr).tobytes())


def unpack_check(name, a, b):
    if not np.array_equal(a, b):
        idx = np.argwhere(a != b)[:4]; print([(tuple(i), hex(int(a[tuple(i)])), hex(int(b[tuple(i)]))) for i in idx])
        raise SystemExit(f"numpy model != MLX for {name}: {(a != b).sum()} mismatches")


rng = np.random.default_rng(20261129)
cases = [("f32", mx.float32, lambda x: x), ("bf16", mx.bfloat16, rbf)]
for std in (0.02, 1.0, 40.0):
    for dname, dt, rnd in cases:
        W = rnd((rng.standard_normal((16, 128)) * std).astype(f32))
        W[0, :16] = 0.0          # an all-zero block
        W[1, 16:32] = W[1, 16]   # a constant block
        w = mx.array(W).astype(dt)
        raw = bf16_bits(W) if dname == "bf16" else W
        st = "BF16" if dname == "bf16" else "F32"
        # nvfp4, with and without a global scale (per-tensor absmax, as mlx_lm does per expert)
        for gs in (None, float(np.abs(W).max())):
            tag = f"nvfp4_{dname}_std{std}_{'gs' if gs else 'nogs'}"
            kw = {} if gs is None else {"global_scale": mx.array(gs, dtype=mx.float32)}
            q, s = mx.quantize(w, group_size=16, bits=4, mode="nvfp4", **kw)
            q, s = np.array(q), np.array(s)
            mq, ms = model_nvfp4(W, gs, rnd)
            unpack_check(tag + " scales", ms, s)
            unpack_check(tag + " codes", mq, q)
            d = np.array(mx.dequantize(mx.array(q), mx.array(s), group_size=16, bits=4, mode="nvfp4",
                                       dtype=mx.float32, **kw))
            put(tag + ".w", raw, st); put(tag + ".codes", q, "U32"); put(tag + ".scales", s, "U8")
            put(tag + ".deq", d, "F32")
            if gs is not None: put(tag + ".global_scale", np.array([gs], f32), "F32")
        for bits in (4, 8):
            tag = f"affine{bits}_{dname}_std{std}"
            q, s, b = mx.quantize(w, group_size=64, bits=bits, mode="affine")
            d = mx.dequantize(q, s, b, group_size=64, bits=bits, mode="affine")
            q = np.array(q); s = np.array(s.astype(mx.float32)); b = np.array(b.astype(mx.float32))
            d = np.array(d.astype(mx.float32))
            mq, ms, mb = model_affine(W, bits, 64, rnd)
            unpack_check(tag + " scales", ms, s); unpack_check(tag + " biases", mb, b)
            unpack_check(tag + " codes", mq, q)
            conv = (lambda a: bf16_bits(a)) if dname == "bf16" else (lambda a: a)
            put(tag + ".w", raw, st); put(tag + ".codes", q, "U32")
            put(tag + ".scales", conv(s), st); put(tag + ".biases", conv(b), st); put(tag + ".deq", conv(d), st)

header, off, blobs = {}, 0, []
for k in sorted(tensors):
    dt, shape, data = tensors[k]
    header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    off += len(data); blobs.append(data)
header["__metadata__"] = {"source": f"mlx {mx.__version__} (mlx-cpu), make_quant_vectors.py"}
hb = json.dumps(header, separators=(",", ":")).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(hb))); f.write(hb)
    for b in blobs: f.write(b)
print(f"wrote {len(tensors)} tensors, {off} bytes; numpy models match MLX {mx.__version__} exactly")
