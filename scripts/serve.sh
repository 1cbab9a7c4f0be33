#!/usr/bin/env bash
# Builds Hunch (release) and runs `hunch serve` on 127.0.0.1:8080. With no --model it serves the
# default model, SmolLM2-135M-Instruct (a 135M chat model: real answers, weak ones), which
# scripts/fetch-default-model.sh fetches into the models cache while the build compiles; pass
# `--model NAME=PATH` (a checkpoint directory or a .gguf file) for a better model, or `--demo` for
# the random DiffusionGemma demo. All arguments go to `hunch serve` (see `hunch serve --help`).
#
# It prints a line as each phase starts, with the seconds since it started, so that a first
# build's minutes of compiling read as progress (docs/benchmarks.md, "First answer").
# Env: HUNCH_BUILD_TIMINGS=1 adds cargo's --timings report (scripts/first-answer.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s.%N)
phase() { python3 -c 'import sys, time; print(f"serve: [{time.time() - float(sys.argv[1]):6.1f} s] {sys.argv[2]}", file=sys.stderr)' "$start" "$*"; }

phase "set-up: system packages and MLX's CPU library (scripts/setup.sh --serve)"
scripts/setup.sh --serve
# The default model (98 MB) downloads while the build compiles: network beside CPU.
model_log=$(mktemp)
trap 'rm -f "$model_log"' EXIT
scripts/fetch-default-model.sh >"$model_log" 2>&1 &
fetch=$!
if [[ -x target/release/hunch && -x target/release/hunch-accelerator ]]; then
  phase "build: hunch and hunch-accelerator (release; only what changed)"
else
  phase "build: hunch and hunch-accelerator (release): a first build compiles ~530 crates," \
    "about 7½ minutes on 2 cores; later runs build only what changed"
fi
cargo build --release -p hunch -p hunch-accelerator --bin hunch --bin hunch-accelerator ${HUNCH_BUILD_TIMINGS:+--timings}
if ! wait "$fetch"; then
  cat "$model_log" >&2
  echo "serve: the default model is not fetched (above: why); \`hunch serve\` needs --model" \
    "NAME=PATH or --demo until scripts/fetch-default-model.sh succeeds" >&2
fi
phase "serve: hunch serve $* (loads the model, then listens)"
exec target/release/hunch serve "$@"
