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
