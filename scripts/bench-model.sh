#!/usr/bin/env bash
# Benchmark of the model itself against the Python reference (mlx_vlm 0.7.10's DiffusionGemma on
# MLX's CPU wheel, in its own venv): one encoder prefill and one batched decoder pass on the same
# random checkpoint, same machine, one after the other. Prints a side-by-side table with both
# times, the ratio, and the resident memory of each process. Not a test.
#
# Each side runs with its own defaults: mlx_vlm on the BLAS its MLX wheel bundles (the reference
# BLAS), Hunch on OpenBLAS when installed (scripts/setup.sh; HUNCH_BLAS=reference for the same
# BLAS as mlx_vlm). The BLAS each side used is printed under the table.
#
#   scripts/bench-model.sh [PRESET=small] [DTYPE=float32]
# Env: REFBENCH (default ../shared/refbench: ref_bench.py + summarize.py), BENCH_ARGS (passed to
# both, default "--prompt-lens 256 --batches 1,4 --widths 32,64 --reps 3 --warmup 1"), NO_BUILD
# (1: use the release binaries already built).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh
bench_positional "$@"
bench_workdir model
[ -x .venv-reference/bin/python ] || tests/reference/setup.sh .venv-reference
# ref_bench.py imports mlx_vlm's model modules, which need these at import time.
.venv-reference/bin/python -c 'import transformers, PIL, requests' 2>/dev/null \
  || .venv-reference/bin/python -m pip install -q transformers pillow requests
bench_build
ckpt="$(bench_checkpoint "$preset")"
rm -f "$work/reference.jsonl" "$work/hunch.jsonl"
echo "reference (mlx_vlm) ..." >&2
MLX_VLM_SRC="$(.venv-reference/bin/python -c 'import importlib.util,os; s=importlib.util.find_spec("mlx_vlm"); print(os.path.dirname(s.submodule_search_locations[0]))')" \
  .venv-reference/bin/python "$refbench/ref_bench.py" --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" \
  --out "$work/reference.jsonl" >/dev/null
echo "hunch (mlx-rs) ..." >&2
"$bin/accel-bench" --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" --out "$work/hunch.jsonl" >/dev/null
hunch_blas="$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("event") == "env":
        print(r.get("blas", "?")); break' "$work/hunch.jsonl" 2>/dev/null || echo "?")"
echo "machine: $(nproc) cores; BLAS: mlx_vlm = its wheel's bundled reference BLAS (its default);" \
  "hunch = ${hunch_blas} (its default; HUNCH_BLAS=${HUNCH_BLAS:-unset}); see docs/mlx-on-linux.md"
python3 "$refbench/summarize.py" "$work/reference.jsonl" "$work/hunch.jsonl" --labels mlx_vlm,hunch
