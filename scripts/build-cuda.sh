#!/usr/bin/env bash
# Builds the sidecar and the binaries the GPU check runs natively against MLX's CUDA wheel (no
# library swapping at run time):
#
#   scripts/build-cuda.sh [cuda13|cuda12]        (default cuda13; the H200 machines run CUDA 13)
#
# Fetches mlx-cuda-13 (or -12) 0.32.2 into .mlx/<backend>/ (or MLX_DIR), then builds
# hunch-accelerator, hunch-ckpt and logits-bench (which link libmlx) with hunch and read-bench
# into target/<backend>/, so the CPU build in target/ is left alone. Linking needs no GPU and no
# CUDA install (the build leaves the CUDA libraries to the run-time loader); running needs the
# CUDA libraries (the nvidia-* Python packages) and an NVIDIA driver, which this script does not
# install. At the end it prints what each library resolves to on this machine and, when every
# one resolves, runs `hunch-accelerator --help` (docs/mlx-on-linux.md).
#
# Env: MLX_DIR, HUNCH_MLX_WHEEL, HUNCH_PYTHON (as scripts/fetch-mlx.sh), CARGO_BUILD_ARGS (extra
# cargo arguments), PROFILE (release, or dev for a quicker build), HUNCH_CUDA_SITE (a
# site-packages folder holding the nvidia-* packages, searched before HUNCH_PYTHON's).
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-cuda13}"
case "$backend" in
  cuda13 | cuda12) ;;
  *) echo "usage: scripts/build-cuda.sh [cuda13|cuda12]" >&2; exit 2 ;;
esac
export HUNCH_MLX_BACKEND="$backend"
HUNCH_MLX_BACKEND="$backend" scripts/fetch-mlx.sh
mlx_dir="${MLX_DIR:-$PWD/.mlx/$backend}"
export MLX_DIR="$mlx_dir"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/$backend}"
profile="${PROFILE:-release}"
started=$SECONDS
# shellcheck disable=SC2086
cargo build --profile "$profile" -p hunch-accelerator -p hunch -p hunch-e2e \
  --bin hunch-accelerator --bin hunch-ckpt --bin logits-bench --bin hunch --bin read-bench \
  ${CARGO_BUILD_ARGS:-}
out_dir="$CARGO_TARGET_DIR/$([ "$profile" = dev ] && echo debug || echo "$profile")"
bin="$out_dir/hunch-accelerator"
echo "built $out_dir/{hunch-accelerator,hunch-ckpt,logits-bench,hunch,read-bench} against" \
  "$(basename "$mlx_dir") ($mlx_dir/mlx/lib/libmlx.so) in $(( SECONDS - started )) s"
if command -v readelf >/dev/null; then
  readelf -d "$bin" | grep -E 'RPATH|RUNPATH|NEEDED' | sed 's/^/  /'
fi

# What the loader finds here: the CUDA libraries of the nvidia-* packages (HUNCH_CUDA_SITE or
# HUNCH_PYTHON's site-packages) and the driver.
# shellcheck source=scripts/cuda-env.sh
source scripts/cuda-env.sh
[ -z "${HUNCH_CUDA_SITE:-}" ] || HUNCH_CUDA_SITE="$(cd "$HUNCH_CUDA_SITE" && pwd)"
lib_path="$(cuda_lib_dirs | paste -sd: -)"
driver="$(cuda_driver_lib)"
[ -z "$driver" ] || lib_path="${lib_path:+$lib_path:}$(dirname "$driver")"
echo "run-time libraries: ${lib_path:-none found} (driver: ${driver:-libcuda.so.1 not found})"
missing="$(LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bin" \
  | grep 'not found' | awk '{print $1}' | sort -u | paste -sd' ' - || true)"
if [ -z "$missing" ]; then
  LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin" --help | head -n1
  echo "hunch-accelerator starts with those libraries"
else
  echo "hunch-accelerator cannot start here: the loader does not find $missing"
  echo "(the nvidia-* packages provide all but libcuda.so.1, which is the NVIDIA driver's)"
fi
cuda_major="${backend#cuda}"
cat <<MSG

Run it on an NVIDIA machine with CUDA $cuda_major's nvidia-* Python packages (or pip-install them,
e.g. nvidia-cublas nvidia-cudnn-cu$cuda_major nvidia-cufft nvidia-cuda-nvrtc nvidia-nccl-cu$cuda_major):
  export LD_LIBRARY_PATH=\$(HUNCH_PYTHON=python3 bash -c 'source scripts/cuda-env.sh; cuda_lib_dirs' | paste -sd:)
  HUNCH_ACCELERATOR_BIN=$bin $out_dir/hunch serve --model NAME=DIR
MLX JIT-compiles kernels with NVRTC and finds CCCL in $mlx_dir/mlx/include/cccl (shipped in
the wheel), the CUDA headers in \$CUDA_HOME/include (default /usr/local/cuda). For a machine that
can fetch nothing, scripts/gpu-pack.sh packs these binaries with MLX for scripts/gpu-check.sh.
MSG
