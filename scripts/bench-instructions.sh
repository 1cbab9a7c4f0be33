#!/usr/bin/env bash
# Instructions executed per encoder prefill and per decoder pass, bfloat16 against float32 on the
# same checkpoint and binary, counted by valgrind's callgrind: unlike times, counts do not move
# with what else runs on a shared machine (docs/benchmarks.md, "bfloat16 against float32 on the
# CPU"). Not a test; it prints a table.
#
# One run per dtype of `accel-bench --reps 2 --warmup 0` under callgrind, which writes a profile
# dump each time the program enters `DiffusionGemma::prefill_chunks` or `DiffusionGemma::denoise`
# (`--dump-before`): each dump holds what ran since the previous one, i.e. exactly one prefill or
# one decoder pass (MLX evaluates on its own thread, but a pass's evaluation ends before the call
# returns, and the counters are the process's). The first dump is the load, the last the exit.
# The median of each measurement's dumps is printed (a 4-canvas pass is followed by the 4 serial
# 1-canvas passes of accel-bench's batched-vs-serial check, counted as 1-canvas passes).
#
# Under valgrind the CPU reports no AVX-512, so the BLAS may pick other kernels than it does
# natively: the counts compare the two dtypes on one code path, they are not native counts.
#
#   scripts/bench-instructions.sh [PRESET=small]        # or CKPT=DIR
# Env: BENCH_ARGS (default "--prompt-lens 256 --batches 1,4 --widths 32"; --reps 2 --warmup 0 are
# added), DTYPES ("float32 bfloat16"), PARALLEL (1: run the dtypes at once), TAG (results in target/bench-instructions-TAG), NO_BUILD,
# PROFILE, BIN (scripts/bench-common.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-small}"
BENCH_ARGS="${BENCH_ARGS:---prompt-lens 256 --batches 1,4 --widths 32}"
source scripts/bench-common.sh
bench_workdir "instructions${TAG:+-$TAG}"
bench_build
if [ -n "${CKPT:-}" ]; then ckpt="$CKPT"; else ckpt="$(bench_checkpoint "$preset")"; fi
echo "machine: $(nproc) cores, $(uname -m), load average $(cut -d' ' -f1-3 /proc/loadavg); checkpoint $ckpt; $(valgrind --version)"
count() {
  local dtype="$1" dir="$work/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  echo "$dtype under callgrind ..." >&2
  # One BLAS thread: an idle BLAS thread's spinning would be counted too.
  OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
    --dump-before='*DiffusionGemma::prefill_chunks' --dump-before='*DiffusionGemma::denoise' \
    "$bin/accel-bench" --ckpt "$ckpt" --dtype "$dtype" "${args[@]}" --reps 2 --warmup 0 \
    --out "$dir/bench.jsonl" >/dev/null 2>"$dir/valgrind.log"
}
for dtype in ${DTYPES:-float32 bfloat16}; do
  # PARALLEL=1: the dtypes side by side (counts do not depend on it; a loaded machine finishes
  # sooner), else one after the other.
  if [ "${PARALLEL:-0}" = 1 ]; then count "$dtype" & else count "$dtype"; fi
done
wait
python3 - "$work" ${DTYPES:-float32 bfloat16} <<'PY'
import glob, json, os, re, statistics, sys
work, dtypes = sys.argv[1], sys.argv[2:]

def passes(dtype):
    """The measurements accel-bench ran, in order, each with its dumps' instruction counts."""
    dumps = []
    for path in glob.glob(os.path.join(work, dtype, "callgrind.out*")):
        n = re.search(r"\.(\d+)$", path)
        text = open(path).read()
        total = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
        dumps.append((int(n.group(1)) if n else 10**9, int(total.group(1)) if total else 0))
    counts = [c for _, c in sorted(dumps)][1:-1]  # without the load and the exit
    events = [json.loads(l) for l in open(os.path.join(work, dtype, "bench.jsonl"))]
    out, at = {}, 0
    for e in events:
        if e["event"] == "prefill":
            out[f"prefill P={e['P']}"] = counts[at:at + 2]; at += 2
        elif e["event"] == "decode":
            key = f"decode P={e['P']} B={e['B']} W={e['W']}"
            out[key] = counts[at:at + 2]; at += 2
            if e["B"] > 1:  # the batched-vs-serial check: B passes of one canvas
                one = f"decode P={e['P']} B=1 W={e['W']}"
                out.setdefault(one, []).extend(counts[at:at + e["B"]]); at += e["B"]
    return out

got = {d: passes(d) for d in dtypes}
print("| measurement | " + " | ".join(f"{d} instructions (10⁹)" for d in dtypes) + " | " + " / ".join(reversed(dtypes)) + " |")
print("|---" * (len(dtypes) + 2) + "|")
for key in got[dtypes[0]]:
    med = [statistics.median(got[d][key]) if got[d].get(key) else float("nan") for d in dtypes]
    print(f"| {key} | " + " | ".join(f"{m / 1e9:.2f}" for m in med) + f" | {med[-1] / med[0]:.2f} |")
PY
