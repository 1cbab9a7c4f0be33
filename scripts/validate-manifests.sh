#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/kubernetes) offline: renders the base and every
# overlay, validates each object against the Kubernetes schemas bundled in the PyPI package
# kubernetes-validate (custom resources against deploy/kubernetes/schemas/), and checks what
# docs/deploy.md promises of them. Installs kubernetes-validate into .venv-deploy/ once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-deploy
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "kubernetes-validate==1.37.0"
fi
exec "$venv/bin/python" deploy/kubernetes/validate.py
