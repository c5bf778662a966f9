"""DESIGN D5: an unmodified PostgreSQL 15 starts at an LSN chosen by Strata,
without recovery, from a pg_control and a WAL segment with a shutdown
checkpoint record that Strata's format library generated.

The cluster runs a workload (leaving a prepared transaction and unlogged
data behind), stops cleanly, and `strata wal reset-to-end` replaces its
pg_control and the WAL after the last record. The server must start with "was
shut down" and no redo, with every row, sequence and prepared transaction as
before, accept writes, and recover from a crash that follows (redo starting
at the generated checkpoint)."""

import json
import re
import subprocess

import pytest

from fixtures.checks import dump_all
from fixtures.strata import parse_lsn
from fixtures.waldump import run_waldump
from fixtures.workload import broad_settings


def controldata(cluster) -> dict:
    res = subprocess.run([cluster.bin("pg_controldata"), "-D", str(cluster.pgdata)],
                         capture_output=True, text=True, timeout=60, check=True,
                         env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
    out = {}
    for line in res.stdout.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def new_log(cluster, offset: int) -> str:
    return cluster.log_text()[offset:]


def record_start(end_of_wal: int) -> int:
    """Where a record written at `end_of_wal` starts: there, or past the
    page header when the WAL ends on a page boundary (24 bytes; 40 at the
    start of a 16 MiB segment, whose first page has the long header)."""
    if end_of_wal % 8192:
        return end_of_wal
    return end_of_wal + (40 if end_of_wal % (16 << 20) == 0 else 24)


def workload(cluster):
    cluster.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    cluster.run(["pgbench", "-n", "-t", "300", "-c", "2"], timeout=300)
    with cluster.connect() as conn:
        conn.execute("CREATE SEQUENCE s")
        conn.execute("SELECT nextval('s') FROM generate_series(1, 1000)")
        conn.execute("CREATE UNLOGGED TABLE u(a int primary key, b text)")
        conn.execute("INSERT INTO u SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
        conn.execute("CREATE TABLE t(a int primary key, b text)")
        conn.execute("INSERT INTO t SELECT g, repeat(md5(g::text), 50) FROM generate_series(1, 2000) g")
        # Oids and multixacts move their counters.
        for i in range(50):
            conn.execute(f"CREATE TABLE many_{i}(a int)")
    with cluster.connect(autocommit=False) as conn:
        conn.execute("INSERT INTO t VALUES (-1, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'kept-across-restart'")


@pytest.mark.parametrize("fresh_wal", [False, True], ids=["keep-old-wal", "fresh-wal"])
def test_start_at_generated_checkpoint(pg_cluster, strata_bin, fresh_wal):
    pg_cluster.initdb()
    pg_cluster.start(broad_settings())
    pg_cluster.sql("CREATE EXTENSION amcheck")
    workload(pg_cluster)
    before = dump_all(pg_cluster, unlogged_data=True, timeout=300)
    prepared = pg_cluster.sql("SELECT gid FROM pg_prepared_xacts")
    assert prepared == [("kept-across-restart",)]
    pg_cluster.stop("fast")
    old = controldata(pg_cluster)

    cmd = [strata_bin, "wal", "reset-to-end", "--pgdata", pg_cluster.pgdata]
    if fresh_wal:
        cmd.append("--fresh-wal")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    checkpoint_lsn = report["checkpoint_lsn"]
    assert report["previous_checkpoint"] == old["Latest checkpoint location"]
    assert parse_lsn(checkpoint_lsn) == record_start(parse_lsn(report["end_of_wal"])), report

    new = controldata(pg_cluster)
    assert new["Database cluster state"] == "shut down"
    assert new["Latest checkpoint location"] == checkpoint_lsn
    assert new["Latest checkpoint's REDO location"] == checkpoint_lsn
    assert new["Database system identifier"] == old["Database system identifier"]
    for field in ["NextXID", "NextOID", "NextMultiXactId", "NextMultiOffset", "oldestXID",
                  "oldestMultiXid", "TimeLineID"]:
        key = f"Latest checkpoint's {field}"
        assert new[key] == old[key], key

    if not fresh_wal:
        # WAL before the end is kept: pg_waldump walks from the old records
        # into the generated one, checking every prev-link on the way.
        out = run_waldump(pg_cluster.bin("pg_waldump"), pg_cluster.waldir)
        generated = out.records[-1]
        assert generated.lsn == parse_lsn(checkpoint_lsn), out.stderr
        assert (generated.rmgr, generated.info) == ("XLOG", "CHECKPOINT_SHUTDOWN")
        assert generated.prev == parse_lsn(old["Latest checkpoint location"])
        assert out.end_lsn == parse_lsn(report["next_record_lsn"]), out.stderr

    offset = len(pg_cluster.log_text())
    pg_cluster.start()
    log = new_log(pg_cluster, offset)
    assert "database system was shut down at" in log, log
    assert "redo starts" not in log and "automatic recovery" not in log, log

    assert dump_all(pg_cluster, unlogged_data=True, timeout=300) == before, "pg_dumpall differs after the restart"
    assert pg_cluster.sql("SELECT count(*) FROM u") == [(5000,)], "unlogged data survives a clean start"

    # Writable, with transaction ids continuing from the tracked counter.
    next_xid = int(old["Latest checkpoint's NextXID"].split(":")[1])
    assert pg_cluster.sql("SELECT txid_current()")[0][0] >= next_xid
    pg_cluster.sql("COMMIT PREPARED 'kept-across-restart'")
    # (After the prepared transaction: it holds a lock the parent check waits for.)
    pg_cluster.run(["pg_amcheck", "--database=postgres", "--heapallindexed", "--rootdescend"], timeout=300)
    pg_cluster.run(["pgbench", "-n", "-t", "200", "-c", "2"], timeout=300)
    pg_cluster.sql("INSERT INTO t VALUES (-2, 'after restart')")
    assert pg_cluster.sql("SELECT b FROM t WHERE a < 0 ORDER BY a") == [("after restart",), ("prepared",)]
    history = pg_cluster.sql("SELECT count(*) FROM pgbench_history")[0][0]

    # A crash now is recovered from the generated checkpoint.
    pg_cluster.stop("immediate")
    offset = len(pg_cluster.log_text())
    pg_cluster.start()
    log = new_log(pg_cluster, offset)
    assert "automatic recovery in progress" in log, log
    m = re.search(r"redo starts at ([0-9A-F]+/[0-9A-F]+)", log)
    assert m, log
    redo = m.group(1)
    assert parse_lsn(redo) > parse_lsn(checkpoint_lsn), (redo, checkpoint_lsn)
    assert pg_cluster.sql("SELECT count(*) FROM pgbench_history")[0][0] == history
    assert pg_cluster.sql("SELECT b FROM t WHERE a = -2") == [("after restart",)]
    pg_cluster.run(["pg_amcheck", "--database=postgres", "--heapallindexed"], timeout=300)
