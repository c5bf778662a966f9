"""Issue: fail-stop on storage errors in the safekeeper. A safekeeper whose
disk fails an fsync stops accepting WAL for the timeline (it is *failed*:
its flush LSN stays where the disk was last known good) while the other two
keep committing; once the disk works again it re-reads the timeline from
disk, cut back to what was durable, accepts again and catches up. Nothing
acknowledged is lost on the way.

Safekeeper 1's data directory is on a strata-faultfs mount
(docs/testing.md) that fails every fsync with EIO while its control file
says `fsync`.

The same for the pageserver: a timeline whose flush fails is broken (kind
`storage`) and holds its `disk_consistent_lsn`, the process serves on, and
the timeline is re-read from disk once the disk works again."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from fixtures.endpoint import Endpoint
from fixtures.load import AckedWriter, AckedWriters
from fixtures.metrics import wait_for_metric
from fixtures.pageserver_api import wait_for_pageserver_lsn
from fixtures.strata import (SEGMENT, SEGMENT_NAME, Safekeeper, WalService, commit_xids, format_lsn, parse_lsn,
                              running_wal_service, segment_name)
from fixtures.wait import wait_until

EIO = "Input/output error"


def copy_wal_prefix(svc: WalService, sk: Safekeeper, end: int, dest: Path) -> None:
    """Copies a safekeeper's segment files into `dest`, keeping only the WAL
    before `end` (zeroes after it): bytes below a flush LSN the safekeeper
    published never change, even while it keeps writing past it."""
    dest.mkdir()
    src = sk.wal_dir(svc.tenant, svc.timeline)
    start = parse_lsn(svc.timeline_status(sk)["timeline_start_lsn"])
    for segno in range(start // SEGMENT, (end - 1) // SEGMENT + 1):
        name = segment_name(segno)
        shutil.copyfile(src / name, dest / name)
        if segno == end // SEGMENT:
            with open(dest / name, "r+b") as f:
                f.truncate(end % SEGMENT)
                f.truncate(SEGMENT)


@pytest.fixture
def sk1_on_faultfs(strata_bin, pg_cluster, tmp_path):
    with running_wal_service(strata_bin, tmp_path, pg_cluster, faultfs=(1,)) as svc:
        yield svc


def test_failed_fsync_stops_one_safekeeper_and_it_recovers_when_the_disk_does(sk1_on_faultfs, tmp_path):
    svc = sk1_on_faultfs
    pg = svc.pg
    sk1, sk2, sk3 = svc.safekeepers
    others = (sk2, sk3)
    wal_dir = str(sk1.wal_dir(svc.tenant, svc.timeline))

    writer = AckedWriter(pg).start()
    t_begin = time.monotonic()
    # Before the fault: sk1 takes part (its flush LSN advances with the others').
    first = svc.flush_lsn(sk1)
    wait_until("sk1 to flush WAL of the workload", lambda: svc.flush_lsn(sk1) > first and writer.count() > 50, 30,
               interval=0.05, retry=())
    time.sleep(2)
    assert svc.timeline_status(sk1)["state"] == "active"

    # The fault: every fsync on sk1's disk fails with EIO.
    t_inject = time.monotonic()
    sk1.faultfs.set_faults("fsync")
    failed = wait_until("sk1's timeline to fail",
                        lambda: (s := svc.timeline_status(sk1))["state"] == "failed" and s, 30,
                        interval=0.02, retry=())
    t_failed = time.monotonic()
    failure = failed["failure"]
    reason = failure["reason"]
    print(f"\nsk1 failed after {t_failed - t_inject:.3f}s: {reason}")
    assert EIO in reason, failure
    # It names the file (or directory) whose fsync failed, under the timeline's directory,
    # the same one the file system reports having failed first.
    synced = re.search(r"syncing(?: directory)? (/\S+): " + EIO, reason)
    assert synced and synced[1].startswith(wal_dir), failure
    injected = wait_until("faultfs to log the injected EIO", sk1.faultfs.injected, 10, interval=0.05, retry=())
    first_injected = re.search(r"injected EIO into \S+ of (\S+)", injected[0])[1]
    assert synced[1].endswith("/" + first_injected.rstrip("/")), (reason, injected[0])
    assert failed["last_error"] == reason
    assert failure["since"] > 0
    durable = parse_lsn(failure["durable_flush_lsn"])
    if SEGMENT_NAME.match(Path(synced[1]).name):
        # A segment's fsync failed: WAL was written past the durable end and never acknowledged.
        assert parse_lsn(failed["write_lsn"]) > durable, failed
    print(f"sk1 at the failure: written to {failed['write_lsn']}, durable to {failure['durable_flush_lsn']}")

    # While failed: the flush LSN does not move and is the durable one; the
    # process and its HTTP API live on; the two others keep committing.
    others_at_failure = max(svc.flush_lsn(sk) for sk in others)
    samples = []
    for _ in range(6):
        s = svc.timeline_status(sk1)
        assert s["state"] == "failed", s
        assert parse_lsn(s["failure"]["durable_flush_lsn"]) == durable, s
        samples.append(parse_lsn(s["flush_lsn"]))
        time.sleep(0.5)
    print("sk1 flush LSN while failed:", [format_lsn(x) for x in samples], "durable:", format_lsn(durable))
    assert samples == [durable] * len(samples), "the flush LSN moved while the timeline was failed"
    assert sk1.process.running()
    # Re-reading the timeline fails as long as the disk does.
    retried = wait_until("a reload to be tried (and fail) while fsync still fails",
                         lambda: (s := svc.timeline_status(sk1))["failure"]["reload_attempts"] >= 1 and s, 30,
                         interval=0.05, retry=())
    assert EIO in retried["failure"]["last_reload_error"], retried["failure"]
    assert parse_lsn(retried["flush_lsn"]) == durable
    metrics = wait_for_metric(sk1, "strata_safekeeper_timelines_failed", 1)
    assert metrics["strata_safekeeper_timeline_failures_total"] >= 1, metrics
    assert metrics["strata_safekeeper_timeline_reloads_total"] == 0, metrics
    others_now = max(svc.flush_lsn(sk) for sk in others)
    assert others_now > others_at_failure > 0 and others_now > durable, "sk2 and sk3 stopped with sk1"
    assert not writer.errors, writer.errors
    t_clear = time.monotonic()
    acked_during = writer.acked_between(t_failed, t_clear)
    assert acked_during > 0, "no commit was acknowledged while one safekeeper of three was failed"
    rate_before = writer.rate(t_begin, t_inject)
    rate_during = writer.rate(t_failed, t_clear)

    # The disk works again: sk1 re-reads the timeline, accepts, catches up.
    sk1.faultfs.set_faults("")
    active = wait_until("sk1 to accept again", lambda: (s := svc.timeline_status(sk1))["state"] == "active" and s, 60,
                        interval=0.05, retry=())
    t_active = time.monotonic()
    # No failure now; the last one stays on record.
    assert active["failure"] is None and "Input/output error" in active["last_error"], active
    assert parse_lsn(active["flush_lsn"]) >= durable
    # The reload kept exactly the durable WAL (what followed was cut).
    reloaded = re.findall(r"timeline re-read from disk; accepting again.* flush_lsn=(\S+)", sk1.process.log_text())
    assert [parse_lsn(x) for x in reloaded] == [durable], reloaded
    # Acknowledged before `target` is read: on sk1 already, or on sk2 and sk3 below `target`.
    acked_before_target = writer.xids()
    target = max(svc.flush_lsn(sk) for sk in others)
    wait_until("sk1 to catch up with the others", lambda: svc.flush_lsn(sk1) >= target, 60, interval=0.05, retry=())
    t_caught_up = time.monotonic()
    metrics = wait_for_metric(sk1, "strata_safekeeper_timelines_failed", 0)
    assert metrics["strata_safekeeper_timeline_reloads_total"] >= 1, metrics
    # Its WAL decodes without error up to its flush LSN.
    held = svc.flush_lsn(sk1)
    copy = tmp_path / "sk1-wal-copy"
    copy_wal_prefix(svc, sk1, held, copy)
    records, last = svc.dump_wal(directory=copy)
    assert "error" not in last, last
    end = parse_lsn(last["end_of_wal"])
    assert held <= end <= (held + 7) & ~7, (format_lsn(held), last)
    assert records and parse_lsn(records[-1]["end_lsn"]) == end
    shutil.rmtree(copy)

    time.sleep(3)
    t_end = time.monotonic()
    rate_after = writer.rate(t_caught_up, t_end)
    writer.stop()
    assert not writer.errors, writer.errors

    print(f"commits acknowledged: {writer.count()}")
    print(f"commit rate before the fault: {rate_before:.0f}/s, during: {rate_during:.0f}/s "
          f"({acked_during} commits in {t_clear - t_failed:.1f}s), after recovery: {rate_after:.0f}/s")
    print(f"time to detect: {t_failed - t_inject:.3f}s; to accept again after the fault cleared: "
          f"{t_active - t_clear:.3f}s; to catch up: {t_caught_up - t_clear:.3f}s; "
          f"reload attempts while failed: {retried['failure']['reload_attempts']}+")

    # Nothing acknowledged was lost: in the table, and on a quorum of WAL.
    acked = writer.xids()
    ids = {r[0] for r in pg.sql("SELECT id FROM acked")}
    missing = sorted(set(acked) - ids)
    assert not missing, f"{len(missing)} acknowledged rows are missing, e.g. {missing[:5]}"
    svc.proposer.stop()
    for sk in svc.safekeepers:
        assert sk.process.stop() == 0, sk.process.log_text()[-3000:]
    holders: dict[int, int] = {}
    for sk in svc.safekeepers:
        records, last = svc.dump_wal(sk)
        assert "error" not in last, (sk.id, last)
        committed = commit_xids(records)
        for xid in set(acked.values()) & committed:
            holders[xid] = holders.get(xid, 0) + 1
        if sk is sk1:
            # What was committed before it caught up, it holds now.
            gone = [i for i, xid in acked_before_target.items() if xid not in committed]
            assert not gone, f"sk1 lacks {len(gone)} commits acknowledged before it caught up, e.g. {gone[:5]}"
    lost = [i for i, xid in acked.items() if holders.get(xid, 0) < 2]
    assert not lost, f"{len(lost)} acknowledged commits are not on a quorum, e.g. {lost[:5]}"
    assert sk1.faultfs.stop() == 0, "strata-faultfs did not unmount cleanly"


def test_safekeeper_whose_fsync_fails_from_the_start_acknowledges_nothing(strata_bin, pg_cluster, tmp_path):
    """sk1's disk fails every fsync from right after the timeline was created,
    before any proposer came: sk1 never acknowledges anything (its flush
    LSN stays at the timeline start) while sk2 and sk3 commit, and it stays
    failed as long as the disk fails (re-reading a timeline that holds no
    WAL yet must not pass for a working disk)."""

    def fail_sk1_fsync(svc: WalService) -> None:
        svc.safekeepers[0].faultfs.set_faults("fsync")

    with running_wal_service(strata_bin, tmp_path, pg_cluster, faultfs=(1,), before_proposer=fail_sk1_fsync) as svc:
        pg = svc.pg
        sk1, sk2, sk3 = svc.safekeepers
        start = parse_lsn(svc.timeline_status(sk1)["timeline_start_lsn"])
        pg.sql("CREATE TABLE t(id int PRIMARY KEY)")
        failed = wait_until("sk1's timeline to fail",
                            lambda: (s := svc.timeline_status(sk1))["state"] == "failed" and s, 30,
                            interval=0.05, retry=())
        print(f"\nsk1 failed when the proposer came: {failed['failure']}")
        assert EIO in failed["failure"]["reason"], failed
        assert parse_lsn(failed["failure"]["durable_flush_lsn"]) == start, failed

        # Commits go on without sk1; sk1 stays failed and holds nothing.
        samples = []
        t1 = time.monotonic()
        with pg.connect() as conn:
            for i in range(1, 601):
                conn.execute("INSERT INTO t VALUES (%s)", (i,))
                if i % 50 == 0:
                    s = svc.timeline_status(sk1)
                    samples.append((s["state"], parse_lsn(s["flush_lsn"]), parse_lsn(s["write_lsn"])))
                    time.sleep(0.25)
        elapsed = time.monotonic() - t1
        committed = pg.wal_lsn("pg_current_wal_flush_lsn")
        print(f"600 commits in {elapsed:.1f}s (with pauses) on sk2 and sk3")
        for state, flushed, written in samples:
            assert (state, flushed, written) == ("failed", start, start), (state, format_lsn(flushed), format_lsn(written))
        for sk in (sk2, sk3):
            assert parse_lsn(svc.timeline_status(sk)["flush_lsn"]) >= committed > start
        assert pg.sql("SELECT count(*) FROM t")[0][0] == 600
        assert sk1.process.running()
        retried = wait_until("a reload to be tried (and fail)",
                             lambda: (s := svc.timeline_status(sk1))["failure"]["reload_attempts"] >= 1 and s, 30,
                             interval=0.05, retry=())
        assert EIO in retried["failure"]["last_reload_error"], retried
        metrics = wait_for_metric(sk1, "strata_safekeeper_timelines_failed", 1)
        assert metrics["strata_safekeeper_timeline_failures_total"] == 1, "the timeline came back while the disk failed"
        assert metrics["strata_safekeeper_timeline_reloads_total"] == 0, metrics
        # Nothing of the WAL reached sk1's files.
        wal_dir = sk1.wal_dir(svc.tenant, svc.timeline)
        if any(SEGMENT_NAME.match(p.name) for p in wal_dir.iterdir()):
            records, _ = svc.dump_wal(sk1)
            assert records == [], records[:3]

        # The disk works again: sk1 catches up.
        sk1.faultfs.set_faults("")
        t2 = time.monotonic()
        wait_until("sk1 to accept again", lambda: svc.timeline_status(sk1)["state"] == "active", 60,
                   interval=0.05, retry=())
        t3 = time.monotonic()
        pg.sql("INSERT INTO t VALUES (0)")
        target = pg.wal_lsn("pg_current_wal_flush_lsn")
        wait_until("sk1 to catch up", lambda: svc.flush_lsn(sk1) >= target, 60, interval=0.05, retry=())
        print(f"sk1 accepted again {t3 - t2:.3f}s after the fault cleared "
              f"(reload attempts: {retried['failure']['reload_attempts']}+), caught up after {time.monotonic() - t2:.3f}s")


# ------------------------------------------------------------------ the pageserver

def test_pageserver_fsync_failure_breaks_the_timeline_until_the_disk_recovers(cluster_factory):
    """The pageserver's data directory is on a strata-faultfs mount (a local
    cluster: `strata init`, the mount, `strata start`). While its fsync
    fails, a flush breaks the timeline (kind `storage`, the reason naming
    the file and the I/O error); `disk_consistent_lsn` holds, ingest stops,
    the process runs on and answers, and re-reading the timeline from disk
    fails as long as the disk does. Once the disk works, the timeline is
    re-read, active again, catches up with the safekeepers, and a new
    compute sees every commit acknowledged meanwhile (commits need only the
    safekeepers)."""
    cluster = cluster_factory(faultfs=("pageserver",))
    fs = cluster.faultfs["pageserver"]
    tl_dir = str(cluster.timeline_dir())
    checkpoint = cluster.timeline_path() + "/checkpoint"
    ep = Endpoint(cluster, "ep")
    ep.start()
    pid = cluster.pid("pageserver")

    def timeline() -> dict:
        return cluster.timeline_status("pageserver")

    writers = AckedWriters(ep, threads=1).start()
    try:
        wait_until("the writer to commit", lambda: writers.count() > 100, 60, interval=0.05, retry=())
        # Before the fault: a checkpoint makes what was ingested durable.
        wait_for_pageserver_lsn(cluster, ep.wal_lsn())
        code, body = cluster.http("pageserver", "POST", checkpoint, timeout=60)
        assert code == 200 and body["state"] == "active", body
        flushed = parse_lsn(body["disk_consistent_lsn"])
        wait_until("more WAL ingested", lambda: parse_lsn(timeline()["last_record_lsn"]) > flushed, 60,
                   interval=0.05, retry=())

        # The fault, and a flush.
        fs.set_faults("fsync")
        t_inject = time.monotonic()
        code, body = cluster.http("pageserver", "POST", checkpoint, timeout=60)
        t_broken = time.monotonic()
        assert code == 500, body
        st = timeline()
        print(f"\npageserver checkpoint with fsync failing: HTTP {code}: {body['error']}")
        assert st["state"] == "broken" and st["broken"]["kind"] == "storage", st
        reason = st["error"]
        assert reason == st["broken"]["reason"] and EIO in reason, st
        # It names the file whose fsync failed, in the timeline's directory:
        # the one the file system reports having failed first.
        synced = re.search(r"syncing(?: directory)? (/\S+): " + EIO, reason)
        assert synced and synced[1].startswith(tl_dir + "/"), reason
        first_injected = re.search(r"injected EIO into \S+ of (\S+)", fs.injected()[0])[1]
        assert synced[1] == str(cluster.data_dir("pageserver") / first_injected), (reason, fs.injected()[0])
        durable = parse_lsn(st["disk_consistent_lsn"])
        wanted = parse_lsn(re.search(r"flushing up to (\S+):", reason)[1])
        assert durable < wanted <= parse_lsn(st["last_record_lsn"]), st

        # While broken: nothing moves, the service runs on, commits go on.
        # (A record being ingested as the flush failed may still complete:
        # the reference is taken a moment later.)
        time.sleep(0.3)
        samples = []
        for _ in range(8):
            s = timeline()
            assert s["state"] == "broken" and s["broken"]["kind"] == "storage", s
            samples.append((parse_lsn(s["disk_consistent_lsn"]), parse_lsn(s["last_record_lsn"])))
            time.sleep(0.5)
        print("disk_consistent_lsn, last_record_lsn while broken:",
              sorted({(format_lsn(a), format_lsn(b)) for a, b in samples}),
              f"({samples[0][1] - parse_lsn(st['last_record_lsn'])} bytes of WAL ingested after the first status)")
        assert {a for a, _ in samples} == {durable}, "disk_consistent_lsn moved while broken"
        assert len({b for _, b in samples}) == 1, "ingest went on while broken"
        assert cluster.pid("pageserver") == pid and cluster.service("pageserver")["restarts"] == 0
        assert cluster.answers("pageserver")
        # Re-reading from disk is tried, and fails while the disk does.
        retried = wait_until("a reload to be tried (and fail)",
                             lambda: (s := timeline())["broken"]["reload_attempts"] >= 1 and s, 30,
                             interval=0.05, retry=())
        assert EIO in retried["broken"]["last_reload_error"], retried["broken"]
        assert retried["state"] == "broken" and parse_lsn(retried["disk_consistent_lsn"]) == durable
        metrics = wait_for_metric(cluster, "strata_pageserver_timelines_broken", 1, service="pageserver")
        assert metrics["strata_pageserver_timeline_reloads_total"] == 0, metrics
        t_clear = time.monotonic()
        during = len(writers.acked_between(t_inject, t_clear))
        assert during > 0 and not writers.errors, (during, writers.errors[:3])

        # The disk works again: re-read, active, caught up with the safekeepers.
        fs.set_faults("")
        active = wait_until("the timeline to be active again", lambda: (s := timeline())["state"] == "active" and s,
                            60, interval=0.05, retry=())
        t_active = time.monotonic()
        assert active["error"] is None and active["broken"] is None, active
        assert parse_lsn(active["disk_consistent_lsn"]) >= durable
        metrics = wait_for_metric(cluster, "strata_pageserver_timelines_broken", 0, service="pageserver")
        assert metrics["strata_pageserver_timeline_reloads_total"] >= 1, metrics
        commit = cluster.commit_lsn()
        wait_for_pageserver_lsn(cluster, commit, timeout=120)
        t_caught_up = time.monotonic()
        code, body = cluster.http("pageserver", "POST", checkpoint, timeout=60)
        assert code == 200 and parse_lsn(body["disk_consistent_lsn"]) >= commit > durable, body
        assert cluster.pid("pageserver") == pid, "the process was restarted"
    finally:
        writers.stop()
    print(f"broken {t_broken - t_inject:.3f}s after the fault; {during} commits acknowledged while broken; "
          f"active again {t_active - t_clear:.3f}s after the disk recovered, caught up with the safekeepers' "
          f"commit LSN after {t_caught_up - t_clear:.3f}s; reload attempts while failing: "
          f"{retried['broken']['reload_attempts']}+")

    # A new compute, from the pageserver, has every acknowledged commit.
    acked = writers.acked_ids()
    ep.stop()
    ep.start()
    ids = {r[0] for r in ep.sql("SELECT id FROM acked")}
    missing = sorted(acked - ids)
    assert not missing, f"{len(missing)} acknowledged rows are missing, e.g. {missing[:5]}"
    print(f"commits acknowledged: {len(acked)}, all on a new compute")
    assert fs.injected(), "strata-faultfs injected nothing"
