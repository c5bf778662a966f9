#!/usr/bin/env bash
# Decoding demo: create a throw-away PostgreSQL 15 cluster, write
# some WAL with pgbench, and decode it with `strata wal dump`, next to a
# summary by resource manager and record type.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=/usr/lib/postgresql/15/bin
work="$(mktemp -d /tmp/strata-demo.XXXXXX)"
chmod 755 "$work"
run_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$work"
cleanup() { run_pg "$bin/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

run_pg "$bin/initdb" -D "$work/data" -A trust -U postgres --no-sync >/dev/null
run_pg "$bin/pg_ctl" -D "$work/data" -l "$work/log" -w \
    -o "-p 54329 -k $work -c listen_addresses='' -c wal_compression=lz4 -c wal_consistency_checking=heap,btree -c wal_keep_size=1GB -c max_wal_size=1GB" start >/dev/null
pgbench -h "$work" -p 54329 -U postgres -i -q -s 2 postgres >/dev/null 2>&1
pgbench -h "$work" -p 54329 -U postgres -n -t 500 postgres >/dev/null
run_pg "$bin/pg_ctl" -D "$work/data" -w stop >/dev/null

echo "== first records of the WAL (strata wal dump)"
{ target/release/strata wal dump "$work/data/pg_wal" 2>/dev/null || true; } | head -n 8
echo "..."
echo "== records by resource manager and type"
target/release/strata wal dump --json "$work/data/pg_wal" | python3 -c '
import collections, json, sys
counts, images, total = collections.Counter(), collections.Counter(), 0
for line in sys.stdin:
    r = json.loads(line)
    if "end_of_wal" in r:
        end = r["end_of_wal"]
        continue
    key = r["rmgr"] + "/" + r["info"]
    counts[key] += 1
    images[key] += sum(b["image"] for b in r["blocks"])
    total += r["total_len"]
for key, n in counts.most_common(12):
    print(f"  {key:<28} {n:>8} records {images[key]:>8} images")
print(f"  {sum(counts.values())} records, {total/1e6:.1f} MB of records, end of WAL at {end}")
'
