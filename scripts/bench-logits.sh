#!/usr/bin/env bash
# The label-logit read against llama.cpp, side by side in one run on the same GGUF, the same
# token ids and the same cores (docs/benchmarks.md, "Label-logit read against llama.cpp").
#
#   scripts/bench-logits.sh [--model M.gguf|DIR] [logits-bench flags...]
#
# 1. Builds llama-cpp-python from source (pinned below) into .venv-llama-cpp, once, for this
#    machine's CPU (GGML_NATIVE: the widest vector instructions it has, as a user building
#    llama.cpp here would get; HUNCH_LLAMA_CPP_NATIVE=0 builds the portable AVX2 variant).
#    Two cores take 10-25 minutes for it; later runs reuse the venv.
# 2. Builds Hunch in release as scripts/serve.sh does, with the bench binary beside it.
# 3. Runs `logits-bench` in both question modes (isolated, joint) with the peer: per-question
#    latency (p50 of the warm rounds), prompt tokens per second, the ratio Hunch / llama.cpp, the
#    machine and BLAS. A Hugging Face folder is read by mlx-lm beside Hunch instead (its venv,
#    .venv-mlx-lm, made once: pip install mlx[cpu] mlx-lm).
# 4. Sends the same requests through `hunch serve` (scripts/bench_logits_http.py: a fresh server
#    per round, three questions per POST /v1/systemone) and prints that per-question time and
#    its ratio to llama.cpp's.
#
# Env: HUNCH_BENCH_MODES (default "isolated joint"), HUNCH_BENCH_ROUNDS (default 3),
# HUNCH_LLAMA_CPP_VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
model="${HOME}/.cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf"
rest=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
[[ -e "$model" ]] || { echo "bench-logits: no model at $model (scripts/fetch-default-model.sh)" >&2; exit 2; }

version="${HUNCH_LLAMA_CPP_VERSION:-0.3.36}"
venv="$root/.venv-llama-cpp"
native="${HUNCH_LLAMA_CPP_NATIVE:-1}"
native_flag=$([[ "$native" == 1 ]] && echo ON || echo OFF)
stamp="$venv/.built-$version-native-$native_flag"
if [[ ! -e "$stamp" ]]; then
  echo "bench-logits: building llama-cpp-python $version from source (GGML_NATIVE=$native_flag)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q numpy scikit-build-core cmake ninja
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  CMAKE_ARGS="-DGGML_NATIVE=$native_flag -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DGGML_OPENMP=OFF" \
    "$venv/bin/pip" install -q --no-build-isolation --no-binary llama-cpp-python \
    "llama-cpp-python==$version"
  touch "$stamp"
fi

eval "$(grep '^cargo build' scripts/serve.sh) --bin logits-bench"
[[ "${HUNCH_BENCH_MODES:-}" == none ]] && exit 0  # build only

peer=()
case "$model" in
  *.gguf) peer=(--peer-python "$venv/bin/python") ;;
  *)
    # A Hugging Face folder: llama.cpp cannot read it; mlx-lm can (its own venv, MLX's CPU wheel).
    mlx_lm_venv="$root/.venv-mlx-lm"
    if [[ ! -x "$mlx_lm_venv/bin/python" ]] || ! "$mlx_lm_venv/bin/python" -c 'import mlx_lm' 2>/dev/null; then
      python3 -m venv "$mlx_lm_venv"
      "$mlx_lm_venv/bin/pip" install -q "mlx[cpu]==$(cat accelerator/mlx-sys/MLX_VERSION)" mlx-lm
    fi
    peer=(--peer-python "$mlx_lm_venv/bin/python") ;;
esac
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)'); llama.cpp: llama-cpp-python $version, GGML_NATIVE=$native_flag"
rounds="${HUNCH_BENCH_ROUNDS:-3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in ${HUNCH_BENCH_MODES:-isolated joint}; do
  echo "--- mode $mode"
  target/release/logits-bench --model "$model" --mode "$mode" --rounds "$rounds" \
    --dump-requests "$tmp/requests.jsonl" "${peer[@]}" "${rest[@]}" | tee "$tmp/bench.txt"
  # The same requests through `hunch serve` (host, HTTP, sidecar), a fresh server per round.
  python3 scripts/bench_logits_http.py target/release/hunch "$model" "$tmp/requests.jsonl" \
    "$rounds" > "$tmp/http.json"
  python3 - "$tmp/http.json" "$tmp/bench.txt" <<'PY'
import json, re, statistics, sys
rounds = json.load(open(sys.argv[1]))["rounds"][1:]
per_q = [sum(r["seconds"] for r in rows) / (3 * len(rows)) for rows in rounds]
p50 = statistics.median(per_q)
spread = f"{min(per_q) * 1e3:.1f}-{max(per_q) * 1e3:.1f}"
print(f"hunch http : {p50 * 1e3:.1f} ms/question (p50 of {len(rounds)} rounds, {spread}), "
      f"POST /v1/systemone of 3 questions through hunch serve")
m = re.search(r"^(llama\.cpp|mlx-lm) +: ([0-9.]+) ms/question", open(sys.argv[2]).read(), re.M)
if m:
    print(f"ratio hunch http / {m.group(1)} (time per question): {p50 * 1e3 / float(m.group(2)):.2f}x")
PY
done
