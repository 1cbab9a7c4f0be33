#!/usr/bin/env bash
# The GPU check: one prepared run for an NVIDIA GPU machine that can fetch nothing (the device
# tool's H200: CUDA 13 driver, nvcc, Python with PyTorch and the nvidia-* packages, no MLX, no
# network). Everything it needs and the machine lacks travels in target/gpu-pack/, made here by
# scripts/gpu-pack.sh; the rest comes from the machine, found at run time.
#
#   scripts/gpu-check.sh          on the GPU machine (the device call carries target/gpu-pack)
#   scripts/gpu-check.sh --cpu    the same steps on this build's CPU binaries (target/debug, or
#                                 PROFILE=release) with small checkpoints; CI does not run it
#
# Steps, one summary line each (also in $OUT/summary.txt):
#   machine     cores, memory, disk, nvidia-smi, nvcc, the Python's nvidia-* packages
#   unpack      the pack's parts checked against MANIFEST.txt's sha256, unpacked (Python's lzma)
#   libs        the CUDA libraries found in the Python's site-packages (nvidia/*/lib), the
#               driver's libcuda.so.1, CUDA_HOME for MLX's kernel compiler; every binary's
#               libraries resolved (ldd), none missing
#   start       every packed binary starts (--help)
#   device      the driver has a CUDA device (cuInit, name, compute capability, memory) of the
#               architecture the pack was built for; every later step needs it
#   small-wide  the 277 MB random checkpoint, bfloat16, per read over HTTP through hunch serve,
#               alone and with 8 clients (read-bench), GPU memory and load sampled (nvidia-smi)
#   chat        a random Llama-3.2-1B-shaped chat checkpoint (scripts/gpu_chat_ckpt.py), the
#               label-logit read (logits-bench: ms per question, prompt tokens per second)
#   full-nvfp4  the 30-layer NVFP4 checkpoint of the real shapes (~16 GB, hunch-ckpt random),
#               bfloat16, ~600-token prompts, 3 questions, fixed draws and seed: p50 alone,
#               requests/s with 8 clients, next to the weight-bandwidth floor
#               (scripts/gpu_check_client.py)
# A step that fails or runs out of its time is reported and the next one runs; a step that needs
# what failed is skipped and says so. The whole run ends within HUNCH_GPU_CHECK_BUDGET seconds
# (default 525: under 9 minutes), each step killed with everything it started at its share.
# $OUT holds at most 6 files: summary.txt, machine.txt, setup.txt, small-wide.txt, chat.txt,
# full-nvfp4.txt (raw output, each cut to its last 4 MiB).
#
# Env: OUT (default target/gpu-check), HUNCH_GPU_PACK (default target/gpu-pack),
# HUNCH_GPU_CHECK_WORK (unpacked binaries and checkpoints; default /tmp/hunch-gpu-check),
# HUNCH_GPU_CHECK_BUDGET, SECONDS_PER_RUN (each timed run with clients; default 20),
# HUNCH_GPU_BANDWIDTH (device memory bytes/s for the floor; default 4.8e12, an H200's HBM3e),
# HUNCH_PYTHON (the Python whose nvidia-* packages hold the CUDA libraries, which also runs the
# checkpoint generator and client; default python3), PROFILE (--cpu: release or dev).
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
mode=gpu
if [ "${1:-}" = --cpu ]; then mode=cpu; shift; fi
[ $# -eq 0 ] || { echo "usage: scripts/gpu-check.sh [--cpu]" >&2; exit 2; }
out="${OUT:-$repo/target/gpu-check}"
work="${HUNCH_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/hunch-gpu-check}"
pack="${HUNCH_GPU_PACK:-$repo/target/gpu-pack}"
budget="${HUNCH_GPU_CHECK_BUDGET:-525}"
seconds="${SECONDS_PER_RUN:-20}"
bandwidth="${HUNCH_GPU_BANDWIDTH:-4.8e12}"
python="${HUNCH_PYTHON:-python3}"
deadline=$(( SECONDS + budget ))
mkdir -p "$out" "$work"
summary="$out/summary.txt"
: > "$summary"
for f in machine setup small-wide chat full-nvfp4; do : > "$out/$f.txt"; done
export repo mode out work pack seconds bandwidth python

if [ "$mode" = gpu ]; then
  bin="$work/pack/hunch-gpu/bin"
else
  bin="$repo/target/$([ "${PROFILE:-dev}" = release ] && echo release || echo debug)"
fi
export bin

# --- the step runner --------------------------------------------------------------------------
declare -A state
say() { echo "$*" | tee -a "$summary"; }
# step NAME FILE CAP NEEDS...: runs the function step_NAME (- read as _) in a child shell (its own process
# group, so `timeout` ends everything it started), output appended to $out/FILE, for at most CAP
# seconds and never past the budget. The step writes its one-line result to $work/NAME.result.
step() {
  local name="$1" file="$2" cap="$3"; shift 3
  local need
  for need in "$@"; do
    if [ "${state[$need]:-}" != ok ]; then
      state[$name]=skipped
      say "$(printf '%-11s skipped   needs %s (%s)' "$name" "$need" "${state[$need]:-not run}")"
      return
    fi
  done
  local left=$(( deadline - SECONDS - 5 ))
  if [ "$left" -lt 15 ]; then
    state[$name]=skipped
    say "$(printf '%-11s skipped   out of time (budget %s s)' "$name" "$budget")"
    return
  fi
  local limit=$(( cap < left ? cap : left )) started=$SECONDS rc
  rm -f "$work/$name.result"
  echo "=== $name: at most $limit s, $(date -u +%FT%TZ)" >> "$out/$file"
  timeout -k 5 "$limit" bash -c "step_${name//-/_}" >> "$out/$file" 2>&1
  rc=$?
  local took=$(( SECONDS - started )) result=""
  [ -f "$work/$name.result" ] && result="$(head -n1 "$work/$name.result")"
  if [ "$rc" = 0 ]; then
    state[$name]=ok
    say "$(printf '%-11s ok    %4d s  %s' "$name" "$took" "$result")"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    state[$name]=timeout
    say "$(printf '%-11s TIMEOUT %2d s  stopped at its %s s; %s' "$name" "$took" "$limit" "${result:-see $file}")"
  else
    state[$name]=failed
    [ -n "$result" ] || result="exit $rc; last line: $(tail -n1 "$out/$file")"
    say "$(printf '%-11s FAILED %3d s  %s' "$name" "$took" "$result")"
  fi
}
result() { echo "$*" > "$work/$STEP.result"; }
# GET a URL, the body on stdout; fails on an error status (Python: no curl needed).
http_get() {
  "$python" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())' "$1"
}
# The GPU's memory in use and load, sampled every second while a step runs (nvidia-smi).
sampler_start() {
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -l 1 \
    > "$work/$STEP.smi" 2>/dev/null &
  echo $! > "$work/$STEP.smi.pid"
}
sampler_stop() {
  [ -f "$work/$STEP.smi.pid" ] || { echo "gpu: not sampled (no nvidia-smi)"; return 0; }
  kill "$(cat "$work/$STEP.smi.pid")" 2>/dev/null
  awk -F', *' '$1+0 > m { m = $1+0 } $2+0 > u { u = $2+0 } END {
    printf "gpu: at most %d MiB in use, at most %d%% busy (%d samples)\n", m, u, NR }' "$work/$STEP.smi"
}
export -f result http_get sampler_start sampler_stop

# --- machine ----------------------------------------------------------------------------------
step_machine() {
  STEP=machine
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo "unknown (no git here)")"
  [ ! -f "$pack/MANIFEST.txt" ] || sed -n '2,4p' "$pack/MANIFEST.txt" | sed 's/^/pack: /'
  local mem_gib
  mem_gib=$(awk '/^MemTotal:/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)
  echo "cores: $(nproc)"; echo "memory: $mem_gib GiB"; uname -a; df -h "$work" | tail -n1
  "$python" --version 2>&1 | sed "s|^|$python: |"
  "$python" -m pip list 2>/dev/null | grep -iE '^(nvidia-|torch |cuda-)' || echo "(no pip list)"
  command -v nvcc >/dev/null && nvcc --version | tail -n2
  local gpu="no nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi; nvidia-smi -q | head -60
    gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)"
  fi
  result "$(nproc) cores, $mem_gib GiB, GPU: $gpu"
}

# --- unpack -----------------------------------------------------------------------------------
step_unpack() {
  STEP=unpack
  [ -f "$pack/MANIFEST.txt" ] || { result "no $pack/MANIFEST.txt: carry target/gpu-pack (scripts/gpu-pack.sh)"; return 1; }
  rm -rf "$work/pack"
  mkdir -p "$work/pack"
  "$python" - "$pack" "$work/pack" <<'PY'
import hashlib, io, lzma, os, sys, tarfile, time
pack, dest = sys.argv[1], sys.argv[2]
started = time.monotonic()
parts = [line.split() for line in open(os.path.join(pack, "MANIFEST.txt")) if line.startswith("part ")]
data = bytearray()
for _, name, size, sha in parts:
    blob = open(os.path.join(pack, name), "rb").read()
    if len(blob) != int(size) or hashlib.sha256(blob).hexdigest() != sha:
        sys.exit(f"{name}: size or sha256 differs from MANIFEST.txt (a part broke on the way)")
    data += blob
with tarfile.open(fileobj=io.BytesIO(lzma.decompress(bytes(data))), mode="r:") as tar:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)
print(f"unpacked {len(parts)} parts ({len(data) / 2**20:.1f} MiB) in {time.monotonic() - started:.1f} s")
PY
  local rc=$?
  [ "$rc" = 0 ] || { result "the pack could not be unpacked (see setup.txt)"; return 1; }
  cat "$work/pack/hunch-gpu/BUILD"
  result "$(du -sh "$work/pack/hunch-gpu" | cut -f1) unpacked into $work/pack: $(ls "$bin" | xargs)"
}

# --- libs: where the CUDA libraries, the driver and the CUDA headers are ----------------------
find_libs() {
  # shellcheck source=scripts/cuda-env.sh
  source "$repo/scripts/cuda-env.sh"
  local dirs driver home mlx_lib=""
  [ "$mode" = gpu ] && mlx_lib="$work/pack/hunch-gpu/mlx/lib"
  dirs="$(HUNCH_PYTHON="$python" cuda_lib_dirs | paste -sd: -)"
  driver="$(cuda_driver_lib)"
  home="$(HUNCH_PYTHON="$python" cuda_include_home)"
  local path="$mlx_lib"
  [ -z "$dirs" ] || path="${path:+$path:}$dirs"
  [ -z "$driver" ] || path="$path:$(dirname "$driver")"
  {
    echo "export LD_LIBRARY_PATH='$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}'"
    [ -z "$home" ] || echo "export CUDA_HOME='$home'"
    echo "export MLX_PTX_CACHE_DIR='$work/ptx-cache'"
    echo "export HUNCH_ACCELERATOR_BIN='$bin/hunch-accelerator'"
    echo "export CUDA_DRIVER_LIB='$driver'"
    echo "export CUDA_LIB_DIRS='$dirs'"
  } > "$work/env.sh"
}
step_libs() {
  STEP=libs
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "CUDA_HOME=${CUDA_HOME:-none found, so MLX looks in /usr/local/cuda}"
  echo "driver: ${CUDA_DRIVER_LIB:-libcuda.so.1 not found}"
  local missing="" b
  for b in "$bin"/hunch-accelerator "$bin"/hunch-ckpt "$bin"/logits-bench "$bin"/hunch "$bin"/read-bench; do
    echo "--- ldd $b"
    ldd "$b" 2>&1 | grep -E 'mlx|cu|nccl|nvrtc|cudnn|blas|lapack|not found' | sed 's/ (0x[0-9a-f]*)//'
    missing="$missing $(ldd "$b" 2>&1 | awk '/not found/ {print $1}')"
  done
  missing="$(echo "$missing" | tr ' ' '\n' | sort -u | xargs)"
  if [ -n "$missing" ]; then
    result "not found: $missing (CUDA libraries from ${CUDA_LIB_DIRS:-no nvidia-* package found by $python})"
    return 1
  fi
  if [ "$mode" = cpu ]; then result "CPU build: MLX's CPU library, nothing of CUDA"; return 0; fi
  result "all resolve; CUDA libraries from $(echo "$CUDA_LIB_DIRS" | tr ':' '\n' | sed 's|/nvidia/.*||' | sort -u | xargs), driver ${CUDA_DRIVER_LIB:-none}"
}

# --- start ------------------------------------------------------------------------------------
step_start() {
  STEP=start
  local b failed=""
  for b in hunch-accelerator hunch-ckpt hunch read-bench; do
    echo "--- $b --help"
    "$bin/$b" --help 2>&1 | head -n3 || true
    "$bin/$b" --help >/dev/null 2>&1 || failed="$failed $b"
  done
  # logits-bench has no --help: without --model it says what it needs and exits 1.
  echo "--- logits-bench"
  "$bin/logits-bench" 2>&1 | head -n2 | tee "$work/logits-bench.start"
  grep -q -- "--model PATH is required" "$work/logits-bench.start" || failed="$failed logits-bench"
  [ -z "$failed" ] || { result "did not start:$failed"; return 1; }
  result "hunch-accelerator, hunch-ckpt, logits-bench, hunch, read-bench start"
}

# --- device: asks the driver itself (ctypes), before anything depends on it -------------------
step_device() {
  STEP=device
  "$python" - "${CUDA_DRIVER_LIB:-libcuda.so.1}" "$work/pack/hunch-gpu/BUILD" > "$work/device.txt" 2>&1 <<'PY'
import ctypes, re, sys
path, build = sys.argv[1], sys.argv[2]
try:
    cuda = ctypes.CDLL(path)
except OSError as e:
    sys.exit(f"no NVIDIA driver: {e}")
def error(rc):
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    cuda.cuGetErrorName(rc, ctypes.byref(name)); cuda.cuGetErrorString(rc, ctypes.byref(text))
    return f"{(name.value or b'?').decode()} ({(text.value or b'?').decode()})"
version = ctypes.c_int(0)
cuda.cuDriverGetVersion(ctypes.byref(version))
driver = f"the NVIDIA driver at {path} (CUDA {version.value // 1000}.{version.value % 1000 // 10})"
rc = cuda.cuInit(0)
if rc != 0:
    sys.exit(f"{driver} answers cuInit with {error(rc)}: there is no CUDA device to run on")
count = ctypes.c_int(0)
cuda.cuDeviceGetCount(ctypes.byref(count))
if count.value == 0:
    sys.exit(f"{driver} sees no CUDA device")
try:
    want = int(re.search(r"sm_(\d+)", open(build).read()).group(1))
except (OSError, AttributeError):
    want = None
names = []
for i in range(count.value):
    dev, major, minor, mem = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    cuda.cuDeviceGetName(name, 256, dev)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
    cuda.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
    names.append(f"{name.value.decode()} sm_{major.value}{minor.value} {mem.value / 2**30:.0f} GiB")
    if i == 0 and want is not None and major.value * 10 + minor.value != want:
        sys.exit(f"device 0 is sm_{major.value}{minor.value} but the pack's MLX has sm_{want} "
                 f"kernels only: repack with HUNCH_GPU_SM={major.value}{minor.value} scripts/gpu-pack.sh")
print(f"{count.value} device(s): {'; '.join(names)}; {driver}")
PY
  local rc=$?
  cat "$work/device.txt"
  result "$(tail -n1 "$work/device.txt")"
  return $rc
}

# --- small-wide -------------------------------------------------------------------------------
step_small_wide() {
  STEP=small-wide
  local ckpt
  if [ "$mode" = gpu ]; then
    ckpt="$work/small-wide"
    [ -f "$ckpt/config.json" ] || "$bin/hunch-ckpt" random --preset small --set vocab_size=32768 \
      --set num_experts=96 --seed 0 --out "$ckpt" || return 1
  else
    ckpt="$work/tiny-cpu"
    [ -f "$ckpt/config.json" ] || "$bin/hunch-ckpt" random --preset tiny --seed 0 --out "$ckpt" || return 1
  fi
  sampler_start
  "$bin/read-bench" --ckpt "$ckpt" --dtype bfloat16 --reps 5 --clients 1,8 --seconds "$seconds" \
    | tee "$work/read-bench.txt"
  local rc=${PIPESTATUS[0]}
  sampler_stop | tee "$work/smi.txt"
  [ "$rc" = 0 ] || return "$rc"
  # The stack part's rows: clients, reads, reads/s, p50, p99.
  result "$(awk '$1 ~ /^[0-9]+$/ && NF >= 7 {printf "%s client(s): %s reads/s, p50 %s ms; ", $1, $3, $4}' "$work/read-bench.txt")$(cat "$work/smi.txt")"
}

# --- chat -------------------------------------------------------------------------------------
step_chat() {
  STEP=chat
  local shape=llama-1b requests=4 rounds=2
  [ "$mode" = gpu ] || { shape=tiny; requests=2; rounds=1; }
  local ckpt="$work/chat-$shape"
  [ -f "$ckpt/config.json" ] || "$python" "$repo/scripts/gpu_chat_ckpt.py" --shape "$shape" --out "$ckpt" || return 1
  sampler_start
  "$bin/logits-bench" --model "$ckpt" --requests "$requests" --rounds "$rounds" | tee "$work/logits-bench.txt"
  local rc=${PIPESTATUS[0]}
  sampler_stop | tee "$work/smi.txt"
  [ "$rc" = 0 ] || return "$rc"
  result "$shape: $(sed -n 's/^hunch *: //p' "$work/logits-bench.txt"); $(cat "$work/smi.txt")"
}

# --- full-nvfp4 -------------------------------------------------------------------------------
step_full_nvfp4() {
  STEP=full-nvfp4
  local ckpt name=full-nvfp4 spec=(--preset full --layout nvfp4 --seed 0)
  [ "$mode" = gpu ] || { name=tiny-nvfp4; spec=(--preset tiny --layout nvfp4 --seed 0 --set num_hidden_layers=2); }
  ckpt="$work/$name"
  if [ ! -f "$ckpt/config.json" ]; then
    local t=$SECONDS
    "$bin/hunch-ckpt" random "${spec[@]}" --out "$ckpt" || return 1
    echo "generated $ckpt in $(( SECONDS - t )) s"
  fi
  local weights
  weights=$(du -sb "$ckpt" | cut -f1)
  echo "$name: $weights bytes on disk"
  sampler_start
  "$bin/hunch" serve --listen 127.0.0.1:0 --model "$name=$ckpt" --sidecar-arg=--dtype=bfloat16 \
    --request-timeout 1800 --max-concurrent-reads 64 > "$work/serve.stdout" 2> "$work/serve.log" &
  local server=$! url="" t=$SECONDS
  trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; tail -c 1000000 "$work/serve.log"' EXIT
  while true; do
    url=$(sed -n 's/^HUNCH_LISTENING //p' "$work/serve.stdout" | head -n1)
    if [ -n "$url" ] && http_get "$url/readyz" >/dev/null 2>&1; then break; fi
    kill -0 "$server" 2>/dev/null || { result "hunch serve exited before ready: $(tail -n1 "$work/serve.log")"; return 1; }
    sleep 1
  done
  echo "$name: ready in $(( SECONDS - t )) s"
  "$python" "$repo/scripts/gpu_check_client.py" --url "$url" --model "$name" --state-tokens 600 \
    --draws 4 --seed 7 --reps 10 --clients 8 --seconds "$seconds" --weights-bytes "$weights" \
    --bandwidth "$bandwidth" | tee "$work/client.txt"
  local rc=${PIPESTATUS[0]}
  http_get "$url/metrics" | grep -E '^hunch_(read|sidecar|forward)' | head -40
  sampler_stop | tee "$work/smi.txt"
  [ "$rc" = 0 ] || return "$rc"
  result "$(grep -E '^p50 alone|clients:' "$work/client.txt" | sed 's/ over .*requests//' | paste -sd';' -); $(cat "$work/smi.txt")"
}
export -f step_machine step_unpack step_libs step_start step_device step_small_wide step_chat step_full_nvfp4

# --- the run ----------------------------------------------------------------------------------
say "gpu-check ($mode): $(date -u +%FT%TZ), budget $budget s, raw output in $out"
step machine machine.txt 30
if [ "$mode" = gpu ]; then
  step unpack setup.txt 120
else
  state[unpack]=ok
fi
if [ "${state[unpack]}" = ok ]; then
  find_libs
  # shellcheck source=/dev/null
  source "$work/env.sh"
  export LD_LIBRARY_PATH CUDA_HOME MLX_PTX_CACHE_DIR HUNCH_ACCELERATOR_BIN CUDA_DRIVER_LIB CUDA_LIB_DIRS
fi
step libs setup.txt 30 unpack
step start setup.txt 60 libs
if [ "$mode" = gpu ]; then
  step device setup.txt 30 start
else
  state[device]=ok
  say "$(printf '%-11s skipped   --cpu: no device' device)"
fi
step small-wide small-wide.txt 170 device
step chat chat.txt 120 device
step full-nvfp4 full-nvfp4.txt 600 device
for f in machine setup small-wide chat full-nvfp4; do
  # Each file comes back whole: at most 4 MiB (the device returns files up to 16 MiB).
  if [ "$(stat -c %s "$out/$f.txt")" -gt 4194304 ]; then
    tail -c 4194304 "$out/$f.txt" > "$work/cut" && mv "$work/cut" "$out/$f.txt"
  fi
done
failed=0
for s in "${!state[@]}"; do [ "${state[$s]}" = ok ] || failed=1; done
say "gpu-check ($mode): done in $SECONDS s; $([ $failed = 0 ] && echo "every step ok" || echo "not every step ok")"
exit $failed
