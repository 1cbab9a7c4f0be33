#!/usr/bin/env bash
# The table "Every row beside llama.cpp 0.3.36" of docs/benchmarks.md: each row's file read by
# logits-bench against llama-cpp-python in the same run, (a) each side at its best (Hunch's
# detected copy, llama.cpp built with GGML_NATIVE=ON) and (b) both at AVX2 (HUNCH_CPU_ISA=avx2,
# llama.cpp built for AVX2 alone), printing a header per run (row, cap, peer, time, load) and
# logits-bench's output.
#
#   scripts/bench-rows.sh NATIVE_PY AVX2_PY ROW...      ROW: NAME=FILE:REQUESTS:ROUNDS[:COLUMNS]
#
# NATIVE_PY and AVX2_PY are Pythons with llama-cpp-python 0.3.36 built each way (the recipe is
# scripts/bench-logits.sh's; `-` skips that column); COLUMNS is `ab` (the default), `a` or `b`.
# Needs target/release/logits-bench (`cargo build --release -p hunch-accelerator --bin
# logits-bench`). Run it on a quiet machine: the two sides take turns, so a busy spell tilts
# the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,14p "$0" >&2; exit 2; }
native_py="$1" avx2_py="$2"
shift 2
bench=target/release/logits-bench
[ -x "$bench" ] || { echo "bench-rows: $bench is not built" >&2; exit 2; }
for row in "$@"; do
  name="${row%%=*}"
  IFS=: read -r file requests rounds columns <<<"${row#*=}"
  for column in a b; do
    [[ "${columns:-ab}" == *"$column"* ]] || continue
    if [ "$column" = a ]; then isa=auto py="$native_py"; else isa=avx2 py="$avx2_py"; fi
    [ "$py" != - ] || continue
    echo "=== $name | HUNCH_CPU_ISA=$isa | peer $py | $(date +%T) | load $(cut -d' ' -f1-3 /proc/loadavg)"
    HUNCH_CPU_ISA="$isa" "$bench" --model "$file" --requests "$requests" --rounds "$rounds" \
      --mode isolated --peer-python "$py"
    echo "load after $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
