#!/usr/bin/env bash
# The benches at small sizes (a minute or two on a laptop), printing their figures. Sizes from the
# environment: BENCH_NODES (default 200), BENCH_SECONDS (heartbeat load, default 5). PostgreSQL from
# DATABASE_URL (default postgres://postgres@127.0.0.1:5432/llmgw); each bench makes its own database.
# Larger runs: call bench/*.py directly (see each file's docstring).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
NODES=${BENCH_NODES:-200}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/llmgw}
export PYTHONPATH=$PWD

echo "== planner (pure, no database): $NODES nodes"
"$PY" bench/planner.py --nodes "$NODES" --plain-sample 20
echo "== placements (PostgreSQL): $NODES nodes"
"$PY" bench/placements.py --nodes "$NODES" --per-model 20 --skip-planner
echo "== heartbeats (PostgreSQL, HTTP): $NODES nodes, ${BENCH_SECONDS:-5} s"
"$PY" bench/heartbeats.py --nodes "$NODES" --workers 1 --connections 8 --seconds "${BENCH_SECONDS:-5}"
