#!/usr/bin/env bash
# Make sure the local PostgreSQL the tests use (127.0.0.1:5432, trust auth) is running; start it if not.
set -euo pipefail
if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  exit 0
fi
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "PostgreSQL is not running on 127.0.0.1:5432 and pg_ctlcluster is not installed." >&2
  echo "Install it (apt-get install postgresql) or point GOODPUT_TEST_POSTGRES at a server." >&2
  exit 1
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
echo "starting PostgreSQL $version ..."
pg_ctlcluster --skip-systemctl-redirect "$version" main start
for _ in $(seq 1 30); do
  pg_isready -h 127.0.0.1 -p 5432 -q && exit 0
  sleep 1
done
echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1
