"""Native redo checked against PostgreSQL's own pages.

A cluster in verification mode (`strata init --verify-redo`) runs its
computes with `wal_consistency_checking = 'all'`, so every heap, heap2 and
btree record also carries PostgreSQL's image of each page after the change.
The pageserver redoes every such block natively on the version before and
compares the result with the image under PostgreSQL's masking rules; any
difference is counted and named in the timeline's status. The compute's WAL
is then checked again offline by `strata wal verify-redo`, which reports per
kind of record how many blocks were compared, so the workload is shown to
reach every kind of record that native redo covers."""

from __future__ import annotations

import json
import os
import random
import subprocess

from fixtures.endpoint import Endpoint
from fixtures.pageserver_api import wait_for_pageserver_lsn
from fixtures.random_workload import run_random_workload
from fixtures.strata import parse_lsn
from fixtures.workload import run_broad_workload

# Kinds of record the workloads must reach, each with at least one block
# compared (pg_waldump's names).
MUST_VERIFY = (
    "Heap/INSERT", "Heap/INSERT+INIT", "Heap/UPDATE", "Heap/HOT_UPDATE", "Heap/DELETE", "Heap/LOCK",
    "Heap/INPLACE", "Heap2/PRUNE", "Heap2/VACUUM", "Heap2/FREEZE_PAGE", "Heap2/VISIBLE",
    "Heap2/MULTI_INSERT", "Heap2/MULTI_INSERT+INIT", "Heap2/LOCK_UPDATED",
    "Btree/INSERT_LEAF", "Btree/INSERT_UPPER", "Btree/SPLIT_L", "Btree/SPLIT_R", "Btree/DEDUP",
    "Btree/VACUUM", "Btree/DELETE", "Btree/NEWROOT", "Btree/MARK_PAGE_HALFDEAD", "Btree/UNLINK_PAGE",
)


def test_native_redo_matches_postgres(cluster_factory, strata_bin):
    cluster = cluster_factory(init_args=("--verify-redo",))
    ep = Endpoint(cluster, "main")
    ep.start()
    assert ep.sql("SHOW wal_consistency_checking")[0][0] == "all"
    # Where the offline check starts: the compute's first segment holds
    # nothing before the LSN it started at.
    first = ep.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]

    seed = int(os.environ.get("STRATA_REDO_SEED", random.randrange(1 << 30)))
    run_broad_workload(ep)
    # Every record carries page images here, so the loads are short: the
    # kinds of record they must reach are counted below (STRATA_REDO_OPS
    # runs a longer random workload).
    ep.run(["pgbench", "-n", "-c", "4", "-T", "5"], timeout=120)
    counts = run_random_workload(ep, seed, ops=int(os.environ.get("STRATA_REDO_OPS", "1000")))
    with ep.connect() as conn:
        # Delete most of an index so that whole pages go (half-dead, unlink).
        conn.execute("CREATE TABLE shrink_t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO shrink_t SELECT i, repeat('s', 100) FROM generate_series(1, 20000) i")
        conn.execute("DELETE FROM shrink_t WHERE id > 100")
        conn.execute("VACUUM shrink_t")
        end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])

    st = wait_for_pageserver_lsn(cluster, end, timeout=300)
    check = st["verify_redo"]
    print("\npageserver redo oracle:", json.dumps(check), "rows:", counts)
    assert st["state"] == "active", st
    assert check["mismatches"] == 0, f"seed {seed}: {check['last_mismatch']}"
    assert check["verified"] > 10_000, check
    metrics = cluster.metrics("pageserver")
    assert metrics["strata_pageserver_redo_mismatches_total"] == 0

    # The same WAL, offline, per kind of record.
    ep.stop()
    result = subprocess.run([str(strata_bin), "wal", "verify-redo", "--start", first, str(ep.pgdata / "pg_wal")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    by = report["by_record"]
    print("offline oracle:", json.dumps({k: v["verified"] for k, v in by.items()}))
    assert report["problems"] == 0, json.dumps(report["reported"], indent=1)
    assert result.returncode == 0
    missing = [k for k in MUST_VERIFY if by.get(k, {}).get("verified", 0) == 0]
    assert not missing, f"kinds of record never verified: {missing}; seen: {sorted(by)}"
    assert not report["blocks_without_native_redo"], report["blocks_without_native_redo"]
