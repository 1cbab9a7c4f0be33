#!/usr/bin/env bash
# Measures the README's first command the way a newcomer meets it: a fresh clone of this
# repository, `scripts/serve.sh`, and the time until `POST /v1/systemone` first answers 200 with
# the real default model. Prints the time of each phase (from serve.sh's own phase lines: set-up,
# build, serve to the first answer) and keeps cargo's build-timings report (`--timings`).
#
#   scripts/first-answer.sh [DIR]     clone HEAD into DIR (default: a new temporary directory)
#
# For a newcomer's figure, run it on a machine where nothing was built or downloaded before (an
# empty ~/.cargo/registry, no models cache): docs/benchmarks.md, "First answer". It runs serve.sh
# itself; the only addition is HUNCH_BUILD_TIMINGS=1 (cargo's --timings report, which costs
# nothing measurable).
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
t_clone=$(now)
HUNCH_BUILD_TIMINGS=1 scripts/serve.sh --listen "127.0.0.1:$port" >"$dir/serve.log" 2>&1 &
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
    echo "first-answer: serve.sh exited; its log:" >&2; cat "$dir/serve.log" >&2; exit 1
  fi
  code=$(curl -s -o "$dir/answer.json" -w '%{http_code}' "127.0.0.1:$port/v1/systemone" \
    -H 'content-type: application/json' -d "$body" 2>/dev/null || true)
  [[ "$code" == 200 ]] && break
  sleep 0.5
done
t_answer=$(now)
# serve.sh's phase lines: "serve: [  12.3 s] build: ..." (seconds since serve.sh started).
at() { sed -n "s/^serve: \[ *\([0-9.]*\) s\] $1.*/\1/p" "$dir/serve.log" | head -1; }
t_build=$(python3 -c "print($t_clone + $(at build:))")
t_serve=$(python3 -c "print($t_clone + $(at serve:))")
echo "first-answer: answer: $(head -c 300 "$dir/answer.json")"
echo "first-answer: phases as serve.sh printed them:"; grep '^serve: \[' "$dir/serve.log" | sed 's/^/  /'
echo "first-answer: clone + setup $(span "$t0" "$t_build")  (clone, apt, MLX wheel)"
echo "first-answer: build         $(span "$t_build" "$t_serve")  (the model downloads meanwhile)"
echo "first-answer: serve         $(span "$t_serve" "$t_answer")  (start, model load, first read)"
echo "first-answer: total         $(span "$t0" "$t_answer")  fresh clone -> first 200"
echo "first-answer: build timings: $(ls -1 "$dir"/target/cargo-timings/cargo-timing-*.html 2>/dev/null | tail -1)"
