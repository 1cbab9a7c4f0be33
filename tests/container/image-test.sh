#!/usr/bin/env bash
# End-to-end test of the container image (scripts/build-image.sh): runs it as Kubernetes would
# (read-only root file system, writable volumes for the cache, a mounted TOML file and policy
# directory, no capabilities) on the default model it ships (SmolLM2-135M-Instruct), asks it a
# question and runs a policy over HTTP, reads the gauges and the probes, then stops it and checks
# that it drained and exited 0. Then it runs the image once more with HUNCH_DEMO=1, the one check
# that needs the demo model: that it is made in the cache volume under a read-only root and
# answers.
#
#   tests/container/image-test.sh [IMAGE]          (default hunch:latest)
#
# Prints `N passed, N failed`; exits non-zero when a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
image="${1:-hunch:latest}"
name="hunch-image-test-$$"
work="$(mktemp -d "${TMPDIR:-/tmp}/hunch-image-test.XXXXXX")"
passed=0
failed=0
check() { # check "what" command...
  local what="$1"; shift
  if "$@"; then passed=$((passed + 1)); echo "ok: $what"
  else failed=$((failed + 1)); echo "FAILED: $what" >&2; fi
}
cleanup() {
  docker rm -f "$name" "$name-demo" >/dev/null 2>&1
  docker volume rm -f "$name-cache" "$name-data" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

docker image inspect "$image" >/dev/null 2>&1 || {
  echo "image-test: $image is not built (scripts/build-image.sh)" >&2; exit 1; }

# A TOML configuration file and a policy directory, mounted read-only as a ConfigMap would be.
mkdir -p "$work/etc" "$work/policies"
cat > "$work/etc/hunch.toml" <<'TOML'
api_keys = ["image-test-key"]
request_timeout = 120
drain_delay = 2
TOML
wasm=policies/target/wasm32-wasip2/release/ticket_router.wasm
if [ -f "$wasm" ]; then cp "$wasm" "$work/policies/ticket-router.wasm"; fi
chmod -R a+rX "$work"

docker volume create "$name-cache" >/dev/null && docker volume create "$name-data" >/dev/null
started=$(date +%s)
docker run -d --name "$name" \
  --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
  -v "$name-cache:/var/cache/hunch" -v "$name-data:/var/lib/hunch" \
  -v "$work/etc/hunch.toml:/etc/hunch/hunch.toml:ro" -v "$work/policies:/etc/hunch/policies:ro" \
  -e HUNCH_DECISION_LOG=/var/lib/hunch/decisions.jsonl \
  -p 127.0.0.1::8080 "$image" >/dev/null || { echo "image-test: docker run failed" >&2; exit 1; }
port="$(docker port "$name" 8080/tcp | head -n1 | sed 's/.*://')"
url="http://127.0.0.1:$port"
echo "image-test: $image as $name on $url"

# Ready: the sidecar loads the default model from the image's /usr/share/hunch/models.
ready=0
for _ in $(seq 1 300); do
  if curl -fsS -o /dev/null "$url/readyz" 2>/dev/null; then ready=1; break; fi
  if [ "$(docker inspect -f '{{.State.Running}}' "$name")" != true ]; then break; fi
  sleep 1
done
check "the container becomes ready ($(( $(date +%s) - started )) s)" test "$ready" = 1
if [ "$ready" != 1 ]; then docker logs "$name" 2>&1 | tail -40 >&2; fi

check "it runs as the non-root user hunch (uid 10001)" \
  test "$(docker exec "$name" id -u 2>/dev/null)" = 10001
check "its root file system is read-only" \
  test "$(docker inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$name")" = true
check "it serves the default model shipped in the image as jev-latest" python3 - "$url" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/models",
                             headers={"authorization": "Bearer image-test-key"})
names = [m["name"] for m in json.load(urllib.request.urlopen(req, timeout=10))["models"]]
assert "smollm2-135m-instruct" in names and "jev-latest" in names, names
PY
check "the sidecar runs on OpenBLAS" \
  sh -c "docker logs '$name' 2>&1 | grep -qiE 'blas[^a-z]*openblas'"

# The mounted TOML file is read: without its API key a request is refused.
body='{"model": "jev-latest", "state": "I was charged twice for my subscription!",
  "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"},
                "team": {"type": "choice", "instructions": "Which team?",
                         "criteria": {"billing": "Payments", "technical": null}}}}'
status=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/systemone" \
  -H 'content-type: application/json' -d "$body")
check "the mounted TOML's api_keys are enforced (401 without a key, got $status)" test "$status" = 401

curl -s -o "$work/answer.json" -w '%{http_code}' "$url/v1/systemone" \
  -H 'content-type: application/json' -H 'authorization: Bearer image-test-key' \
  -d "$body" > "$work/status"
check "a question is answered (200, got $(cat "$work/status"))" test "$(cat "$work/status")" = 200
check "the answers are a probability and a distribution that sums to 1" python3 - "$work/answer.json" <<'PY'
import json, sys
answer = json.load(open(sys.argv[1]))
answers = answer["answers"]
assert set(answers) == {"billing", "team"}, answers
assert 0.0 <= answers["billing"]["noul"] <= 1.0, answers
team = answers["team"]["probabilities"]
assert set(team) == {"billing", "technical"} and abs(sum(team.values()) - 1) < 1e-3, team
PY
if [ ! -s "$work/answer.json" ] || [ "$(cat "$work/status")" != 200 ]; then cat "$work/answer.json" >&2; fi

if [ -f "$work/policies/ticket-router.wasm" ]; then
  status=$(curl -s -o "$work/policy.json" -w '%{http_code}' "$url/v1/policies/ticket-router" \
    -H 'content-type: application/json' -H 'authorization: Bearer image-test-key' \
    -d @examples/policies/ticket.json)
  check "the policy from the mounted directory decides (200, got $status)" test "$status" = 200
  [ "$status" = 200 ] || cat "$work/policy.json" >&2
else
  echo "image-test: $wasm not built, the policy check is left out" >&2
  failed=$((failed + 1))
fi

curl -s "$url/metrics" > "$work/metrics"
for gauge in hunch_queued_requests hunch_running_requests hunch_prefix_cache_utilization; do
  check "/metrics has the gateway gauge $gauge" grep -q "^$gauge " "$work/metrics"
done
check "the prefix cache utilisation is a fraction" python3 - "$work/metrics" <<'PY'
import sys
value = [l.split()[1] for l in open(sys.argv[1]) if l.startswith("hunch_prefix_cache_utilization ")]
assert value and 0.0 <= float(value[0]) <= 1.0, value
PY

health=""
for _ in $(seq 1 30); do
  health="$(docker inspect -f '{{.State.Health.Status}}' "$name")"
  [ "$health" = healthy ] && break
  sleep 1
done
check "the image's HEALTHCHECK reports healthy (got $health)" test "$health" = healthy

# Stop as Kubernetes does (SIGTERM, then SIGKILL after the grace period): it drains and exits 0.
docker stop -t 60 "$name" >/dev/null
check "it exits 0 on SIGTERM (got $(docker inspect -f '{{.State.ExitCode}}' "$name"))" \
  test "$(docker inspect -f '{{.State.ExitCode}}' "$name")" = 0
docker logs "$name" > "$work/logs" 2>&1
check "it drained as the mounted TOML says: unready for 2 s, then the decision log flushed" \
  sh -c "grep 'still serving for the drain delay' '$work/logs' | grep -q 'drain_delay=2s' && grep -q 'decision log flushed' '$work/logs'"
if [ "$failed" -gt 0 ]; then tail -30 "$work/logs" >&2; fi

# The demo model, asked for explicitly (HUNCH_DEMO=1): generated into the cache volume at first
# start, which is the only place a read-only root lets it be written.
docker run -d --name "$name-demo" \
  --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
  -v "$name-cache:/var/cache/hunch" -e HUNCH_DEMO=1 \
  -p 127.0.0.1::8080 "$image" >/dev/null || { echo "image-test: docker run (demo) failed" >&2; exit 1; }
demo_url="http://127.0.0.1:$(docker port "$name-demo" 8080/tcp | head -n1 | sed 's/.*://')"
demo_ready=0
for _ in $(seq 1 300); do
  if curl -fsS -o /dev/null "$demo_url/readyz" 2>/dev/null; then demo_ready=1; break; fi
  if [ "$(docker inspect -f '{{.State.Running}}' "$name-demo")" != true ]; then break; fi
  sleep 1
done
check "with HUNCH_DEMO=1 the container becomes ready on the demo model" test "$demo_ready" = 1
if [ "$demo_ready" != 1 ]; then docker logs "$name-demo" 2>&1 | tail -40 >&2; fi
check "the demo model was made in the cache volume" \
  docker exec "$name-demo" test -f /var/cache/hunch/demo-v1/.complete
status=$(curl -s -o "$work/demo.json" -w '%{http_code}' "$demo_url/v1/systemone" \
  -H 'content-type: application/json' -d "$body")
check "the demo model answers (200, got $status)" test "$status" = 200
check "the demo model is hunch-demo" python3 -c \
  'import json, sys; assert json.load(open(sys.argv[1]))["model"] == "hunch-demo"' "$work/demo.json"
docker rm -f "$name-demo" >/dev/null 2>&1

echo "container: $passed passed, $failed failed"
[ "$failed" = 0 ]
