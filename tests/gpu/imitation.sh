#!/usr/bin/env bash
# Runs the packed GPU check in a container that imitates the device tool's GPU machine as closely
# as a machine without a GPU can, and checks it gets exactly as far as it can there:
#
#   tests/gpu/imitation.sh        (after scripts/gpu-pack.sh; not in CI: the image alone holds
#                                  1.3 GB of NVIDIA wheels; docs/mlx-on-linux.md)
#
# The imitation, like the GPU machine:
# - reaches nothing: `docker run --network none`;
# - receives only what the device tool sends: the working tree (tracked files and untracked ones
#   git does not ignore, copied as `git ls-files` lists them) and the carried target/gpu-pack/;
#   nothing of this machine's .mlx/, .whl/ or target/ builds;
# - has a python3 whose site-packages hold the nvidia-* packages MLX's CUDA wheel needs, in the
#   versions PyTorch 2.11+cu130 pins (what the GPU image has), in a venv at /opt/py, a folder the
#   build machine never used (the GPU image's is /opt/torch/.venv);
# - has a driver library and no device: the GPU machine's driver is mounted under
#   /usr/local/nvidia; here that folder holds tests/gpu/no-device-driver.c built as
#   libcuda.so.1, which answers as NVIDIA's driver does on a machine without a GPU
#   (CUDA_ERROR_NO_DEVICE). There is no nvidia-smi.
# Expected: machine, unpack, libs (every library resolves, the CUDA ones from /opt/py) and start
# pass; device fails naming CUDA_ERROR_NO_DEVICE; the GPU steps are skipped as needing it; no
# library is missing and nothing tries the network. The run's summary and setup output are left
# in target/gpu-imitation/out/.
#
# Env: HUNCH_IMITATION_TAG (the image; default hunch-gpu-imitation:torch2.11-cu130),
# HUNCH_IMITATION_WHEELS (where the nvidia-* wheels are downloaded; default .whl/gpu-imitation).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
tag="${HUNCH_IMITATION_TAG:-hunch-gpu-imitation:torch2.11-cu130}"
wheels="${HUNCH_IMITATION_WHEELS:-$repo/.whl/gpu-imitation}"
work="$repo/target/gpu-imitation"
# What PyTorch 2.11.0 (cu130, PyPI) pins through cuda-toolkit 13.0.2, cudnn and nccl: the
# packages of the GPU image that mlx-cuda-13 0.32.2 depends on.
wheel_pins=(nvidia-cublas==13.1.0.3 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96
  nvidia-cufft==12.0.0.61 nvidia-nvjitlink==13.0.88 nvidia-cudnn-cu13==9.19.0.56
  nvidia-nccl-cu13==2.28.9)
fail() { echo "imitation: $*" >&2; exit 1; }
command -v docker >/dev/null || fail "docker is not installed"
started=$SECONDS

# --- the image ---------------------------------------------------------------------------------
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  scripts/base-image.sh
  mkdir -p "$wheels"
  if [ "$(ls "$wheels"/nvidia_*.whl 2>/dev/null | wc -l)" -lt "${#wheel_pins[@]}" ]; then
    python3 -m pip download --no-deps --only-binary=:all: -d "$wheels" "${wheel_pins[@]}"
  fi
  context="$work/context"
  rm -rf "$context"
  mkdir -p "$context/wheels"
  ln "$wheels"/nvidia_*.whl "$context/wheels/" 2>/dev/null || cp "$wheels"/nvidia_*.whl "$context/wheels/"
  cc -shared -fPIC -O2 -Wall -o "$context/libcuda.so.1" -Wl,-soname,libcuda.so.1 tests/gpu/no-device-driver.c
  cat > "$context/Dockerfile" <<'EOF'
FROM hunch-base:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv \
      binutils >/dev/null && rm -rf /var/lib/apt/lists/*
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/py && /opt/py/bin/pip install -q --no-index --no-deps --no-compile \
      /tmp/wheels/*.whl && rm -rf /tmp/wheels
COPY libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1
RUN echo /usr/local/nvidia/lib64 > /etc/ld.so.conf.d/nvidia.conf && ldconfig
ENV PATH=/opt/py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
  echo "imitation: building $tag"
  DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$context" >/dev/null
  rm -rf "$context"
fi

# --- what travels: the working tree as the device tool sends it, and the pack -----------------
[ -f target/gpu-pack/MANIFEST.txt ] || fail "no target/gpu-pack: run scripts/gpu-pack.sh first"
tree="$work/tree"
rm -rf "$tree" "$work/out"
mkdir -p "$tree/target" "$work/out"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -C "$tree" -xf -
cp -r target/gpu-pack "$tree/target/"
echo "imitation: $(du -sh "$tree" | cut -f1) travels ($(du -sh target/gpu-pack | cut -f1) of it the pack)"

# --- the run -----------------------------------------------------------------------------------
set +e
docker run --rm --network none -v "$tree:/repo" -v "$work/out:/out" -e OUT=/out -w /repo \
  "$tag" timeout 600 scripts/gpu-check.sh 2>&1 | tee "$work/run.log"
rc=${PIPESTATUS[0]}
set -e
summary="$work/out/summary.txt"
[ -f "$summary" ] || fail "the check wrote no summary (exit $rc)"

# --- what it must show -------------------------------------------------------------------------
problems=()
for s in machine unpack libs start; do
  grep -qE "^$s +ok " "$summary" || problems+=("step $s is not ok")
done
grep -qE '^device +FAILED .*CUDA_ERROR_NO_DEVICE' "$summary" \
  || problems+=("the device step did not fail with CUDA_ERROR_NO_DEVICE")
for s in small-wide chat full-nvfp4; do
  grep -qE "^$s +skipped +needs device" "$summary" || problems+=("step $s was not skipped as needing the device")
done
grep -q '/opt/py/lib/python3[.0-9]*/site-packages' "$work/out/setup.txt" \
  || problems+=("the CUDA libraries were not found in /opt/py's site-packages")
if grep -qE 'not found' "$work/out/setup.txt"; then problems+=("a library was not found"); fi
if grep -qiE 'downloading|pip download|name resolution|urlopen error|network is unreachable' \
  "$work/run.log" "$work/out"/*.txt; then
  problems+=("something tried the network")
fi
if [ "${#problems[@]}" -gt 0 ]; then
  printf 'imitation: FAILED: %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "imitation: passed in $(( SECONDS - started )) s: unpacked, every library resolved, every" \
  "binary started, the device step failed with CUDA_ERROR_NO_DEVICE and nothing tried the network"
