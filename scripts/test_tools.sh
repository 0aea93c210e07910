#!/usr/bin/env bash
# The programs `make test` runs besides Python, installed when missing:
#   - PostgreSQL's initdb and pg_ctl, for the throwaway cluster (not needed when DATABASE_URL
#     is set; Debian keeps them in /usr/lib/postgresql/*/bin, where throwaway_postgres.py looks);
#   - redis-server, which the Celery tests start on a free loopback port;
#   - pgbouncer, which the tests of running behind a transaction-pooling PgBouncer start the
#     same way (Debian puts it in /usr/sbin);
#   - Chromium, which the browser tests drive;
#   - Python's venv module with ensurepip, which Debian packages apart from Python.
# Silent when everything is there. As root with apt-get, installs what is missing; otherwise
# exits 2 at once, printing the command that installs it.
set -euo pipefail

PYTHON=${PYTHON:-python3}

missing_packages() {
  if [ -z "${DATABASE_URL:-}" ] && ! command -v initdb >/dev/null 2>&1 \
    && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    echo postgresql
  fi
  command -v redis-server >/dev/null 2>&1 || echo redis-server
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || echo pgbouncer
  [ -x /usr/bin/chromium ] || echo chromium
  "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1 || echo python3-venv
}

read -r -a missing <<<"$(missing_packages | tr '\n' ' ')"
[ ${#missing[@]} -eq 0 ] && exit 0

command="apt-get install -y ${missing[*]}"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make test needs ${missing[*]}, which this machine lacks. Install them:" >&2
  if command -v apt-get >/dev/null 2>&1; then
    echo "    sudo $command" >&2
  else
    echo "    with this system's package manager (the Debian command: $command)" >&2
  fi
  echo "then run make test again." >&2
  exit 2
fi

echo "make test: installing ${missing[*]} with apt-get (once)" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
  >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "make test: \`$command\` failed (the end of its output is above)" >&2
  exit 2
fi
read -r -a still <<<"$(missing_packages | tr '\n' ' ')"
if [ ${#still[@]} -ne 0 ]; then
  echo "make test: apt-get installed ${missing[*]}, yet ${still[*]} is still missing" >&2
  exit 2
fi
