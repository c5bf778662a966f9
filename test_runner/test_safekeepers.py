"""Issue: WAL service. A stock PostgreSQL 15 commits only when a quorum of
three safekeepers has fsynced its WAL (the compute's proposer is its only
synchronous standby); any one safekeeper can die without losing a commit;
a newer proposer takes over and the old one can no longer commit."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time

import pytest

from fixtures.load import AckedWriter
from fixtures.metrics import parse_metrics
from fixtures.strata import FakeConsumer, WalService, http_text, parse_lsn, running_wal_service
from fixtures.wait import wait_until

@pytest.fixture
def wal_service(strata_bin, pg_cluster, tmp_path):
    with running_wal_service(strata_bin, tmp_path, pg_cluster) as svc:
        yield svc


def insert_in_background(cluster, sql: str) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            with cluster.connect() as conn:
                conn.execute(sql)
            result["ok"] = time.monotonic()
        except Exception as e:  # reported by the test
            result["error"] = repr(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def test_quorum_commit(wal_service):
    pg = wal_service.pg
    pg.run(["pgbench", "-i", "-q", "-s", "2"], timeout=300)
    out = pg.run(["pgbench", "-n", "-T", "5", "-c", "4", "-j", "2"], timeout=120).stdout
    assert "tps = " in out, out
    statuses = wal_service.statuses()
    commit = max(parse_lsn(s["commit_lsn"]) for s in statuses)
    assert commit >= pg.wal_lsn("pg_current_wal_flush_lsn") - 10 * 1024 * 1024

    # One commit, then silence: no later WAL carries its commit LSN, so the
    # proposer sends it on its own (after a short wait) to every safekeeper.
    pg.sql("INSERT INTO pgbench_history(tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, now())")
    target = pg.wal_lsn("pg_current_wal_flush_lsn")
    wait_until("the commit LSN to reach every safekeeper",
               lambda: min(parse_lsn(s["commit_lsn"]) for s in wal_service.statuses()) >= target, timeout=10,
               interval=0.05, retry=(), details=wal_service.statuses)

    # Two of three safekeepers gone: commits wait, reads work.
    sk1, sk2, sk3 = wal_service.safekeepers
    sk2.process.kill9()
    sk3.process.kill9()
    t, result = insert_in_background(pg, "INSERT INTO pgbench_history(tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 7, now())")
    time.sleep(3)
    assert result == {}, f"the commit returned without a quorum: {result}"
    waits = pg.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")[0][0]
    assert waits >= 1
    assert pg.sql("SELECT count(*) FROM pgbench_accounts")[0][0] == 200000, "reads still work"

    # One comes back: the waiting commit completes with no error.
    sk2.start()
    t.join(timeout=60)
    assert "ok" in result, result
    out = pg.run(["pgbench", "-n", "-T", "3", "-c", "2"], timeout=120).stdout
    assert "tps = " in out
    sk3.start()


def test_no_acknowledged_commit_is_lost_when_safekeepers_are_killed(wal_service):
    writer = AckedWriter(wal_service.pg).start()
    rng = random.Random(7)
    deadline = time.monotonic() + 25
    kills = 0
    while time.monotonic() < deadline:
        sk = rng.choice(wal_service.safekeepers)
        sk.process.kill9()
        kills += 1
        time.sleep(rng.uniform(0.2, 1.5))
        sk.start()
        time.sleep(rng.uniform(0.2, 1.0))
    writer.stop()
    assert not writer.errors, writer.errors
    acked = writer.xids()
    assert kills >= 8 and len(acked) > 200, (kills, len(acked))

    # Every acknowledged commit is in the WAL of at least two safekeepers.
    wal_service.proposer.stop()
    for sk in wal_service.safekeepers:
        sk.process.stop()
    holders: dict[int, int] = {}
    for sk in wal_service.safekeepers:
        committed = wal_service.committed_xids(sk)
        for xid in set(acked.values()):
            if xid in committed:
                holders[xid] = holders.get(xid, 0) + 1
    lost = [i for i, xid in acked.items() if holders.get(xid, 0) < 2]
    assert not lost, f"{len(lost)} acknowledged commits are not on a quorum, e.g. {lost[:5]}"


def test_newer_proposer_takes_over(wal_service):
    pg = wal_service.pg
    pg.run(["pgbench", "-i", "-q", "-s", "1"], timeout=300)
    pg.run(["pgbench", "-n", "-T", "2", "-c", "2"], timeout=120)
    # A second proposer (sync-safekeepers) is elected with a higher term.
    status = wal_service.timeline_status(wal_service.safekeepers[0])
    old_term = status["term"]
    res = subprocess.run(wal_service.proposer_args("sync-safekeepers") + [
        "--system-id", str(pg.sql("SELECT system_identifier FROM pg_control_system()")[0][0])],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    end = parse_lsn(res.stdout.strip())
    # The first proposer can no longer get anything acknowledged and stops.
    t, result = insert_in_background(pg, "INSERT INTO pgbench_history(tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, now())")
    wait_until("the superseded proposer to stop", lambda: not wal_service.proposer.running(), timeout=30,
               interval=0.2, retry=())
    assert "lost the election" in wal_service.proposer.log_text()
    time.sleep(2)
    assert result == {}, f"a commit was acknowledged after the takeover: {result}"
    statuses = wal_service.statuses()
    # The election needs a quorum: a safekeeper that answered late may
    # still be in the old term (the next proposer brings it along).
    assert sum(s["term"] > old_term for s in statuses) >= 2, statuses
    # Every safekeeper's WAL up to the new end is identical.
    flushes = [parse_lsn(s["flush_lsn"]) for s in statuses]
    assert sum(f >= end for f in flushes) >= 2
    common = min(flushes)
    contents = [wal_service.held_wal(sk) for sk in wal_service.safekeepers]
    start = parse_lsn(statuses[0]["timeline_start_lsn"])
    n = common - start
    assert all(c[:n] == contents[0][:n] for c in contents), "safekeepers hold different WAL for one LSN range"
    pg.stop("immediate")


@pytest.fixture
def small_buffer_wal_service(strata_bin, pg_cluster, tmp_path):
    with running_wal_service(strata_bin, tmp_path, pg_cluster, ("--max-buffer-mb", "16")) as svc:
        yield svc


def test_peer_recovery(small_buffer_wal_service):
    """A safekeeper down while more than 100 MB of WAL is written catches up
    from its peers; the proposer, which keeps only 16 MB, does not resend it."""
    svc = small_buffer_wal_service
    pg = svc.pg
    sk1, sk2, sk3 = svc.safekeepers
    sk3.process.kill9()
    before = svc.flush_lsn(sk1)
    pg.run(["pgbench", "-i", "-q", "-s", "10"], timeout=600)
    pg.sql("CHECKPOINT")
    target = pg.wal_lsn("pg_current_wal_flush_lsn")
    assert target - before >= 100 << 20, f"only {(target - before) >> 20} MB written"
    wait_until("the quorum of two to commit the WAL",
               lambda: parse_lsn(svc.timeline_status(sk1)["commit_lsn"]) >= target, timeout=60,
               interval=0.2, retry=())

    sk3.start()

    def log_tail() -> str:
        return sk3.process.log_text()[-3000:]

    wait_until("safekeeper 3 to catch up",
               lambda: svc.flush_lsn(sk3) >= target, timeout=180,
               interval=0.5, retry=(), details=log_tail)
    # The worker logs the end of the recovery after its last append is published.
    wait_until("safekeeper 3 to log the end of its recovery",
               lambda: "recovered WAL from peer" in sk3.process.log_text(), timeout=10, interval=0.2, retry=(),
               details=log_tail)
    # The proposer did not resend it: safekeeper 3 received far less from
    # proposers than it holds now (its counter restarted with it).
    received = sk3.metrics()["strata_safekeeper_append_bytes_total"]
    assert received < 32 << 20, f"safekeeper 3 got {received / 2**20:.0f} MiB from the proposer"
    # The recovered WAL is byte for byte the peers'.
    start = parse_lsn(svc.timeline_status(sk1)["timeline_start_lsn"])

    assert svc.held_wal(sk3)[: target - start] == svc.held_wal(sk1)[: target - start]
    # And it is a member of the quorum again: commits continue with sk1 gone.
    sk1.process.kill9()
    out = pg.run(["pgbench", "-n", "-t", "200", "-c", "2"], timeout=120).stdout
    assert "tps = " in out


@pytest.fixture
def small_disk_safekeeper(strata_bin, pg_cluster, tmp_path):
    """Safekeeper 1's data directory on a 40 MiB tmpfs (needs root and mount)."""
    import os
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    svc = WalService(strata_bin, tmp_path, pg_cluster)
    mountpoint = svc.safekeepers[0].dir / "data"
    mountpoint.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mountpoint)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        svc.start()
        yield svc, mountpoint
    finally:
        svc.stop()
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def test_full_disk_stalls_then_resumes(small_disk_safekeeper, strata_bin):
    svc, mountpoint = small_disk_safekeeper
    pg = svc.pg
    sk1, sk2, _ = svc.safekeepers
    # About 100 MB of WAL: more than safekeeper 1's disk holds.
    pg.run(["pgbench", "-i", "-q", "-s", "8"], timeout=600)
    status = svc.timeline_status(sk1)
    assert "No space left on device" in (status["last_error"] or ""), status
    stalled_at = parse_lsn(status["flush_lsn"])
    commit = parse_lsn(svc.timeline_status(sk2)["commit_lsn"])
    assert stalled_at < commit, "the full safekeeper stalls while the other two commit"

    # Space returns: it catches up and its WAL decodes cleanly.
    subprocess.run(["mount", "-o", "remount,size=400m", str(mountpoint)], check=True)
    target = pg.wal_lsn("pg_current_wal_flush_lsn")
    pg.sql("SELECT 1")
    wait_until("safekeeper 1 to catch up",
               lambda: svc.flush_lsn(sk1) >= target, timeout=120,
               interval=0.5, retry=(), details=lambda: sk1.process.log_text()[-3000:])
    res = subprocess.run([str(strata_bin), "wal", "dump", "--json", str(sk1.wal_dir(svc.tenant, svc.timeline))],
                         capture_output=True, text=True, timeout=300)
    last = json.loads(res.stdout.splitlines()[-1])
    assert res.returncode == 0 and "end_of_wal" in last, res.stderr[-2000:]
    assert parse_lsn(last["end_of_wal"]) >= target


@pytest.fixture
def throttled_wal_service(strata_bin, pg_cluster, tmp_path):
    with running_wal_service(strata_bin, tmp_path, pg_cluster, ("--max-consumer-lag-mb", "1")) as svc:
        yield svc


def test_backpressure_holds_commits_while_consumers_lag(throttled_wal_service):
    svc = throttled_wal_service
    pg = svc.pg
    sk1 = svc.safekeepers[0]
    start = svc.timeline_status(sk1)["timeline_start_lsn"]
    consumer = FakeConsumer(sk1, svc.tenant, svc.timeline, start)
    try:
        applied = pg.wal_lsn("pg_current_wal_flush_lsn")
        consumer.report(applied)
        time.sleep(1)
        pg.sql("CREATE TABLE bp(a int, b text)")
        # The proposer learns the consumer's position from sk1's answers; a
        # quorum of the two others may commit before sk1 answers, unthrottled.
        def learned() -> bool:
            consumer.drain()
            return parse_lsn(svc.proposer_status()["consumer_applied_lsn"]) >= applied

        wait_until("the proposer to learn the consumer's position", learned, timeout=20, interval=0.1, retry=())
        # Far more than 1 MiB of WAL while the consumer stays put: commits stall.
        t, result = insert_in_background(pg, "INSERT INTO bp SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g")
        def throttled() -> bool:
            if svc.proposer_status()["throttled_seconds"] >= 1.0:
                return True
            consumer.drain()
            return False

        wait_until("commits held back for a second", throttled, timeout=20, interval=0.2, retry=())
        status = svc.proposer_status()
        assert status["throttled_seconds"] >= 1.0, status
        assert "ok" not in result, "the commit returned while consumers lagged"
        assert parse_lsn(status["acknowledged_lsn"]) <= applied + (1 << 20)
        assert parse_lsn(status["commit_lsn"]) > parse_lsn(status["acknowledged_lsn"])
        metrics = parse_metrics(http_text(f"http://127.0.0.1:{svc.proposer_http}/metrics"))
        throttled = metrics["strata_proposer_throttled_seconds_total"]
        assert throttled >= 1.0, metrics
        # The consumer catches up: the commit returns.
        consumer.report(parse_lsn(status["commit_lsn"]))
        t.join(timeout=30)
        assert "ok" in result, result
    finally:
        consumer.close()


def test_pg_receivewal_streams_from_a_safekeeper(strata_bin, pg_cluster, tmp_path):
    """Stock pg_receivewal streams a timeline's committed WAL from a
    safekeeper; with strata.strip_consistency=on every record's
    XLR_CHECK_CONSISTENCY flag is cleared and its CRC recomputed, and the
    result is still valid WAL (stock pg_waldump reads it)."""
    with running_wal_service(strata_bin, tmp_path, pg_cluster, extra_settings={"wal_consistency_checking": "all"}) as svc:
        pg = svc.pg
        pg.run(["pgbench", "-i", "-q", "-s", "1"], timeout=300)
        # pg_receivewal starts at the segment holding the server position: fill that one.
        pg.sql("SELECT pg_switch_wal()")
        pg.run(["pgbench", "-n", "-t", "300"], timeout=300)
        sk1 = svc.safekeepers[0]
        commit = svc.timeline_status(sk1)["commit_lsn"]
        out_dir = tmp_path / "received"
        out_dir.mkdir()
        conn = (f"host=127.0.0.1 port={sk1.pg_port} user=postgres "
                f"options='-c strata.timeline={svc.tenant}/{svc.timeline} -c strata.strip_consistency=on'")
        res = subprocess.run([pg.bin("pg_receivewal"), "-D", str(out_dir), "-d", conn, "--no-loop",
                              "--endpos", commit, "--no-sync", "-v"],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        received = subprocess.run([str(strata_bin), "wal", "dump", "--json", str(out_dir)],
                                  capture_output=True, text=True, timeout=120)
        original = subprocess.run([str(strata_bin), "wal", "dump", "--json",
                                   str(sk1.wal_dir(svc.tenant, svc.timeline))],
                                  capture_output=True, text=True, timeout=120)
        got = [json.loads(l) for l in received.stdout.splitlines() if '"lsn"' in l]
        orig = [json.loads(l) for l in original.stdout.splitlines() if '"lsn"' in l]
        assert len(got) > 1000, received.stderr
        by_lsn = {r["lsn"]: r for r in orig}
        flagged = 0
        for r in got:
            o = by_lsn[r["lsn"]]
            assert (r["rmgr"], r["info"], r["total_len"]) == (o["rmgr"], o["info"], o["total_len"])
            assert r["xl_info"] & 0x02 == 0, r
            flagged += o["xl_info"] & 0x02 != 0
        assert flagged > 500, "the original WAL carries the flag on most records"
        # Stock pg_waldump reads the rewritten WAL (CRCs are right).
        for p in out_dir.glob("*.partial"):
            p.rename(p.with_suffix(""))  # pg_waldump reads only complete names
        files = sorted(p.name for p in out_dir.iterdir() if len(p.name) == 24)
        dump = subprocess.run([pg.bin("pg_waldump"), "-p", str(out_dir), files[0], files[-1]],
                              capture_output=True, text=True, timeout=120)
        assert dump.stdout.count("\n") >= len(got) - 5, dump.stderr
        assert "incorrect resource manager data checksum" not in dump.stderr, dump.stderr
