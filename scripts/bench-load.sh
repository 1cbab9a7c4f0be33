#!/usr/bin/env bash
# Loading and reading at real width (issue 10, item 4), per layout and activation dtype, next to
# mlx_vlm on the same HF checkpoints. Not a test: it prints a table and asserts nothing.
#
# A 30-layer 26B-A4B checkpoint (18.8-52 GB) is not something this benchmark generates; instead
# it writes full-width checkpoints (all 262,144 vocabulary rows, 128 experts, the real head
# dimensions: `hunch-ckpt random --preset full`) with 1 and with 2 layers, and times both. The
# difference is one layer's cost; what is left of the 1-layer time is the part that does not grow
# with depth (embedding, final norm, the tied head over the whole vocabulary). The 30-layer
# estimate is that fixed part plus 30 layers. Memory, as users feel it: each process's anonymous
# resident memory is sampled every 20 ms (scripts/sample_anon.py), giving the steady state after
# the load, the peak above it during the load and during the reads, next to the checkpoint's
# largest tensor (the bound those peaks should stay within) and the bytes on disk; the 2-minus-
# 1-layer difference of the steady states is kept as an extra column.
#
#   scripts/bench-load.sh                # hf nvfp4 affine x bfloat16 float32, + mlx_vlm on hf and affine
# Env: LAYOUTS ("hf nvfp4 affine"), DTYPES ("bfloat16 float32"), REFERENCE (1: also mlx_vlm on the
# hf and affine checkpoints; 0: not), REFERENCE_DTYPES (the dtypes mlx_vlm runs in, default
# DTYPES: its bf16 affine products take MLX's slow bf16 CPU kernels, tens of minutes a run),
# BENCH_ARGS (passed to both sides, default one prompt of 256 tokens and one decoder pass of one
# 64-token canvas, 2 repetitions after a warm-up), WORK (target/bench-load),
# KEEP (1: keep the generated checkpoints, several GB each), REFBENCH (../shared/refbench),
# NO_BUILD (1: use the binaries already built), PROFILE (release, or dev: scripts/bench-common.sh),
# MIN_AVAILABLE_GB (before each run, wait until the machine has this much memory available, so a
# run on a shared machine neither swaps nor starves the others; default 0: do not wait).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh
layouts=(${LAYOUTS:-hf nvfp4 affine})
dtypes=(${DTYPES:-bfloat16 float32})
reference="${REFERENCE:-1}"
ref_dtypes=" ${REFERENCE_DTYPES:-${dtypes[*]}} "
args=(${BENCH_ARGS:---prompt-lens 256 --batches 1 --widths 64 --reps 2 --warmup 1})
work="${WORK:-target/bench-load}"
refbench="${REFBENCH:-../shared/refbench}"
out="$work/results.jsonl"
mkdir -p "$work"
rm -f "$out"
bench_build
wait_for_memory() {
  local want=$(( ${MIN_AVAILABLE_GB:-0} * 1024 * 1024 )) have
  while have="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"; [ "$have" -lt "$want" ]; do
    echo "waiting: $((have / 1048576)) GiB available, ${MIN_AVAILABLE_GB} wanted" >&2
    sleep 10
  done
}
if [ "$reference" = 1 ]; then
  [ -x .venv-reference/bin/python ] || tests/reference/setup.sh .venv-reference
  .venv-reference/bin/python -c 'import transformers, PIL, requests' 2>/dev/null \
    || .venv-reference/bin/python -m pip install -q transformers pillow requests
  mlx_vlm_src="$(.venv-reference/bin/python -c 'import importlib.util,os; s=importlib.util.find_spec("mlx_vlm"); print(os.path.dirname(s.submodule_search_locations[0]))')"
fi
for layout in "${layouts[@]}"; do
  for layers in 1 2; do
    ckpt="$work/$layout-l$layers"
    if [ ! -f "$ckpt/config.json" ]; then
      echo "writing $ckpt ..." >&2
      "$bin"/hunch-ckpt random --preset full --set "num_hidden_layers=$layers" \
        --layout "$layout" --out "$ckpt" >/dev/null
    fi
    for dtype in "${dtypes[@]}"; do
      wait_for_memory
      echo "hunch   $layout $dtype $layers layer(s) ..." >&2
      tag="hunch:$layout:$dtype:$layers"
      python3 scripts/sample_anon.py --out "$out" --tag "$tag" -- \
        "$bin"/accel-bench --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" \
        --tag "$tag" --out "$out" >/dev/null
      [ "$reference" = 1 ] && [[ "$ref_dtypes" == *" $dtype "* ]] || continue
      # mlx_vlm reads hf as ref_bench.py does, affine through scripts/ref_bench_quantized.py
      # (quantised modules swapped in per config.json, as mlx_vlm's loader does; its quantised
      # experts run as stored, so no float32 expert upcast). No mlx_vlm loader is wired for nvfp4.
      case "$layout" in
        hf) ref=("$refbench/ref_bench.py") ;;
        affine) ref=(scripts/ref_bench_quantized.py --refbench "$refbench" --experts native) ;;
        *) continue ;;
      esac
      wait_for_memory
      echo "mlx_vlm $layout $dtype $layers layer(s) ..." >&2
      tag="mlx_vlm:$layout:$dtype:$layers"
      MLX_VLM_SRC="$mlx_vlm_src" python3 scripts/sample_anon.py --out "$out" --tag "$tag" -- \
        .venv-reference/bin/python "${ref[@]}" \
        --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" --no-check \
        --tag "$tag" --out "$out" >/dev/null
    done
    [ "${KEEP:-0}" = 1 ] || rm -rf "$ckpt"
  done
done
python3 scripts/bench_load_table.py "$out"
