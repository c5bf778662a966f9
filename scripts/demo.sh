#!/usr/bin/env bash
# The main job: bring up a local Strata cluster (3 safekeepers, a pageserver,
# a tenant with a `main` branch) and a stock PostgreSQL 15 compute on it,
# write to it, and show how to connect. The cluster keeps running; stop it
# with `target/release/strata stop --workdir .strata`.
set -euo pipefail
cd "$(dirname "$0")/.."
strata="${STRATA_BIN:-target/release/strata}"
workdir="${STRATA_WORKDIR:-.strata}"
if [ ! -f "$workdir/cluster.toml" ]; then
    "$strata" init --workdir "$workdir"
fi
"$strata" start --workdir "$workdir"
if ! "$strata" endpoint list --workdir "$workdir" | grep -qE '^main .*running'; then
    "$strata" endpoint start main --workdir "$workdir" >/dev/null
fi
# The password stays off every command line and environment (others see
# those in `ps`): psql reads it from a password file of this user's alone.
# The connection string verifies the server against the cluster's CA.
password="$(head -n 1 "$workdir/endpoints/main/password")"
port="$(awk -F' *= *' '$1 == "pg_port" {print $2}' "$workdir/endpoints/main/endpoint.toml")"
passfile="$workdir/demo.pgpass"
(umask 077 && printf '127.0.0.1:%s:*:app:%s\n' "$port" "$password" >"$passfile")
export PGPASSFILE="$passfile"
connstr="postgresql://app@127.0.0.1:$port/postgres?sslmode=verify-full&sslrootcert=$(cd "$workdir" && pwd)/tls/ca.pem"
echo
echo "== writing through the compute (commits wait for 2 of 3 safekeepers)"
psql "$connstr" -v ON_ERROR_STOP=1 -q <<'SQL'
CREATE TABLE IF NOT EXISTS demo (id bigserial PRIMARY KEY, note text, at timestamptz DEFAULT now());
INSERT INTO demo (note) SELECT 'row ' || g FROM generate_series(1, 1000) g;
SQL
psql "$connstr" -Atc "SELECT count(*) || ' rows in demo; WAL at ' || pg_current_wal_lsn() FROM demo"
echo
echo "== the cluster"
"$strata" status --workdir "$workdir"
echo
echo "Connect with:  PGPASSFILE=$passfile psql '$connstr'"
echo "Restart the compute (a new PostgreSQL from the pageserver, nothing lost):"
echo "  $strata endpoint stop main --workdir $workdir && $strata endpoint start main --workdir $workdir"
echo "Stop everything:  $strata stop --workdir $workdir"
