#!/usr/bin/env bash
# Nothing is deployed yet: the apps keep one initial migration set, made anew from the models.
# Run after merging model changes: it deletes every migration and writes the initial set again.
set -euo pipefail
cd "$(dirname "$0")/.."
for app in agents facility placement; do
  find "$app/migrations" -name '0*.py' -delete
done
LLMGW_DATA_DIR=$(mktemp -d) .venv/bin/llmgw makemigrations agents facility placement
.venv/bin/ruff check --fix -q agents/migrations facility/migrations placement/migrations || true
