#!/usr/bin/env bash
# Create (or update) the virtual environment of the Python reference read.
#   tests/reference/setup.sh [VENV_DIR]      (default: .venv-reference)
# Idempotent: an existing venv whose packages already match is left alone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-.venv-reference}"
python="${PYTHON:-python3}"
mlx_vlm_pin="mlx-vlm==0.7.10"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# keep the venv out of git wherever it lives (as Python 3.13's venv does)
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"
stamp="$venv/.hunch-reference-stamp"
want="$(cat "$here/requirements.txt"; echo "$mlx_vlm_pin")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" install -r "$here/requirements.txt"
"${pip[@]}" install --no-deps "$mlx_vlm_pin"
"$venv/bin/python" -c "import mlx.core, numpy, tokenizers, safetensors, PIL, jinja2"
printf '%s' "$want" > "$stamp"
