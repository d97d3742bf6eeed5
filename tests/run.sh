#!/usr/bin/env bash
# Install Keystone with its dev tools into a virtualenv (created if missing) and run the tests:
#   1. the whole suite on PostgreSQL: TEST_DATABASE_URL or DATABASE_URL, else the server on
#      127.0.0.1:5432, else a throwaway cluster started here (initdb + pg_ctl) and deleted after;
#      with no PostgreSQL binaries at all, this pass is skipped with a one-line note
#   2. the tests marked `embedded` again on the zero-configuration SQLite default.
# The Celery tests start a redis-server of their own (KEYSTONE_TEST_BROKER_URL overrides).
# Extra arguments go to both pytest runs, e.g. `bash tests/run.sh -x -k baseline`.
# Env: KEYSTONE_VENV (default .venv), PYTHON (default python3), TEST_DATABASE_URL.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${KEYSTONE_VENV:-.venv}"
# Where the default PostgreSQL is looked for when no URL is given (a test of this script
# points it at a port where nothing answers).
default_pg_port="${KEYSTONE_TEST_PG_PORT:-5432}"
pg_url="${TEST_DATABASE_URL:-${DATABASE_URL:-}}"

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
# Reinstall only when pyproject.toml changed since the last install into this venv.
stamp="$venv/.keystone-install-stamp"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e '.[dev,embeddings]'
  echo "$want" >"$stamp"
fi

# Tests never touch the developer's var/: database file, artifacts and scratch go here.
KEYSTONE_HOME="$(mktemp -d -t keystone-tests.XXXXXX)"
export KEYSTONE_HOME
cluster=""
cleanup() {
  if [ -n "$cluster" ]; then
    as_owner "$pg_bin/pg_ctl" -D "$cluster/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$cluster"
  fi
  rm -rf "$KEYSTONE_HOME"
}
trap cleanup EXIT
unset CELERY_BROKER_URL

# initdb and postgres refuse to run as root: the throwaway cluster belongs to `postgres`
# (or `nobody`) when this script runs as root.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$cluster_owner" -- "$@"; else "$@"; fi
}

# PostgreSQL: the URL given, else one answering on 127.0.0.1:$default_pg_port, else a
# throwaway cluster (initdb + pg_ctl on a free port) that the trap stops and deletes.
pg_bin=""
if [ -z "$pg_url" ]; then
  if command -v pg_isready >/dev/null && pg_isready -h 127.0.0.1 -p "$default_pg_port" -q; then
    pg_url="postgresql://postgres@127.0.0.1:$default_pg_port/keystone"
  else
    pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
    if [ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ]; then
      cluster="$(mktemp -d -t keystone-pg.XXXXXX)"
      cluster_owner="$(id -un postgres 2>/dev/null || echo nobody)"
      [ "$(id -u)" -eq 0 ] && chown "$cluster_owner" "$cluster"
      port="$("${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
      as_owner "$pg_bin/initdb" -D "$cluster/data" -U postgres -A trust >/dev/null
      as_owner "$pg_bin/pg_ctl" -D "$cluster/data" -w -l "$cluster/postgres.log" \
        -o "-p $port -k $cluster -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
      pg_url="postgresql://postgres@127.0.0.1:$port/keystone"
      echo "== no PostgreSQL on 127.0.0.1:$default_pg_port: started a throwaway cluster on port $port"
    else
      echo "== no PostgreSQL on 127.0.0.1:$default_pg_port and no PostgreSQL binaries: running only the SQLite pass"
    fi
  fi
fi

# Both passes always run, so one report shows every failure; either failing fails the script.
pg_status=0
if [ -n "$pg_url" ]; then
  echo "== tests on PostgreSQL ($pg_url)"
  DATABASE_URL="$pg_url" "$venv/bin/python" -m pytest "$@" || pg_status=$?
fi

echo "== tests marked 'embedded' on the embedded SQLite default"
embedded_status=0
env -u DATABASE_URL "$venv/bin/python" -m pytest -m embedded "$@" || embedded_status=$?
# Exit 5 = no test selected. With no arguments that is a broken suite; with arguments the
# caller narrowed the selection to tests that simply are not marked `embedded`.
if [ "$embedded_status" -eq 5 ] && [ "$#" -gt 0 ]; then
  echo "(no 'embedded' test among the selected ones)"
  embedded_status=0
fi

echo "== PostgreSQL pass: exit $pg_status; embedded SQLite pass: exit $embedded_status"
if [ "$pg_status" -ne 0 ]; then exit "$pg_status"; fi
exit "$embedded_status"
