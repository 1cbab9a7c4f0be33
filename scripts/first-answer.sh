#!/usr/bin/env bash
# Measures the README's first command the way a newcomer meets it: a fresh clone of this
# repository, `scripts/serve.sh`, and the time until `POST /v1/systemone` first answers 200 with
# the real default model. Prints the time of each phase (setup, build, serve to the first answer)
# and keeps cargo's build-timings report (`--timings`) for the build.
#
#   scripts/first-answer.sh [DIR]     clone HEAD into DIR (default: a new temporary directory)
#
# For a newcomer's figure, run it on a machine where nothing was built or downloaded before (an
# empty ~/.cargo/registry, no models cache): docs/benchmarks.md, "First answer". The build runs as
# serve.sh runs it; the only addition is `--timings` (cargo's report costs nothing measurable).
#
# Env: HUNCH_FIRST_ANSWER_PORT (default 18080).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$(mktemp -d /tmp/hunch-first-answer.XXXXXX)}"
port="${HUNCH_FIRST_ANSWER_PORT:-18080}"
now() { date +%s.%N; }
span() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):7.1f} s')" "$1" "$2"; }

t0=$(now)
git clone -q "$src" "$dir"
cd "$dir"
echo "first-answer: clone of $(git rev-parse --short HEAD) in $dir ($(nproc) cores)"

# serve.sh's own steps, one at a time so that each is timed.
grep -q '^scripts/setup.sh$' scripts/serve.sh || { echo "first-answer: serve.sh changed; update this script" >&2; exit 2; }
scripts/setup.sh
t_setup=$(now)
build_line=$(grep '^cargo build' scripts/serve.sh)
eval "$build_line --timings"
t_build=$(now)
exec_line=$(grep '^exec ' scripts/serve.sh | sed 's/^exec //; s/"\$@"//')
$exec_line --listen "127.0.0.1:$port" >"$dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT

body='{"model": "jev-latest",
  "state": "I was charged twice for my subscription and the app keeps crashing!",
  "questions": {
    "team": {"type": "choice", "instructions": "Which team should handle this",
             "criteria": {"billing": "Payment or subscription issues", "technical": "Bugs, errors", "sales": null}},
    "urgency": {"type": "score", "instructions": "How frustrated the customer appears",
                "criteria": ["Calm", "Mildly annoyed", "Very frustrated"]},
    "urgent": {"type": "noul", "instructions": "The message conveys urgency"}}}'
while :; do
  if ! kill -0 $server 2>/dev/null; then
    echo "first-answer: the server exited; its log:" >&2; cat "$dir/serve.log" >&2; exit 1
  fi
  code=$(curl -s -o "$dir/answer.json" -w '%{http_code}' "127.0.0.1:$port/v1/systemone" \
    -H 'content-type: application/json' -d "$body" 2>/dev/null || true)
  [[ "$code" == 200 ]] && break
  sleep 0.5
done
t_answer=$(now)
echo "first-answer: answer: $(head -c 300 "$dir/answer.json")"
echo "first-answer: setup        $(span "$t0" "$t_setup")  (clone, apt, MLX wheel, default model)"
echo "first-answer: build        $(span "$t_setup" "$t_build")"
echo "first-answer: serve        $(span "$t_build" "$t_answer")  (start, model load, first read)"
echo "first-answer: total        $(span "$t0" "$t_answer")  fresh clone -> first 200"
echo "first-answer: build timings: $(ls -1 "$dir"/target/cargo-timings/cargo-timing-*.html 2>/dev/null | tail -1)"
