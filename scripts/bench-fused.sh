#!/usr/bin/env bash
# Fused elementwise chains (docs/model.md, "Fused elementwise chains") against the same binary with
# MLX's compiling turned off (MLX_DISABLE_COMPILE=1), one encoder prefill and one batched decoder
# pass on the same random checkpoint, alternating the two sides ROUNDS times so that a busy
# machine slows both alike. Prints one table per round: both sides and the ratio. Not a test.
#
#   scripts/bench-fused.sh [PRESET=small] [DTYPE=float32]
# Env: ROUNDS (3), BENCH_ARGS (default "--prompt-lens 256 --batches 1,4 --widths 32,64 --reps 3
# --warmup 1"), REFBENCH (../shared/refbench, for its summarize.py), NO_BUILD (1: use the release
# binaries already built).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh
bench_positional "$@"
bench_workdir fused
bench_build
ckpt="$(bench_checkpoint "$preset")"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $preset, $dtype"
for round in $(seq "${ROUNDS:-3}"); do
  rm -f "$work/unfused-$round.jsonl" "$work/fused-$round.jsonl"
  echo "round $round: unfused ..." >&2
  MLX_DISABLE_COMPILE=1 "$bin/accel-bench" --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" \
    --out "$work/unfused-$round.jsonl" >/dev/null
  echo "round $round: fused ..." >&2
  "$bin/accel-bench" --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" \
    --out "$work/fused-$round.jsonl" >/dev/null
  echo "round $round (load average $(cut -d' ' -f1-3 /proc/loadavg)):"
  python3 "$refbench/summarize.py" "$work/unfused-$round.jsonl" "$work/fused-$round.jsonl" \
    --labels unfused,fused | sed -n '/^|/p'
done
