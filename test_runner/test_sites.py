"""Two sites in one local cluster (docs/sites.md): `strata init --sites 2`
puts two safekeepers and a pageserver in dc1, one safekeeper and a
pageserver in dc2, and every byte between the sites through the link
proxy, which adds the latency and cuts the link for a partition.

Each branch has a WAL placement: `local-quorum` (dc1's safekeepers make
the quorum, dc2's is asynchronous) keeps committing through a partition;
`stretched` (every commit on safekeepers of two sites) stalls and resumes
without losing anything; `local-quorum` with `throttle` holds commits once
the asynchronous safekeeper is `max_async_lag` behind."""

from __future__ import annotations

import re
import time

import pytest

from fixtures.endpoint import Endpoint, SocketSuperuser, start_endpoint
from fixtures.load import AckedWriters
from fixtures.processes import pid_alive
from fixtures.strata import parse_lsn
from fixtures.versions import MAJORS
from fixtures.wait import wait_until

LATENCY_MS = 4


def sites_cluster(cluster_factory, *extra: str):
    return cluster_factory(init_args=("--sites", "2", "--site-latency-ms", str(LATENCY_MS), *extra))


def membership(cluster, sk: str, branch: str = "main") -> dict:
    code, body = cluster.http(sk, "GET", cluster.timeline_path(branch) + "/membership")
    assert code == 200, body
    return body


def cut(cluster, heal: bool = False) -> None:
    """Cuts (or heals) every route between the sites."""
    code, body = cluster.http("link-proxy", "POST", f"/v1/route/*/{'heal' if heal else 'cut'}")
    assert code == 200, body


def proposer(ep) -> dict:
    return ep.agent_status()["proposer"]


def sk_flush(cluster, sk: str) -> int:
    return parse_lsn(cluster.timeline_status(sk)["flush_lsn"])


def wait_commits_resume(writers: AckedWriters, since: float) -> None:
    wait_until("commits to resume", lambda: len(writers.acked_between(since, time.monotonic())) > 20, timeout=60)


def lose_dc1(cluster, ep, writers: AckedWriters) -> None:
    """dc1 is cut off, then dies whole: every service of it and its writer
    (kill -9); the writers stop."""
    cut(cluster)
    time.sleep(1)
    for name in ("sk1", "sk2", "pageserver", "controller"):
        cluster.kill9(name, supervisor=True)
    ep.kill9_compute()
    writers.stop()


def check_all_acked_present(ep, writers: AckedWriters) -> None:
    present = {r[0] for r in ep.sql(f"SELECT id FROM {writers.table}")}
    lost = writers.acked_ids() - present
    assert not lost, f"{len(lost)} acknowledged commits lost, e.g. {sorted(lost)[:5]}"


def test_a_cluster_in_two_sites_places_wal_by_policy(cluster_factory):
    cluster = sites_cluster(cluster_factory)
    status = cluster.status()
    sites = {s["name"]: s["site"] for s in status["services"]}
    assert sites == {"link-proxy": "dc1", "sk1": "dc1", "sk2": "dc1", "sk3": "dc2", "pageserver": "dc1",
                     "pageserver2": "dc2", "controller": "dc1", "controller2": "dc2", "proxy": "dc1"}, sites
    # The default placement of a cluster with sites: local-quorum at home in
    # dc1, every member knowing every member's site, on every safekeeper.
    for sk in ("sk1", "sk2", "sk3"):
        m = membership(cluster, sk)
        assert m["placement"]["policy"] == "local-quorum" and m["placement"]["home"] == "dc1", m
        assert m["placement"]["on_async_lag"] == "fall-behind"
        assert [x.get("site") for x in m["members"]] == ["dc1", "dc1", "dc2"], m
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t (id int)")
    # About 400 kB of WAL (with full-page writes off, 1000 rows made only 80).
    ep.sql("INSERT INTO t SELECT generate_series(1, 5000)")
    p = proposer(ep)
    assert p["placement"] == "local-quorum", p
    # dc2's safekeeper is asynchronous, reached through the proxy.
    proxy_ports = {r["port"] for r in cluster.cluster_toml["routes"]}
    [asynchronous] = p["async_safekeepers"]
    assert int(asynchronous["address"].rsplit(":", 1)[1]) in proxy_ports, asynchronous
    wait_until("dc2's safekeeper to hold the WAL",
               lambda: sk_flush(cluster, "sk3") >= parse_lsn(p["commit_lsn"]), timeout=30)
    # The proxy relayed that WAL (and nothing within a site crosses it).
    code, proxy = cluster.http("link-proxy", "GET", "/v1/status")
    assert code == 200
    relayed = {r["name"]: r["delivered_bytes"] for r in proxy["routes"]}
    assert relayed["dc1-sk3-listen"] > 100_000, relayed

    # The placement changes live, through the membership change.
    out = cluster.run("branch", "placement", "main", "stretched").stdout
    assert "joint" in out and "stretched" in out, out
    for sk in ("sk1", "sk2", "sk3"):
        assert membership(cluster, sk)["placement"]["policy"] == "stretched"
    ep.sql("INSERT INTO t SELECT generate_series(1, 1000)")
    wait_until("the proposer to work under stretched", lambda: proposer(ep)["placement"] == "stretched", timeout=30)
    assert proposer(ep)["async_safekeepers"] == []
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 6000
    # Refused: a home site without safekeepers; stretched where all sit in one site is checked at init.
    bad = cluster.run("branch", "placement", "main", "local-quorum", "--home", "dc9", check=False)
    assert bad.returncode != 0 and "dc9" in bad.stderr, bad.stderr
    assert "placement" in (cluster.workdir / "cluster.toml").read_text()


def test_a_partition_under_local_quorum_keeps_committing(cluster_factory):
    cluster = sites_cluster(cluster_factory, "--placement", "local-quorum")
    ep = start_endpoint(cluster)
    writers = AckedWriters(ep, threads=4).start()
    try:
        time.sleep(2)
        cut(cluster)
        t0 = time.monotonic()
        time.sleep(6)
        t1 = time.monotonic()
        during = len(writers.acked_between(t0, t1))
        pause = writers.longest_pause(t0, t1)
        behind_at = sk_flush(cluster, "sk3")
        cut(cluster, heal=True)
        # dc2 catches up once the link is back.
        wait_until("dc2's safekeeper to catch up",
                   lambda: sk_flush(cluster, "sk3") >= parse_lsn(proposer(ep)["commit_lsn"]) > behind_at,
                   timeout=60)
        time.sleep(1)
    finally:
        writers.stop()
    assert during > 100, f"only {during} commits in 6 s of partition"
    assert pause < 2.0, f"commits paused {pause:.2f} s during the partition"
    assert not writers.errors, writers.errors[:3]
    check_all_acked_present(ep, writers)


def test_a_partition_under_stretched_stalls_and_resumes_without_loss(cluster_factory):
    cluster = sites_cluster(cluster_factory, "--placement", "stretched")
    ep = start_endpoint(cluster)
    assert proposer(ep)["placement"] == "stretched"
    writers = AckedWriters(ep, threads=4).start()
    try:
        time.sleep(2)
        before = writers.count()
        assert before > 20, f"{before} commits before the partition"
        cut(cluster)
        t0 = time.monotonic()
        time.sleep(5)
        t1 = time.monotonic()
        # A commit acknowledged just as the cut came may still land; after a
        # moment nothing more is, since dc1 alone is not enough.
        stalled = writers.acked_between(t0 + 1.0, t1)
        held = sk_flush(cluster, "sk3")
        cut(cluster, heal=True)
        t2 = time.monotonic()
        wait_commits_resume(writers, t2)
    finally:
        writers.stop()
    assert not stalled, f"{len(stalled)} commits acknowledged without dc2 under stretched"
    # Whatever was acknowledged is on dc2's safekeeper too.
    assert sk_flush(cluster, "sk3") >= held
    check_all_acked_present(ep, writers)


def test_throttle_holds_commits_at_max_async_lag(cluster_factory):
    cluster = sites_cluster(cluster_factory)
    lag = 1 << 20
    cluster.run("branch", "placement", "main", "local-quorum", "--max-async-lag", str(lag),
                "--on-async-lag", "throttle")
    ep = start_endpoint(cluster)
    writers = AckedWriters(ep, threads=4).start()
    try:
        time.sleep(1)
        cut(cluster)
        t0 = time.monotonic()
        # Commits go on until dc2 is a MiB behind, then wait.
        wait_until("commits to be held", lambda: proposer(ep)["throttled_seconds"] > 2, timeout=60)
        p = proposer(ep)
        dc2_holds = sk_flush(cluster, "sk3")
        [asynchronous] = p["async_safekeepers"]
        t1 = time.monotonic()
        quiet = writers.longest_pause(t0, t1)
        cut(cluster, heal=True)
        t2 = time.monotonic()
        wait_commits_resume(writers, t2)
    finally:
        writers.stop()
    assert quiet > 1.5, f"commits never waited (longest pause {quiet:.2f} s)"
    # What PostgreSQL was told is durable stays within the bound of what
    # dc2 holds, while the quorum in dc1 has committed more.
    acked_end = parse_lsn(p["acknowledged_lsn"])
    assert acked_end <= dc2_holds + lag, (p, dc2_holds)
    assert parse_lsn(p["commit_lsn"]) > acked_end, p
    assert asynchronous["lag_bytes"] > lag, asynchronous
    check_all_acked_present(ep, writers)


def test_fall_behind_drops_a_lagging_async_safekeeper_which_catches_up_from_its_peers(cluster_factory):
    cluster = sites_cluster(cluster_factory)
    cluster.run("branch", "placement", "main", "local-quorum", "--max-async-lag", str(1 << 20))
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE filler (id int, pad text)")
    cut(cluster)
    # Well past the bound while dc2 is cut off: commits never wait.
    t = time.monotonic()
    ep.sql("INSERT INTO filler SELECT g, repeat('x', 500) FROM generate_series(1, 40000) g")
    took = time.monotonic() - t
    p = proposer(ep)
    # Dropped for its lag, or its link already broken by the cut before the
    # lag passed the bound (which of the two comes first is a race): either
    # way nothing waits for it.
    assert p["async_dropped"] >= 1 or not any(s["streaming"] for s in p["async_safekeepers"]), p
    assert p["throttled_seconds"] == 0, p
    cut(cluster, heal=True)
    target = parse_lsn(p["commit_lsn"])
    wait_until("dc2's safekeeper to catch up", lambda: sk_flush(cluster, "sk3") >= target, timeout=120)
    assert took < 30, f"the load took {took:.1f} s"
    assert ep.sql("SELECT count(*) FROM filler")[0][0] == 40000


def pageserver_in_use(ep) -> dict:
    return ep.agent_status()["pageserver"]


def test_computes_in_dc2_read_their_own_sites_pageserver_and_a_replica_rides_out_a_cut(cluster_factory):
    """A writer of another branch and replicas of `main` on dc2's host.
    dc2's pageserver is `main`'s reader there: it ingests from sk3 alone
    (the WAL crosses the link once) and serves dc2's replicas. While the
    link is cut the replica answers everything up to what dc2 holds, new
    sessions and plans included; once healed it catches up with the writer
    in dc1, which kept committing. A replica told `--site dc1` reads dc1's
    pageserver through a route instead."""
    cluster = sites_cluster(cluster_factory)
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    ep.sql("INSERT INTO t SELECT g, 'before' FROM generate_series(1, 1000) g")
    cluster.run("branch", "create", "b2")
    w2 = Endpoint(cluster, "w2", branch="b2")
    w2.start("--host", "dc2")
    w2.sql("INSERT INTO t SELECT g, 'dc2' FROM generate_series(1001, 1100) g")
    assert w2.sql("SELECT count(*) FROM t")[0][0] == 1100
    p2 = proposer(w2)
    # dc2's writer reaches sk1 and sk2 (dc1) through routes, sk3 directly;
    # sk1 and sk2 are its asynchronous members (the branch's home is dc1,
    # as main's), so its commits need dc1's quorum. A writer reads the
    # attached pageserver, in dc1.
    assert p2["connected_safekeepers"] == 3, p2
    assert p2["placement"] == "local-quorum", p2
    assert pageserver_in_use(w2)["name"] == "pageserver" and not pageserver_in_use(w2)["reader"]
    status = {e["name"]: e for e in cluster.status()["endpoints"]}
    assert status["w2"]["site"] == "dc2" and status["ep"]["site"] == "dc1", status

    # The controller made dc2's pageserver the tenant's reader in dc2.
    code, ps2 = cluster.http("pageserver2", "GET", "/v1/status")
    assert code == 200, ps2
    assert [loc["mode"] for loc in ps2["locations"]] == ["reader"], ps2["locations"]
    sk3 = next(s for s in cluster.cluster_toml["services"] if s["name"] == "sk3")
    sk3_addr = f"127.0.0.1:{sk3['ports']['listen']}"

    wait_until("dc2's pageserver to stream main from sk3",
               lambda: cluster.timeline_status("pageserver2")["wal_source"] == sk3_addr, timeout=30)

    replica = start_endpoint(cluster, "r2", "--replica-of", "ep", "--site", "dc2")
    assert status_of(cluster, "r2")["host"] == "dc2"
    assert replica.sql("SELECT count(*) FROM t")[0][0] == 1000
    used = pageserver_in_use(replica)
    assert used["name"] == "pageserver2" and used["reader"], used

    # A replica in dc2 told to read dc1's pageserver goes through a route.
    far = start_endpoint(cluster, "r1", "--replica-of", "ep", "--host", "dc2", "--site", "dc1")
    assert far.sql("SELECT count(*) FROM t")[0][0] == 1000
    assert pageserver_in_use(far)["name"] == "pageserver" and not pageserver_in_use(far)["reader"]
    code, proxy = cluster.http("link-proxy", "GET", "/v1/status")
    assert any(r["accepted"] > 0 for r in proxy["routes"] if r["name"] == "dc2-pageserver-pg"), proxy
    far.stop()
    w2.stop()
    pages_routed = routed_bytes(cluster, "dc2-pageserver-pg")

    with replica.connect() as session:
        session.execute("PREPARE before AS SELECT count(*) FROM t WHERE v = 'before'")
        assert session.execute("EXECUTE before").fetchone()[0] == 1000
        cut(cluster)
        try:
            ep.sql("INSERT INTO t SELECT g, 'during' FROM generate_series(2001, 2100) g")
            # The replica answers from what dc2 holds: the session from
            # before, and new sessions and plans, whose pages come from
            # dc2's own pageserver.
            t = time.monotonic()
            assert session.execute("EXECUTE before").fetchone()[0] == 1000
            assert time.monotonic() - t < 5
            assert replica.sql("SELECT count(*), max(id) FROM t WHERE v <> 'during'")[0] == (1000, 1000)
            assert replica.sql("SELECT v FROM t WHERE id = 500")[0][0] == "before"
            assert replica.sql("SELECT count(*) FROM pg_class WHERE relname = 't'")[0][0] == 1
        finally:
            cut(cluster, heal=True)
    wait_until("the replica to catch up after the cut",
               lambda: replica.sql("SELECT count(*) FROM t WHERE v = 'during'")[0][0] == 100, timeout=60)
    # Its pages never crossed the link: the route to dc1's page service
    # carried nothing since the other computes of dc2 stopped.
    assert routed_bytes(cluster, "dc2-pageserver-pg") == pages_routed
    # The reader's WAL came from sk3 alone, which got it once from dc1.
    assert cluster.timeline_status("pageserver2")["wal_source"] in (sk3_addr, None)


def status_of(cluster, name: str) -> dict:
    return {e["name"]: e for e in cluster.status()["endpoints"]}[name]


def routed_bytes(cluster, route: str) -> int:
    code, proxy = cluster.http("link-proxy", "GET", "/v1/status")
    assert code == 200, proxy
    return sum(r["delivered_bytes"] for r in proxy["routes"] if r["name"] == route)


def test_a_reader_down_while_dc1_compacts_comes_back_from_the_newest_index(cluster_factory):
    """dc2's pageserver dies while dc1's compacts and deletes the layers
    it had replaced. The replica in dc2 reads dc1's pageserver meanwhile
    (through the route), the reader comes back from the newest index and
    ingests from sk3 again, and the replica returns to it, reading what
    the writer wrote."""
    cluster = sites_cluster(cluster_factory)
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t AS SELECT g AS id, repeat('x', 200) AS v FROM generate_series(1, 100000) g")
    replica = start_endpoint(cluster, "r2", "--replica-of", "ep", "--site", "dc2")
    assert replica.sql("SELECT count(*) FROM t")[0][0] == 100000
    assert pageserver_in_use(replica)["reader"]

    cluster.kill9("pageserver2", supervisor=True)
    wait_until("the replica to read dc1's pageserver while dc2's is down",
               lambda: pageserver_in_use(replica)["name"] == "pageserver", timeout=60)
    deleted = cluster.metrics("pageserver").get("strata_pageserver_remote_deletions_total", 0)
    ep.sql("UPDATE t SET v = 'updated' WHERE id % 10 = 0")
    code, body = cluster.http(
        "pageserver", "POST", cluster.timeline_path() + "/checkpoint?compact=true&upload_timeout=60", timeout=90)
    assert code == 200, body
    wait_until("dc1's pageserver to delete the layers compaction replaced",
               lambda: cluster.metrics("pageserver").get("strata_pageserver_remote_deletions_total", 0) > deleted,
               timeout=30)
    assert replica.sql("SELECT count(*) FROM t WHERE v = 'updated'")[0][0] == 10000

    cluster.run("start")
    wait_until("the replica back on dc2's reader",
               lambda: pageserver_in_use(replica)["name"] == "pageserver2" and pageserver_in_use(replica)["reader"],
               timeout=60)
    ep.sql("UPDATE t SET v = 'again' WHERE id % 10 = 1")
    wait_until("the replica to replay the second update",
               lambda: replica.sql("SELECT count(*) FROM t WHERE v = 'again'")[0][0] == 10000, timeout=60)
    assert replica.sql("SELECT count(*), sum(id), count(*) FILTER (WHERE v = 'updated') FROM t") == \
        ep.sql("SELECT count(*), sum(id), count(*) FILTER (WHERE v = 'updated') FROM t")
    sk3 = next(s for s in cluster.cluster_toml["services"] if s["name"] == "sk3")
    wait_until("dc2's reader to stream from sk3",
               lambda: cluster.timeline_status("pageserver2")["wal_source"] == f"127.0.0.1:{sk3['ports']['listen']}",
               timeout=30)


def report_line(out: str, branch: str = "main") -> str:
    """The loss report's line of a branch in `site promote|rejoin`'s output."""
    lines = [ln for ln in out.splitlines() if ln.startswith(f"branch {branch}: ") and
             ("lost" in ln or "nothing lost" in ln)]
    assert lines, out
    return lines[-1]


def lost_range(line: str) -> tuple[int, int, int, int | None]:
    """(F, C, bytes, transactions) of a report line `lost [F, C): N bytes, T transactions …`."""
    m = re.search(r"lost \[([0-9A-F]+/[0-9A-F]+), ([0-9A-F]+/[0-9A-F]+)\): (\d+) bytes, (?:(\d+) transactions)?", line)
    assert m, line
    return parse_lsn(m[1]), parse_lsn(m[2]), int(m[3]), int(m[4]) if m[4] else None


def test_promoting_dc2_under_local_quorum_reports_dc1s_tail_and_fences_its_writer(cluster_factory):
    """The link is cut and dc1's writer goes on committing (local-quorum):
    a tail dc2 never receives. `strata site promote dc2` (the operator
    still reaches dc1's safekeepers): dc1's writer is fenced at once, the
    branch goes on in dc2 from where its WAL ends, and the report names
    the lost range with its transactions, exactly the acknowledged commits
    dc2's writer does not have. The divergent branch keeps them, readable;
    after the heal `strata site rejoin dc1` brings dc1's safekeepers in as
    asynchronous members of the new home."""
    cluster = sites_cluster(cluster_factory)
    ep = start_endpoint(cluster)
    writers = AckedWriters(ep, threads=2).start()
    wait_until("commits", lambda: writers.count() > 50, timeout=60)
    cut(cluster)
    cut_at = time.monotonic()
    wait_until("commits past the cut", lambda: len(writers.acked_between(cut_at + 0.5, time.monotonic())) > 50,
               timeout=60)
    started = time.monotonic()
    out = cluster.run("site", "promote", "dc2").stdout
    print(out)
    # dc1's writer is fenced: the seal closed its safekeeper connections,
    # and they refuse it when it comes back, so it stops for good (its
    # supervisor does not start it again) having acknowledged nothing after
    # the seal.
    pids = ep.supervisor_pid(), ep.agent_pid()
    wait_until("dc1's writer stopped for good",
               lambda: not any(p is not None and pid_alive(p) for p in (*pids, ep.postmaster_pid())), timeout=60)
    assert not writers.acked_between(started + 5, time.monotonic()), "dc1's writer committed after the seal"
    assert "has sealed the timeline" in (ep.dir / "compute.log").read_text()
    writers.stop()
    f, c, nbytes, txns = lost_range(report_line(out))
    assert c > f and nbytes == c - f and txns is not None, out
    connstr = out.strip().splitlines()[-1]
    assert connstr.startswith("postgres"), out
    # The writers' table is the superuser's, as the fixtures made it.
    dc2 = SocketSuperuser(cluster.workdir / "endpoints" / "main-dc2" / "pgdata")
    with dc2.connect() as conn:
        on_dc2 = {r[0] for r in conn.execute(f"SELECT id FROM {writers.table}")}
        conn.execute(f"INSERT INTO {writers.table} (id, writer) VALUES (-1, -1)")  # the new writer commits
    acked = writers.acked_ids()
    missing = acked - on_dc2
    assert missing, "the cut left no tail in dc1"
    # Every acknowledged commit dc2 lacks is in the reported range: one transaction each.
    assert len(missing) <= txns, (len(missing), txns)
    assert not (on_dc2 - acked - writers.in_doubt), "dc2 has commits nobody attempted"
    # The branches: main goes on in a new timeline, dc1's history is kept.
    branches = {b["name"]: b for b in cluster.tenant()["branches"]}
    divergent = f"main-divergent-{f:X}"
    assert branches[divergent]["divergent"]["continued_as"] == "main"
    assert branches["main"]["parent"] == divergent
    status = {e["name"]: e for e in cluster.status()["endpoints"]}
    assert status["ep"]["branch"] == divergent and status["main-dc2"]["site"] == "dc2", status
    code, sk1 = cluster.http("sk1", "GET", cluster.timeline_path(divergent))
    assert code == 200 and sk1["sealed"], sk1

    cut(cluster, heal=True)
    out = cluster.run("site", "rejoin", "dc1").stdout
    assert lost_range(report_line(out))[:2] == (f, c), out
    # The divergent branch reads as dc1 had it: every acknowledged commit
    # (dc2's pageserver ingests its tail from dc1's sealed safekeepers).
    reader = Endpoint(cluster, "old", branch=divergent)
    reader.start("--at", f"{c >> 32:X}/{c & 0xFFFFFFFF:X}")
    on_dc1 = {r[0] for r in reader.sql(f"SELECT id FROM {writers.table}")}
    assert acked <= on_dc1, f"{len(acked - on_dc1)} acknowledged commits missing from the divergent branch"
    assert not (on_dc1 - acked - writers.in_doubt)
    # dc1's safekeepers hold main's new timeline and catch up as asynchronous members.
    with dc2.connect() as conn:
        conn.execute(f"INSERT INTO {writers.table} (id, writer) VALUES (-2, -1)")
        end = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    wait_until("dc1's safekeepers to catch up on main",
               lambda: min(sk_flush(cluster, "sk1"), sk_flush(cluster, "sk2")) >= end, timeout=60)
    assert membership(cluster, "sk1")["placement"]["home"] == "dc2"


@pytest.mark.parametrize("major", MAJORS)
def test_promoting_dc2_under_stretched_after_losing_dc1_loses_nothing(cluster_factory, major):
    """Under `stretched` every acknowledged commit is on dc2's safekeeper,
    for a cluster of each major.
    dc1 is cut off, then dies whole (every service and the writer, kill
    -9); `strata site promote dc2` reports nothing lost and dc2's writer
    has every acknowledged commit. dc1 comes back: `strata site rejoin dc1`
    confirms nothing was lost, and the old writer, started again on its
    (divergent) branch, is refused: its timeline is sealed."""
    cluster = sites_cluster(cluster_factory, "--placement", "stretched", "--pg-version", str(major))
    ep = start_endpoint(cluster)
    assert ep.sql("SELECT current_setting('server_version_num')::int / 10000") == [(major,)]
    writers = AckedWriters(ep, threads=2).start()
    wait_until("commits", lambda: writers.count() > 50, timeout=60)
    lose_dc1(cluster, ep, writers)
    out = cluster.run("site", "promote", "dc2", timeout=300).stdout
    assert "nothing lost: under stretched" in report_line(out), out
    with SocketSuperuser(cluster.workdir / "endpoints" / "main-dc2" / "pgdata").connect() as conn:
        on_dc2 = {r[0] for r in conn.execute(f"SELECT id FROM {writers.table}")}
    lost = writers.acked_ids() - on_dc2
    assert not lost, f"{len(lost)} acknowledged commits lost under stretched"

    cut(cluster, heal=True)
    cluster.run("start")
    # dc1's safekeepers seal the old timeline as soon as they hear from sk3.
    divergent = next(b["name"] for b in cluster.tenant()["branches"] if b.get("divergent"))
    for sk in ("sk1", "sk2"):
        wait_until(f"{sk} to adopt the seal from its peer",
                   lambda sk=sk: cluster.timeline_status(sk, divergent)["sealed"], timeout=30)
    out = cluster.run("site", "rejoin", "dc1").stdout
    assert "nothing lost" in report_line(out), out
    # The old writer, on its sealed timeline, cannot commit.
    res = cluster.run("endpoint", "start", "ep", check=False, timeout=180)
    assert res.returncode != 0, res.stdout
    assert "sealed" in (res.stdout + res.stderr).lower(), res.stdout + res.stderr


def test_promoting_dc2_carries_a_sharded_tenant_over_shard_by_shard(cluster_factory):
    """A tenant of two shards, one attached in each site, under
    `stretched`; dc1 dies whole (kill -9). `strata site promote dc2`
    attaches both shards in dc2 and forks each of them at F into one new
    timeline; the writer it starts in dc2 has every acknowledged commit and
    reads pgbench's tables, striped over both shards, as dc1 had them."""
    cluster = sites_cluster(cluster_factory, "--placement", "stretched")
    cluster.run("tenant", "create", "sh", "--shards", "2", "--stripe-blocks", "8", timeout=300)
    tenant_id = cluster.tenant_id("sh")

    def placements() -> dict:
        """The leading controller's attached pageserver of each shard."""
        for ctl in ("controller", "controller2"):
            code, body = cluster.http(ctl, "GET", "/v1/status") if cluster.answers(ctl) else (0, {})
            if code == 200 and body.get("leader"):
                return {t: p["attached"] for t, p in body["state"]["tenants"].items() if t.startswith(tenant_id)}
        return {}

    def spread() -> bool:
        return sorted(placements().values()) == ["pageserver", "pageserver2"]
    wait_until("a shard attached in each site", spread, timeout=60, details=placements)
    ep = Endpoint(cluster, "ep")
    ep.start("--tenant", "sh")
    ep.run(["pgbench", "-i", "-s", "1", "-q"], timeout=300)
    digest = "SELECT md5(string_agg(a::text, ',' ORDER BY aid)), count(*) FROM pgbench_accounts a"
    before = ep.sql(digest)
    writers = AckedWriters(ep, threads=2).start()
    wait_until("commits", lambda: writers.count() > 50, timeout=60)
    lose_dc1(cluster, ep, writers)

    out = cluster.run("site", "promote", "dc2", timeout=300).stdout
    assert "pageserver2: the tenant is attached in dc2" in out, out
    assert "nothing lost: under stretched" in report_line(out), out
    # Both shards have main's new timeline on dc2's pageserver, and the
    # old one is the divergent branch.
    branches = {b["name"]: b for b in cluster.tenant("sh")["branches"]}
    divergent = next(n for n, b in branches.items() if b.get("divergent"))
    assert branches["main"]["parent"] == divergent, branches
    for n in range(2):
        path = f"/v1/tenant/{tenant_id}-{n}of2/timeline/{branches['main']['timeline_id']}"
        code, body = cluster.http("pageserver2", "GET", path)
        assert code == 200, (n, body)
    dc2 = SocketSuperuser(cluster.workdir / "endpoints" / "sh-main-dc2" / "pgdata")
    with dc2.connect() as conn:
        on_dc2 = {r[0] for r in conn.execute(f"SELECT id FROM {writers.table}")}
        assert conn.execute(digest).fetchall() == before
        conn.execute(f"INSERT INTO {writers.table} (id, writer) VALUES (-1, -1)")  # the new writer commits
    lost = writers.acked_ids() - on_dc2
    assert not lost, f"{len(lost)} acknowledged commits lost under stretched"
    assert not (on_dc2 - writers.acked_ids() - writers.in_doubt), "dc2 has commits nobody attempted"

    # dc1 returns: `site rejoin dc1` fills its pageserver again, and the
    # shards spread over both sites while dc2's writer goes on.
    cut(cluster, heal=True)
    cluster.run("start")
    old_path = f"/v1/tenant/{tenant_id}/timeline/{branches[divergent]['timeline_id']}"
    for sk in ("sk1", "sk2"):
        wait_until(f"{sk} to adopt the seal from its peer",
                   lambda sk=sk: cluster.http(sk, "GET", old_path)[1]["sealed"], timeout=30)
    out = cluster.run("site", "rejoin", "dc1").stdout
    assert "nothing lost" in report_line(out), out

    wait_until("the shards to spread over both sites again", spread, timeout=120, details=placements)
    with dc2.connect() as conn:
        conn.execute(f"INSERT INTO {writers.table} (id, writer) VALUES (-2, -1)")
        assert conn.execute(digest).fetchall() == before
        assert conn.execute(f"SELECT count(*) FROM {writers.table} WHERE id < 0").fetchall() == [(2,)]
