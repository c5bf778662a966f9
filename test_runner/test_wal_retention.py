"""WAL retention on the safekeepers, through the CLI's cluster.

Offload: completed, committed segments go to object storage once each (the
safekeeper with the lowest id among the live ones that hold them uploads
them), each with a metadata object whose CRC-32C matches; `pg_waldump`
reads the offloaded segments; when the offloader is killed with -9 under
pgbench another safekeeper takes over with no segment missing.

Removal: under pgbench each safekeeper's local WAL stays bounded (segments
go once offloaded, below the pageserver's remote_consistent_lsn and held by
every safekeeper), every removal is logged with its LSNs, and every
acknowledged commit is still there after the whole cluster restarts."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import crc32c

from fixtures.checks import assert_pgbench_invariants, dump_all, pgbench_state, split_sequences
from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.pageserver_api import wait_for_pageserver_lsn
from fixtures.pg import PgCluster
from fixtures.strata import SEGMENT, format_lsn, parse_lsn, segment_number
from fixtures.wait import wait_until
from fixtures.workload import bulk_write, switch_segment

SAFEKEEPERS = ("sk1", "sk2", "sk3")


def wal_dir(cluster) -> Path:
    return cluster.workdir / "remote_storage" / "wal" / cluster.tenant_id() / cluster.timeline_id()


def check_offloaded(cluster, upto: int) -> dict[int, int]:
    """Every segment below `upto` is in object storage once, whole, with
    metadata that matches it; returns the uploader of each segment."""
    root = wal_dir(cluster)
    metas = sorted(p for p in root.iterdir() if p.name.endswith(".json"))
    segnos = [segment_number(p.name) for p in metas]
    assert segnos == list(range(segnos[0], segnos[0] + len(segnos))), f"a segment is missing: {segnos}"
    assert (segnos[-1] + 1) * SEGMENT >= upto, (segnos, upto)
    uploaders = {}
    for segno, meta_path in zip(segnos, metas):
        meta = json.loads(cluster.object_content(meta_path))
        data = cluster.object_content(root / meta_path.name.removesuffix(".json"))
        assert len(data) == SEGMENT == meta["segment_size"], meta_path.name
        assert crc32c.crc32c(data) == meta["crc32c"], f"{meta_path.name}: CRC mismatch"
        assert parse_lsn(meta["start_lsn"]) == segno * SEGMENT and meta["format_version"] == 1, meta
        uploaders[segno] = meta["uploaded_by"]
    return uploaders


def offloaded_lsns(cluster, names=SAFEKEEPERS) -> dict[str, int]:
    return {n: parse_lsn(cluster.timeline_status(n)["offload"]["offloaded_lsn"]) for n in names}


def test_completed_segments_are_offloaded_once_and_pg_waldump_reads_them(cluster, pg_bin_dir, tmp_path):
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "4", "-q"], timeout=300)
    with ep.connect() as conn:
        conn.execute("SELECT pg_switch_wal()")
        conn.execute("CREATE TABLE after_switch AS SELECT 1 AS x")
        end = current_lsn(conn)
    segment_end = end // SEGMENT * SEGMENT
    assert segment_end >= 3 * SEGMENT, format_lsn(end)

    # Every safekeeper learns what sk1 offloaded (from its peers), up to the
    # last completed segment.
    def all_offloaded():
        lsns = offloaded_lsns(cluster)
        return lsns if min(lsns.values()) >= segment_end else None

    lsns = wait_until("segments offloaded", all_offloaded, timeout=120)
    statuses = {n: cluster.timeline_status(n)["offload"] for n in SAFEKEEPERS}
    print("\noffloaded:", {n: format_lsn(v) for n, v in lsns.items()})
    uploaders = check_offloaded(cluster, segment_end)
    assert set(uploaders.values()) == {1}, uploaders
    m = {n: cluster.metrics(n) for n in SAFEKEEPERS}
    assert m["sk1"]["strata_safekeeper_segments_offloaded_total"] >= len(uploaders)
    assert m["sk2"]["strata_safekeeper_segments_offloaded_total"] == 0, "a segment was uploaded twice"
    assert m["sk3"]["strata_safekeeper_segments_offloaded_total"] == 0, "a segment was uploaded twice"
    assert all(s["last_error"] is None for s in statuses.values()), statuses

    # Stock pg_waldump decodes the offloaded WAL as it is.
    copy = tmp_path / "offloaded"
    copy.mkdir()
    for p in wal_dir(cluster).iterdir():
        if not p.name.endswith(".json"):
            (copy / p.name).write_bytes(cluster.object_content(p))
    # From the first page boundary after the timeline's start: the WAL
    # before the start is on no safekeeper (docs/safekeeper.md).
    start = (parse_lsn(cluster.timeline_status("sk1")["timeline_start_lsn"]) // 8192 + 1) * 8192
    dump = subprocess.run([str(pg_bin_dir / "pg_waldump"), "-p", str(copy), "-s", format_lsn(start),
                           "-e", format_lsn(segment_end), "--stats"], capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, dump.stderr[-2000:]
    total = next(line for line in dump.stdout.splitlines() if line.startswith("Total"))
    print("pg_waldump:", total)
    assert int(total.split()[1]) > 1000, total


def test_another_safekeeper_takes_over_when_the_offloader_is_killed(cluster):
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    switch_segment(ep)
    wait_until("sk1 offloads", lambda: cluster.timeline_status("sk1")["offload"]["offloaded_lsn"] != "0/0", timeout=120)

    # pgbench goes on while the offloader dies; bulk writes make sure that
    # several segments complete after it (pgbench alone is slow on a busy machine).
    bench = ep.popen(["pgbench", "-n", "-c", "2", "-T", "600"])
    try:
        before = offloaded_lsns(cluster, ("sk1",))["sk1"]
        # The others know what sk1 offloaded before it dies (peers hear of it
        # within a second or so): a successor re-uploads, under its own
        # name, what it has not heard of, and what sk1 uploaded would
        # then not show as sk1's below.
        wait_until("sk2 and sk3 know what sk1 offloaded",
                   lambda: min(offloaded_lsns(cluster, ("sk2", "sk3")).values()) >= before, timeout=60)
        cluster.kill9("sk1", supervisor=True)  # stays down
        bulk_write(ep, before + 3 * SEGMENT, rows=50_000)

        # sk2 takes over within a few seconds and goes on offloading.
        def sk2_offloads():
            st = cluster.timeline_status("sk2")["offload"]
            return st if st["offloader"] == 2 and parse_lsn(st["offloaded_lsn"]) >= before + 2 * SEGMENT else None

        took_over = wait_until("sk2 offloads", sk2_offloads, timeout=120)
        print("\nafter the offloader died:", took_over)
        assert bench.poll() is None, "pgbench failed while a safekeeper was down"
    finally:
        bench.terminate()
        bench.wait(timeout=60)
    end = switch_segment(ep) // SEGMENT * SEGMENT
    wait_until("the rest offloaded", lambda: offloaded_lsns(cluster, ("sk2", "sk3"))["sk3"] >= end, timeout=120)
    uploaders = check_offloaded(cluster, end)
    assert {1, 2} <= set(uploaders.values()) <= {1, 2}, uploaders
    # sk1 comes back, learns what was offloaded meanwhile, and uploads nothing twice.
    cluster.start()
    wait_until("sk1 caught up", lambda: offloaded_lsns(cluster, ("sk1",))["sk1"] >= end, timeout=120)
    assert check_offloaded(cluster, end) == uploaders


def local_segments(cluster, name: str) -> list[str]:
    d = cluster.data_dir(name) / cluster.tenant_id() / cluster.timeline_id()
    return sorted(p.name for p in d.iterdir() if len(p.name) == 24)


def test_local_wal_stays_bounded_and_acknowledged_commits_survive_a_restart(cluster_factory):
    cluster = cluster_factory(start=False)
    # Small in-memory layers: the pageserver uploads (and so reports) often.
    cluster.configure("pageserver", {"checkpoint_distance": 8 << 20})
    cluster.start()
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "4", "-q"], timeout=300)
    with ep.connect() as conn:
        start = current_lsn(conn)
    # Offload runs (it starts once the safekeepers have heard from each other).
    wait_until("an offloader chosen", lambda: all(cluster.timeline_status(n)["offload"]["offloader"] == 1
                                                   for n in SAFEKEEPERS), timeout=60)

    # pgbench (acknowledged commits to check later) beside bulk writes (WAL volume).
    bench = ep.popen(["pgbench", "-n", "-c", "2", "-T", "600"])
    peak = {n: 0 for n in SAFEKEEPERS}

    def sample():
        for n in SAFEKEEPERS:
            peak[n] = max(peak[n], int(cluster.timeline_status(n)["removal"]["local_wal_bytes"]),
                          len(local_segments(cluster, n)) * SEGMENT)

    def between_batches(conn) -> None:
        sample()
        # The pageserver keeps up: the next batch waits for its ingest.
        wait_for_pageserver_lsn(cluster, current_lsn(conn), timeout=120)
        sample()

    try:
        bulk_write(ep, start + (400 << 20), after_each=between_batches)
        bench.terminate()
        bench.wait(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    with ep.connect() as conn:
        end = current_lsn(conn)
        before = pgbench_state(conn)
    written = end - start
    # Everything flushed and uploaded: the horizon reaches the last segment boundary.
    cluster.run("timeline", "checkpoint", timeout=600)
    boundary = end // SEGMENT * SEGMENT

    def removed_everywhere():
        st = {n: cluster.timeline_status(n)["removal"] for n in SAFEKEEPERS}
        return st if all(parse_lsn(s["removed_before"]) >= boundary - SEGMENT for s in st.values()) else None

    st = wait_until("WAL removed on every safekeeper", removed_everywhere, timeout=120)
    print(f"\nWAL written under pgbench: {written / 2**20:.0f} MiB; peak local WAL per safekeeper (MiB):",
          {n: p // 2**20 for n, p in peak.items()}, "; now:", {n: s["local_wal_bytes"] // 2**20 for n, s in st.items()})
    for n in SAFEKEEPERS:
        files = local_segments(cluster, n)
        assert len(files) <= 3, f"{n} still holds {files}"
        assert peak[n] <= 160 << 20, f"{n} held {peak[n]} bytes of the {written} written under load"
        assert cluster.metrics(n)["strata_safekeeper_segments_removed_total"] > 0
        # Removed segments are kept to be recycled, at most two.
        assert 1 <= st[n]["spare_segments"] <= 2, st[n]
        log = cluster.log(n)
        assert "removed WAL segments" in log and "remote_consistent" in log and "offloaded_lsn" in log
        assert st[n]["held_back_by"], st[n]

    # Restart everything: every acknowledged commit is there.
    ep.stop()
    cluster.stop()
    cluster.start()
    ep.start()
    with ep.connect() as conn:
        after = pgbench_state(conn)
    assert after == before, (before, after)
    assert_pgbench_invariants(after, 4)


def test_stock_postgres_restores_a_base_backup_with_the_offloaded_wal(cluster_factory, pg_bin_dir, tmp_path):
    """A stock PostgreSQL restored from a pg_basebackup of the compute (no
    WAL in it) and `strata wal restore` as its restore_command reaches the
    same pg_dumpall as the compute. The last segment is not complete: its
    committed part is in object storage as a partial segment within the
    configured time (here 1 s), and the restore reads it."""
    # PostgreSQL runs its restore_command as its own user, who must not read
    # the cluster's storage key: this archive is left unencrypted
    # (docs/security.md, "Encryption at rest").
    cluster = cluster_factory(start=False, init_args=("--no-encryption-at-rest",))
    cluster.configure_safekeepers({"partial_offload_after": 1})
    cluster.start()
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    stock = PgCluster(pg_bin_dir, tmp_path / "stock", traverse_root=tmp_path)
    ep.run(["pg_basebackup", "-D", str(stock.pgdata), "-X", "none", "-c", "fast", "--no-sync"], timeout=300)
    # Written after the backup: only the offloaded WAL brings it.
    ep.run(["pgbench", "-n", "-c", "2", "-t", "300"], timeout=300)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE after_backup AS SELECT g FROM generate_series(1, 1000) g")
    expected = dump_all(ep)
    # No WAL after this: the partial segment is offloaded once more and then
    # stays. (The read access granted below covers the objects the store
    # holds when it is granted; a partial segment replaced after it would be
    # the services' own again.)
    ep.stop()
    end = cluster.commit_lsn()
    assert end % SEGMENT > 0, "the last segment is not complete"

    # The last commits are in object storage: whole segments, then the
    # committed part of the last one.
    def partial_covers():
        st = cluster.timeline_status("sk1")["offload"]
        return st if parse_lsn(st["offloaded_lsn"]) >= end // SEGMENT * SEGMENT and \
            parse_lsn(st["partial_lsn"]) >= end else None

    st = wait_until("the WAL offloaded, the last segment partly", partial_covers, timeout=120)
    partial = wal_dir(cluster) / (sorted(p.name for p in wal_dir(cluster).iterdir()
                                         if p.name.endswith(".partial"))[-1])
    meta = json.loads(cluster.object_content(partial.parent / (partial.name + ".json")))
    data = cluster.object_content(partial)
    assert meta["partial"] is True and crc32c.crc32c(data) == meta["crc32c"], meta
    assert parse_lsn(meta["end_lsn"]) - parse_lsn(meta["start_lsn"]) == len(data) and \
        parse_lsn(meta["start_lsn"]) == end // SEGMENT * SEGMENT, meta
    print("\noffload:", st, "; partial segment:", partial.name, meta["end_lsn"])
    assert cluster.metrics("sk1")["strata_safekeeper_partial_segments_offloaded_total"] >= 1

    try:
        stock.recover_from_archive(cluster.wal_restore_command(), timeout=300)
        log = stock.log_text()
        assert "restored log file" in log, log[-3000:]
        got = dump_all(stock)
    finally:
        stock.cleanup()
    # Sequences come back ahead after a recovery (PostgreSQL logs them in advance).
    assert split_sequences(got)[0] == split_sequences(expected)[0], "the restored server differs from the compute"
    assert "after_backup" in got

    # Once the segment is complete, it is offloaded whole and the partial one goes.
    ep.start()
    switch_segment(ep)
    wait_until("the partial segment replaced", lambda: not partial.exists() and
               (partial.parent / partial.name.removesuffix(".partial")).exists(), timeout=120)


def test_pageserver_restored_to_an_older_state_reads_the_offloaded_wal(cluster_factory):
    """The pageserver's objects go back to an earlier snapshot (a bucket
    restored from a backup) while the safekeepers have removed the WAL
    after it: a pageserver on an empty disk attaches the old index, reads
    the removed WAL from object storage, then streams the rest from the
    safekeepers, with nothing lost."""
    cluster = cluster_factory(start=False)
    cluster.configure("pageserver", {"checkpoint_distance": 8 << 20})
    cluster.start()
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    cluster.run("timeline", "checkpoint", timeout=600)
    remote = cluster.workdir / "remote_storage"
    snapshot = cluster.workdir / "tenants-snapshot"
    cluster.stop("--only", "pageserver")
    shutil.copytree(remote / "tenants", snapshot)
    cluster.start("--only", "pageserver")
    old = parse_lsn(cluster.timeline_status("pageserver")["remote_consistent_lsn"])

    # More WAL; the pageserver uploads it, so the safekeepers remove the WAL
    # after the snapshot's LSN.
    ep.run(["pgbench", "-n", "-c", "2", "-t", "500"], timeout=300)
    bulk_write(ep, old + 5 * SEGMENT)
    ep.run(["pgbench", "-n", "-c", "2", "-t", "500"], timeout=300)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE last_words AS SELECT g FROM generate_series(1, 1000) g")
        end = current_lsn(conn)
        before = pgbench_state(conn)
    cluster.run("timeline", "checkpoint", timeout=600)
    gone = (old // SEGMENT + 2) * SEGMENT

    def removed_everywhere():
        st = {n: parse_lsn(cluster.timeline_status(n)["removal"]["removed_before"]) for n in SAFEKEEPERS}
        return st if min(st.values()) >= gone else None

    removed = wait_until("the WAL after the snapshot removed", removed_everywhere, timeout=180)
    print(f"\nsnapshot at {format_lsn(old)}; the safekeepers hold the WAL from",
          {n: format_lsn(v) for n, v in removed.items()})

    # The pageserver's objects go back to the snapshot; its disk is empty.
    cluster.stop("--only", "pageserver")
    shutil.rmtree(cluster.data_dir("pageserver") / "tenants")
    shutil.rmtree(remote / "tenants")
    shutil.copytree(snapshot, remote / "tenants")
    cluster.start("--only", "pageserver")
    st = cluster.timeline_status("pageserver")
    assert parse_lsn(st["disk_consistent_lsn"]) <= old < gone, st

    wait_for_pageserver_lsn(cluster, end, timeout=300)
    read = cluster.metrics("pageserver")["strata_pageserver_wal_segments_from_object_storage_total"]
    assert read >= 1, read
    assert "reading offloaded WAL from object storage" in cluster.log("pageserver")
    print("segments read from object storage:", read)

    # A new compute starts from the restored pageserver with every commit.
    ep.stop()
    ep.start()
    with ep.connect() as conn:
        assert pgbench_state(conn) == before
        assert conn.execute("SELECT count(*) FROM last_words").fetchone()[0] == 1000
    assert_pgbench_invariants(before, 2)


def test_a_safekeeper_far_behind_recovers_what_its_peers_removed_from_object_storage(cluster):
    """sk3 is down while pgbench and bulk writes go on; sk1 and sk2 offload
    and remove the WAL (a safekeeper that is down does not hold their WAL
    back when there is object storage). Back up, sk3 takes the removed part
    from object storage and the rest from a peer: its segments equal the
    offloaded ones byte for byte, and with sk1 down, sk2 and sk3 carry on
    with every acknowledged commit."""
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    wait_until("an offloader chosen", lambda: all(cluster.timeline_status(n)["offload"]["offloader"] == 1
                                                   for n in SAFEKEEPERS), timeout=60)
    cluster.kill9("sk3", supervisor=True)  # stays down
    behind = parse_lsn(cluster.timeline_status("sk1")["flush_lsn"])
    bench = ep.popen(["pgbench", "-n", "-c", "2", "-T", "600"])
    try:
        bulk_write(ep, behind + 6 * SEGMENT)
    finally:
        bench.terminate()
        bench.wait(timeout=60)
    end = switch_segment(ep)
    cluster.run("timeline", "checkpoint", timeout=600)
    gone = (behind // SEGMENT + 3) * SEGMENT

    def removed():
        st = {n: parse_lsn(cluster.timeline_status(n)["removal"]["removed_before"]) for n in ("sk1", "sk2")}
        return st if min(st.values()) >= gone else None

    held = wait_until("sk1 and sk2 removed the WAL sk3 lacks", removed, timeout=180)
    print(f"\nsk3 stopped at {format_lsn(behind)}; its peers hold the WAL from",
          {n: format_lsn(v) for n, v in held.items()})

    cluster.start()
    wait_until("sk3 caught up", lambda: parse_lsn(cluster.timeline_status("sk3")["flush_lsn"]) >= end, timeout=300)
    recovered = cluster.metrics("sk3")["strata_safekeeper_segments_recovered_from_object_storage_total"]
    assert recovered >= 2, recovered
    assert "recovering WAL the peer removed from object storage" in cluster.log("sk3")
    # sk3's copy of what it recovered is the offloaded segment, byte for byte.
    sk3_dir = cluster.data_dir("sk3") / cluster.tenant_id() / cluster.timeline_id()
    compared = 0
    for name in local_segments(cluster, "sk3"):
        offloaded = wal_dir(cluster) / name
        segno = segment_number(name)
        if offloaded.exists() and behind // SEGMENT < segno < held["sk1"] // SEGMENT:
            assert (sk3_dir / name).read_bytes() == cluster.object_content(offloaded), f"sk3's {name} differs"
            compared += 1
    assert compared >= 2, compared
    print("segments recovered from object storage:", recovered, "; compared byte for byte:", compared)

    # sk1 goes: sk2 and sk3 are the quorum, with every acknowledged commit.
    with ep.connect() as conn:
        before = pgbench_state(conn)
    cluster.kill9("sk1", supervisor=True)
    ep.run(["pgbench", "-n", "-c", "2", "-t", "200"], timeout=300)
    with ep.connect() as conn:
        after = pgbench_state(conn)
    assert after.counts["pgbench_history"] == before.counts["pgbench_history"] + 400, (before, after)
    ep.stop()
    ep.start()
    with ep.connect() as conn:
        assert pgbench_state(conn) == after
    assert_pgbench_invariants(after, 2)


def test_the_wal_archive_is_bounded_by_its_retention(cluster_factory):
    """Offloaded segments older than wal_archive_retention (here 1 s) go
    from object storage once the pageserver's remote_consistent_lsn is past
    them, and not before: while the pageserver is down, the segments
    written meanwhile stay. A restarted safekeeper finds where the
    archive's unbroken run ends from its oldest segment and uploads
    nothing again."""
    cluster = cluster_factory(start=False)
    retention = 1  # seconds
    cluster.configure_safekeepers({"wal_archive_retention": retention})
    cluster.configure("pageserver", {"checkpoint_distance": 8 << 20})
    cluster.start()
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    with ep.connect() as conn:
        bulk_write(ep, current_lsn(conn) + 3 * SEGMENT)
    cluster.run("timeline", "checkpoint", timeout=600)
    consistent = parse_lsn(cluster.timeline_status("pageserver")["remote_consistent_lsn"])

    def archived() -> list[int]:
        # The local store removes a prefix's directory with its last object.
        root = wal_dir(cluster)
        names = [p.name for p in root.iterdir()] if root.exists() else []
        return sorted(segment_number(n) for n in names if n.endswith(".json") and "partial" not in n)

    def expired_total() -> float:
        return cluster.metrics("sk1")["strata_safekeeper_archived_segments_expired_total"]

    def expired_below(lsn, counted: float):
        # The counter moves after a batch of deletions: wait for both, or an
        # emptied archive is seen before the deletions are counted.
        def check():
            segs = archived()
            done = all((s + 1) * SEGMENT > lsn for s in segs) and expired_total() >= counted
            return segs or [-1] if done else None
        return check

    wait_until("offloaded", lambda: offloaded_lsns(cluster, ("sk1",))["sk1"] >= consistent // SEGMENT * SEGMENT,
               timeout=120)
    # Three segments and more were written below remote_consistent_lsn.
    wait_until("the archive below remote_consistent_lsn deleted", expired_below(consistent, 3), timeout=120)
    deleted = expired_total()
    assert deleted >= 3, deleted
    assert "deleted archived WAL past its retention" in cluster.log("sk1")

    # The pageserver is down: what is written now is offloaded and, older
    # than the retention or not, stays in the archive.
    cluster.stop("--only", "pageserver")
    with ep.connect() as conn:
        bulk_write(ep, current_lsn(conn) + 3 * SEGMENT)
    end = switch_segment(ep) // SEGMENT * SEGMENT
    wait_until("offloaded", lambda: offloaded_lsns(cluster, ("sk1",))["sk1"] >= end, timeout=120)
    time.sleep(3 * retention)  # three retentions
    segs = archived()
    print(f"\nremote_consistent_lsn {format_lsn(consistent)}; with the pageserver down the archive holds {segs}")
    assert segs == list(range(segs[0], end // SEGMENT)) and segs[0] <= consistent // SEGMENT, segs
    assert cluster.metrics("sk1")["strata_safekeeper_archived_segments_expired_total"] == deleted
    check_offloaded(cluster, end)  # whole, matching their metadata

    # sk1 restarts: the archive's run begins at its oldest segment, nothing is uploaded twice.
    cluster.stop("--only", "sk1")
    cluster.start("--only", "sk1")
    wait_until("sk1 listed the archive", lambda: offloaded_lsns(cluster, ("sk1",))["sk1"] >= end, timeout=120)
    assert cluster.metrics("sk1")["strata_safekeeper_segments_offloaded_total"] == 0

    # The pageserver is back and uploads: the rest expires.
    cluster.start()
    wait_for_pageserver_lsn(cluster, end, timeout=300)
    cluster.run("timeline", "checkpoint", timeout=600)
    consistent = parse_lsn(cluster.timeline_status("pageserver")["remote_consistent_lsn"])
    assert consistent >= end
    wait_until("the rest deleted", expired_below(consistent, deleted + 1), timeout=120)


def test_wal_restore_tells_a_missing_segment_from_a_damaged_one(cluster, strata_bin, tmp_path):
    """`strata wal restore` exits 1 for a segment that is not offloaded
    (PostgreSQL ends recovery there) and 127 for a damaged one or a store
    it cannot read (PostgreSQL stops), never handing over bad bytes."""
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "1", "-q"], timeout=300)
    end = switch_segment(ep) // SEGMENT * SEGMENT
    wait_until("offloaded", lambda: offloaded_lsns(cluster, ("sk1",))["sk1"] >= end, timeout=120)
    ct = cluster.cluster_toml
    name = sorted(p.name for p in wal_dir(cluster).iterdir() if len(p.name) == 24)[-1]

    def restore(segment: str, config=None) -> subprocess.CompletedProcess:
        out = tmp_path / "restored"
        out.unlink(missing_ok=True)
        return subprocess.run([str(strata_bin), "wal", "restore", "--config",
                               str(config or cluster.service_config_path("sk1")), "--tenant-id", cluster.tenant_id(),
                               "--timeline-id", cluster.timeline_id(), segment, str(out)],
                              capture_output=True, text=True, timeout=120)

    ok = restore(name)
    assert ok.returncode == 0 and (tmp_path / "restored").stat().st_size == SEGMENT, ok.stderr
    absent = restore("0000000100000000000000FF")
    assert absent.returncode == 1 and "not in object storage" in absent.stderr, absent
    assert not (tmp_path / "restored").exists()

    # A flipped byte in the object: damaged, exit 127, nothing written.
    obj = wal_dir(cluster) / name
    data = bytearray(obj.read_bytes())
    data[SEGMENT // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    damaged = restore(name)
    # Sealed (encryption at rest): refused as not authentic, before any CRC.
    assert damaged.returncode == 127 and "fails authentication" in damaged.stderr, damaged
    assert not (tmp_path / "restored").exists()

    # A config without object storage, or one that does not parse: exit 127.
    bare = tmp_path / "bare.toml"
    bare.write_text("id = 9\n")
    assert restore(name, bare).returncode == 127
    broken = tmp_path / "broken.toml"
    broken.write_text("remote_storage = [\n")
    assert restore(name, broken).returncode == 127
