#!/usr/bin/env bash
# The whole test suite: lint, migrations check, then pytest on PostgreSQL and Redis (unit, integration,
# browser). Fails with a clear message when PostgreSQL or Redis cannot be reached; never skips silently.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

PGHOST_=${LLMGW_TEST_PGHOST:-127.0.0.1}
PGPORT_=${LLMGW_TEST_PGPORT:-5432}
REDIS_=${LLMGW_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

need() {  # need NAME HOST PORT HOW-TO-START
  if ! "$BIN/python" - "$2" "$3" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError:
    sys.exit(1)
PY
  then
    echo "make test: $1 is not reachable at $2:$3. The tests run on a real $1; start it:" >&2
    echo "    $4" >&2
    exit 2
  fi
}
need PostgreSQL "$PGHOST_" "$PGPORT_" "pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start"
need Redis 127.0.0.1 6379 "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no"

# Chromium for the browser tests, from Debian's packages, when missing.
if ! command -v chromium >/dev/null 2>&1; then
  echo "make test: installing Debian's chromium for the browser tests"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || {
      echo "make test: could not install chromium (apt-get install chromium)" >&2; exit 2; }
  else
    echo "make test: chromium is missing; install it: sudo apt-get install chromium" >&2; exit 2
  fi
fi

# Prometheus and promtool (Debian's prometheus package) for the alert-rule tests and the Prometheus
# facility source, when missing.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "make test: installing Debian's prometheus for the rule tests and the Prometheus source"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus >/dev/null) || { echo "make test: could not install prometheus (apt-get install prometheus)" >&2; exit 2; }
  else
    echo "make test: prometheus is missing; install it: sudo apt-get install prometheus" >&2; exit 2
  fi
fi

# nginx (Debian's) for the compose proxy's test (tests/integration/test_deploy_units.py), when missing.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "make test: installing Debian's nginx for the compose proxy's test"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      nginx >/dev/null) || { echo "make test: could not install nginx (apt-get install nginx)" >&2; exit 2; }
  else
    echo "make test: nginx is missing; install it: sudo apt-get install nginx" >&2; exit 2
  fi
fi

echo "== ruff"
"$BIN/ruff" check .
echo "== lint-imports"
"$BIN/lint-imports"
echo "== docs (mkdocs build --strict; the reference pages written from the code)"
NO_MKDOCS_2_WARNING=1 LLMGW_DATA_DIR=$(mktemp -d) "$BIN/mkdocs" build --strict --quiet || {
  echo "make test: the docs do not build cleanly (mkdocs build --strict)" >&2; exit 1; }
echo "== migrations"
LLMGW_DATA_DIR=$(mktemp -d) "$BIN/llmgw" makemigrations --check --dry-run >/dev/null || {
  echo "make test: a model changed without its migration (llmgw makemigrations)" >&2; exit 1; }

echo "== pytest (PostgreSQL ${PGHOST_}:${PGPORT_}, Redis ${REDIS_})"
export DATABASE_URL="postgres://postgres@${PGHOST_}:${PGPORT_}/${LLMGW_TEST_DB:-llmgw}"  # the tests use test_<it>
export LLMGW_TEST_REDIS_URL="$REDIS_"
# A data directory of the run's own, never the one the environment names (make exports the demo's var/).
export LLMGW_DATA_DIR="$(mktemp -d)"
mkdir -p test-output
unset REDIS_URL
# The suite in worker processes (pytest-xdist), a test file each at a time: each worker has its own test
# database and Redis database (tests/conftest.py). Many tests mostly wait on the servers, workers and
# browsers they start, so one more worker than cores; LLMGW_TEST_WORKERS=0 runs it in one process.
WORKERS=${LLMGW_TEST_WORKERS:-$(( $(nproc) + 1 > 8 ? 8 : $(nproc) + 1 ))}
PARALLEL=()
if [ "$WORKERS" != 0 ]; then PARALLEL=(-n "$WORKERS" --dist loadfile); fi
echo "== pytest workers: ${WORKERS}"
exec "$BIN/pytest" -p no:cacheprovider --timeout=300 --durations=20 "${PARALLEL[@]}" "$@"
