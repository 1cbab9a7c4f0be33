#!/usr/bin/env bash
# Builds Hunch (release) and runs `hunch serve` on 127.0.0.1:8080. With no --model it serves a
# small generated demo model whose answers carry no meaning; pass `--model NAME=DIR` for a real
# DiffusionGemma checkpoint. All arguments go to `hunch serve` (see `hunch serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p hunch -p hunch-accelerator
exec target/release/hunch serve "$@"
