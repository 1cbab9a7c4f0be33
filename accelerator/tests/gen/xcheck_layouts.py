"""Cross-check hunch-ckpt outputs against MLX: re-quantise every HF tensor with mx.quantize and
# Usage: hunch-ckpt random --preset small --layout {hf,nvfp4,affine} --out /tmp/c-{layout} --seed 1
#        python xcheck_layouts.py /tmp/c-hf /tmp/c-nvfp4 /tmp/c-affine   (needs mlx==0.32.2, mlx-cpu)
compare bytes with the Rust-written nvfp4/affine checkpoints."""
import json, sys
import mlx.core as mx
hf, nv, af = sys.argv[1:4]
import glob


def load(d):
    out = {}
    for f in sorted(glob.glob(f"{d}/*.safetensors")):
        out.update(mx.load(f))
    return out


H, N, A = load(hf), load(nv), load(af)
cfg = json.load(open(f"{af}/config.json"))["quantization"]
n_nv = n_af = 0
for name, w in H.items():
    if ".experts." in name:
        codes, scales, gs = N[name + ".weight"], N[name + ".scales"], N[name + ".global_scale"]
        for e in range(w.shape[0]):
            g = mx.abs(w[e]).max().astype(mx.float32)
            assert g.item() == gs[e].item(), (name, e)
            q, s = mx.quantize(w[e], group_size=16, bits=4, mode="nvfp4", global_scale=g)
            assert mx.array_equal(q, codes[e]).item() and mx.array_equal(s, scales[e]).item(), (name, e)
            n_nv += 1
    else:
        assert mx.array_equal(N[name], w).item(), name
    mod = name[:-7] if name.endswith(".weight") else name
    over = cfg.get(mod)
    wname = name + ".weight" if ".experts." in name else name
    if over is False or w.ndim == 1:
        assert mx.array_equal(A[wname], w).item(), name
        continue
    bits = over["bits"] if isinstance(over, dict) else cfg["bits"]
    q, s, b = mx.quantize(w, group_size=64, bits=bits)
    base = wname[:-7]
    assert mx.array_equal(q, A[wname]).item(), name
    assert mx.array_equal(s, A[base + ".scales"]).item() and mx.array_equal(b, A[base + ".biases"]).item(), name
    assert A[base + ".scales"].dtype == mx.bfloat16
    n_af += 1
print(f"OK: {n_nv} experts re-quantised by MLX equal the Rust NVFP4 bytes; {n_af} affine modules equal")
