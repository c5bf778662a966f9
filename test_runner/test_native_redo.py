"""Native redo checked against PostgreSQL's own pages.

A cluster in verification mode (`strata init --verify-redo`) runs its
computes with `wal_consistency_checking = 'all'`, so every heap, heap2 and
btree record also carries PostgreSQL's image of each page after the change.
The pageserver redoes every such block natively on the version before and
compares the result with the image under PostgreSQL's masking rules; any
difference is counted and named in the timeline's status. The compute's WAL
is then checked again offline by `strata wal verify-redo`, which reports per
kind of record how many blocks were compared, so the workload is shown to
reach every kind of record that native redo covers.

Every other major the suite runs (fixtures/versions.py) is checked offline
the same way, on the WAL of a stock server of that major: its own page
images are the oracle for its record layouts (17's merged prune and freeze
records, the visibility-map pages that records register from 18.6)."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

from fixtures.endpoint import Endpoint
from fixtures.pageserver_api import wait_for_pageserver_lsn
from fixtures.random_workload import run_random_workload
from fixtures.strata import format_lsn, parse_lsn
from fixtures.versions import DEFAULT_MAJOR, MAJORS
from fixtures.workload import broad_settings, run_broad_workload

# Kinds of record the workloads must reach, each with at least one block
# compared (pg_waldump's names).
COMMON_KINDS = (
    "Heap/INSERT", "Heap/INSERT+INIT", "Heap/UPDATE", "Heap/HOT_UPDATE", "Heap/DELETE", "Heap/LOCK",
    "Heap/INPLACE", "Heap2/VISIBLE", "Heap2/MULTI_INSERT", "Heap2/MULTI_INSERT+INIT", "Heap2/LOCK_UPDATED",
    "Btree/INSERT_LEAF", "Btree/INSERT_UPPER", "Btree/SPLIT_L", "Btree/SPLIT_R", "Btree/DEDUP",
    "Btree/VACUUM", "Btree/DELETE", "Btree/NEWROOT", "Btree/MARK_PAGE_HALFDEAD", "Btree/UNLINK_PAGE",
)
MUST_VERIFY = COMMON_KINDS + ("Heap2/PRUNE", "Heap2/VACUUM", "Heap2/FREEZE_PAGE")


def must_verify(major: int) -> tuple[str, ...]:
    """The kinds for `major`: 17 merged prune, vacuum and freeze."""
    if major >= 17:
        return COMMON_KINDS + ("Heap2/PRUNE_ON_ACCESS", "Heap2/PRUNE_VACUUM_SCAN", "Heap2/PRUNE_VACUUM_CLEANUP")
    return MUST_VERIFY


def verify_offline(strata_bin, waldir, first: str) -> dict:
    """`strata wal verify-redo` on a WAL directory from `first`: its report,
    after checking that nothing differed and nothing was left to images."""
    result = subprocess.run([str(strata_bin), "wal", "verify-redo", "--start", first, str(waldir)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == 0, json.dumps(report["reported"], indent=1)
    assert result.returncode == 0
    assert not report["blocks_without_native_redo"], report["blocks_without_native_redo"]
    return report


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
    by = verify_offline(strata_bin, ep.pgdata / "pg_wal", first)["by_record"]
    print("offline oracle:", json.dumps({k: v["verified"] for k, v in by.items()}))
    missing = [k for k in MUST_VERIFY if by.get(k, {}).get("verified", 0) == 0]
    assert not missing, f"kinds of record never verified: {missing}; seen: {sorted(by)}"


@pytest.mark.parametrize("major", [m for m in MAJORS if m != DEFAULT_MAJOR])
def test_native_redo_matches_each_majors_own_pages(pg_cluster_factory, strata_bin, major):
    pg = pg_cluster_factory(major=major)
    pg.initdb([])
    pg.start(broad_settings("all", "off"))
    first = pg.wal_lsn("pg_current_wal_insert_lsn")
    seed = int(os.environ.get("STRATA_REDO_SEED", random.randrange(1 << 30)))
    run_broad_workload(pg)
    # A count, not a duration: the WAL (every record with its images) must
    # stay within the kept 2 GB however fast the machine runs pgbench.
    pg.run(["pgbench", "-n", "-c", "4", "-t", "500"], timeout=300)
    run_random_workload(pg, seed, ops=int(os.environ.get("STRATA_REDO_OPS", "1000")))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE shrink_t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO shrink_t SELECT i, repeat('s', 100) FROM generate_series(1, 20000) i")
        conn.execute("DELETE FROM shrink_t WHERE id > 100")
        conn.execute("VACUUM shrink_t")
    pg.stop()
    by = verify_offline(strata_bin, pg.waldir, format_lsn(first))["by_record"]
    print(f"\noffline oracle, PostgreSQL {major}, seed {seed}:", json.dumps({k: v["verified"] for k, v in by.items()}))
    missing = [k for k in must_verify(major) if by.get(k, {}).get("verified", 0) == 0]
    assert not missing, f"kinds of record never verified: {missing}; seen: {sorted(by)}"
