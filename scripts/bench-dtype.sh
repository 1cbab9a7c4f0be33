#!/usr/bin/env bash
# bfloat16 against float32 activations on the same checkpoint, binary and machine, in one run:
# one encoder prefill and one batched decoder pass per side, alternating the two sides ROUNDS
# times so that a busy machine slows both alike. Prints, per round, both medians and the ratio
# bfloat16 / float32 of the wall time and of the process's CPU time (which does not grow while it
# waits for a core on a shared machine; with OPENBLAS_NUM_THREADS=1 no idle BLAS thread spins
# into it either), the ratio of the fastest repetitions (steadier than medians where the
# machine's speed moves between processes), and the memory each side holds: anonymous memory
# after the load and the sampled peak above it (docs/benchmarks.md, "bfloat16 against float32 on
# the CPU"). Not a test.
#
#   scripts/bench-dtype.sh [PRESET=small]          # or CKPT=DIR scripts/bench-dtype.sh
# Env: ROUNDS (3), BENCH_ARGS (default "--prompt-lens 256 --batches 1,4 --widths 32,64 --reps 3
# --warmup 1"), CKPT (an existing checkpoint instead of a generated preset), PROFILE and BIN
# (scripts/bench-common.sh), NO_BUILD (1: use the binaries already built).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-small}"
source scripts/bench-common.sh
bench_workdir dtype
bench_build
if [ -n "${CKPT:-}" ]; then ckpt="$CKPT"; else ckpt="$(bench_checkpoint "$preset")"; fi
echo "machine: $(nproc) cores, $(uname -m), load average $(cut -d' ' -f1-3 /proc/loadavg); checkpoint $ckpt"
for round in $(seq "${ROUNDS:-3}"); do
  for dtype in float32 bfloat16; do
    rm -f "$work/$dtype-$round.jsonl"
    echo "round $round: $dtype ..." >&2
    "$bin/accel-bench" --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" \
      --out "$work/$dtype-$round.jsonl" >/dev/null
  done
  echo "round $round (load average $(cut -d' ' -f1-3 /proc/loadavg)):"
  python3 - "$work/float32-$round.jsonl" "$work/bfloat16-$round.jsonl" <<'PY'
import json, sys
def rows(path):
    out, load = {}, {}
    for line in open(path):
        e = json.loads(line)
        if e["event"] == "load":
            load = e
        elif e["event"] == "prefill":
            out[f"prefill P={e['P']}"] = e
        elif e["event"] == "decode":
            out[f"decode P={e['P']} B={e['B']} W={e['W']}"] = e
    return load, out
(l32, f32), (l16, b16) = rows(sys.argv[1]), rows(sys.argv[2])
print("| measurement | float32 ms | bfloat16 ms | bf16 / f32 | float32 CPU ms | bfloat16 CPU ms | CPU bf16 / f32 "
      "| fastest f32 / bf16 ms | fastest bf16 / f32 |")
print("|---|---|---|---|---|---|---|---|---|")
for k, a in f32.items():
    b = b16.get(k)
    if b:
        ca, cb = a.get("cpu_median_ms", float("nan")), b.get("cpu_median_ms", float("nan"))
        print(f"| {k} | {a['median_ms']:.0f} | {b['median_ms']:.0f} | {b['median_ms'] / a['median_ms']:.2f} "
              f"| {ca:.0f} | {cb:.0f} | {cb / ca:.2f} "
              f"| {a['min_ms']:.0f} / {b['min_ms']:.0f} | {b['min_ms'] / a['min_ms']:.2f} |")
for name, l in (("float32", l32), ("bfloat16", l16)):
    peaks = [e.get("anon_peak_over_mb", 0) for e in {**(f32 if name == "float32" else b16)}.values()]
    print(f"| {name}: anonymous MiB after load, peak above it (load / reads), largest tensor | "
          f"{l.get('anon_mb', 0):.0f} | {l.get('anon_peak_over_mb', 0):.0f} / {max(peaks, default=0):.0f} | "
          f"{l.get('largest_tensor_mb', 0):.0f} |")
PY
done
