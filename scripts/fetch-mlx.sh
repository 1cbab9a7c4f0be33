#!/usr/bin/env bash
# Fetch and unpack the prebuilt MLX that accelerator/mlx-sys links, exactly as its build.rs would:
# into <repo>/.mlx/<backend>/ (wheel cached in <repo>/.mlx/wheels/). CI can cache `.mlx/`.
#   HUNCH_MLX_BACKEND=cpu|cuda13|cuda12|metal (default: metal on macOS, cpu elsewhere)
#   MLX_DIR=/path                        unpack there instead of <repo>/.mlx/<backend>/
#   HUNCH_MLX_WHEEL=/path/to/wheel.whl   use this wheel instead of downloading
#   HUNCH_PYTHON=python3                 the interpreter whose pip downloads
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The one pin, shared with accelerator/mlx-sys/build.rs.
MLX_VERSION="$(tr -d '[:space:]' < "$root/accelerator/mlx-sys/MLX_VERSION")"
python="${HUNCH_PYTHON:-python3}"
backend="${HUNCH_MLX_BACKEND:-}"
if [[ -z "$backend" ]]; then
  if [[ "$(uname -s)" == Darwin ]]; then backend=metal; else backend=cpu; fi
fi
case "$backend" in
  cpu) dist=mlx-cpu ;;
  cuda12 | cuda-12) backend=cuda12; dist=mlx-cuda-12 ;;
  cuda13 | cuda-13 | cuda) backend=cuda13; dist=mlx-cuda-13 ;;
  metal) dist=mlx-metal ;;
  *) echo "HUNCH_MLX_BACKEND=$backend is not known; use cpu, cuda13, cuda12 or metal" >&2; exit 2 ;;
esac
dest="${MLX_DIR:-$root/.mlx/$backend}"
if [[ -f "$dest/mlx/include/mlx/mlx.h" ]]; then
  echo "MLX already unpacked in $dest"
  exit 0
fi
wheel="${HUNCH_MLX_WHEEL:-}"
if [[ -z "$wheel" ]]; then
  mkdir -p "$root/.mlx/wheels"
  prefix="${dist//-/_}-$MLX_VERSION-"
  wheel="$(ls "$root/.mlx/wheels/$prefix"*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    "$python" -m pip download --no-deps --only-binary=:all: -d "$root/.mlx/wheels" "$dist==$MLX_VERSION"
    wheel="$(ls "$root/.mlx/wheels/$prefix"*.whl | head -n1)"
  fi
fi
mkdir -p "$(dirname "$dest")"
staging="$(dirname "$dest")/.unpack-$backend-$$"
rm -rf "$staging"
"$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$staging"
mv "$staging" "$dest"
echo "MLX $MLX_VERSION ($dist) unpacked in $dest"
