"""Lazy computes (docs/lazy-compute.md), through the CLI's cluster: the lazy
basebackup carries no relation data and a manifest that names every
relation fork of the full basebackup with its size."""

from __future__ import annotations

import io
import re
import tarfile
import urllib.error
import urllib.request

from fixtures.endpoint import Endpoint
from fixtures.strata import http_json

BLOCK = 8192
SEGMENT_FILE = re.compile(r"^(?P<path>(?:global|base/\d+)/(?P<rel>\d+)(?P<fork>_vm|_fsm|_init)?)(?:\.(?P<seg>\d+))?$")


def basebackup(cluster, query: str) -> tuple[int, bytes]:
    url = cluster.http_url("pageserver", cluster.timeline_path() + "/basebackup?" + query)
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def agent_status(cluster, endpoint: str) -> dict:
    ep = next(e for e in cluster.status()["endpoints"] if e["name"] == endpoint)
    code, body = http_json("GET", f"http://127.0.0.1:{ep['ports']['http']}/v1/status")
    assert code == 200, body
    return body


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


def test_the_lazy_basebackup_names_every_relation_fork_and_carries_none(cluster):
    """The lazy basebackup at the end of the WAL: the full one's files but
    the logged relations' data; the manifest lists exactly the full one's
    main and visibility map forks with their sizes (a table over 1 GiB is
    not needed: segments are added up the same way), and the unlogged
    relation's forks come in the tar as in eager mode."""
    ep = Endpoint(cluster, "ep")
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
    assert lines[0] == "strata lazy manifest 1" and lines[1].startswith("lsn ") and lines[-1] == f"end {len(lines) - 3}"
    entries = dict(line.rsplit(" ", 1) for line in lines[2:-1])
    assert list(entries) == sorted(entries), "sorted by path"
    listed = {path: int(blocks) for path, blocks in entries.items()}

    full_sizes = fork_sizes(full)
    unlogged = {m["rel"] for name in full if (m := SEGMENT_FILE.match(name)) and m["fork"] == "_init"}
    logged = {p: n for p, n in full_sizes.items()
              if SEGMENT_FILE.match(p)["rel"] not in unlogged and SEGMENT_FILE.match(p)["fork"] in (None, "_vm")}
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
    eager.start()
    eager.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    eager.sql("CREATE TABLE t AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 50000) g")
    expected = eager.sql("SELECT count(*), sum(id), md5(string_agg(v, ',' ORDER BY id)) FROM t")
    eager.stop()

    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy")
    mounts = [line.split()[1] for line in open("/proc/self/mounts") if "strata-lazy" in line]
    assert any(m.endswith("/base") for m in mounts) and any(m.endswith("/global") for m in mounts), mounts
    assert ep.sql("SELECT count(*), sum(id), md5(string_agg(v, ',' ORDER BY id)) FROM t") == expected
    ep.run(["pgbench", "-n", "-c", "2", "-T", "10"], timeout=300)
    ep.sql("INSERT INTO t SELECT g, 'lazy' FROM generate_series(50001, 51000) g")
    ep.sql("CREATE TABLE created_here AS SELECT generate_series(1, 1000) AS id")
    with ep.connect() as conn:
        state = pgbench_state(conn)
    assert_pgbench_invariants(state, 2)
    run_amcheck(ep)
    lazy = agent_status(cluster, "lazy")["lazy"]
    assert lazy["blocks_fetched"] > 0 and lazy["fetch_errors"] == 0, lazy

    # A restart keeps the mode and every commit.
    ep.stop()
    assert not [line for line in open("/proc/self/mounts") if "strata-lazy" in line], "unmounted at stop"
    ep.start()
    assert [line for line in open("/proc/self/mounts") if "strata-lazy" in line]
    with ep.connect() as conn:
        assert pgbench_state(conn) == state
    assert ep.sql("SELECT count(*) FROM t") == [(51000,)]
    assert ep.sql("SELECT count(*) FROM created_here") == [(1000,)]
    ep.stop()


def test_a_read_fails_while_the_pageserver_is_down_and_works_once_it_is_back(cluster):
    """kill -9 of the pageserver (and its supervisor, so it stays down): a
    lazy compute's query that needs blocks it does not hold fails with
    PostgreSQL's own I/O error, while commits and queries on what it holds
    go on; once the pageserver is back the same query answers, and
    PostgreSQL was never restarted."""
    import psycopg
    import pytest

    eager = Endpoint(cluster, "eager")
    eager.start()
    eager.sql("CREATE TABLE t AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 20000) g")
    eager.sql("CREATE TABLE w (id int)")
    eager.stop()

    ep = Endpoint(cluster, "lazy")
    ep.start("--lazy")
    started = ep.sql("SELECT pg_postmaster_start_time()")
    # What the later statements on w read (its pages, the catalogs), in
    # shared buffers and the backing files now.
    ep.sql("INSERT INTO w VALUES (1)")
    assert ep.sql("SELECT count(*) FROM w") == [(1,)]
    cluster.kill9("pageserver", supervisor=True)
    assert cluster.service("pageserver")["state"] == "stopped"

    with pytest.raises(psycopg.Error) as failed:
        ep.sql("SELECT count(*) FROM t")
    assert "could not read block" in str(failed.value) and "Input/output error" in str(failed.value), failed.value
    # The blocks it holds still serve, and commits need only the safekeepers.
    ep.sql("INSERT INTO w VALUES (2)")
    assert ep.sql("SELECT count(*) FROM w") == [(2,)]

    out = cluster.start()
    assert "pageserver: started" in out, out
    assert ep.sql("SELECT count(*) FROM t") == [(20000,)]
    lazy = agent_status(cluster, "lazy")["lazy"]
    assert lazy["fetch_errors"] >= 1 and lazy["blocks_fetched"] > 300, lazy
    assert ep.sql("SELECT pg_postmaster_start_time()") == started, "PostgreSQL ran on"
    ep.stop()
