#!/usr/bin/env bash
# Runs every test of the project, as CI does: unit tests, the model's golden parity, the read
# against the Python reference, the policies, and end-to-end tests of real `hunch serve`
# processes with the official TypeSafe SDK and jevbench.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# Policies are WebAssembly components built for wasm32-wasip2 in their own workspace.
if [ -f policies/Cargo.toml ]; then
  cargo build --quiet --manifest-path policies/Cargo.toml --target wasm32-wasip2 --release
  cargo test --manifest-path policies/Cargo.toml
fi
# `fault-injection` builds the sidecar with the engine-thread panic the supervisor test injects;
# no other build has it.
cargo test --workspace --features hunch-accelerator/fault-injection
# The integer kernels' aarch64 copies (NEON, dotprod, i8mm) under QEMU, each as the copy the
# emulated CPU detects (about half a minute warm; installs the cross linker and qemu-user from
# apt on first use). HUNCH_TEST_SKIP=aarch64 leaves them out on purpose.
if [[ ",${HUNCH_TEST_SKIP:-}," == *",aarch64,"* ]]; then
  echo "SKIPPED on purpose (HUNCH_TEST_SKIP lists aarch64): the kernels' aarch64 copies"
else
  scripts/test-aarch64.sh
fi
# The GPU pack's fat-binary pruner on a synthetic library (seconds; tests/gpu/imitation.sh, the
# packed GPU check in a container, is too heavy for CI: docs/mlx-on-linux.md).
python3 tests/gpu/test_prune_fatbin.py
# Where scripts/quality.sh keeps its reports for the server (the key both compute; seconds).
python3 scripts/test_quality_store.py

# The deployment (docs/deploy.md): the Kubernetes manifests validated offline, then the container
# image built once from this run's binaries (no second Rust build) and a container from it asked
# a question, then the fleet test: three containers of the same image behind HAProxy on Docker
# Compose, with faults (tests/fleet/). HUNCH_TEST_SKIP=container leaves the image and the fleet
# out on a machine without Docker; HUNCH_TEST_SKIP=fleet leaves out only the fleet.
scripts/validate-manifests.sh
if [[ ",${HUNCH_TEST_SKIP:-}," == *",container,"* ]]; then
  echo "SKIPPED on purpose (HUNCH_TEST_SKIP lists container): the container image, its test and" \
    "the fleet test"
else
  if ! docker info >/dev/null 2>&1; then
    echo "test: Docker Engine is not running; the image test needs it (or set" \
      "HUNCH_TEST_SKIP=container to skip it on purpose)" >&2
    exit 1
  fi
  scripts/build-image.sh --profile dev
  tests/container/image-test.sh hunch:latest
  if [[ ",${HUNCH_TEST_SKIP:-}," == *",fleet,"* ]]; then
    echo "SKIPPED on purpose (HUNCH_TEST_SKIP lists fleet): the fleet test"
  else
    tests/fleet/run.sh hunch:latest
  fi
fi
