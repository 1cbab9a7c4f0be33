#!/usr/bin/env bash
# The fleet test (docs/deploy.md, "The fleet test"): three replicas of the image behind HAProxy,
# a bundle server and a decision-log collector on Docker Compose, with faults. Builds the tools
# image (HAProxy, nginx, Python from Debian on hunch-base:bookworm) when it is missing or its
# Containerfile changed, then runs tests/fleet/fleet-test.py.
#
#   tests/fleet/run.sh [IMAGE] [fleet-test.py options...]      (default hunch:latest)
#
# Needs: Docker Engine, docker-compose, the image (scripts/build-image.sh, which also makes
# hunch-base:bookworm), target/debug/hunch (for `hunch bundle build`) and the policies' wasm.
set -euo pipefail
cd "$(dirname "$0")/../.."
image="${1:-hunch:latest}"
[ $# -gt 0 ] && shift
tools=hunch-fleet-tools
command -v docker-compose >/dev/null || {
  echo "fleet: docker-compose is not installed (or set HUNCH_TEST_SKIP=fleet to skip this test)" >&2
  exit 1
}
docker image inspect "$image" >/dev/null 2>&1 || {
  echo "fleet: $image is not built (scripts/build-image.sh --profile dev)" >&2; exit 1; }
docker image inspect hunch-base:bookworm >/dev/null 2>&1 || {
  echo "fleet: hunch-base:bookworm is missing (scripts/build-image.sh makes it)" >&2; exit 1; }
want="$(sha256sum tests/fleet/tools.Containerfile | cut -c1-16)"
have="$(docker image inspect -f '{{index .Config.Labels "io.hunch.fleet-tools"}}' "$tools" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
  echo "fleet: building $tools"
  DOCKER_BUILDKIT=0 docker build -q --label "io.hunch.fleet-tools=$want" -t "$tools" \
    -f tests/fleet/tools.Containerfile tests/fleet >/dev/null
fi
exec python3 tests/fleet/fleet-test.py --image "$image" --tools-image "$tools" "$@"
