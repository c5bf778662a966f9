"""Read replicas (docs/replicas.md): stock PostgreSQL hot standbys of a
branch that stream its WAL from the safekeepers.

So far the ground they stand on:
- a stock standby made from a base backup of a writer (without its WAL)
  streams the branch from a safekeeper's replication service, over TLS
  with a tenant token, follows the writer's commits, and moves to another
  safekeeper when its own is stopped;
- the pageserver's standby basebackup (the data at a checkpoint record's
  redo point, a backup_label naming the record) starts a stock standby
  that reaches consistency, takes queries and ends up equal to the writer.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
import time
from pathlib import Path

import psycopg
import pytest

from fixtures.endpoint import Endpoint, current_lsn, start_endpoint
from fixtures.load import AckedWriters, PgbenchLoop
from fixtures.pageserver_api import PageserverApi, wait_for_pageserver_lsn
from fixtures.pg import PgCluster
from fixtures.strata import SEGMENT, format_lsn, parse_lsn
from fixtures.versions import MAJORS
from fixtures.wait import wait_until


def _safekeepers_conninfo(cluster, ca, application_name: str) -> str:
    """primary_conninfo naming every safekeeper's replication service in
    turn (libpq's list of hosts), over TLS with a tenant token."""
    ct = cluster.cluster_toml
    sks = [s for s in ct["services"] if s["kind"] == "safekeeper"]
    token = cluster.token_file("tenant").read_text().strip()
    return (f"host={','.join('127.0.0.1' for _ in sks)} port={','.join(str(s['ports']['pg']) for s in sks)} "
            f"user=postgres password={token} sslmode=verify-full sslrootcert={ca} "
            f"application_name={application_name} "
            f"options='-c strata.timeline={cluster.tenant_id()}/{cluster.timeline_id()}'")


TABLES_DIGEST = ("SELECT string_agg(t || ':' || n || ':' || d, ',' ORDER BY t) FROM ("
                 " SELECT 'a' AS t, count(*) AS n, md5(string_agg(g::text || v, ',' ORDER BY g)) AS d FROM rep_a"
                 " UNION ALL"
                 " SELECT 'b', count(*), md5(string_agg(g::text, ',' ORDER BY g)) FROM rep_b) x")


def test_a_standby_starts_from_the_pageservers_standby_basebackup(cluster, pg_bin_dir, tmp_path):
    ep = start_endpoint(cluster)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE rep_a AS SELECT g, md5(g::text) AS v FROM generate_series(1, 20000) g")
        conn.execute("CHECKPOINT")
        cp = [parse_lsn(v) for v in conn.execute(
            "SELECT checkpoint_lsn::text, redo_lsn::text FROM pg_control_checkpoint()").fetchone()]
        # After the checkpoint: replay brings these.
        conn.execute("UPDATE rep_a SET v = 'changed' WHERE g % 7 = 0")
        conn.execute("CREATE TABLE rep_b AS SELECT g FROM generate_series(1, 3000) g")
        end = current_lsn(conn)
    wait_for_pageserver_lsn(cluster, end)

    ps = PageserverApi(cluster)
    try:
        code, body = ps.request("GET", ps.tl_path() + "/basebackup?standby=true&full=true", timeout=120)
    finally:
        ps.close()
    assert code == 200, body[:500]
    standby = PgCluster(pg_bin_dir, tmp_path / "standby", traverse_root=tmp_path)
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        tar.extractall(standby.pgdata, filter="data")
    label = files["backup_label"].decode()
    assert f"CHECKPOINT LOCATION: {format_lsn(cp[0])}\n" in label, label
    assert label.startswith(f"START WAL LOCATION: {format_lsn(cp[1])} (file "), label
    assert "BACKUP FROM: standby\n" in label, label
    # Its WAL comes from the safekeepers. Only when the redo point lies in
    # the segment where the timeline begins does the tar carry that
    # segment's page headers before the beginning (and nothing after it).
    wal = [n for n in files if n.startswith("pg_wal/")]
    begin = parse_lsn(cluster.timeline_status("pageserver")["start_lsn"])
    assert len(wal) <= 1, wal
    if wal:
        assert begin // SEGMENT == cp[1] // SEGMENT and wal[0] == f"pg_wal/{1:08X}{0:08X}{begin // SEGMENT:08X}", wal
        data = files[wal[0]]
        assert data[:2] == b"\x10\xd1" and not any(data[begin % SEGMENT:]), "only headers before the beginning"

    ca = standby.base_dir / "ca.pem"
    shutil.copyfile(cluster.ca, ca)
    (standby.pgdata / "standby.signal").write_text("")
    (standby.pgdata / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    standby.take_copied_data_dir()
    standby.start({"primary_conninfo": _safekeepers_conninfo(cluster, ca, "replica2"), "hot_standby": "on",
                   "ssl": "off"})
    log = standby.log_text()
    assert f"starting backup recovery with redo LSN {format_lsn(cp[1])}, checkpoint LSN {format_lsn(cp[0])}" in log, log

    def replayed(lsn: int):
        return parse_lsn(standby.sql("SELECT pg_last_wal_replay_lsn()::text")[0][0]) >= lsn or None

    wait_until("the standby to replay the writer's WAL", lambda: replayed(end), timeout=60)
    assert standby.sql(TABLES_DIGEST) == ep.sql(TABLES_DIGEST)
    # And it follows.
    with ep.connect() as conn:
        conn.execute("DELETE FROM rep_a WHERE g > 15000")
        conn.execute("INSERT INTO rep_b SELECT generate_series(3001, 4000)")
        end = current_lsn(conn)
    wait_until("the standby to replay the writer's later WAL", lambda: replayed(end), timeout=60)
    assert standby.sql(TABLES_DIGEST) == ep.sql(TABLES_DIGEST)
    assert standby.sql("SELECT count(*) FROM rep_a")[0][0] == 15000


def test_a_stock_standby_streams_the_branch_from_the_safekeepers(cluster, pg_bin_dir, tmp_path):
    ep = start_endpoint(cluster)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE before_backup AS SELECT g FROM generate_series(1, 1000) g")
    standby = PgCluster(pg_bin_dir, tmp_path / "standby", traverse_root=tmp_path)
    ep.run(["pg_basebackup", "-D", str(standby.pgdata), "-X", "none", "-c", "fast", "--no-sync"], timeout=300)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE after_backup AS SELECT g FROM generate_series(1, 500) g")

    # Every safekeeper, in turn (libpq's list of hosts): the walreceiver
    # moves on when the one it streams from goes away.
    sks = [s for s in cluster.cluster_toml["services"] if s["kind"] == "safekeeper"]
    ca = standby.base_dir / "ca.pem"
    shutil.copyfile(cluster.ca, ca)
    conninfo = _safekeepers_conninfo(cluster, ca, "replica1")
    (standby.pgdata / "standby.signal").write_text("")
    standby.take_copied_data_dir()
    standby.start({"primary_conninfo": conninfo, "hot_standby": "on", "hot_standby_feedback": "on", "ssl": "off",
                   "synchronous_standby_names": ""})

    def replayed(lsn: int):
        return parse_lsn(standby.sql("SELECT pg_last_wal_replay_lsn()::text")[0][0]) >= lsn or None

    with ep.connect() as conn:
        end = current_lsn(conn)
    wait_until("the standby to replay the writer's WAL", lambda: replayed(end), timeout=60)
    assert standby.sql("SELECT pg_is_in_recovery()")[0][0] is True
    assert standby.sql("SELECT count(*) FROM before_backup")[0][0] == 1000
    assert standby.sql("SELECT count(*) FROM after_backup")[0][0] == 500
    streaming = [r for r in cluster.log(sks[0]["name"]).splitlines() if "replication client streaming" in r]
    assert streaming, "the standby did not stream from the first safekeeper"

    # Its safekeeper stops; the writer commits on the other two, and the
    # standby follows from one of them.
    cluster.stop("--only", sks[0]["name"])
    with ep.connect() as conn:
        conn.execute("CREATE TABLE while_sk1_down AS SELECT g FROM generate_series(1, 300) g")
        end = current_lsn(conn)
    wait_until("the standby to replay past its safekeeper's stop", lambda: replayed(end), timeout=120)
    assert standby.sql("SELECT count(*) FROM while_sk1_down")[0][0] == 300
    others = "".join(cluster.log(s["name"]) for s in sks[1:])
    assert "replication client streaming" in others
    # Queries on a standby are read-only, as on any stock standby.
    with standby.connect() as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("INSERT INTO before_backup VALUES (0)")
    cluster.start("--only", sks[0]["name"])


def _replay_lsn(replica) -> int:
    return parse_lsn(replica.sql("SELECT pg_last_wal_replay_lsn()::text")[0][0])


@pytest.mark.parametrize("major", MAJORS)
def test_a_replica_endpoint_follows_its_writer(cluster_factory, major):
    """`strata endpoint start R --replica-of EP`, of each major: a lazy hot
    standby that starts from the writer's fresh checkpoint, streams from
    the safekeepers, reads its relation files through the pageserver,
    reports its lag and leases its read floor."""
    cluster = cluster_factory(init_args=("--pg-version", str(major)))
    ep = start_endpoint(cluster)
    assert ep.sql("SELECT current_setting('server_version_num')::int / 10000") == [(major,)]
    with ep.connect() as conn:
        conn.execute("CREATE TABLE rep_a AS SELECT g, md5(g::text) AS v FROM generate_series(1, 20000) g")
        conn.execute("CREATE TABLE rep_b AS SELECT g FROM generate_series(1, 3000) g")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep")
    assert replica.sql("SELECT pg_is_in_recovery()")[0][0] is True
    second = Endpoint(cluster, "r2")  # several per branch
    second.start("--replica-of", "ep")
    with ep.connect() as conn:
        end = current_lsn(conn)
    for r in (replica, second):
        wait_until("the replicas to replay the writer's WAL", lambda: _replay_lsn(r) >= end or None, timeout=60)
        assert r.sql(TABLES_DIGEST) == ep.sql(TABLES_DIGEST)
    second.stop()
    with ep.connect() as conn:
        conn.execute("UPDATE rep_a SET v = 'changed' WHERE g % 7 = 0")
        conn.execute("DELETE FROM rep_a WHERE g > 15000")
        conn.execute("INSERT INTO rep_b SELECT generate_series(3001, 4000)")
        end = current_lsn(conn)
    wait_until("the replica to replay later WAL", lambda: _replay_lsn(replica) >= end or None, timeout=60)
    assert replica.sql(TABLES_DIGEST) == ep.sql(TABLES_DIGEST)
    with replica.connect() as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("INSERT INTO rep_b VALUES (0)")

    status = replica.agent_status()
    assert status["lazy"]["blocks_fetched"] > 0, status
    r = status["replica"]
    assert parse_lsn(r["redo_lsn"]) <= parse_lsn(r["checkpoint_lsn"]) <= end

    def caught_up():
        r = replica.agent_status()["replica"]
        return r if r["replay_lsn"] and parse_lsn(r["replay_lsn"]) >= end and r["lag_bytes"] == 0 else None

    r = wait_until("the replica's status to catch up", caught_up, timeout=30)
    assert parse_lsn(r["replay_lsn"]) >= end and r["lag_seconds"] == 0, r
    assert parse_lsn(r["read_floor"]) <= parse_lsn(r["replay_lsn"]), r
    # (The writer's background WAL may arrive between two looks: the lag
    # is then a few bytes for a moment.)
    metrics = replica.agent_metrics()
    assert re.search(r"^strata_compute_replica_lag_bytes \d+$", metrics, re.M), metrics
    assert re.search(r"^strata_compute_replica_replay_lsn \d+$", metrics, re.M), metrics
    # `strata status` shows each endpoint's role and a replica's lag.
    endpoints = {e["name"]: e for e in cluster.status()["endpoints"]}
    assert endpoints["ep"]["role"] == "writer" and endpoints["ep"]["replica"] is None
    assert endpoints["r1"]["role"] == "replica" and endpoints["r1"]["replica"]["lag_bytes"] < 1 << 20, endpoints["r1"]
    text = cluster.run("status").stdout
    assert re.search(r"replica, lag \d+ B \d+\.\d\d s", text), text
    # The pageserver holds its read floor under its name.
    leases = cluster.timeline_status("pageserver")["leases"]
    assert any(le.get("holder") == "r1" for le in leases), leases


def test_a_restarted_replica_never_answers_with_an_older_state(cluster):
    """A replica's PostgreSQL killed: its agent starts it again from the
    branch's last checkpoint record, which is older than what it had
    replayed. Its first answer afterwards must show everything it showed
    before: queries wait until replay has passed the newest record the
    pageserver had ingested at the start (`docs/replicas.md`, "Never older
    than before")."""
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE mono (id bigint)")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep")
    # WAL after the replica's checkpoint record: replaying it takes a while.
    with ep.connect() as conn:
        for i in range(10):
            conn.execute("INSERT INTO mono SELECT g FROM generate_series(%s, %s) g", (i * 50_000, i * 50_000 + 49_999))
        end = current_lsn(conn)
    wait_until("the replica to replay the inserts", lambda: _replay_lsn(replica) >= end or None, timeout=120)
    seen = replica.sql("SELECT count(*) FROM mono")[0][0]
    assert seen == 500_000
    pid = replica.postmaster_pid()
    os.kill(pid, 9)

    def first_answer():
        if replica.postmaster_pid() in (None, pid):
            return None
        try:
            with replica.connect(connect_timeout=2) as conn:
                return (conn.execute("SELECT count(*) FROM mono").fetchone()[0],)
        except psycopg.OperationalError:
            return None  # not accepting connections yet

    (first,) = wait_until("the replica to answer again", first_answer, timeout=120, interval=0.01)
    assert first == seen, f"the restarted replica first answered with {first} rows, after {seen}"
    held = re.findall(r"consistent_at=(\S+)", (replica.dir / "compute.log").read_text())
    assert len(held) >= 2 and parse_lsn(held[-1]) >= end, held


def test_promotion_under_load_keeps_every_acknowledged_commit_and_fences_the_writer(cluster):
    """`strata endpoint promote`: the replica starts again as the branch's
    writer in a new safekeeper term. Every commit the old writer
    acknowledged is there; the old writer's next commit is refused by the
    safekeepers, its agent stops it for good, and its supervisor does not
    start it again."""
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "1", "-q"], timeout=300)
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep")
    writers = AckedWriters(ep, threads=3, backoff=(0.01, 0.1)).start()
    bench = PgbenchLoop(ep, clients=2).start()
    try:
        wait_until("commits on the writer", lambda: writers.count() > 100 or None, timeout=60,
                   details=lambda: writers.errors[-3:])
        out = cluster.run("endpoint", "promote", "r1").stdout
        assert "promoted to the writer of branch main" in out, out
    finally:
        bench.stop()
        writers.stop()
    acked = writers.acked_ids()
    assert len(acked) > 100
    assert replica.sql("SELECT pg_is_in_recovery()")[0][0] is False
    rows = {r[0] for r in replica.sql("SELECT id FROM acked")}
    lost = acked - rows
    assert not lost, f"{len(lost)} acknowledged commits lost: {sorted(lost)[:10]}"
    # Whatever the new writer has beyond the acknowledged ones was in doubt.
    assert rows - acked <= writers.in_doubt | writers.attempted
    sums = replica.sql("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance)"
                       " FROM pgbench_branches), (SELECT sum(delta) FROM pgbench_history)")[0]
    assert sums[0] == sums[1] == sums[2], f"pgbench invariants on the promoted writer: {sums}"
    replica.sql("INSERT INTO acked (id, writer) VALUES (-1, -1)")
    assert replica.sql("SELECT count(*) FROM acked WHERE id = -1")[0][0] == 1

    # The old writer was fenced by the term (it was committing when the new
    # writer was elected) and its supervisor did not start it again.
    log = (ep.dir / "compute.log").read_text(errors="replace")
    assert "another writer took the branch over" in log, log[-3000:]
    wait_until("the old writer to be stopped", lambda: next(
        e for e in cluster.status()["endpoints"] if e["name"] == "ep")["state"] == "stopped" or None, timeout=30)
    endpoints = {e["name"]: e for e in cluster.status()["endpoints"]}
    assert endpoints["r1"]["state"] == "running", endpoints
    # It cannot come back while the promoted one writes.
    with pytest.raises(Exception, match="one writer per branch"):
        ep.start()
    # The new writer keeps every commit across a restart.
    replica.restart()
    assert {r[0] for r in replica.sql("SELECT id FROM acked")} >= acked | {-1}


PGBENCH_SUMS = ("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),"
                " (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history),"
                " (SELECT coalesce(max(id), 0) FROM acked), (SELECT count(*) FROM acked)")


def _check_snapshot(replica) -> tuple[int, int]:
    """One consistent snapshot of the replica: pgbench's balances agree
    across its tables. Returns the highest id and the number of the acked
    rows it saw (a single writer commits them one after another: checked
    against the ids that committed once the run is over)."""
    with replica.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        a, b, t, h, top, n = conn.execute(PGBENCH_SUMS).fetchone()
        conn.execute("COMMIT")
    assert a == b == t == h, f"pgbench invariants broken on the replica: {a} {b} {t} {h}"
    return top, n


def test_a_replica_under_load_sees_consistent_snapshots_across_failures(cluster):
    """pgbench RW on the writer, one writer committing a sequence; the
    replica's snapshots, taken at random moments, always satisfy pgbench's
    invariants and see the sequence in commit order, across a writer
    restart, a safekeeper kill -9 and a pageserver kill -9. Its reads of
    blocks it has not fetched wait out the pageserver's restart."""
    import random
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    ep.sql("CREATE EXTENSION amcheck")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep")
    rng = random.Random(30)
    taken: list[tuple[int, int]] = []

    def snapshots(k: int) -> None:
        for _ in range(k):
            time.sleep(rng.uniform(0.05, 0.6))
            top, n = _check_snapshot(replica)
            assert not taken or n >= taken[-1][1], f"the replica went back in time: {n} acked rows after {taken[-1]}"
            taken.append((top, n))

    seq = AckedWriters(ep, threads=1, backoff=(0.01, 0.2)).start()
    bench = PgbenchLoop(ep, clients=4).start()
    try:
        snapshots(8)
        # The writer restarts: the replica streams from the safekeepers, not from it.
        ep.restart()
        snapshots(5)
        # A safekeeper dies: the replica's walreceiver moves to another.
        sk = cluster.safekeeper_names()[0]
        old = cluster.kill9(sk)
        snapshots(5)
        cluster.wait_restarted(sk, old)
        # The pageserver dies: reads of blocks not fetched yet wait for it.
        old = cluster.kill9("pageserver")
        snapshots(5)
        cluster.wait_restarted("pageserver", old)
        snapshots(5)
    finally:
        bench.stop()
        seq.stop()
    with ep.connect() as conn:
        end = current_lsn(conn)
    wait_until("the replica to replay everything", lambda: _replay_lsn(replica) >= end or None, timeout=120)
    _, n = _check_snapshot(replica)
    committed = sorted(r[0] for r in ep.sql("SELECT id FROM acked"))
    assert n == len(committed) and seq.acked_ids() <= set(committed), "every acknowledged row is on the replica"
    # Rows appear in commit order: a snapshot that sees id k sees every id
    # committed before it. (An insert in doubt that did not commit leaves a
    # gap in the ids, which is not a gap in the commits.)
    import bisect
    for top, n in taken:
        assert n == bisect.bisect_right(committed, top), f"a snapshot saw {n} rows up to id {top}, out of commit order"
    assert len(taken) == 28
    assert replica.sql(PGBENCH_SUMS) == ep.sql(PGBENCH_SUMS)
    assert replica.agent_status()["lazy"]["fetch_errors"] == 0
    replica.run(["pg_amcheck", "--heapallindexed", "-d", "postgres"], timeout=300)


def test_a_replica_lagging_beyond_the_bound_restarts_at_the_newest_wal(cluster_factory):
    """A replica whose replay stops (paused here) holds GC at its read
    floor while it is within the lag bound. Past the bound its agent
    restarts it from the newest checkpoint, its named lease moves there,
    and GC moves on."""
    cluster = cluster_factory(start=False)
    cluster.configure("pageserver", {"pitr_interval": 1.0, "gc_horizon": 0, "gc_period": 3600.0})
    cluster.start()
    gc_path = cluster.timeline_path() + "/checkpoint?compact=true&gc=true"

    def gc_cutoff() -> int:
        code, st = cluster.http("pageserver", "POST", gc_path)
        assert code == 200, st
        return parse_lsn(st["gc"]["cutoff"])

    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE lagging (g int, pad text)")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep", "--max-replica-lag-mb", "1")
    start = parse_lsn(replica.agent_status()["replica"]["redo_lsn"])
    # Paused once it has replayed what the writer wrote so far: the lag
    # then grows only with what the test writes next.
    written = ep.wal_lsn()
    wait_until("the replica to replay the writer's first WAL", lambda: _replay_lsn(replica) >= written or None,
               timeout=60)
    replica.sql("SELECT pg_wal_replay_pause()")
    # Within the bound: GC stays at or below the replica's lease.
    ep.sql("INSERT INTO lagging SELECT g, 'early' FROM generate_series(1, 500) g")
    time.sleep(1.5)
    ep.sql("INSERT INTO lagging VALUES (0, 'a commit after the window')")
    held = [parse_lsn(le["lsn"]) for le in cluster.timeline_status("pageserver")["leases"] if le.get("holder") == "r1"]
    assert len(held) == 1 and start <= held[0], held
    assert gc_cutoff() <= held[0]
    with ep.connect() as conn:
        conn.execute("INSERT INTO lagging SELECT g, repeat('x', 500) FROM generate_series(1, 8000) g")
        conn.execute("CHECKPOINT")
        newest = parse_lsn(conn.execute("SELECT redo_lsn::text FROM pg_control_checkpoint()").fetchone()[0])
        conn.execute("INSERT INTO lagging SELECT g, 'after' FROM generate_series(1, 10) g")
    assert newest - start > 2 << 20
    # The insert alone may have passed the bound before the CHECKPOINT (a
    # loaded machine): the replica then restarted from the checkpoint
    # before it and caught up. Paused again past the CHECKPOINT, its next
    # lag restart must start from that one, the newest.
    # Its agent may restart it at any moment from here on (it is paused
    # and past the bound): a pause sent as it restarts is retried.

    def paused_again():
        try:
            replica.sql("SELECT pg_wal_replay_pause()")
        except psycopg.OperationalError:
            return None
        return True

    wait_until("the replica to be paused again", paused_again, timeout=90)
    with ep.connect() as conn:
        conn.execute("INSERT INTO lagging SELECT g, repeat('y', 500) FROM generate_series(1, 3000) g")
        end = current_lsn(conn)

    def restarted():
        s = replica.agent_status(timeout=2)
        again = s["state"] == "running" and s["replica"] and parse_lsn(s["replica"]["redo_lsn"]) >= newest
        return s if again and s["replica"]["lag_restarts"] >= 1 else None

    s = wait_until("the lagging replica to be restarted", restarted, timeout=90)
    assert "lagging" in s["last_restart_cause"], s
    wait_until("the restarted replica to replay the writer's WAL", lambda: _replay_lsn(replica) >= end or None,
               timeout=60)
    assert replica.sql("SELECT count(*) FROM lagging")[0][0] == 11511
    # Its lease moved with it: nothing holds GC at the old start, and GC moves on.
    leases = [le for le in cluster.timeline_status("pageserver")["leases"] if le.get("holder") == "r1"]
    assert len(leases) == 1 and parse_lsn(leases[0]["lsn"]) > start + (2 << 20), leases
    time.sleep(1.5)
    ep.sql("INSERT INTO lagging VALUES (0, 'a commit after the window')")
    assert gc_cutoff() > held[0] + (2 << 20)
    restarts = re.search(r"^strata_compute_replica_lag_restarts_total (\d+)$", replica.agent_metrics(), re.M)
    assert restarts and int(restarts[1]) >= 1


def test_a_replica_of_a_branch_made_at_a_past_time(cluster):
    """A branch made at an earlier time of main (its timeline begins inside
    a WAL segment), its writer, and a replica of it: the replica has the
    branch's rows, not main's later ones, and follows the branch."""
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
    time.sleep(1.1)
    point = ep.sql("SELECT now()::text")[0][0]
    time.sleep(1.1)
    ep.sql("INSERT INTO t SELECT generate_series(1001, 5000)")
    cluster.run("branch", "create", "past", "--from", "main", "--at-time", point, timeout=120)
    writer = Endpoint(cluster, "past-ep", branch="past")
    writer.start()
    assert writer.sql("SELECT count(*) FROM t")[0][0] == 1000
    writer.sql("INSERT INTO t SELECT generate_series(-99, 0)")
    replica = Endpoint(cluster, "past-r", branch="past")
    replica.start("--replica-of", "past-ep")
    with writer.connect() as conn:
        conn.execute("DELETE FROM t WHERE g > 900")
        end = current_lsn(conn)
    wait_until("the branch's replica to replay its writer's WAL", lambda: _replay_lsn(replica) >= end or None,
               timeout=60)
    assert replica.sql("SELECT count(*), min(g), max(g) FROM t") == [(1000, -99, 900)]
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 5000


def test_a_replica_behind_what_the_safekeepers_keep_gets_the_offloaded_wal(cluster):
    """A replica frozen (SIGSTOP) while the writer writes several segments,
    the pageserver uploads them and the safekeepers offload and remove
    them: once it runs again, the safekeepers stream it the removed WAL
    back from object storage, and it catches up with every row."""
    import signal

    from fixtures.strata import SEGMENT
    from fixtures.workload import bulk_write
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE marks (g int)")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep")
    with ep.connect() as conn:
        start = current_lsn(conn)
    # Every process of its PostgreSQL (each works in the data directory).
    postgres = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd") == str(replica.pgdata.resolve()):
                postgres.append(int(proc.name))
        except OSError:
            pass
    assert len(postgres) >= 3, postgres
    for p in postgres:
        os.kill(p, signal.SIGSTOP)
    try:
        bulk_write(ep, start + 5 * SEGMENT, after_each=lambda c: c.execute("INSERT INTO marks VALUES (1)"))
        with ep.connect() as conn:
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("INSERT INTO marks VALUES (2)")
            end = current_lsn(conn)
        cluster.run("timeline", "checkpoint", timeout=600)
        gone = (start // SEGMENT + 2) * SEGMENT

        def removed_everywhere():
            st = {n: parse_lsn(cluster.timeline_status(n)["removal"]["removed_before"])
                  for n in cluster.safekeeper_names()}
            return st if min(st.values()) >= gone else None

        wait_until("the safekeepers to remove the WAL the replica has not read", removed_everywhere, timeout=180)
    finally:
        for p in postgres:
            os.kill(p, signal.SIGCONT)
    wait_until("the replica to replay the removed WAL and the rest", lambda: _replay_lsn(replica) >= end or None,
               timeout=180)
    assert replica.sql("SELECT count(*) FROM marks") == ep.sql("SELECT count(*) FROM marks")
    logs = "".join(cluster.log(n) for n in cluster.safekeeper_names())
    assert "a replication client reads WAL offloaded to object storage" in logs


def test_hot_standby_feedback_reaches_the_writer_through_the_safekeepers(cluster):
    """A replica started with --hot-standby-feedback: its oldest snapshot
    travels replica -> safekeeper -> the writer's proposer -> the writer's
    slot, so the writer's VACUUM keeps the rows a replica query still
    reads, and the query is not cancelled. Once the query ends, the hold
    moves on."""
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE held AS SELECT g FROM generate_series(1, 10000) g")
    # Writes that leave nothing to clean up (temporary tables would: their
    # catalog rows, pruned before the feedback arrives, conflict with the
    # replica's snapshot as on any stock standby).
    ep.sql("CREATE TABLE nudge (x int)")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep", "--hot-standby-feedback")
    slot_xmin = "SELECT xmin::text FROM pg_replication_slots WHERE slot_name = 'strata_proposer'"

    with replica.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        assert conn.execute("SELECT count(*) FROM held").fetchone()[0] == 10000
        snapshot_xmin = int(conn.execute("SELECT txid_snapshot_xmin(txid_current_snapshot())").fetchone()[0])

        def held_back():
            ep.sql("INSERT INTO nudge VALUES (1)")  # WAL: an append carries the feedback along
            x = ep.sql(slot_xmin)[0][0]
            return int(x) if x is not None else None

        xmin = wait_until("the writer's slot to hold the replica's snapshot", held_back, timeout=60)
        assert xmin <= snapshot_xmin & 0xFFFFFFFF, (xmin, snapshot_xmin)
        with ep.connect() as w:
            w.execute("DELETE FROM held")
            notices = []
            w.add_notice_handler(lambda d: notices.append(d.message_primary))
            w.execute("VACUUM (VERBOSE) held")
            end = current_lsn(w)
        assert any("10000 are dead but not yet removable" in n for n in notices), notices
        wait_until("the replica to replay the vacuum", lambda: _replay_lsn(replica) >= end or None, timeout=60)
        # The rows the snapshot sees were kept: no conflict, no cancellation.
        assert conn.execute("SELECT count(*) FROM held").fetchone()[0] == 10000
        conn.execute("COMMIT")
    assert replica.sql("SELECT count(*) FROM held")[0][0] == 0

    def released():
        ep.sql("INSERT INTO nudge VALUES (1)")
        x = ep.sql(slot_xmin)[0][0]
        return x is None or int(x) > xmin or None

    wait_until("the hold to move on once the query ended", released, timeout=60)


def _table_digests(client) -> dict:
    """Every user table's row count and a digest of its rows in order."""
    tables = [r[0] for r in client.sql(
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind = 'r' AND n.nspname = 'public' ORDER BY 1")]
    out = {}
    for t in tables:
        out[t] = client.sql(f"SELECT count(*), md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), ''))"
                            f" FROM {t} x")[0]
    return out


def test_a_replica_equals_a_stock_standby_fed_the_same_wal(cluster, pg_bin_dir, tmp_path):
    """A seeded random workload on the writer; its WAL streams from the
    safekeepers to a lazy replica and to a stock standby on local disk.
    At random moments the writer pauses, both replay to the same LSN, and
    every table is equal on the two; the replica reads its blocks at the
    read floor meanwhile (docs/replicas.md, rules). Then pg_amcheck finds
    nothing on the replica."""
    import random
    rng = random.Random(3030)
    ep = start_endpoint(cluster)
    ep.sql("CREATE EXTENSION amcheck")
    ep.sql("CREATE TABLE t0 (id int PRIMARY KEY, v text, n int)")
    ep.sql("INSERT INTO t0 SELECT g, md5(g::text), g % 17 FROM generate_series(1, 40000) g")
    standby = PgCluster(pg_bin_dir, tmp_path / "standby", traverse_root=tmp_path)
    ep.run(["pg_basebackup", "-D", str(standby.pgdata), "-X", "none", "-c", "fast", "--no-sync"], timeout=300)
    ca = standby.base_dir / "ca.pem"
    shutil.copyfile(cluster.ca, ca)
    (standby.pgdata / "standby.signal").write_text("")
    standby.take_copied_data_dir()
    standby.start({"primary_conninfo": _safekeepers_conninfo(cluster, ca, "stock_standby"), "hot_standby": "on",
                   "ssl": "off", "synchronous_standby_names": ""})
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep", "--cache-mb", "1")  # a small cache: blocks are dropped and read back

    tables = ["t0"]
    statements = 0
    for round_ in range(6):
        with ep.connect() as conn:
            for _ in range(rng.randint(20, 60)):
                t = rng.choice(tables)
                k = rng.randint(1, 25000)
                op = rng.random()
                if op < 0.3:
                    conn.execute(f"UPDATE {t} SET v = md5(v), n = n + 1 WHERE id BETWEEN %s AND %s", (k, k + 300))
                elif op < 0.5:
                    conn.execute(f"INSERT INTO {t} SELECT g, 'i' || g, 0 FROM generate_series(%s::int, %s::int) g"
                                 " ON CONFLICT (id) DO UPDATE SET n = excluded.n", (k, k + 500))
                elif op < 0.65:
                    conn.execute(f"DELETE FROM {t} WHERE id BETWEEN %s AND %s", (k, k + 200))
                elif op < 0.72:
                    conn.execute(f"VACUUM {t}")
                elif op < 0.77:
                    conn.execute(f"UPDATE {t} SET n = n + 1 WHERE n %% 5 = %s", (k % 5,))  # HOT updates
                elif op < 0.81 and len(tables) < 5:
                    name = f"t{len(tables)}"
                    conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text, n int)")
                    conn.execute(f"INSERT INTO {name} SELECT g, md5(g::text), 0 FROM generate_series(1, %s::int) g",
                                 (rng.randint(100, 20000),))
                    tables.append(name)
                elif op < 0.84:
                    conn.execute(f"CREATE INDEX IF NOT EXISTS {t}_n ON {t} (n)")
                elif op < 0.86 and t != "t0":
                    conn.execute(f"TRUNCATE {t}")
                else:
                    conn.execute(f"SELECT count(*) FROM {t}")  # reads only
                statements += 1
                # Reads on the replica while replay moves under it.
                if rng.random() < 0.2:
                    replica.sql(f"SELECT count(*), sum(n) FROM {rng.choice(tables[:1])}")
            end = current_lsn(conn)
        wait_until("the replica to replay the round", lambda: _replay_lsn(replica) >= end or None, timeout=120)
        wait_until("the stock standby to replay the round", lambda: parse_lsn(
            standby.sql("SELECT pg_last_wal_replay_lsn()::text")[0][0]) >= end or None, timeout=120)
        ours, stock = _table_digests(replica), _table_digests(standby)
        assert ours == stock, f"round {round_}: the replica differs from the stock standby: {ours} != {stock}"
    assert statements > 100
    assert replica.agent_status()["lazy"]["cache_evictions"] > 0, "the small cache dropped blocks"
    replica.run(["pg_amcheck", "--heapallindexed", "-d", "postgres"], timeout=300)


def test_a_replica_starts_while_its_writer_is_down_and_follows_the_next_writer(cluster):
    """No writer runs: a replica starts from the last checkpoint record in
    the WAL (the writer's shutdown checkpoint), and follows a writer that
    starts later."""
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 3000) g")
    ep.stop()
    replica = Endpoint(cluster, "r1")
    out = replica.start("--replica-of", "ep")
    assert out
    r = replica.agent_status()["replica"]
    assert parse_lsn(r["redo_lsn"]) == parse_lsn(r["checkpoint_lsn"]), r  # a shutdown checkpoint
    assert replica.sql("SELECT count(*) FROM t")[0][0] == 3000
    ep.start()
    with ep.connect() as conn:
        conn.execute("INSERT INTO t SELECT generate_series(3001, 4000)")
        end = current_lsn(conn)
    wait_until("the replica to follow the new writer", lambda: _replay_lsn(replica) >= end or None, timeout=60)
    assert replica.sql("SELECT count(*) FROM t")[0][0] == 4000
