#!/usr/bin/env bash
# Creates .venv/ with the official TypeSafe Python SDK (with zstd) and jevbench, pinned to the versions
# the end-to-end tests were written against. Wheels in $HUNCH_WHEELS (default /tmp/wheels) are used when
# present; everything else comes from PyPI. Idempotent: rerunning only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${HUNCH_WHEELS:-/tmp/wheels}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
find_links=()
if [ -d "$WHEELS" ]; then
  find_links=(--find-links "$WHEELS")
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${find_links[@]}" \
  "typesafe-sdk[zstd]==0.7.5" "jevbench==0.1.0"
.venv/bin/python -c "import typesafe_sdk, jevbench; from typesafe_sdk._core.compression import COMPRESSORS; assert 'zstd' in COMPRESSORS, 'zstd compressor missing'; print('python env ok: typesafe-sdk', typesafe_sdk.__version__ if hasattr(typesafe_sdk, '__version__') else '0.7.5', 'with zstd; jevbench')"
