"""Branches (docs/branches.md) through the CLI's cluster: `strata branch
create|list`, computes on branches, isolation, a branch of a branch, a
branch at a time that brings back a dropped table, and the state of
prepared and in-progress transactions at the branch point."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
from pathlib import Path

import psycopg

from fixtures.checks import assert_pgbench_invariants, pgbench_state, run_amcheck
from fixtures.endpoint import Endpoint, current_lsn
from fixtures.load import PgbenchLoop
from fixtures.page_compare import catalog, compare_data_dir, mismatch_report, quiet_compute, wait_quiet
from fixtures.pageserver_api import PageserverApi, error_message
from fixtures.pg import PgCluster
from fixtures.strata import format_lsn, http_text, parse_lsn
from fixtures.wait import wait_until
from fixtures.workload import run_broad_workload


def branch_create(cluster, name: str, *extra: str) -> tuple[str, int]:
    """Creates a branch; returns its timeline id and start LSN."""
    out = cluster.run("branch", "create", name, *extra, timeout=120).stdout.strip().splitlines()[-1]
    # branch NAME: timeline ID, from PARENT at LSN
    words = out.split()
    assert words[0] == "branch" and words[1] == f"{name}:", out
    return words[3].rstrip(","), parse_lsn(words[-1])


def branches(cluster) -> dict[str, dict]:
    return {b["name"]: b for b in json.loads(cluster.run("branch", "list", "--json").stdout)}


def ids(ep: Endpoint, table: str = "t") -> list[int]:
    return [r[0] for r in ep.sql(f"SELECT id FROM {table} ORDER BY id")]


def test_branches_are_isolated_and_a_branch_of_a_branch_reads_through_both(cluster):
    main = Endpoint(cluster, "main-ep")
    main.start()
    main.run(["pgbench", "-i", "-s", "1", "-q"], timeout=300)
    main.sql("CREATE TABLE t (id int PRIMARY KEY)")
    main.sql("INSERT INTO t SELECT generate_series(1, 100)")

    timeline, start = branch_create(cluster, "dev")
    listed = branches(cluster)
    assert listed["dev"]["parent"] == "main" and listed["dev"]["timeline_id"] == timeline, listed
    assert parse_lsn(listed["dev"]["ancestor_lsn"]) == start
    assert start <= main.wal_lsn()

    dev = Endpoint(cluster, "dev-ep", branch="dev")
    dev.start()
    assert ids(dev) == list(range(1, 101)), "the branch has the parent's rows at the branch point"
    dev.sql("INSERT INTO t SELECT generate_series(101, 200)")
    main.sql("INSERT INTO t SELECT generate_series(1001, 1100)")
    assert ids(dev) == list(range(1, 201))
    assert ids(main) == list(range(1, 101)) + list(range(1001, 1101)), "the child's writes never show on the parent"

    # A branch of the branch.
    branch_create(cluster, "hotfix", "--from", "dev")
    hot = Endpoint(cluster, "hot-ep", branch="hotfix")
    hot.start()
    assert ids(hot) == list(range(1, 201))
    hot.sql("DELETE FROM t WHERE id > 150")
    assert ids(hot) == list(range(1, 151))
    assert ids(dev) == list(range(1, 201)), "the grandchild's writes never show on its parent"

    # pgbench on two branches at once, then invariants and amcheck on each.
    with main.connect() as conn:
        main_before = pgbench_state(conn)
    with dev.connect() as conn:
        dev_before = pgbench_state(conn)
    runs = [ep.popen(["pgbench", "-n", "-c", "2", "-t", "150"]) for ep in (main, dev)]
    for r in runs:
        assert r.wait(timeout=600) == 0
    for ep, before in ((main, main_before), (dev, dev_before)):
        with ep.connect() as conn:
            after = pgbench_state(conn)
        assert after.counts["pgbench_history"] == before.counts["pgbench_history"] + 300
        assert_pgbench_invariants(after, 1)
        run_amcheck(ep)
    with hot.connect() as conn:
        assert pgbench_state(conn) == dev_before, "pgbench on dev does not reach hotfix"

    tree = cluster.run("branch", "list").stdout
    print("\n" + tree)
    lines = tree.splitlines()
    assert lines[1].startswith("main") and "dev" in lines[2] and "hotfix" in lines[3], tree
    assert "main-ep" in lines[1] and "dev-ep" in lines[2] and "hot-ep" in lines[3], tree
    assert branches(cluster)["dev"]["logical_size"] > 10 << 20

    # Every branch comes back after the whole cluster restarts.
    for ep in (main, dev, hot):
        ep.stop()
    cluster.stop()
    cluster.start()
    for ep in (main, dev, hot):
        ep.start()
    assert ids(main) == list(range(1, 101)) + list(range(1001, 1101))
    assert ids(dev) == list(range(1, 201))
    assert ids(hot) == list(range(1, 151))


def test_branch_points_are_checked(cluster):
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE t (id int)")
    now = ep.wal_lsn()

    def refused(*args: str) -> str:
        r = cluster.run("branch", "create", *args, check=False, timeout=120)
        assert r.returncode != 0, r
        return r.stderr

    branch_create(cluster, "b1")
    assert "exists" in refused("b1")
    assert "no branch named" in refused("b2", "--from", "nope")
    assert "in the future" in refused("b2", "--at", format_lsn(now + (1 << 30)))
    start = parse_lsn(branches(cluster)["b1"]["ancestor_lsn"])
    assert "not a WAL position" in refused("b2", "--at", format_lsn(start - 4))
    assert "before the start" in refused("b2", "--at", "0/10")
    assert "in the future" in refused("b2", "--at-time", "2999-01-01 00:00:00+00")
    assert "no commit" in refused("b2", "--at-time", "2001-01-01 00:00:00+00")
    r = cluster.run("branch", "create", "b2", "--at-time", "yesterday", check=False)
    assert r.returncode == 2 and "--at-time" in r.stderr, r
    assert set(branches(cluster)) == {"main", "b1"}


def test_a_branch_at_a_time_brings_back_a_dropped_table(cluster):
    """Write, note the time, DROP TABLE, branch at the noted time: the table
    is there with every row committed before it. Exact to the commit: rows
    committed one after another around the noted times split exactly."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE important (id int PRIMARY KEY, note text)")
    marks = []
    with ep.connect() as conn:
        for i in range(1, 301):
            conn.execute("INSERT INTO important VALUES (%s, 'row')", (i,))
            if i % 100 == 0:
                # The time after commit i, before commit i + 1 begins.
                marks.append((i, conn.execute("SELECT clock_timestamp()::text").fetchone()[0]))
    time.sleep(0.2)
    ep.sql("DROP TABLE important")

    for i, at in marks:
        name = f"before-drop-{i}"
        branch_create(cluster, name, "--at-time", at)
        b = Endpoint(cluster, f"ep-{i}", branch=name)
        b.start()
        assert ids(b, "important") == list(range(1, i + 1)), f"branch at {at}"
        b.stop()
    try:
        ep.sql("SELECT count(*) FROM important")
        raise AssertionError("the parent still has the table")
    except psycopg.errors.UndefinedTable:
        pass


def test_prepared_and_in_progress_transactions_at_the_branch_point(cluster):
    """A branch behaves as after a crash at its point: a transaction in
    progress there is aborted on the branch, a prepared one is kept and can
    be committed there, independently of the parent."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, what text)")
    with ep.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t SELECT i, 'prepared' FROM generate_series(1, 10) i")
        conn.execute("PREPARE TRANSACTION 'p1'")
    open_conn = psycopg.connect(**ep.conninfo(), autocommit=False)
    try:
        open_conn.execute("INSERT INTO t SELECT i, 'in progress' FROM generate_series(11, 20) i")
        ep.sql("INSERT INTO t VALUES (100, 'committed')")
        branch_create(cluster, "after-crash")
    finally:
        open_conn.commit()
        open_conn.close()
    b = Endpoint(cluster, "b", branch="after-crash")
    b.start()
    assert b.sql("SELECT gid FROM pg_prepared_xacts") == [("p1",)]
    assert b.sql("SELECT id, what FROM t ORDER BY id") == [(100, "committed")]
    b.sql("COMMIT PREPARED 'p1'")
    assert [r[0] for r in b.sql("SELECT id FROM t ORDER BY id")] == list(range(1, 11)) + [100]
    # The parent: the in-progress transaction committed later; p1 still prepared there.
    assert ep.sql("SELECT gid FROM pg_prepared_xacts") == [("p1",)]
    ep.sql("ROLLBACK PREPARED 'p1'")
    assert [r[0] for r in ep.sql("SELECT id FROM t ORDER BY id")] == list(range(11, 21)) + [100]
    assert [r[0] for r in b.sql("SELECT id FROM t ORDER BY id")] == list(range(1, 11)) + [100]


def test_deleting_branches(cluster):
    """A branch with a running endpoint is deleted only with --force, one
    with branches not at all, `main` never. Deleted, its timeline is gone
    from the pageserver, the safekeepers and object storage, and the parent
    no longer retains its branch point."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT generate_series(1, 10) AS id")
    timeline, start = branch_create(cluster, "doomed")
    branch_create(cluster, "child", "--from", "doomed")
    on = Endpoint(cluster, "on-doomed", branch="doomed")
    on.start()
    assert ids(on) == list(range(1, 11))

    def refused(*args: str) -> str:
        r = cluster.run("branch", "delete", *args, check=False, timeout=120)
        assert r.returncode == 1, r
        return r.stderr

    assert "first branch" in refused("main")
    assert "has branches (child)" in refused("doomed")
    cluster.run("branch", "delete", "child", timeout=120)
    assert "stop it first or use --force" in refused("doomed")
    main_tl = cluster.timeline_id("main")
    code, st = cluster.http("pageserver", "GET", f"/v1/tenant/{cluster.tenant_id()}/timeline/{main_tl}")
    assert [parse_lsn(x) for x in st["retain_lsns"]] == [start], st
    cluster.run("branch", "delete", "doomed", "--force", timeout=120)
    assert on.postmaster_pid() is None

    assert set(branches(cluster)) == {"main"}
    path = f"/v1/tenant/{cluster.tenant_id()}/timeline/{timeline}"
    assert cluster.http("pageserver", "GET", path)[0] == 404
    for sk in ("sk1", "sk2", "sk3"):
        assert cluster.http(sk, "GET", path)[0] == 404
    remote = cluster.workdir / "remote_storage"
    assert not list(remote.glob(f"tenants/*/timelines/{timeline}/*")), "the branch's layers are still in object storage"
    assert not list(remote.glob(f"wal/*/{timeline}/*")), "the branch's WAL is still in object storage"
    code, st = cluster.http("pageserver", "GET", f"/v1/tenant/{cluster.tenant_id()}/timeline/{main_tl}")
    assert st["retain_lsns"] == [], st
    assert ids(ep) == list(range(1, 11))


def test_the_branch_tree_comes_back_from_object_storage_alone(cluster):
    """Every branch, checkpointed into object storage; the pageserver loses
    its disk and attaches the tenant from object storage alone: the tree is
    whole (each branch names its parent) and every branch reads as before."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT generate_series(1, 1000) AS id")
    branch_create(cluster, "dev")
    ep.sql("INSERT INTO t SELECT generate_series(1001, 2000)")
    dev = Endpoint(cluster, "dev-ep", branch="dev")
    dev.start()
    dev.sql("DELETE FROM t WHERE id % 2 = 0")
    branch_create(cluster, "deeper", "--from", "dev")
    dev.sql("DELETE FROM t WHERE id < 100")
    for e in (ep, dev):
        e.stop()
    expected = {"main": list(range(1, 2001)), "dev": [i for i in range(1, 1001) if i % 2 and i >= 100],
                "deeper": [i for i in range(1, 1001) if i % 2]}
    for name in expected:
        cluster.run("timeline", "checkpoint", "--branch", name, timeout=600)
    before = {name: b["ancestor_lsn"] for name, b in branches(cluster).items()}

    ps_data = cluster.data_dir("pageserver")
    cluster.stop("--only", "pageserver")
    shutil.rmtree(ps_data / "tenants")
    cluster.start("--only", "pageserver")
    tenant = cluster.tenant_id()
    for name, b in branches(cluster).items():
        code, st = cluster.http("pageserver", "GET", f"/v1/tenant/{tenant}/timeline/{b['timeline_id']}")
        assert code == 200 and st["state"] == "active", st
        parent = b["parent"] and cluster.timeline_id(b["parent"])
        assert st["ancestor_timeline_id"] == parent and st["ancestor_lsn"] == before[name], (name, st)
    for name, rows in expected.items():
        e = Endpoint(cluster, f"after-{name}", branch=name)
        e.start()
        assert ids(e) == rows, name
        e.stop()
    assert cluster.metrics("pageserver")["strata_pageserver_layers_downloaded_total"] > 0


def test_gc_keeps_branch_points_and_refuses_points_below_its_cutoff(cluster_factory):
    """With a 2 s PITR window: a branch made inside the window keeps its
    point readable through GC (it reads exactly what it held), while the
    parent's history older than the window goes, and a branch below the
    cutoff, by LSN or by time, is refused naming it."""
    cluster = cluster_factory(start=False)
    cluster.configure("pageserver", {"pitr_interval": 2.0, "gc_horizon": 0, "gc_period": 3600.0})
    cluster.start()
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY)")
    ep.sql("INSERT INTO t SELECT generate_series(1, 100)")
    with ep.connect() as conn:
        old = current_lsn(conn)
        old_time = conn.execute("SELECT clock_timestamp()::text").fetchone()[0]
    tenant, main_tl = cluster.tenant_id(), cluster.timeline_id()
    # Images at the old rows: what GC removes below them is the history older than the window.
    code, st = cluster.http("pageserver", "POST", f"/v1/tenant/{tenant}/timeline/{main_tl}/checkpoint?compact=true")
    assert code == 200 and st["compaction"]["images_written"] > 0, st
    time.sleep(2.5)
    ep.sql("INSERT INTO t SELECT generate_series(101, 150)")
    with ep.connect() as conn:
        leased = current_lsn(conn)
    ro = Endpoint(cluster, "ro")
    ro.start("--at", format_lsn(leased))
    ep.sql("INSERT INTO t SELECT generate_series(151, 200)")
    _, inside = branch_create(cluster, "inside")
    ep.sql("INSERT INTO t SELECT generate_series(201, 300)")
    time.sleep(2.5)
    ep.sql("INSERT INTO t SELECT generate_series(301, 400)")
    code, st = cluster.http("pageserver", "POST", f"/v1/tenant/{tenant}/timeline/{main_tl}/checkpoint?compact=true&gc=true")
    assert code == 200, st
    cutoff = parse_lsn(st["gc"]["cutoff"])
    print("\ngc:", st["gc"], "branch point", hex(inside))
    assert old < cutoff == leased < inside, "the cutoff passed the old rows and stopped at the lease"
    assert ids(ro) == list(range(1, 151))
    assert st["gc"]["layers_removed"] > 0, st["gc"]

    b = Endpoint(cluster, "inside-ep", branch="inside")
    b.start()
    assert ids(b) == list(range(1, 201))
    r = cluster.run("branch", "create", "too-old", "--at", format_lsn(old), check=False)
    assert r.returncode == 1 and "below the GC cutoff" in r.stderr and st["gc"]["cutoff"] in r.stderr, r
    r = cluster.run("branch", "create", "too-old", "--at-time", old_time, check=False)
    assert r.returncode == 1 and "no commit" in r.stderr, r
    r = cluster.run("endpoint", "start", "ro-old", "--at", format_lsn(old), check=False)
    assert r.returncode == 1 and "below the GC cutoff" in r.stderr, r
    # The pageserver refuses such a basebackup before it starts streaming.
    old_text = format_lsn(old).replace("/", "%2F")
    code, body = cluster.http("pageserver", "GET",
                              f"/v1/tenant/{tenant}/timeline/{main_tl}/basebackup?lsn={old_text}&read_only=true")
    assert code == 410 and "below the GC cutoff" in body["error"], (code, body)
    assert ids(ep) == list(range(1, 401))


def test_a_read_only_endpoint_at_a_point_of_a_branch(cluster):
    """`endpoint start --at LSN|TIME` runs a read-only compute at that point,
    next to the branch's writer: it sees the branch as it was, PostgreSQL
    itself refuses its writes, and its LSN is leased on the pageserver."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY)")
    ep.sql("INSERT INTO t SELECT generate_series(1, 100)")
    with ep.connect() as conn:
        lsn = current_lsn(conn)
        at_time = conn.execute("SELECT clock_timestamp()::text").fetchone()[0]
    ep.sql("INSERT INTO t SELECT generate_series(101, 200)")

    by_lsn = Endpoint(cluster, "by-lsn")
    by_lsn.start("--at", format_lsn(lsn))
    by_time = Endpoint(cluster, "by-time")
    by_time.start("--at", at_time)
    for ro in (by_lsn, by_time):
        assert ids(ro) == list(range(1, 101))
        assert ro.sql("SELECT pg_is_in_recovery()") == [(True,)]
        with ro.connect() as conn:
            try:
                conn.execute("INSERT INTO t VALUES (1000)")
                raise AssertionError("a read-only compute took a write")
            except psycopg.errors.ReadOnlySqlTransaction as e:
                assert "read-only transaction" in str(e)
    # The writer goes on.
    ep.sql("INSERT INTO t VALUES (201)")
    assert ids(ep) == list(range(1, 202))
    tenant = cluster.tenant_id()
    code, st = cluster.http("pageserver", "GET", f"/v1/tenant/{tenant}/timeline/{cluster.timeline_id()}")
    leases = [parse_lsn(x["lsn"]) for x in st["leases"]]
    assert lsn in leases and all(0 < x["seconds_left"] <= 600 for x in st["leases"]), st["leases"]
    path = f"/v1/tenant/{tenant}/timeline/{cluster.timeline_id()}/lease"
    for bad in ("0/8", "0/16B3741", "FFFF/0"):
        code, body = cluster.http("pageserver", "POST", path, {"lsn": bad})
        assert code == 422, (bad, code, body)
    # Restarted, it is at the same point.
    by_lsn.stop()
    by_lsn.start()
    assert ids(by_lsn) == list(range(1, 101))
    r = cluster.run("endpoint", "start", "bad", "--at", "last tuesday", check=False)
    assert r.returncode == 2 and "--at" in r.stderr, r


def test_every_page_of_a_branch_equals_stock_postgres_replayed_to_its_point(cluster_factory, pg_bin_dir, tmp_path):
    """A branch at LSN P of a compute that ran the broad workload (every
    index access method, TOAST, both CREATE DATABASE strategies, two-phase
    commit, multixacts, VACUUM FULL, ...): after the parent has gone on,
    written images above P and garbage-collected past P with a 1 s PITR
    window, every block of every relation fork of a stock PostgreSQL
    restored from a base backup and replayed to exactly P (archive recovery
    from the offloaded WAL, recovery_target_lsn) equals the branch's page
    at P, under PostgreSQL's masking rules, and every fork's size agrees."""
    # PostgreSQL runs its restore_command as its own user, who must not read
    # the cluster's storage key: this archive is left unencrypted
    # (docs/security.md, "Encryption at rest").
    cluster = cluster_factory(start=False, init_args=("--no-encryption-at-rest",))
    cluster.configure_safekeepers({"partial_offload_after": 1})
    cluster.configure("pageserver", {"pitr_interval": 1.0, "gc_horizon": 0, "gc_period": 3600.0})
    cluster.start()
    ep = Endpoint(cluster, "ep")
    ep.start()
    # Nothing in the background writes between the point and the checks;
    # every database's catalog (template0's too) can be read on the stock server.
    quiet_compute(ep)
    stock = PgCluster(pg_bin_dir, tmp_path / "stock", traverse_root=tmp_path)
    ep.run(["pg_basebackup", "-D", str(stock.pgdata), "-X", "none", "-c", "fast", "--no-sync"], timeout=300)

    run_broad_workload(ep)
    wait_quiet(ep)
    # At the point: a prepared transaction and one in progress.
    ep.sql("CREATE TABLE prepared_t (id int)")
    with ep.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO prepared_t SELECT generate_series(1, 100)")
        conn.execute("PREPARE TRANSACTION 'at_the_point'")
    with ep.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO pgbench_history VALUES (1, 1, 1, 42, now(), 'in progress')")
        with ep.connect() as other:
            other.execute("UPDATE pgbench_branches SET bbalance = bbalance + 7")
            point = current_lsn(other)
        conn.execute("COMMIT")
    ps = PageserverApi(cluster)
    ps.wait_lsn(point)
    timeline, start = branch_create(cluster, "exact", "--at", format_lsn(point))
    assert start == point

    # The parent goes on: new versions of what the point has, images above
    # the point, then GC past it with a 1 s window.
    tenant, main_tl = cluster.tenant_id(), cluster.timeline_id()
    gc_path = f"/v1/tenant/{tenant}/timeline/{main_tl}/checkpoint?compact=true"
    for _ in range(2):
        ep.run(["pgbench", "-n", "-t", "200", "-c", "2"], timeout=300)
        ep.sql("VACUUM FULL pgbench_accounts")
        code, st = cluster.http("pageserver", "POST", gc_path)
        assert code == 200 and st["compaction"]["images_written"] > 0, st
    time.sleep(1.5)
    ep.sql("CREATE TABLE after_the_point AS SELECT generate_series(1, 10) AS id")
    code, st = cluster.http("pageserver", "POST", gc_path + "&gc=true")
    assert code == 200, st
    gc = st["gc"]
    print("\ngc past the branch point:", gc, "point", format_lsn(point))
    assert parse_lsn(gc["cutoff"]) > point and [parse_lsn(p) for p in gc["retained_points"]] == [point], gc
    assert gc["layers_removed"] > 0, gc
    # The parent reads at the retained point only, not next to it.
    code, body = ps.page(1664, 0, 1262, "main", 0, point + 8)
    assert code == 410 and "below the GC cutoff" in error_message(body), (code, body)
    code, _ = ps.page(1664, 0, 1262, "main", 0, point)
    assert code == 200

    # The stock server: the base backup, replayed from the offloaded WAL to
    # exactly the point (every record that ends at or before it), promoted.
    # The compute stops first: no WAL comes after, so every object the
    # restore reads is uploaded before `wal_restore_command` lets
    # PostgreSQL's user read the store's objects (those there now).
    ep.stop()

    def offloaded_to_the_end() -> bool:
        st = cluster.timeline_status("sk1")
        off = st["offload"]
        return max(parse_lsn(off["offloaded_lsn"]), parse_lsn(off["partial_lsn"])) >= parse_lsn(st["flush_lsn"])

    wait_until("the WAL offloaded to its end", offloaded_to_the_end, timeout=120)
    try:
        stock.recover_from_archive(cluster.wal_restore_command(), {
            "autovacuum": "off", "recovery_target_lsn": format_lsn(point), "recovery_target_inclusive": "off"},
            timeout=300)
        replayed = parse_lsn(stock.sql("SELECT pg_last_wal_replay_lsn()::text")[0][0])
        assert replayed == point, f"stock replay ended at {replayed:X}, the point is {point:X}"
        assert stock.sql("SELECT gid FROM pg_prepared_xacts") == [("at_the_point",)]
        assert stock.sql("SELECT count(*) FROM pgbench_history WHERE filler = 'in progress'") == [(0,)]
        dbs, rels = catalog(stock)
        stock.sql("CHECKPOINT")
        stock.stop()

        ps.timeline = timeline
        t0 = time.monotonic()
        cmp = compare_data_dir(ps, stock, rels, point)
        report = {**cmp.summary(), "comparison_seconds": round(time.monotonic() - t0, 1)}
        print("branch pages against stock PostgreSQL at the point:", json.dumps(report, indent=1))
        assert not cmp.mismatches, mismatch_report(report, cmp.mismatches)
        assert not cmp.size_mismatches, json.dumps(cmp.size_mismatches[:20], indent=1)
        assert cmp.blocks_compared == cmp.blocks_equal > 4000, report
        for kind in ("heap", "btree", "hash", "gin", "gist", "spgist", "brin", "vm"):
            assert cmp.by_kind[kind] > 0, f"no {kind} page compared: {report}"
        assert {"postgres", "template0", "template1", "db_wal_log"} <= set(dbs), dbs
    finally:
        stock.cleanup()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_branch_churn_under_load_leaves_no_memory_behind(cluster_factory):
    """Branches made, read and deleted one after another under pgbench RW:
    nothing of a deleted branch stays in the pageserver. Its median RSS
    after a branch over the last 12 branches is within one in-memory layer
    (`checkpoint_distance`) of its median over the 12 before, where a
    leak of the size once reported (25 MiB a branch) would add 300 MiB;
    the long run is `bench/memory_soak.py`."""
    distance = 8 << 20
    cluster = cluster_factory(start=False)
    cluster.configure("pageserver", {"checkpoint_distance": distance})
    cluster.start()
    main = Endpoint(cluster, "main-ep")
    main.start()
    main.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    bench = PgbenchLoop(main).start()

    def churn(n: int) -> None:
        branch_create(cluster, f"churn{n}")
        ep = Endpoint(cluster, f"churn{n}-ep", branch=f"churn{n}")
        ep.start()
        assert ep.sql("SELECT count(*) FROM pgbench_accounts")[0][0] == 200_000
        ep.stop()
        cluster.run("branch", "delete", f"churn{n}", timeout=120)

    for n in range(6):
        churn(n)
    pid = cluster.pid("pageserver")
    # The median RSS after a branch over each of two windows of 12.
    # In-memory layers, reconstructions and ingest fill and empty in both
    # windows alike: the RSS after a branch ranges over 20 MiB and more,
    # so a window's highest or lowest is one outlier (a CI run's highest
    # rose by 26 MiB with no leak). Anything a branch left behind raises
    # every later value, the median too.
    series = []
    for n in range(6, 30):
        churn(n)
        series.append(round(rss_mib(pid), 1))
    windows = [statistics.median(series[:12]), statistics.median(series[12:])]
    bench.stop()
    assert bench.restarts() <= 1, bench.runs
    print(f"\npageserver RSS, median over branches 7-18 and 19-30: {windows[0]:.0f} and {windows[1]:.0f} MiB; "
          f"after each: {series}")
    # A bounded structure filling late may add up to one in-memory layer;
    # 1.5 MiB left by each branch would pass that.
    assert windows[1] - windows[0] <= distance / (1 << 20) + 8, (windows, series)
    # Every deleted branch is gone from the pageserver: main alone is left.
    metrics = http_text(cluster.http_url("pageserver", "/metrics"))
    counts = re.findall(r'^strata_pageserver_timelines\{state="\w+"\} (\S+)$', metrics, re.M)
    assert sum(float(c) for c in counts) == 1, counts
