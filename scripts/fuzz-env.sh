#!/usr/bin/env bash
# Creates .venv-fuzz/ with schemathesis, the property-based API fuzzer that
# tests/tests/openapi.rs runs against a real server's /openapi.json. Its own venv: schemathesis
# and its dependencies (hypothesis, ...) stay apart from the SDK pins of .venv. Pinned to the
# version the test's command line was written against. Wheels in $HUNCH_WHEELS (default
# /tmp/wheels) are used when present; everything else comes from PyPI. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${HUNCH_WHEELS:-/tmp/wheels}"
VERSION=4.32.5
if [ ! -x .venv-fuzz/bin/python ]; then
  "$PYTHON" -m venv .venv-fuzz
fi
find_links=()
if [ -d "$WHEELS" ]; then
  find_links=(--find-links "$WHEELS")
fi
.venv-fuzz/bin/python -m pip install --quiet --disable-pip-version-check "${find_links[@]}" \
  "schemathesis==$VERSION"
.venv-fuzz/bin/schemathesis --version
