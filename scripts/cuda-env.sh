# Finds, at run time, what MLX's CUDA library needs from the machine it runs on: the CUDA
# libraries of the Python `nvidia-*` packages, the NVIDIA driver's libcuda.so.1 and a CUDA
# include folder for MLX's run-time kernel compiler (NVRTC). Sourced by scripts/build-cuda.sh and
# scripts/gpu-check.sh; nothing here names a CUDA version or a fixed site-packages path.
#
#   cuda_lib_dirs           the `lib` folders of every installed nvidia-* package, one a line:
#                           `nvidia` is a namespace package, so its __path__ lists each
#                           site-packages folder holding one (HUNCH_PYTHON, default python3;
#                           HUNCH_CUDA_SITE=DIR adds DIR/nvidia/*/lib first)
#   cuda_driver_lib         the path of the driver's libcuda.so.1, or nothing
#   cuda_include_home       a folder whose include/ has cuda_runtime.h (for CUDA_HOME), or nothing
# shellcheck shell=bash

cuda_lib_dirs() {
  local site
  if [ -n "${HUNCH_CUDA_SITE:-}" ]; then
    for site in "$HUNCH_CUDA_SITE"/nvidia/*/lib; do
      [ -d "$site" ] && echo "$site"
    done
  fi
  "${HUNCH_PYTHON:-python3}" - <<'PY' 2>/dev/null || true
import os
try:
    import nvidia  # a namespace package: one folder per site-packages holding nvidia-* wheels
except ImportError:
    raise SystemExit(0)
for base in list(nvidia.__path__):
    for name in sorted(os.listdir(base)):
        lib = os.path.join(base, name, "lib")
        if os.path.isdir(lib):
            print(lib)
PY
}

cuda_driver_lib() {
  local found dir
  # The loader's cache first (where a driver installed by packages is), then the folders NVIDIA's
  # container runtimes mount the driver into, then the loader path the caller already set.
  found="$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) \
    | sed -n 's/^[[:space:]]*libcuda\.so\.1 (.*x86-64.*) => //p' | head -n1)"
  if [ -n "$found" ] && [ -e "$found" ]; then echo "$found"; return; fi
  local IFS=:
  for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
    ${LD_LIBRARY_PATH:-}; do
    if [ -n "$dir" ] && [ -e "$dir/libcuda.so.1" ]; then echo "$dir/libcuda.so.1"; return; fi
  done
}

cuda_include_home() {
  local home
  for home in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [ -n "$home" ] && [ -f "$home/include/cuda_runtime.h" ]; then echo "$home"; return; fi
  done
  # Else the headers of the nvidia-cuda-runtime package (nvidia/cu13/include), which is where
  # MLX itself looks when it is pip-installed beside them.
  local lib
  while IFS= read -r lib; do
    if [ -f "$lib/../include/cuda_runtime.h" ]; then (cd "$lib/.." && pwd); return; fi
  done < <(cuda_lib_dirs)
}
