#!/usr/bin/env bash
# Ask a running Hunch (scripts/serve.sh) the TypeSafe quickstart questions with curl.
#   examples/systemone.sh [BASE_URL]
set -euo pipefail
base="${1:-http://127.0.0.1:8080}"
curl -sS "$base/v1/systemone" -H 'content-type: application/json' -d @- <<'JSON'
{"model": "jev-latest",
 "state": "Hi, I was charged twice for my subscription this month and the app keeps crashing when I open my invoices. I need this fixed today.",
 "questions": {
   "team": {"type": "choice", "instructions": "Which team should handle this",
            "criteria": {"billing": "Payment or subscription issues",
                         "technical": "Bugs, errors, or product not working",
                         "sales": "Questions about buying or upgrading"}},
   "frustration": {"type": "score", "instructions": "How frustrated the customer appears",
                   "criteria": ["Calm, just stating facts", "Mildly annoyed", "Very frustrated or angry"]},
   "urgent": {"type": "noul", "instructions": "The message conveys urgency or time-sensitivity"}}}
JSON
echo
