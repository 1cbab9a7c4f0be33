#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine that can fetch nothing and lacks MLX:
#
#   scripts/gpu-pack.sh          -> target/gpu-pack/ (ignored by git; it travels to the GPU
#                                   machine by being named in the device call's carry list)
#
# 1. Builds (scripts/build-cuda.sh cuda13, PROFILE as there; NO_BUILD=1 takes what is built) the
#    sidecar, hunch-ckpt and logits-bench against MLX's CUDA 13 wheel, and hunch and read-bench.
# 2. MLX's CUDA library for one GPU architecture: the wheel's libmlx.so (142 MB) carries kernels
#    for sm_75, sm_80, sm_90a, sm_100a, sm_120a, sm_121a and PTX for compute_120; an H200 can only
#    run the sm_90a ones. scripts/prune-fatbin.py keeps those (HUNCH_GPU_SM, default 90) and
#    zeroes the rest and the static symbol table in place, then checks with cuobjdump when one
#    is at hand (HUNCH_CUOBJDUMP, or the nvidia-cuda-cuobjdump package's).
# 3. What MLX's CUDA backend reads at run time: its include/ (CCCL, CuTe and CUTLASS headers,
#    which its NVRTC kernels include) and the wheel's BLAS/LAPACK (mlx_cuda_13.libs/). The CUDA
#    libraries themselves (cuBLAS, cuDNN, cuFFT, NVRTC, NCCL) are not packed: the GPU machine
#    has them in its Python's nvidia-* packages, and gpu-check.sh finds them there.
# 4. One tar, xz at its highest level (-9e), split into parts of at most 15 MiB, with
#    MANIFEST.txt (each part's size and sha256, what the pack holds, the commit and profile).
#    -9e took 623 s on the shared 2-core box; HUNCH_GPU_PACK_XZ=-6 (say) is quicker, and larger.
#
# Prints the pack's size with the working tree's (what travels) against the device's 64 MiB,
# and fails when the pack is over HUNCH_GPU_PACK_LIMIT_MIB (default 56).
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${PROFILE:-release}"
dir="$([ "$profile" = dev ] && echo debug || echo "$profile")"
sm="${HUNCH_GPU_SM:-90}"
limit_mib="${HUNCH_GPU_PACK_LIMIT_MIB:-56}"
mlx_dir="${MLX_DIR:-$PWD/.mlx/cuda13}"
bins="$PWD/target/cuda13/$dir"
pack="$PWD/target/gpu-pack"
stage="$PWD/target/gpu-pack-stage"
started=$SECONDS

if [ "${NO_BUILD:-0}" != 1 ]; then
  MLX_DIR="$mlx_dir" PROFILE="$profile" scripts/build-cuda.sh cuda13
fi
for b in hunch-accelerator hunch-ckpt logits-bench hunch read-bench; do
  [ -x "$bins/$b" ] || { echo "gpu-pack: $bins/$b is missing (run without NO_BUILD=1)" >&2; exit 1; }
done
[ -f "$mlx_dir/mlx/lib/libmlx.so" ] || { echo "gpu-pack: no $mlx_dir/mlx/lib/libmlx.so" >&2; exit 1; }

rm -rf "$stage" "$pack"
mkdir -p "$stage/hunch-gpu/bin" "$stage/hunch-gpu/mlx/lib" "$pack"
root="$stage/hunch-gpu"

# --- the binaries: debug information off (symbols stay, for backtraces) -----------------------
for b in hunch-accelerator hunch-ckpt logits-bench hunch read-bench; do
  cp "$bins/$b" "$root/bin/"
  strip --strip-debug "$root/bin/$b"
done

# --- MLX: libmlx.so for sm_$sm only, its run-time headers and bundled BLAS ---------------------
python3 scripts/prune-fatbin.py "$mlx_dir/mlx/lib/libmlx.so" "$root/mlx/lib/libmlx.so" \
  --sm "$sm" --drop-symtab
cuobjdump="${HUNCH_CUOBJDUMP:-}"
if [ -z "$cuobjdump" ]; then
  cuobjdump="$(command -v cuobjdump || ls "$PWD"/.whl/*/nvidia/cu*/bin/cuobjdump 2>/dev/null | head -n1 || true)"
fi
if [ -n "$cuobjdump" ] && [ -x "$cuobjdump" ]; then
  archs="$("$cuobjdump" --list-elf "$root/mlx/lib/libmlx.so" | sed -n 's/.*\.\(sm_[0-9a-z]*\)\.cubin$/\1/p' | sort | uniq -c | xargs)"
  echo "gpu-pack: cuobjdump lists in the pruned libmlx.so: $archs"
  case "$archs" in
    *" sm_$sm"*) ;;
    *) echo "gpu-pack: the pruned library has no sm_$sm code" >&2; exit 1 ;;
  esac
else
  echo "gpu-pack: no cuobjdump here (pip download nvidia-cuda-cuobjdump, or set HUNCH_CUOBJDUMP);" \
    "prune-fatbin.py's own re-parse is the only check"
fi
cp -r "$mlx_dir/mlx/include" "$root/mlx/"
mlx_libs="$(cd "$mlx_dir" && ls -d mlx_cuda_*.libs)"
cp -r "$mlx_dir/$mlx_libs" "$root/"
cp "$mlx_dir/mlx/include/mlx/version.h" "$root/mlx/version.h" 2>/dev/null || true

# --- the archive -------------------------------------------------------------------------------
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
{
  echo "commit $commit"
  echo "profile $profile"
  echo "mlx $(tr -d '[:space:]' < accelerator/mlx-sys/MLX_VERSION) (mlx-cuda-13 wheel), sm_$sm"
} > "$root/BUILD"
tar_started=$SECONDS
tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name -cf - hunch-gpu \
  | xz "${HUNCH_GPU_PACK_XZ:--9e}" -T0 -c > "$stage/hunch-gpu.tar.xz"
split -b 15M -d -a 2 "$stage/hunch-gpu.tar.xz" "$pack/hunch-gpu.tar.xz.part-"
compress_s=$(( SECONDS - tar_started ))

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
{
  echo "# scripts/gpu-pack.sh: what scripts/gpu-check.sh unpacks on the GPU machine"
  cat "$root/BUILD"
  echo "# parts (concatenate in order; one xz-compressed tar):"
  for part in "$pack"/hunch-gpu.tar.xz.part-*; do
    echo "part $(basename "$part") $(stat -c %s "$part") $(sha256sum "$part" | cut -d' ' -f1)"
  done
  echo "# contents, unpacked (bytes):"
  (cd "$stage" && du -sb hunch-gpu/bin/* hunch-gpu/mlx/lib/libmlx.so hunch-gpu/mlx/include \
    "hunch-gpu/$mlx_libs" | sed 's/^/# /')
} > "$pack/MANIFEST.txt"

pack_bytes=$(du -cb "$pack"/* | tail -n1 | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n1 | cut -f1)
unpacked=$(du -sb "$root" | cut -f1)
echo
echo "gpu-pack: target/gpu-pack/ holds $(ls "$pack" | wc -l) files, $(mib "$pack_bytes")" \
  "($(mib "$unpacked") unpacked; xz ${HUNCH_GPU_PACK_XZ:--9e} in $compress_s s; $(( SECONDS - started )) s in all):"
(cd "$stage" && du -sb hunch-gpu/bin/* hunch-gpu/mlx/lib/libmlx.so hunch-gpu/mlx/include "hunch-gpu/$mlx_libs") \
  | while read -r bytes path; do printf '  %-40s %s\n' "${path#hunch-gpu/}" "$(mib "$bytes")"; done
echo "gpu-pack: pack $(mib "$pack_bytes") + working tree $(mib "$tree_bytes") = $(mib $(( pack_bytes + tree_bytes )))" \
  "of the device's 64 MiB (pack limit $limit_mib MiB)"
rm -rf "$stage"
if [ "$pack_bytes" -gt $(( limit_mib * 1048576 )) ]; then
  echo "gpu-pack: the pack is over $limit_mib MiB: it would not travel with the tree" >&2
  exit 1
fi
