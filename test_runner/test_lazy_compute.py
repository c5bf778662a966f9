"""Lazy computes (docs/lazy-compute.md), through the CLI's cluster: the lazy
basebackup carries no relation data and a manifest that names every
relation fork of the full basebackup with its size."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from fixtures.endpoint import Endpoint
from fixtures.pageserver_api import PageserverApi
from fixtures.strata import drop_os_caches
from fixtures.versions import MAJORS
from fixtures.wait import wait_until

BLOCK = 8192
SEGMENT_FILE = re.compile(r"^(?P<path>(?:global|base/\d+)/(?P<rel>\d+)(?P<fork>_vm|_fsm|_init)?)(?:\.(?P<seg>\d+))?$")


def basebackup(cluster, query: str) -> tuple[int, bytes]:
    ps = PageserverApi(cluster)
    try:
        return ps.request("GET", ps.tl_path() + "/basebackup?" + query, timeout=120)
    finally:
        ps.close()


def members(tar_bytes: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def fork_sizes(files: dict[str, bytes]) -> dict[str, int]:
    """Blocks of each relation fork in a tar, its segments added up."""
    sizes: dict[str, int] = {}
    for name, data in files.items():
        m = SEGMENT_FILE.match(name)
        if m:
            assert len(data) % BLOCK == 0, name
            sizes[m["path"]] = sizes.get(m["path"], 0) + len(data) // BLOCK
    return sizes


@pytest.mark.parametrize("major", MAJORS)
def test_the_lazy_basebackup_names_every_relation_fork_and_carries_none(cluster_factory, major):
    """The lazy basebackup at the end of the WAL, of each major: the full
    one's files but the logged relations' data; the manifest lists exactly
    the full one's main and visibility map forks with their sizes (a table
    over 1 GiB is not needed: segments are added up the same way), and the
    unlogged relation's forks come in the tar as in eager mode."""
    cluster = cluster_factory(init_args=("--pg-version", str(major)))
    ep = Endpoint(cluster, "ep", pg_bin_dir=f"/usr/lib/postgresql/{major}/bin")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, 20000) g")
    ep.sql("VACUUM t")  # a visibility map fork
    ep.sql("CREATE UNLOGGED TABLE u (id int PRIMARY KEY)")
    ep.sql("CREATE DATABASE other")
    ep.stop()

    code, full_tar = basebackup(cluster, "full=true")
    assert code == 200, full_tar[:300]
    code, lazy_tar = basebackup(cluster, "lazy=true")
    assert code == 200, lazy_tar[:300]
    full, lazy = members(full_tar), members(lazy_tar)

    manifest = lazy.pop("strata.lazy.manifest").decode()
    lines = manifest.splitlines()
    assert lines[0] == "strata lazy manifest 2" and lines[1].startswith("lsn ") and lines[-1] == f"end {len(lines) - 3}"
    entries = dict(line.rsplit(" ", 1) for line in lines[2:-1])
    assert list(entries) == sorted(entries), "sorted by path"
    listed = {path: int(blocks) for path, blocks in entries.items()}

    full_sizes = fork_sizes(full)
    unlogged = {m["rel"] for name in full if (m := SEGMENT_FILE.match(name)) and m["fork"] == "_init"}
    logged = {p: n for p, n in full_sizes.items()
              if SEGMENT_FILE.match(p)["rel"] not in unlogged and SEGMENT_FILE.match(p)["fork"] in (None, "_vm", "_fsm")}
    assert listed == logged, sorted(set(listed.items()) ^ set(logged.items()))[:20]
    assert any(p.endswith("_vm") and n > 0 for p, n in listed.items()), "t's visibility map is listed"
    assert sum(listed.values()) * BLOCK > 10 << 20, "t alone is over 10 MiB"
    assert len({p.split("/")[1] for p in listed if p.startswith("base/")}) >= 4, "every database"

    # Everything else is the same, byte for byte but the generated pg_control
    # and checkpoint segment (they carry the time); relation data is gone.
    relation_files = {n for n in full if SEGMENT_FILE.match(n) and SEGMENT_FILE.match(n)["rel"] not in unlogged}
    assert set(lazy) == set(full) - relation_files, sorted(set(lazy) ^ (set(full) - relation_files))[:20]
    for name in lazy:
        if name != "global/pg_control" and not name.startswith("pg_wal/"):
            assert lazy[name] == full[name], name
    assert any(SEGMENT_FILE.match(n) and SEGMENT_FILE.match(n)["rel"] in unlogged for n in lazy), \
        "the unlogged relation is in the tar"
    # Without the generated 16 MiB WAL segment, what a lazy compute unpacks
    # is a small fraction of the relation data.
    unpacked = sum(len(v) for n, v in lazy.items() if not n.startswith("pg_wal/"))
    data = sum(len(full[n]) for n in relation_files)
    print(f"\nlazy basebackup: {unpacked} bytes besides the WAL segment, against {data} bytes of relation data; "
          f"{len(listed)} forks, {sum(listed.values())} blocks listed")
    assert unpacked * 10 < data

    code, body = basebackup(cluster, "full=true&lazy=true")
    assert code == 400 and b"exclude each other" in body, (code, body)


def test_a_lazy_compute_runs_pgbench_and_keeps_every_commit(cluster):
    """`endpoint start --lazy`: PostgreSQL on FUSE-served relation files
    reads the data an eager compute wrote, writes, restarts (lazy again,
    remembered) and keeps every commit; pgbench's invariants hold and
    pg_amcheck finds nothing."""
    from fixtures.checks import assert_pgbench_invariants, pgbench_state, run_amcheck

    eager = Endpoint(cluster, "eager")
    eager.start("--eager")
    eager.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    eager.sql("CREATE TABLE t AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 50000) g")
    expected = eager.sql("SELECT count(*), sum(id), md5(string_agg(v, ',' ORDER BY id)) FROM t")
    eager.stop()

    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy")
    assert sorted(ep.lazy_mounts()) == [f"{ep.pgdata}/base", f"{ep.pgdata}/global"], ep.lazy_mounts()
    assert ep.sql("SELECT count(*), sum(id), md5(string_agg(v, ',' ORDER BY id)) FROM t") == expected
    ep.run(["pgbench", "-n", "-c", "2", "-T", "10"], timeout=300)
    ep.sql("INSERT INTO t SELECT g, 'lazy' FROM generate_series(50001, 51000) g")
    ep.sql("CREATE TABLE created_here AS SELECT generate_series(1, 1000) AS id")
    with ep.connect() as conn:
        state = pgbench_state(conn)
    assert_pgbench_invariants(state, 2)
    run_amcheck(ep)
    lazy = ep.agent_status(timeout=10)["lazy"]
    assert lazy["blocks_fetched"] > 0 and lazy["fetch_errors"] == 0, lazy

    # A restart keeps the mode and every commit.
    ep.stop()
    assert not ep.lazy_mounts(), "unmounted at stop"
    ep.start()
    assert ep.lazy_mounts()
    with ep.connect() as conn:
        assert pgbench_state(conn) == state
    assert ep.sql("SELECT count(*) FROM t") == [(51000,)]
    assert ep.sql("SELECT count(*) FROM created_here") == [(1000,)]
    ep.stop()


def test_a_read_fails_while_the_pageserver_is_down_and_works_once_it_is_back(cluster):
    """kill -9 of the pageserver (and its supervisor, so it stays down): a
    lazy compute's query that needs blocks it does not hold waits (the
    fetch retries for --fetch-retry-secs, 20 s by default: long enough for a
    supervised restart; 4 s here) and then
    fails with PostgreSQL's own I/O error, while commits and queries on
    what it holds go on; once the pageserver is back the same query
    answers, and PostgreSQL was never restarted."""
    import time

    import psycopg
    import pytest

    eager = Endpoint(cluster, "eager")
    eager.start("--eager")
    eager.sql("CREATE TABLE t AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 20000) g")
    eager.sql("CREATE TABLE w (id int)")
    eager.stop()

    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy", "--fetch-retry-secs", "4")
    started = ep.sql("SELECT pg_postmaster_start_time()")
    # What the later statements on w read (its pages, the catalogs), in
    # shared buffers and the backing files now.
    ep.sql("INSERT INTO w VALUES (1)")
    assert ep.sql("SELECT count(*) FROM w") == [(1,)]
    cluster.kill9("pageserver", supervisor=True)
    assert cluster.service("pageserver")["state"] == "stopped"

    t0 = time.monotonic()
    with pytest.raises(psycopg.Error) as failed:
        ep.sql("SELECT count(*) FROM t")
    waited = time.monotonic() - t0
    # The window configured, not the default's 20 s.
    assert 3.5 <= waited < 15, f"the fetch waited {waited:.1f} s for the pageserver before failing"
    assert "could not read block" in str(failed.value) and "Input/output error" in str(failed.value), failed.value
    # The blocks it holds still serve, and commits need only the safekeepers.
    ep.sql("INSERT INTO w VALUES (2)")
    assert ep.sql("SELECT count(*) FROM w") == [(2,)]

    out = cluster.start()
    assert "pageserver: started" in out, out
    assert ep.sql("SELECT count(*) FROM t") == [(20000,)]
    lazy = ep.agent_status(timeout=10)["lazy"]
    assert lazy["fetch_errors"] >= 1 and lazy["blocks_fetched"] > 300, lazy
    assert ep.sql("SELECT pg_postmaster_start_time()") == started, "PostgreSQL ran on"
    ep.stop()


def test_a_cache_smaller_than_the_working_set_drops_blocks_and_reads_them_back_right(cluster):
    """A lazy compute with a 1 MiB cache and 16 MB of shared buffers runs
    pgbench on a database of about 30 MB: blocks are dropped from local disk
    and fetched again (written ones at their own LSN), the cache stays
    within its budget, pgbench's invariants hold, pg_amcheck finds nothing,
    and at the end every block of every pgbench relation as PostgreSQL
    reads it equals the pageserver's at the compute's last LSN."""
    from fixtures.checks import assert_pgbench_invariants, pgbench_state, run_amcheck
    from fixtures.page_compare import fetch_pages, wait_quiet
    from fixtures.page_mask import masked
    from fixtures.pageserver_api import wait_for_pageserver_lsn

    eager = Endpoint(cluster, "eager")
    eager.start("--eager")
    eager.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    eager.stop()

    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy", "--cache-mb", "1", "--shared-buffers", "16MB")
    assert ep.sql("SHOW shared_buffers") == [("16MB",)]
    ep.run(["pgbench", "-n", "-c", "4", "-j", "2", "-T", "10"], timeout=300)
    # A scan of every table and index, twice: more than the cache holds.
    for _ in range(2):
        ep.sql("SELECT count(*) FROM pgbench_accounts WHERE filler IS NOT NULL")
        ep.sql("SELECT count(*) FROM (SELECT aid FROM pgbench_accounts ORDER BY aid) a")
    with ep.connect() as conn:
        state = pgbench_state(conn)
    assert_pgbench_invariants(state, 2)
    run_amcheck(ep)

    status = ep.agent_status(timeout=10)["lazy"]
    budget = status["cache_budget_blocks"]
    assert budget == 128, status
    assert status["cache_evictions"] > 4 * budget and status["fetch_errors"] == 0, status
    # pgbench_accounts alone is about 3300 blocks; every block was fetched
    # at least once, many again after being dropped.
    assert status["blocks_fetched"] > 4000, status

    def within_budget() -> dict:
        s = ep.agent_status(timeout=10)["lazy"]
        return s if s["cache_blocks"] <= budget else None

    wait_until("the cache back within its budget", within_budget, timeout=30, interval=0.2, retry=(),
               details=lambda: ep.agent_status(timeout=10)["lazy"])

    # Every block PostgreSQL reads equals the pageserver's at the last LSN:
    # a block read back at a wrong version would have been changed and
    # logged from the wrong content, and differ here. Autovacuum is off
    # for the comparison: a worker changing a page after that LSN would
    # make the two differ rightly.
    for table in ("pgbench_accounts", "pgbench_branches", "pgbench_history", "pgbench_tellers"):
        ep.sql(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    wait_quiet(ep)
    ep.sql("CHECKPOINT")
    lsn = ep.wal_lsn("pg_current_wal_flush_lsn")
    wait_for_pageserver_lsn(cluster, lsn)
    ep.sql("CREATE EXTENSION IF NOT EXISTS pageinspect")
    rels = ep.sql("""
        SELECT c.relname, c.relfilenode, (SELECT oid FROM pg_database WHERE datname = current_database()),
               CASE c.relkind WHEN 'i' THEN 'btree' ELSE 'heap' END, pg_relation_size(c.oid) / 8192
        FROM pg_class c WHERE c.relname LIKE 'pgbench%' AND c.relkind IN ('r', 'i') ORDER BY 1""")
    assert len(rels) == 7, rels  # four tables, three primary keys
    ps = PageserverApi(cluster)
    compared, differ = 0, []
    try:
        with ep.connect() as conn:
            for name, filenode, db, kind, nblocks in rels:
                # Each block as PostgreSQL reads it, one query per relation.
                mine = [bytes(page) for (_, page) in conn.execute(
                    "SELECT b, get_raw_page(%s, 'main', b) FROM generate_series(0, %s - 1) b ORDER BY b",
                    (name, nblocks)).fetchall()]
                assert len(mine) == nblocks, (name, len(mine), nblocks)
                # The pageserver's, over its page service (pipelined).
                served = fetch_pages(ps, [(1663, db, filenode, "main", b) for b in range(nblocks)], lsn)
                for b, (page, s) in enumerate(zip(mine, served)):
                    assert s.page is not None, (name, b, s.error)
                    compared += 1
                    if page != s.page and masked(page, kind, b) != masked(s.page, kind, b):
                        differ.append((name, b))
    finally:
        ps.close()
    assert compared > 3500 and not differ, (compared, differ[:20])
    ep.stop()


def abort_fuse_connection(mountpoint) -> None:
    """Aborts the FUSE connection of a mount, as if its daemon had died:
    every access fails from then on (through the FUSE control file system,
    mounted here if it is not yet)."""
    import subprocess

    connections = Path("/sys/fs/fuse/connections")
    if not any(line.split()[2] == "fusectl" for line in open("/proc/self/mounts")):
        subprocess.run(["mount", "-t", "fusectl", "none", str(connections)], check=True, capture_output=True)
    dev = os.stat(mountpoint).st_dev
    (connections / str(os.minor(dev)) / "abort").write_text("1")


def test_a_dead_mount_makes_the_agent_start_postgres_afresh_with_every_commit(cluster):
    """The FUSE connection of `base/` aborted under writes (the file
    system's daemon gone for that mount): the agent sees the mount no
    longer served, stops PostgreSQL and starts it afresh on new mounts, and
    every commit acknowledged before is there."""
    import threading

    import psycopg

    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy")
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    started = ep.server_started_at()
    acknowledged: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                with ep.connect(connect_timeout=2) as conn:
                    while not stop.is_set():
                        conn.execute("INSERT INTO t VALUES (%s, repeat('x', 500))", (i,))
                        acknowledged.append(i)
                        i += 1
            except psycopg.Error:
                stop.wait(0.05)

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until("the writer to make progress", lambda: len(acknowledged) >= 500, timeout=30, interval=0.05,
                   retry=())
        abort_fuse_connection(ep.pgdata / "base")
        ep.wait_new_server(started, timeout=90)
        before = len(acknowledged)
        wait_until("commits after the restart", lambda: len(acknowledged) >= before + 100, timeout=30,
                   interval=0.05, retry=())
    finally:
        stop.set()
        t.join(timeout=30)
    ids = {r[0] for r in ep.sql("SELECT id FROM t")}
    missing = set(acknowledged) - ids
    assert not missing, f"{len(missing)} acknowledged commits lost, e.g. {sorted(missing)[:10]}"
    status = ep.agent_status(timeout=10)
    assert status["restarts"] >= 1 and "no longer served" in status["last_restart_cause"], status
    assert f"{ep.pgdata}/base" in ep.lazy_mounts(), "mounted again"
    ep.stop()


def test_random_workloads_through_a_tiny_cache_end_as_on_stock_postgres(cluster, pg_cluster_factory):
    """The block rules against a stock PostgreSQL: the same seeded random
    workloads (inserts, HOT and moving updates, deletes, multixacts,
    subtransactions, VACUUM, FREEZE, CLUSTER, VACUUM FULL, REINDEX, tables
    dropped and created again) run on a lazy compute whose 2 MB of shared
    buffers and 1 MiB cache make nearly every block pass through the file
    system, written blocks dropped and read back at their LSN, and on stock
    PostgreSQL on local disk. Twice a round the kernel's page cache is
    emptied, so that reads reach the file system. After each round the lazy compute restarts
    (its rules start afresh from the manifest at a new LSN) and every
    table's rows equal stock's; pg_amcheck finds nothing at the end."""
    import random

    from fixtures.checks import run_amcheck
    from fixtures.random_workload import run_random_workload, table_digests

    seed = int(os.environ.get("STRATA_LAZY_SEED", random.randrange(1 << 30)))
    stock = pg_cluster_factory("stock")
    stock.initdb()
    stock.start()
    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy", "--cache-mb", "1", "--shared-buffers", "2MB")
    for round_ in range(2):
        for part in range(2):
            s = seed + 2 * round_ + part
            assert run_random_workload(ep, s, ops=250) == run_random_workload(stock, s, ops=250), f"seed {s}"
            # The kernel's write-back sent to the daemon and its page cache
            # emptied: the next reads of blocks the cache dropped go to the
            # pageserver at the blocks' own LSNs instead of being answered
            # from pages the kernel still held.
            print(f"kernel page cache dropped: {drop_os_caches()}")
        ep.sql("CHECKPOINT")
        ep.stop()
        ep.start()
        assert table_digests(ep) == table_digests(stock), f"seed {s}, round {round_}"
    run_amcheck(ep)
    status = ep.agent_status(timeout=10)["lazy"]
    print(f"seed {seed}: {status}")
    assert status["cache_evictions"] > 0 and status["fetch_errors"] == 0, status
    ep.stop()


def test_a_table_over_1_gib_is_served_on_both_sides_of_its_segment_boundary(cluster):
    """PostgreSQL keeps a relation in 1 GiB segment files (131 072 blocks
    each). A lazy compute with a 64 MiB cache writes a table of just over
    1 GiB and updates rows on both sides of the boundary; a fresh lazy
    compute reads it all from the pageserver: the `.1` file holds the
    fork's later blocks at their place, each row is as written (the rows
    next to the boundary by their block), and pg_amcheck finds nothing.
    Cut back below the boundary by VACUUM, the next compute has no second
    segment."""
    from fixtures.checks import run_amcheck

    segment = 131072
    rows = segment + 300
    ep = Endpoint(cluster, "big")
    ep.start("--cache-mb", "64")
    # Fillfactor 10 and rows of 700 bytes: one row per block, so about
    # 100 MB of WAL makes the 1 GiB.
    ep.sql("CREATE TABLE big (id int, pad text) WITH (fillfactor = 10, autovacuum_enabled = off)")
    with ep.connect() as conn:
        conn.execute("SET statement_timeout = 0")
        conn.execute(f"INSERT INTO big SELECT g, repeat(chr(65 + g % 26), 700) FROM generate_series(1, {rows}) g")
        conn.execute("UPDATE big SET pad = repeat('z', 700) WHERE id BETWEEN %s AND %s", (segment - 100, segment + 100))
    (blocks,) = ep.sql("SELECT pg_relation_size('big') / 8192")[0]
    assert blocks == rows, blocks
    db, filenode = ep.sql("SELECT (SELECT oid FROM pg_database WHERE datname = current_database()), "
                          "pg_relation_filenode('big')")[0]
    status = ep.agent_status(timeout=10)["lazy"]
    assert status["cache_budget_blocks"] == 64 * 128 and status["fetch_errors"] == 0, status

    def check(expected_rows: int) -> None:
        first = f"base/{db}/{filenode}"
        assert (ep.pgdata / first).stat().st_size == min(expected_rows, segment) * BLOCK
        second = ep.pgdata / f"{first}.1"
        if expected_rows > segment:
            assert second.stat().st_size == (expected_rows - segment) * BLOCK
        else:
            assert not second.exists()
        total = expected_rows * (expected_rows + 1) // 2
        updated = max(0, min(expected_rows, segment + 100) - (segment - 100) + 1)
        got = ep.sql("SELECT count(*), sum(id), count(*) FILTER (WHERE pad = repeat('z', 700)), "
                     "count(*) FILTER (WHERE pad = repeat(chr(65 + id % 26), 700)) FROM big")[0]
        assert got == (expected_rows, total, updated, expected_rows - updated), got
        # Block b holds row b + 1 (one row per block, updated on its block).
        last = min(segment + 2, expected_rows)
        by_block = ep.sql("SELECT (ctid::text::point)[0]::int, id, left(pad, 1) FROM big "
                          "WHERE id BETWEEN %s AND %s ORDER BY id", (last - 4, last))
        letter = {i: "z" if segment - 100 <= i <= segment + 100 else chr(65 + i % 26) for i in range(last - 4, last + 1)}
        assert by_block == [(i - 1, i, letter[i]) for i in range(last - 4, last + 1)], by_block

    ep.stop()
    ep.start("--cache-mb", "64")
    check(rows)
    run_amcheck(ep)
    status = ep.agent_status(timeout=10)["lazy"]
    assert status["blocks_fetched"] >= rows and status["cache_evictions"] > 0 and status["fetch_errors"] == 0, status

    # VACUUM truncates empty blocks at the end when there are at least 1000.
    ep.sql(f"DELETE FROM big WHERE id > {segment - 1000}")
    # Only once the deleted rows are removable: a snapshot taken before the
    # DELETE and still held when VACUUM starts (the agent's activity poll,
    # on a loaded machine) leaves them, and the blocks, for the next VACUUM.
    def truncated() -> bool:
        ep.sql("VACUUM big")
        return ep.sql("SELECT pg_relation_size('big') / 8192")[0] == (segment - 1000,)

    wait_until("VACUUM to truncate the deleted rows' blocks", truncated, 120, interval=1)
    ep.stop()
    ep.start("--cache-mb", "64")
    check(segment - 1000)
    ep.stop()


def test_a_database_of_more_relation_files_than_descriptors_starts_lazily(cluster_factory):
    """A lazy compute holds no descriptor and creates no backing file per
    relation file until PostgreSQL looks that file up: a database of more
    than twice as many relation files as descriptors starts lazily with every Strata process limited
    to 1024 open files, and reads and writes every table (each segment file
    of the manifest used to hold a descriptor from the start)."""
    # 600 tables of 4 files each: more than twice the descriptors allowed.
    tables = 600
    cluster = cluster_factory(nofile=1024)
    eager = Endpoint(cluster, "eager")
    eager.start("--eager")
    for first in range(1, tables + 1, 300):
        # Each with a primary key and a TOAST table and its index: 4 files.
        eager.sql(f"DO $$ BEGIN FOR i IN {first}..{first + 299} LOOP "
                  "EXECUTE format('CREATE TABLE many%s (id int PRIMARY KEY, v text)', i); "
                  "EXECUTE format('INSERT INTO many%s VALUES (%s, repeat(''x'', 100))', i, i); "
                  "END LOOP; END $$")
    files = eager.sql("SELECT count(*) FROM pg_class WHERE relfilenode <> 0 AND relpersistence = 'p'")[0][0]
    assert files > 4 * tables > 2 * 1024, files
    eager.stop()

    total = ("SELECT sum((xpath('/row/s/text()', query_to_xml(format('SELECT sum(id) AS s FROM many%s', i), "
             f"false, true, '')))[1]::text::bigint) FROM generate_series(1, {tables}) i")
    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy")
    assert ep.sql(total) == [(tables * (tables + 1) // 2,)]
    ep.sql(f"DO $$ BEGIN FOR i IN 1..{tables} LOOP "
           "EXECUTE format('UPDATE many%s SET id = id * 2', i); END LOOP; END $$")
    assert ep.sql(total) == [(tables * (tables + 1),)]
    # Only what PostgreSQL looked up exists in the backing directory.
    backing = cluster.workdir / "endpoints" / "lazy" / "pgdata.lazy" / "base"
    created = sum(1 for p in backing.rglob("*") if p.is_file())
    assert created < files, (created, files)
    ep.stop()
    ep.start()
    assert ep.sql(total) == [(tables * (tables + 1),)]
    ep.stop()


def test_a_copy_of_the_mounts_in_another_mount_namespace_does_not_hang_the_stop(cluster):
    """A mount namespace made while the compute runs, with private
    propagation (a container, a service with a private /tmp, the hosts of
    test_hosts.py), holds copies of the lazy mounts that the agent's unmount
    does not reach, and so keeps their FUSE connections and daemon threads
    alive: the agent waits for them a bounded time, says so, and stops; the
    endpoint starts again with its rows."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        import pytest

        pytest.skip("needs unshare (util-linux)")
    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy")
    ep.sql("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 1000) g")
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "300"])
    try:
        ns = Path(f"/proc/{holder.pid}/ns/mnt")
        wait_until("the other mount namespace", lambda: os.readlink(ns) != os.readlink("/proc/self/ns/mnt"),
                   timeout=10, interval=0.05)
        copies = Path(f"/proc/{holder.pid}/mounts").read_text()
        assert f"{ep.pgdata}/base " in copies, "the namespace holds a copy of the mount"
        ep.stop()
        log = (ep.dir / "compute.log").read_text()
        assert "still serves" in log, "the copy kept the daemon serving after the unmount"
        assert ep.lazy_mounts() == []
    finally:
        holder.kill()
        holder.wait()
    ep.start("--lazy")
    assert ep.sql("SELECT count(*), sum(id) FROM t") == [(1000, 500500)]
    ep.stop()
