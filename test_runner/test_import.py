"""`strata tenant import` (docs/import.md): an existing database becomes a
tenant whose `main` branch equals it, for each major the suite runs. A
running server is copied with its own pg_basebackup while pgbench writes
to it; a stopped data directory is read where it is; a base backup whose
WAL is in an archive is replayed with it. In each case a compute on the
new tenant gives the source's `pg_dump` of a database of many kinds of
object, pgbench's invariant holds, and pg_amcheck finds nothing. What
cannot be imported (a tablespace, a stream that escapes its directory, a
caller without the management scope) is refused with a clear error."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
import urllib.error

import pytest

from fixtures.checks import read_every_page, split_sequences
from fixtures.endpoint import Endpoint
from fixtures.load import AckedWriter
from fixtures.objects import OBJECTS
from fixtures.strata import urlopen
from fixtures.versions import MAJORS
from fixtures.wait import wait_until



def put_tar(cluster, path: str, body: bytes, token: str | None = None) -> tuple[int, dict]:
    """`PUT` of a tar stream to the pageserver (with the cluster's own token
    unless `token` names another)."""
    headers = {"Content-Type": "application/x-tar"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urlopen(cluster.http_url("pageserver", path), "PUT", body, headers, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text or b"{}")
        except ValueError:
            return e.code, {"error": text.decode(errors="replace")}


def pg_bin(major: int) -> str:
    return f"/usr/lib/postgresql/{major}/bin"


def source_with_objects(pg_cluster_factory, major: int, settings: dict | None = None):
    """A running stock server of `major` with the objects database and
    pgbench's tables in `postgres`."""
    src = pg_cluster_factory("src", major=major)
    # Checksums on for every major (18's initdb default; 15's is off): the
    # pages Strata builds must carry them.
    src.initdb(["--data-checksums"])
    src.start({"wal_level": "replica", "max_wal_senders": 4, **(settings or {})})
    src.sql("CREATE DATABASE objects")
    (src.base_dir / "objects.sql").write_text(OBJECTS)
    src.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(src.base_dir / "objects.sql")], dbname="objects",
            timeout=300)
    src.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    return src


def dump(server, db: str) -> str:
    """`pg_dump` of one database, sequences apart (a server restored from
    WAL may be up to 32 values ahead of what was handed out)."""
    text = server.run(["pg_dump", "--restrict-key=strata", "--no-unlogged-table-data"], dbname=db,
                      timeout=300).stdout
    return split_sequences(text)


def assert_same_dump(source, target, db: str) -> None:
    (text_a, seqs_a), (text_b, seqs_b) = dump(source, db), dump(target, db)
    if text_a != text_b:
        import difflib

        diff = difflib.unified_diff(text_a.splitlines(), text_b.splitlines(), "source", "tenant", lineterm="", n=2)
        raise AssertionError(f"pg_dump of {db} differs:\n" + "\n".join(list(diff)[:200]))
    assert seqs_a.keys() == seqs_b.keys()
    for k, (va, _) in seqs_a.items():
        assert 0 <= seqs_b[k][0] - va <= 32, (k, seqs_a[k], seqs_b[k])


def check_tenant(cluster, name: str, major: int, source) -> Endpoint:
    """A compute on the imported tenant: the source's system identifier and
    major, the source's dump of the objects database, pg_amcheck clean."""
    tenant = cluster.tenant(name)
    assert tenant.get("pg_version", 15) == major, tenant  # 15 is left out of cluster.toml
    ep = Endpoint(cluster, f"{name}-ep", pg_bin_dir=pg_bin(major))
    ep.start("--tenant", name)
    sysid = "SELECT system_identifier FROM pg_control_system()"
    assert ep.sql(sysid) == source.sql(sysid)
    assert ep.sql("SELECT current_setting('server_version_num')::int / 10000") == [(major,)]
    assert_same_dump(source, ep, "objects")
    assert ep.sql("SELECT count(*) FROM scratch", dbname="objects") == [(0,)], "unlogged: empty after a restart"
    assert ep.sql("SELECT length(lo_get(424242))", dbname="objects") == [(13 * 20000,)]
    for db in ("objects", "postgres"):
        ep.sql("CREATE EXTENSION IF NOT EXISTS amcheck", dbname=db)
    ep.run(["pg_amcheck", "--all", "--heapallindexed", "--rootdescend"], timeout=600)

    # The tenant is a database like any other: it takes writes.
    ep.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    assert ep.sql("SELECT sum(abalance) = (SELECT sum(delta) FROM pgbench_history) FROM pgbench_accounts") == [
        (True,)]
    # After a restart every page comes from the pageserver: imported, or
    # redone by Strata from the writes above. PostgreSQL's buffer manager
    # verifies each one's checksum as it reads it.
    ep.restart()
    assert ep.sql("SHOW data_checksums") == [("on",)]
    for db in ("objects", "postgres"):
        assert read_every_page(ep, db) > 0
    return ep


@pytest.mark.parametrize("major", MAJORS)
def test_a_running_server_is_imported_while_it_takes_writes(cluster, pg_cluster_factory, major):
    src = source_with_objects(pg_cluster_factory, major)
    src.run(["pgbench", "-n", "-c", "2", "-t", "50"], timeout=300)
    before = src.sql("SELECT count(*) FROM pgbench_history")[0][0]
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        while not stop.is_set():
            r = src.run(["pgbench", "-n", "-c", "2", "-T", "2"], check=False, timeout=60)
            if r.returncode != 0:
                errors.append(r.stderr[-2000:])
                return

    t = threading.Thread(target=writer)
    t.start()
    try:
        info = src.conninfo()
        conninfo = f"host={info['host']} port={info['port']} user={info['user']} dbname=postgres"
        out = cluster.run("tenant", "import", "shop", "--from", conninfo, timeout=900).stdout
    finally:
        stop.set()
        t.join(timeout=120)
    assert not errors, errors
    assert "tenant shop:" in out, out
    after = src.sql("SELECT count(*) FROM pgbench_history")[0][0]
    ep = check_tenant(cluster, "shop", major, src)
    # The copy is of one moment during the backup: pgbench's invariant
    # held there (checked above, after more writes), and its history is
    # between what was there before and after.
    imported = ep.sql("SELECT count(*) FROM pgbench_history")[0][0] - 200
    assert before <= imported <= after, (before, imported, after)
    ep.stop()
    # The staging copy is gone; the source is untouched and still serves.
    assert not (cluster.workdir / "imports" / "shop").exists()
    assert src.sql("SELECT count(*) FROM pgbench_history")[0][0] == after


@pytest.mark.parametrize("major", MAJORS)
def test_a_streaming_import_follows_its_source_and_cuts_over_losing_no_acknowledged_commit(cluster, pg_cluster_factory,
                                                                                          major):
    """`--follow`: main takes the source's WAL while pgbench and a writer of
    acknowledged commits go on; a cut-over while the source runs is refused
    and following goes on; once the source is stopped under that load, the
    cut-over gives a main holding every commit the source acknowledged."""
    src = source_with_objects(pg_cluster_factory, major)
    acked = AckedWriter(src).start()
    stop = threading.Event()
    errors: list[str] = []

    def pgbench() -> None:
        while not stop.is_set():
            r = src.run(["pgbench", "-n", "-c", "2", "-T", "2"], check=False, timeout=60)
            if r.returncode != 0 and not stop.is_set():
                errors.append(r.stderr[-2000:])
                return

    load = threading.Thread(target=pgbench)
    load.start()
    try:
        info = src.conninfo()
        conninfo = f"host={info['host']} port={info['port']} user={info['user']} dbname=postgres"
        out = cluster.run("tenant", "import", "live", "--from", conninfo, "--follow", timeout=900).stdout
        assert "follows the source" in out, out
        assert cluster.tenant("live")["follows"] == "strata_import_live"
        # The source's connection string (a password, maybe) and the
        # follower's token are their owners' alone.
        secrets = [cluster.workdir / "imports" / "live" / "source.conf",
                   cluster.workdir / "imports" / "live.follower" / "follower.token"]
        assert secrets[0].exists()
        for path in secrets:
            assert not path.exists() or path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)
        slots = src.sql("SELECT slot_name, active FROM pg_replication_slots")
        assert ("strata_import_live", True) in slots, slots
        # No writer on main while it follows: its WAL is the source's.
        r = cluster.run("endpoint", "start", "live-early", "--tenant", "live", check=False, timeout=120)
        assert r.returncode != 0 and "strata tenant cutover live" in r.stderr, r
        time.sleep(2)
        # The follower killed: its supervisor starts it again, and it is
        # elected and streams on from what a quorum holds.
        pidfile = cluster.workdir / "imports" / "live.follower" / "follower.pid"
        killed = int(pidfile.read_text())
        os.kill(killed, signal.SIGKILL)
        wait_until("the follower started again",
                   lambda: pidfile.exists() and pidfile.read_text().strip() not in ("", str(killed)) or None, 60)
        time.sleep(2)
        # The source runs: its WAL goes on past what the relay has, so a
        # cut-over fails and the import keeps following.
        r = cluster.run("tenant", "cutover", "live", "--wait", "20", check=False, timeout=300)
        assert r.returncode != 0 and "the source still runs" in r.stderr, r
        assert cluster.tenant("live")["follows"] == "strata_import_live"
        time.sleep(3)
    finally:
        # The source stops under the load: what it acknowledged before is
        # all that counts.
        stop.set()
        src.stop("fast")
        load.join(timeout=120)
        acked.stop()
    assert not errors, errors
    began = time.monotonic()
    out = cluster.run("tenant", "cutover", "live", timeout=300).stdout
    assert "cut over at" in out and "pg_drop_replication_slot('strata_import_live')" in out, out
    assert "follows" not in cluster.tenant("live")
    ep = Endpoint(cluster, "live-ep", pg_bin_dir=pg_bin(major))
    ep.start("--tenant", "live")
    print(f"PostgreSQL {major}: cut-over and a compute serving in {time.monotonic() - began:.1f} s")
    mine = {row[0] for row in ep.sql("SELECT id FROM acked")}
    assert len(acked.xids()) > 50, "the writer committed through the import, its following and the stop"
    lost = set(acked.xids()) - mine
    assert not lost, f"{len(lost)} acknowledged commits lost, e.g. {sorted(lost)[:10]}"
    assert not (cluster.workdir / "imports" / "live").exists()
    src.start()
    assert mine == {row[0] for row in src.sql("SELECT id FROM acked")}
    assert ep.sql("SELECT count(*) FROM pgbench_history") == src.sql("SELECT count(*) FROM pgbench_history")
    check = "SELECT sum(abalance) = (SELECT sum(delta) FROM pgbench_history) FROM pgbench_accounts"
    assert ep.sql(check) == [(True,)]
    assert_same_dump(src, ep, "objects")
    # Main is the tenant's now: it takes writes.
    ep.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    assert ep.sql(check) == [(True,)]
    ep.stop()


def test_a_stopped_data_directory_and_a_base_backup_with_archived_wal_are_imported(cluster, pg_cluster_factory,
                                                                                   tmp_path):
    major = MAJORS[-1]
    archive = tmp_path / "archive"
    archive.mkdir()
    archive.chmod(0o777)
    src = source_with_objects(pg_cluster_factory, major,
                              {"archive_mode": "on", "archive_command": f"cp %p {archive}/%f"})
    # A base backup without WAL (-X none): its WAL is the archive's.
    backup = tmp_path / "backup"
    info = src.conninfo()
    subprocess.run([f"{pg_bin(major)}/pg_basebackup", "-h", info["host"], "-p", str(info["port"]), "-U", info["user"],
                    "-D", str(backup), "-X", "none", "-c", "fast"], check=True, capture_output=True, timeout=300)
    cluster.run("tenant", "import", "frombackup", "--pgdata", str(backup), "--wal", str(archive), timeout=900)
    assert (backup / "backup_label").exists(), "the base backup itself is only read"
    ep = check_tenant(cluster, "frombackup", major, src)
    ep.stop()

    # The source stopped cleanly: read where it is, nothing copied.
    src.stop()
    control_before = (src.pgdata / "global" / "pg_control").read_bytes()
    out = cluster.run("tenant", "import", "stopped", "--pgdata", str(src.pgdata), timeout=900).stdout
    assert "copying" not in out, out
    assert (src.pgdata / "global" / "pg_control").read_bytes() == control_before
    src.start()
    ep = check_tenant(cluster, "stopped", major, src)
    ep.stop()


def test_what_cannot_be_imported_is_refused_with_a_clear_error(cluster, pg_cluster_factory, tmp_path):
    src = pg_cluster_factory("src")
    src.initdb()
    src.start()
    space = tmp_path / "space"
    space.mkdir()
    subprocess.run(["chown", "postgres:", str(space)], check=True)
    src.sql(f"CREATE TABLESPACE elsewhere LOCATION '{space}'")
    src.stop()
    r = cluster.run("tenant", "import", "spaced", "--pgdata", str(src.pgdata), check=False, timeout=300)
    assert r.returncode != 0 and "tablespaces, which are not imported" in r.stderr, r
    assert all(t["name"] != "spaced" for t in cluster.cluster_toml["tenants"])

    # The route reads only plain names of files and directories, and only
    # with the management scope.
    tenant, timeline = "0" * 31 + "1", "0" * 31 + "2"
    path = f"/v1/tenant/{tenant}/timeline/{timeline}/import"

    def tar_with(name: str, kind: bytes = tarfile.REGTYPE) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
        return out.getvalue()

    for body, want in ((tar_with("base/../../escape"), "plain names"),
                       (tar_with("base/1/link", tarfile.SYMTYPE), "only files and directories"),
                       (b"not a tar stream at all" * 40, "tar")):
        code, answer = put_tar(cluster, path, body)
        assert code == 422 and want in answer["error"], (code, answer)
    tenant_token = cluster.run("auth", "token", "--scope", "tenant").stdout.strip()
    code, answer = put_tar(cluster, path, tar_with("PG_VERSION"), tenant_token)
    assert code == 403 and "needs management scope" in answer["error"], (code, answer)
    assert not list((cluster.workdir / "pageserver" / "data" / "imports").iterdir())
