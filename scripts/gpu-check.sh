#!/usr/bin/env bash
# The GPU check: one prepared run for an NVIDIA GPU machine (CUDA 13 driver), the day one is
# available. Run it first there and commit the figures (docs/benchmarks.md, "GPU check").
#
#   scripts/gpu-check.sh          on the GPU machine; raw output into $OUT (default
#                                 target/gpu-check)
#   scripts/gpu-check.sh --cpu    the same steps on the CPU with small checkpoints: what a machine
#                                 without a GPU can check of this script (CI does not run it)
#
# 1. The machine: nvidia-smi, cores, memory.
# 2. Builds: the sidecar natively against MLX's CUDA 13 wheel (scripts/build-cuda.sh cuda13), the
#    host, hunch-ckpt and read-bench (CPU build; they run no model).
# 3. `small-wide` (the random checkpoint of docs/benchmarks.md, 277 MB) per read over HTTP through
#    `hunch serve`, alone and with 8 clients, bfloat16 activations (read-bench).
# 4. A 30-layer NVFP4 checkpoint of the real shapes (`hunch-ckpt random --preset full --layout
#    nvfp4`, ~16 GB, generated there), bfloat16: ~600-token prompts, 3 questions, fixed draws and
#    seed; p50 alone, requests/s with 8 clients, next to the weight-bandwidth floor
#    (scripts/gpu_check_client.py).
#
# Env: OUT (where the raw output goes), PROFILE (release, or dev for a quicker build),
# HUNCH_GPU_BANDWIDTH (device memory bytes/s for the floor; default 4.8e12, an H200's HBM3e),
# HUNCH_GPU_CHECK_WORK (checkpoints; default target/gpu-check-work), SECONDS_PER_RUN (default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
if [ "${1:-}" = --cpu ]; then mode=cpu; shift; fi
[ $# -eq 0 ] || { echo "usage: scripts/gpu-check.sh [--cpu]" >&2; exit 2; }
out="${OUT:-$PWD/target/gpu-check}"
work="${HUNCH_GPU_CHECK_WORK:-$PWD/target/gpu-check-work}"
profile="${PROFILE:-release}"
seconds="${SECONDS_PER_RUN:-30}"
bandwidth="${HUNCH_GPU_BANDWIDTH:-4.8e12}"
dir="$([ "$profile" = dev ] && echo debug || echo "$profile")"
mkdir -p "$out" "$work"
log="$out/gpu-check.log"
: > "$log"
say() { echo "gpu-check: $*" | tee -a "$log"; }
# run NAME COMMAND...: its output (stdout and stderr) into $out/NAME.txt and the log.
run() {
  local name="$1"; shift
  say "$name: $*"
  local started=$SECONDS
  if "$@" > "$out/$name.txt" 2>&1; then
    say "$name: done in $(( SECONDS - started )) s"
  else
    say "$name: FAILED (exit $?) after $(( SECONDS - started )) s; tail:"
    tail -20 "$out/$name.txt" | tee -a "$log"
    return 1
  fi
}

# --- 1. The machine --------------------------------------------------------------------------
say "mode $mode, profile $profile, raw output in $out, $(date -u +%FT%TZ)"
{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "cores: $(nproc)"; uname -a; free -g
  if command -v nvidia-smi >/dev/null; then nvidia-smi; nvidia-smi -q | head -80; fi
} > "$out/machine.txt" 2>&1
if [ "$mode" = gpu ] && ! command -v nvidia-smi >/dev/null; then
  say "no nvidia-smi: this is not an NVIDIA machine (use --cpu to check the script on a CPU)"
  exit 1
fi

# --- 2. Builds ---------------------------------------------------------------------------------
run setup scripts/setup.sh
if [ "$profile" = dev ]; then
  # The test build's command line: reuses what `cargo test --workspace` built.
  run build-host cargo test --workspace --no-run
else
  run build-host cargo build --profile "$profile" -p hunch -p hunch-accelerator -p hunch-e2e \
    --bin hunch --bin hunch-ckpt --bin read-bench --bin hunch-accelerator
fi
ckpt_tool="target/$dir/hunch-ckpt"
if [ "$mode" = gpu ]; then
  run build-cuda env PROFILE="$profile" scripts/build-cuda.sh cuda13
  accelerator="$PWD/target/cuda13/$dir/hunch-accelerator"
  # MLX JIT-compiles kernels with NVRTC; CUDA 13's runtime libraries where the machine has them.
  export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
else
  accelerator="$PWD/target/$dir/hunch-accelerator"
fi
export HUNCH_ACCELERATOR_BIN="$accelerator"

# --- 3. small-wide per read over HTTP, alone and with 8 clients, bfloat16 ---------------------
if [ "$mode" = gpu ]; then
  small=(--preset small --set vocab_size=32768 --set num_experts=96 --seed 0)
else
  small=(--preset tiny --seed 0)
fi
small_dir="$work/small-wide-$mode"
[ -f "$small_dir/config.json" ] || run ckpt-small-wide "$ckpt_tool" random "${small[@]}" --out "$small_dir"
run small-wide-bf16 "target/$dir/read-bench" --ckpt "$small_dir" --dtype bfloat16 --reps 5 \
  --clients 1,8 --seconds "$seconds"

# --- 4. The 30-layer NVFP4 checkpoint, bfloat16 -------------------------------------------------
if [ "$mode" = gpu ]; then
  full=(--preset full --layout nvfp4 --seed 0)
  full_name=full-nvfp4
else
  full=(--preset tiny --layout nvfp4 --seed 0 --set num_hidden_layers=2)
  full_name=tiny-nvfp4
fi
full_dir="$work/$full_name"
[ -f "$full_dir/config.json" ] || run "ckpt-$full_name" "$ckpt_tool" random "${full[@]}" --out "$full_dir"
"$ckpt_tool" inspect "$full_dir" > "$out/inspect-$full_name.txt" 2>&1 || true
weights=$(du -sb "$full_dir" | cut -f1)
say "$full_name: $weights bytes on disk"

server_log="$out/serve-$full_name.txt"
"target/$dir/hunch" serve --listen 127.0.0.1:0 --model "$full_name=$full_dir" \
  --sidecar-arg=--dtype=bfloat16 --request-timeout 1800 --max-concurrent-reads 64 \
  > "$out/serve-$full_name.stdout" 2> "$server_log" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT
url=""
for _ in $(seq 1 3600); do
  url=$(sed -n 's/^HUNCH_LISTENING //p' "$out/serve-$full_name.stdout" | head -n1)
  if [ -n "$url" ] && curl -fsS -o /dev/null "$url/readyz" 2>/dev/null; then break; fi
  kill -0 "$server" 2>/dev/null || { say "hunch serve exited; see $server_log"; exit 1; }
  sleep 1
done
curl -fsS -o /dev/null "$url/readyz" || { say "$full_name never became ready"; exit 1; }
say "$full_name: ready ($SECONDS s since this script started, builds included)"
run "client-$full_name" python3 scripts/gpu_check_client.py --url "$url" --model "$full_name" \
  --state-tokens 600 --draws 4 --seed 7 --reps 10 --clients 8 --seconds "$seconds" \
  --weights-bytes "$weights" --bandwidth "$bandwidth"
curl -fsS "$url/metrics" > "$out/metrics-$full_name.txt"
tail -6 "$out/client-$full_name.txt" | tee -a "$log"
say "done: raw output in $out"
