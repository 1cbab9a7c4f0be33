#!/usr/bin/env python3
"""Run the reference harness's `ref_bench.py` on an mlx-community affine checkpoint.

`ref_bench.py` builds mlx_vlm's DiffusionGemma and loads dense weights into it. An affine
checkpoint (a `quantization` block in config.json, U32 codes with scales and biases) needs the
model's linears, embedding and experts swapped for their quantised forms before the weights are
loaded, the way mlx_vlm's own loader does: each module named in the block gets that entry's
group size and bits (`false`: left dense), any other module that has stored `.scales` gets the
block's defaults. Everything else (timings, events, arguments) is `ref_bench.py`'s, unchanged.

    python scripts/ref_bench_quantized.py --refbench DIR <ref_bench.py arguments>

A checkpoint without a quantization block is loaded by `ref_bench.py` itself.
"""
import glob
import importlib.util
import os
import sys


def load_refbench(refbench_dir):
    path = os.path.join(refbench_dir, "ref_bench.py")
    spec = importlib.util.spec_from_file_location("ref_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ref_bench"] = module
    spec.loader.exec_module(module)
    return module


def main():
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--refbench":
        raise SystemExit("usage: ref_bench_quantized.py --refbench DIR <ref_bench.py arguments>")
    rb = load_refbench(argv[1])
    sys.argv = [sys.argv[0]] + argv[2:]
    dense_load = rb.load_model

    def load_model(ckpt, dtype, experts, L, C, D, S, mx, nn):
        cfg = rb.read_config(ckpt)
        quant = cfg.get("quantization") or cfg.get("quantization_config")
        if not quant:
            return dense_load(ckpt, dtype, experts, L, C, D, S, mx, nn)
        if quant.get("mode", "affine") != "affine":
            raise SystemExit(f"{ckpt}: quantization mode {quant.get('mode')} is not affine")
        mc = C.ModelConfig.from_dict(cfg)
        model = D.Model(mc)
        weights = {}
        for f in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
            weights.update(mx.load(f))
        weights = model.sanitize(weights)

        def predicate(path, module):
            if path in quant:
                return quant[path]
            if not hasattr(module, "to_quantized"):
                return False
            return f"{path}.scales" in weights

        nn.quantize(model, group_size=quant["group_size"], bits=quant["bits"],
                    mode="affine", class_predicate=predicate)
        # Floats (scales, biases, norms) in the activation dtype, codes as stored.
        out = {}
        for k, v in weights.items():
            if mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype:
                v = v.astype(dtype)
            out[k] = v
        del weights
        model.load_weights(list(out.items()), strict=True)
        del out
        mx.eval(model.parameters())
        return model, mc

    rb.load_model = load_model
    rb.main()


if __name__ == "__main__":
    main()
