#!/usr/bin/env bash
# Install Debian's PostgreSQL server binaries for the manager's database tests.
# Idempotent.  Nothing is started here: each test run starts its own server on a
# private port and data directory (tests/pg.py) and stops it.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
  exit 0
fi
echo "postgres: installing postgresql"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# policy-rc.d 101: install the binaries without starting Debian's own cluster.
policy=/usr/sbin/policy-rc.d
created=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created=1
fi
apt-get install -y -q --no-install-recommends postgresql >/dev/null
if [ "$created" = 1 ]; then rm -f "$policy"; fi
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null
