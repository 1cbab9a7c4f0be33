#!/usr/bin/env bash
# Decision quality of a System One server (docs/quality.md):
#   scripts/quality.sh [--url URL] [--model NAME] [--max-requests N] [--out DIR] [--remedies LIST]
#                      [--quality-dir DIR]
# JevBench on the frozen subset tests/quality/jevbench (beside fake:coherent and fake:biased) and
# the labelled suite tests/quality/labelled.jsonl; writes DIR/quality.json and DIR/quality.md
# (default DIR: quality-report), and stores the report under its model's fingerprint in the
# quality directory (--quality-dir, $HUNCH_QUALITY_DIR, else ~/.cache/hunch/quality), where
# `hunch serve` shows it (GET /v1/models/NAME/quality). Without --url it starts `hunch serve`
# on the default model (target/release/hunch, else $HUNCH_BIN or hunch on PATH) and stops it
# after. The logic is scripts/quality.py, run by the repository's .venv python
# (scripts/python-env.sh makes it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${HUNCH_QUALITY_PYTHON:-$root/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
  echo "quality: $python not found: run scripts/python-env.sh (it makes .venv with jevbench)" >&2
  exit 1
fi
exec "$python" "$root/scripts/quality.py" "$@"
