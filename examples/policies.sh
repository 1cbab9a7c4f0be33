#!/usr/bin/env bash
# Decision policies over HTTP with curl.
#
#   cargo build --manifest-path policies/Cargo.toml --target wasm32-wasip2 --release
#   mkdir -p /tmp/policies
#   cp policies/target/wasm32-wasip2/release/invoice_vat.wasm   /tmp/policies/invoice-vat.wasm
#   cp policies/target/wasm32-wasip2/release/tool_firewall.wasm /tmp/policies/tool-firewall.wasm
#   hunch serve --policies /tmp/policies --admin-key secret ...   (see the server docs for readers)
#
# Then run this script (HUNCH=http://127.0.0.1:8080 by default).
set -euo pipefail
HUNCH=${HUNCH:-http://127.0.0.1:8080}
ADMIN_KEY=${ADMIN_KEY:-secret}
here=$(cd "$(dirname "$0")" && pwd)
wasm_dir=${WASM_DIR:-$here/../policies/target/wasm32-wasip2/release}

# What is deployed: name, version (content hash), schemas, limits, last reload status.
curl -s "$HUNCH/v1/policies" | head -c 2000; echo

# Deploy over HTTP (admin key): the body is the component; limits and reader as query parameters.
curl -s -X PUT "$HUNCH/v1/policies/ticket-router?max_reads=2&timeout_ms=5000" \
  -H "X-Admin-Key: $ADMIN_KEY" \
  -H "Content-Type: application/wasm" \
  --data-binary @"$wasm_dir/ticket_router.wasm"; echo

# Decide. The answer: output, policy, version, every read with its answers, usage, timings.
curl -s -X POST "$HUNCH/v1/policies/invoice-vat"   -H "Content-Type: application/json" -d @"$here/policies/invoice.json"; echo
curl -s -X POST "$HUNCH/v1/policies/tool-firewall" -H "Content-Type: application/json" -d @"$here/policies/tool-call.json"; echo
curl -s -X POST "$HUNCH/v1/policies/ticket-router" -H "Content-Type: application/json" -d @"$here/policies/ticket.json"; echo

# An input that breaks the declared schema is refused before the policy runs (422).
curl -s -X POST "$HUNCH/v1/policies/invoice-vat" -H "Content-Type: application/json" -d '{"lines": []}'; echo

# Remove a deployment.
curl -s -X DELETE "$HUNCH/v1/policies/ticket-router" -H "X-Admin-Key: $ADMIN_KEY" -o /dev/null -w "%{http_code}\n"
