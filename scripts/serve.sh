#!/usr/bin/env bash
# Builds Hunch (release) and runs `hunch serve` on 127.0.0.1:8080. With no --model it serves the
# default model, SmolLM2-135M-Instruct (a 135M chat model: real answers, weak ones), which
# scripts/setup.sh fetches into the models cache (scripts/fetch-default-model.sh); pass
# `--model NAME=PATH` (a checkpoint directory or a .gguf file) for a better model, or `--demo` for
# the random DiffusionGemma demo. All arguments go to `hunch serve` (see `hunch serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p hunch -p hunch-accelerator --bin hunch --bin hunch-accelerator
exec target/release/hunch serve "$@"
