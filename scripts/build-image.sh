#!/usr/bin/env bash
# Builds Hunch's container image (deploy/Containerfile) here, from Debian packages and PyPI wheels
# only: nothing is pulled from a container registry.
#
#   scripts/build-image.sh [--profile release|dev] [--cuda13] [--tag TAG] [--base IMAGE]
#
# 1. The base: a Debian bookworm root file system made with debootstrap and imported into the
#    engine as `hunch-base:bookworm` (once; reused while that image exists). debootstrap needs
#    root: as another user this step runs its commands with sudo (and says so), and fails naming
#    what to do without it. `--base IMAGE` uses another base (e.g. debian:bookworm where a
#    registry is reachable) and needs no root.
# 2. The binaries: built with this machine's cargo (`--profile release`, the default; `dev`
#    reuses what `cargo test --workspace` built, which is how CI builds the image once per run),
#    MLX's CPU wheel from .mlx/cpu (scripts/fetch-mlx.sh). With --cuda13 the sidecar is built
#    against MLX's CUDA 13 wheel (scripts/build-cuda.sh) and the wheel is installed with the
#    NVIDIA libraries it depends on, from PyPI. The default model (SmolLM2-135M-Instruct, a 98 MB
#    GGUF) is copied from the models cache (scripts/fetch-default-model.sh fetches it when it is
#    not there) into the image's /usr/share/hunch/models/, where HUNCH_DEFAULT_MODEL points.
# 3. `docker build` with BINARIES=context: the image takes those binaries from the build context
#    (docs/deploy.md says why the Rust build does not run inside the image here), with the
#    engine's classic builder.
#
# Tags `hunch:latest` (`hunch:latest-cuda13` with --cuda13) unless --tag says otherwise, and
# prints the image's size.
# Env: HUNCH_DEBIAN_MIRROR (debootstrap's mirror), HUNCH_IMAGE_CONTEXT (the staging directory,
# default target/image-context).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
backend=cpu
tag=""
base="hunch-base:bookworm"
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs release or dev}"; shift 2 ;;
    --profile=*) profile="${1#--profile=}"; shift ;;
    --cuda13) backend=cuda13; shift ;;
    --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
    --tag=*) tag="${1#--tag=}"; shift ;;
    --base) base="${2:?--base needs an image}"; shift 2 ;;
    --base=*) base="${1#--base=}"; shift ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) out=release ;;
  dev) out=debug ;;
  *) echo "build-image: --profile is release or dev, not $profile" >&2; exit 2 ;;
esac
if [ -z "$tag" ]; then
  if [ "$backend" = cpu ]; then tag=hunch:latest; else tag="hunch:latest-$backend"; fi
fi
command -v docker >/dev/null || { echo "build-image: docker is not installed" >&2; exit 1; }
started=$(date +%s)

# --- 1. The base image ---------------------------------------------------------------------
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if [ "$base" != "hunch-base:bookworm" ]; then
    echo "build-image: the base image $base is not in the engine (pull or load it first)" >&2
    exit 1
  fi
  scripts/base-image.sh
fi

# --- 2. The binaries and MLX ---------------------------------------------------------------
context="${HUNCH_IMAGE_CONTEXT:-$PWD/target/image-context}"
rm -rf "$context"
mkdir -p "$context/prebuilt/bin" "$context/prebuilt/models" "$context/deploy"
# The default model first: a registry that cannot be reached fails the build before the compile.
default_model="$(scripts/fetch-default-model.sh)"
cp "$default_model" "$context/prebuilt/models/"
MLX_VERSION="$(tr -d '[:space:]' < accelerator/mlx-sys/MLX_VERSION)"
if [ "$backend" = cpu ]; then
  scripts/fetch-mlx.sh >/dev/null
  if [ "$profile" = dev ]; then
    # The same command line as scripts/test.sh (so nothing is rebuilt after a test run): it builds
    # the binaries of every package with integration tests, hunch and hunch-accelerator among them.
    # Its sidecar therefore has the test-only `fault-injection` hook (it acts only when
    # HUNCH_TEST_ENGINE_PANIC_ONCE is set): a dev image is CI's, never one to ship.
    cargo test --workspace --features hunch-accelerator/fault-injection --no-run
  else
    cargo build --release -p hunch -p hunch-accelerator
  fi
  cp "target/$out/hunch" "target/$out/hunch-accelerator" "$context/prebuilt/bin/"
  # .mlx may be a link; copy what it points at, keeping the wheel's layout (libmlx finds its
  # BLAS in ../../mlx_cpu.libs).
  mkdir -p "$context/prebuilt/mlx"
  cp -rL .mlx/cpu/mlx .mlx/cpu/mlx_cpu.libs "$context/prebuilt/mlx/"
else
  PROFILE="$profile" scripts/build-cuda.sh "$backend"
  cargo build --profile "$profile" -p hunch
  cp "target/$out/hunch" "$context/prebuilt/bin/"
  cp "target/$backend/$out/hunch-accelerator" "$context/prebuilt/bin/"
  # The CUDA wheel with the nvidia-* wheels it depends on (its libmlx finds them beside it).
  python3 -m pip install --quiet --no-compile --only-binary=:all: --target "$context/prebuilt/mlx" \
    "mlx-cuda-13==$MLX_VERSION"
  # MLX compiles kernels at run time against the CCCL headers shipped in the wheel: keep include/.
fi
# Debug information is for debugging builds, not for the image (symbols stay for backtraces).
strip --strip-debug "$context"/prebuilt/bin/*
cp deploy/Containerfile "$context/deploy/"
cp -r deploy/container "$context/deploy/"

# --- 3. The image --------------------------------------------------------------------------
# The classic builder: Debian's engine has no buildx, which BuildKit needs in the client.
DOCKER_BUILDKIT=0 docker build \
  -f "$context/deploy/Containerfile" \
  --build-arg BASE="$base" --build-arg BINARIES=context --build-arg MLX_BACKEND="$backend" \
  --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  --label "org.opencontainers.image.source=hunch" \
  -t "$tag" "$context"
size=$(docker image inspect --format '{{.Size}}' "$tag")
echo "build-image: $tag ($profile, $backend) is $(( size / 1024 / 1024 )) MiB;" \
  "built in $(( $(date +%s) - started )) s"
