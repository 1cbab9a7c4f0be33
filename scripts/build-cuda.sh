#!/usr/bin/env bash
# Builds the sidecar natively against MLX's CUDA wheel (no library swapping at run time):
#
#   scripts/build-cuda.sh [cuda13|cuda12]        (default cuda13; the H200 machines run CUDA 13)
#
# Fetches mlx-cuda-13 (or -12) 0.32.2 into .mlx/<backend>/ (or MLX_DIR), then builds
# hunch-accelerator and hunch in release into target/<backend>/ so the CPU build in target/ is
# left alone. Linking needs no GPU and no CUDA install (docs/mlx-on-linux.md); running needs an
# NVIDIA driver and the CUDA runtime libraries, which this script does not install.
#
# Env: MLX_DIR, HUNCH_MLX_WHEEL, HUNCH_PYTHON (as scripts/fetch-mlx.sh), CARGO_BUILD_ARGS (extra
# cargo arguments), PROFILE (release, or dev for a quicker link check).
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
# shellcheck disable=SC2086
cargo build --profile "$profile" -p hunch-accelerator --bin hunch-accelerator ${CARGO_BUILD_ARGS:-}
out_dir="$CARGO_TARGET_DIR/$([ "$profile" = dev ] && echo debug || echo "$profile")"
bin="$out_dir/hunch-accelerator"
echo "built $bin against $(basename "$mlx_dir") ($mlx_dir/mlx/lib/libmlx.so)"
if command -v readelf >/dev/null; then
  readelf -d "$bin" | grep -E 'RPATH|NEEDED' | sed 's/^/  /'
fi
cuda_major="${backend#cuda}"
cat <<MSG

Run it on an NVIDIA machine (the wheel's libmlx looks for the CUDA libraries in the nvidia-*
wheels next to it, then in the loader's path):
  export LD_LIBRARY_PATH=/usr/local/cuda-$cuda_major/targets/x86_64-linux/lib:\$LD_LIBRARY_PATH
  # or: pip install --target $mlx_dir nvidia-cuda-runtime nvidia-cublas nvidia-cudnn-cu$cuda_major ...
  $bin serve --model DIR            # bfloat16 activations by default on a GPU
MLX JIT-compiles kernels with NVRTC and finds CCCL in $mlx_dir/mlx/include/cccl (shipped in
the wheel).
MSG
