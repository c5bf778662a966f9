"""A tenant's PostgreSQL major (docs/postgres-versions.md): `strata tenant
create --pg-version` makes the tenant with that major's own initdb, the
pageserver and every safekeeper keep its timeline as that major's, and a
basebackup is that major's data directory; a major a tenant cannot have is
refused by name, and a 15 tenant beside it is untouched."""

from __future__ import annotations

import io
import subprocess
import tarfile

from fixtures.checks import read_every_page, run_amcheck
from fixtures.endpoint import Endpoint, current_lsn
from fixtures.load import AckedWriters
from fixtures.strata import format_lsn, urlopen
from fixtures.versions import MAJORS
from fixtures.wait import wait_until


def test_a_tenant_of_each_major_is_made_by_that_majors_initdb(cluster):
    for major in [m for m in MAJORS if m != 15]:
        name = f"pg{major}"
        out = cluster.run("tenant", "create", name, "--pg-version", str(major), timeout=180).stdout
        assert f"tenant {name}:" in out, out
        tenant = cluster.tenant(name)
        assert tenant["pg_version"] == major, tenant
        tenant_id = tenant["tenant_id"]
        timeline_id = next(b["timeline_id"] for b in tenant["branches"] if b["name"] == "main")
        path = f"/v1/tenant/{tenant_id}/timeline/{timeline_id}"

        code, status = cluster.http("pageserver", "GET", path)
        assert code == 200 and status["pg_version"] == major, (code, status)
        for sk in cluster.safekeeper_names():
            code, status = cluster.http(sk, "GET", path)
            assert code == 200 and status["pg_version"] == major, (sk, code, status)

        # The basebackup is that major's data directory: its PG_VERSION
        # files and a pg_control of its version (18: checksums on, as its
        # initdb does by default).
        with urlopen(cluster.http_url("pageserver", path + "/basebackup"), timeout=60) as r:
            tar = tarfile.open(fileobj=io.BytesIO(r.read()))
        files = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(files["PG_VERSION"]).read() == f"{major}\n".encode()
        db_versions = [n for n in files if n.startswith("base/") and n.endswith("/PG_VERSION")]
        assert db_versions and all(tar.extractfile(files[n]).read() == f"{major}\n".encode() for n in db_versions)
        control = tar.extractfile(files["global/pg_control"]).read()
        control_version = int.from_bytes(control[8:12], "little")
        assert control_version == {17: 1700, 18: 1800}[major], control_version
        if major >= 18:
            assert int.from_bytes(control[252:256], "little") == 1, "data checksums on"

    # A major no tenant can have: refused by name, nothing recorded.
    r = cluster.run("tenant", "create", "pg16", "--pg-version", "16", check=False)
    assert r.returncode != 0 and "PostgreSQL 16 is not a major a tenant can have" in r.stderr, r
    assert all(t["name"] != "pg16" for t in cluster.cluster_toml["tenants"])

    # The pageserver refuses it too, whoever asks.
    code, body = cluster.http("pageserver", "POST", "/v1/tenant", {"pg_version": 16})
    assert code == 400 and "PostgreSQL 16" in body["error"], (code, body)

    # The default tenant is still 15's.
    assert cluster.timeline_status("pageserver")["pg_version"] == 15


def test_a_compute_of_each_major_runs_that_majors_postgres(cluster, tmp_path):
    for major in [m for m in MAJORS if m != 15]:
        name = f"pg{major}"
        cluster.run("tenant", "create", name, "--pg-version", str(major), timeout=180)
        ep = Endpoint(cluster, f"e{major}", pg_bin_dir=f"/usr/lib/postgresql/{major}/bin")
        ep.start("--tenant", name)
        assert ep.sql("SHOW server_version_num")[0][0].startswith(str(major)), ep.sql("SELECT version()")
        ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
        ep.sql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 10000) g")
        ep.sql("UPDATE t SET v = 'y' WHERE id % 10 = 0")
        ep.sql("VACUUM t")
        # A new compute reads every page back from the pageserver.
        ep.stop()
        ep.start("--tenant", name)
        assert ep.sql("SELECT count(*), count(*) FILTER (WHERE v = 'y') FROM t") == [(10000, 1000)]
        if major >= 18:
            # 18's initdb turns checksums on: every page read back (built
            # or redone by the pageserver) passed PostgreSQL's check.
            assert ep.sql("SHOW data_checksums") == [("on",)]
        # That major's own clients: pgbench writes, pg_amcheck finds every
        # heap and index whole.
        ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
        ep.run(["pgbench", "-n", "-c", "4", "-t", "200"], timeout=300)
        ep.sql("CREATE EXTENSION amcheck")
        ep.stop()
        ep.start("--tenant", name)
        ep.run(["pg_amcheck", "--all", "--heapallindexed", "--rootdescend"], timeout=300)
        assert ep.sql("SELECT sum(abalance) = (SELECT sum(delta) FROM pgbench_history) FROM pgbench_accounts") == [(True,)]
        ep.stop()


def test_init_makes_the_default_tenant_of_another_major(cluster_factory):
    cluster = cluster_factory(init_args=("--pg-version", "18"))
    assert cluster.tenant()["pg_version"] == 18
    assert cluster.timeline_status("pageserver")["pg_version"] == 18
    ep = Endpoint(cluster, "ep", pg_bin_dir="/usr/lib/postgresql/18/bin")
    ep.start()
    assert ep.sql("SELECT current_setting('server_version_num')::int / 10000") == [(18,)]
    ep.stop()
    # A major no tenant can have is refused before anything is made.
    other = cluster.workdir.parent / "other"
    r = subprocess.run([str(cluster.strata_bin), "init", "--workdir", str(other), "--pg-version", "16"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "PostgreSQL 16 is not a major a tenant can have" in r.stderr, r
    assert not (other / "cluster.toml").exists()


def test_a_tenant_of_the_newest_major_branches_replicates_fails_over_and_promotes(cluster_factory):
    """What 15 does, on the newest major (18): a branch at a past LSN
    brings back a dropped table on an eager compute; a lazy replica follows its writer; the
    attached pageserver killed under writes fails over to the secondary
    while the writer and the replica go on; the replica promoted keeps
    every acknowledged commit, and every page of it reads with its checksum
    verified."""
    major = MAJORS[-1]
    bin_dir = f"/usr/lib/postgresql/{major}/bin"
    cluster = cluster_factory(init_args=("--pageservers", "2", "--pg-version", str(major)), start=False)
    for name in ("pageserver", "pageserver2"):
        cluster.configure(name, {"heatmap_period": 1})
    cluster.start()
    ep = Endpoint(cluster, "ep", pg_bin_dir=bin_dir)
    ep.start()
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    ep.sql("CREATE TABLE keep AS SELECT g AS id FROM generate_series(1, 1000) g")
    with ep.connect() as conn:
        before_drop = current_lsn(conn)
    ep.sql("DROP TABLE keep")

    # Point in time: a branch where the table still was.
    cluster.run("branch", "create", "before", "--at", format_lsn(before_drop), timeout=120)
    # An eager compute: the whole branch restored before PostgreSQL starts.
    old = Endpoint(cluster, "old", branch="before", pg_bin_dir=bin_dir)
    old.start("--eager")
    assert old.sql("SELECT count(*), current_setting('server_version_num')::int / 10000 FROM keep") == [
        (1000, major)]
    old.stop()
    assert ep.sql("SELECT to_regclass('keep') IS NULL") == [(True,)]

    # A replica; then the attached pageserver dies under writes.
    ep.sql("CREATE EXTENSION amcheck")
    ep.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    cluster.run("timeline", "checkpoint")
    tenant = cluster.tenant_id()
    wait_until("the secondary warm", lambda: secondary_layers(cluster, tenant) > 0 or None, timeout=60)
    replica = Endpoint(cluster, "r1", pg_bin_dir=bin_dir)
    replica.start("--replica-of", "ep")
    writers = AckedWriters(ep, threads=2, backoff=(0.01, 0.1)).start()
    bench = subprocess.Popen(ep.command(["pgbench", "-n", "-c", "2", "-T", "20"]), env=ep.client_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until("commits", lambda: writers.count() > 50 or None, timeout=60, details=lambda: writers.errors[-3:])
        cluster.kill9("pageserver", supervisor=True)
        wait_until("the tenant on pageserver2", lambda: attached(cluster) == "pageserver2" or None, timeout=60)
        done = writers.count()
        wait_until("commits after the failover", lambda: writers.count() > done + 50 or None, timeout=60,
                   details=lambda: writers.errors[-3:])
        out = cluster.run("endpoint", "promote", "r1", timeout=180).stdout
        assert "promoted to the writer of branch main" in out, out
    finally:
        writers.stop()
        # pgbench loses its connections when the writer is fenced.
        bench.communicate(timeout=120)
    acked = writers.acked_ids()
    rows = {r[0] for r in replica.sql("SELECT id FROM acked")}
    assert not acked - rows, f"{len(acked - rows)} acknowledged commits lost"
    assert replica.sql("SELECT sum(abalance) = (SELECT sum(delta) FROM pgbench_history) FROM pgbench_accounts") \
        == [(True,)]
    run_amcheck(replica)
    replica.restart()
    assert replica.sql("SHOW data_checksums") == [("on",)]
    assert read_every_page(replica, "postgres") > 0
    cluster.start()


def secondary_layers(cluster, tenant: str) -> int:
    code, body = cluster.http("pageserver2", "GET", "/v1/status")
    assert code == 200, body
    return next((loc["local_layers"] for loc in body["locations"] if loc["tenant_id"] == tenant), 0)


def attached(cluster) -> str | None:
    return cluster.status()["timelines"][0]["attached"]


def test_the_lazy_file_system_serves_18_under_every_io_method(cluster_factory):
    """PostgreSQL 18 reads through its asynchronous I/O (`io_method`):
    worker processes, io_uring, or each backend for itself. A lazy compute
    started with each (`--io-method`) reads a table larger than its
    shared buffers, cold, and its index, the same as it wrote them, and
    writes; a branch of 15 refuses the option by name."""
    cluster = cluster_factory(init_args=("--pg-version", "18"))
    ep = Endpoint(cluster, "ep", pg_bin_dir="/usr/lib/postgresql/18/bin")
    ep.start()
    ep.sql("CREATE TABLE big AS SELECT g AS id, md5(g::text) AS v, repeat('x', 200) AS pad"
           " FROM generate_series(1, 200000) g")
    ep.sql("CREATE INDEX big_v ON big (v)")
    digest = "SELECT count(*), md5(string_agg(v, ',' ORDER BY id)) FROM big"
    expected = ep.sql(digest)
    probes = "SELECT count(*) FROM big WHERE v IN (SELECT md5(g::text) FROM generate_series(1, 200000, 997) g)"
    for method in ("sync", "worker", "io_uring"):
        ep.stop()
        ep.start("--io-method", method)
        assert ep.sql("SHOW io_method") == [(method,)]
        # Cold: the table (about 60 MB) is more than shared_buffers holds.
        assert ep.sql(digest) == expected, method
        with ep.connect() as conn:
            conn.execute("SET enable_seqscan = off")
            assert conn.execute(probes).fetchone() == (201,), method
        ep.sql(f"INSERT INTO big SELECT 200000 + g, md5('{method}' || g), '' FROM generate_series(1, 1000) g")
        ep.sql("DELETE FROM big WHERE id > 200000")
    assert ep.agent_status()["lazy"]["fetch_errors"] == 0
    ep.stop()
    cluster.run("tenant", "create", "old", timeout=180)
    r = cluster.run("endpoint", "start", "old-ep", "--tenant", "old", "--io-method", "io_uring", check=False,
                    timeout=120)
    assert r.returncode != 0 and "io_method is PostgreSQL 18's" in r.stderr, r
