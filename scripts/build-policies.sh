#!/usr/bin/env bash
# Builds the example decision policies and puts them where `hunch serve --policies DIR` serves
# them: DIR/NAME.wasm, NAME the URL segment (`/v1/policies/ticket-router`).
#
#   scripts/build-policies.sh [DIR]      (default target/policies)
#
# policies/ holds the policies' sources (a Cargo workspace for wasm32-wasip2); the build writes
# policies/target/wasm32-wasip2/release/NAME.wasm with the crate's underscores (ticket_router),
# which is neither the directory a server should watch nor the name it should serve. Only the
# examples are copied: `hostile` and `replay-probe*` are test policies.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/policies}"
if command -v rustup >/dev/null 2>&1; then
  rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
fi
cargo build --quiet --manifest-path policies/Cargo.toml --target wasm32-wasip2 --release
mkdir -p "$dir"
for name in ticket-router tool-firewall invoice-vat; do
  cp "policies/target/wasm32-wasip2/release/${name//-/_}.wasm" "$dir/$name.wasm"
done
echo "build-policies: ticket-router, tool-firewall, invoice-vat in $dir"
