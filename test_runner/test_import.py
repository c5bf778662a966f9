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
import subprocess
import urllib.error
import tarfile
import threading

import pytest

from fixtures.checks import split_sequences
from fixtures.endpoint import Endpoint
from fixtures.strata import urlopen
from fixtures.versions import MAJORS

#: Objects of most kinds PostgreSQL has, in a database of their own.
OBJECTS = r"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TYPE floatrange AS RANGE (subtype = float8, subtype_diff = float8mi);
CREATE SEQUENCE counter START 100 INCREMENT 7;
CREATE TABLE items (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    feeling mood DEFAULT 'ok',
    p pair,
    qty positive,
    tags text[],
    doc jsonb,
    span int4range,
    pt point,
    body text,
    ts tsvector GENERATED ALWAYS AS (to_tsvector('english', coalesce(body, ''))) STORED
);
INSERT INTO items (name, feeling, p, qty, tags, doc, span, pt, body)
SELECT 'item' || g, (ARRAY['sad','ok','happy']::mood[])[1 + g % 3], ROW(g, md5(g::text))::pair, 1 + g % 50,
       ARRAY['t' || g % 7, 't' || g % 11], jsonb_build_object('g', g, 'sq', g * g), int4range(g, g + 10),
       point(g % 100, g / 100), repeat(md5(g::text), 1 + g % 5)
FROM generate_series(1, 5000) g;
-- TOAST: values far over 2 kB, some compressible and some not.
CREATE TABLE blobs (id int PRIMARY KEY, big text, raw bytea);
INSERT INTO blobs SELECT g, repeat('toast', 2000 + g), decode(string_agg(md5(g::text || x::text), ''), 'hex')
FROM generate_series(1, 40) g, generate_series(1, 300) x GROUP BY g;
-- Every index access method.
CREATE INDEX items_hash ON items USING hash (name);
CREATE INDEX items_gist ON items USING gist (pt);
CREATE INDEX items_gin ON items USING gin (tags);
CREATE INDEX items_fts ON items USING gin (ts);
CREATE INDEX items_brin ON items USING brin (id);
CREATE INDEX items_spgist ON items USING spgist (span);
CREATE INDEX items_partial ON items (qty) WHERE feeling = 'happy';
CREATE INDEX items_expr ON items ((doc ->> 'g'));
-- Partitions, by range and by list, with a default.
CREATE TABLE events (at date NOT NULL, kind text NOT NULL, n int) PARTITION BY RANGE (at);
CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')
    PARTITION BY LIST (kind);
CREATE TABLE events_2025_a PARTITION OF events_2025 FOR VALUES IN ('a');
CREATE TABLE events_2025_other PARTITION OF events_2025 DEFAULT;
CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
INSERT INTO events SELECT date '2025-01-01' + g % 700, (ARRAY['a','b','c'])[1 + g % 3], g
FROM generate_series(1, 3000) g;
-- Foreign keys, a check, an exclusion constraint.
CREATE EXTENSION IF NOT EXISTS btree_gist;
CREATE TABLE orders (id serial PRIMARY KEY, item bigint REFERENCES items ON DELETE CASCADE,
                     during tsrange, CHECK (id > 0), EXCLUDE USING gist (item WITH =, during WITH &&));
INSERT INTO orders (item, during) SELECT g, tsrange(timestamp '2025-01-01' + g * interval '1 hour',
                                                    timestamp '2025-01-01' + (g + 1) * interval '1 hour')
FROM generate_series(1, 500) g;
-- Views, a materialized view, a rule, functions, a procedure, triggers.
CREATE VIEW happy_items AS SELECT id, name FROM items WHERE feeling = 'happy';
CREATE MATERIALIZED VIEW item_stats AS SELECT feeling, count(*) AS n, sum(qty) AS q FROM items GROUP BY feeling;
CREATE INDEX ON item_stats (feeling);
CREATE TABLE audit (at timestamptz DEFAULT now(), what text);
CREATE RULE keep_audit AS ON DELETE TO audit DO INSTEAD NOTHING;
CREATE FUNCTION add(a int, b int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT a + b';
CREATE FUNCTION log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO audit (what) VALUES (TG_OP || ' ' || NEW.name); RETURN NEW; END $$;
CREATE TRIGGER items_log AFTER UPDATE ON items FOR EACH ROW EXECUTE FUNCTION log_change();
CREATE PROCEDURE bump(n int) LANGUAGE plpgsql AS $$ BEGIN UPDATE items SET qty = qty + 1 WHERE id <= n; END $$;
CALL bump(10);
CREATE AGGREGATE total(int) (sfunc = add, stype = int, initcond = '0');
-- Row-level security, a policy, comments, grants.
CREATE ROLE reader NOLOGIN;
ALTER TABLE orders ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_orders ON orders FOR SELECT TO reader USING (id % 2 = 0);
GRANT SELECT ON items, orders TO reader;
COMMENT ON TABLE items IS 'things for sale';
COMMENT ON COLUMN items.qty IS 'how many';
-- Text search, a collation, a schema, an unlogged table, a large object.
CREATE TEXT SEARCH CONFIGURATION simple_en (COPY = english);
CREATE COLLATION plain_c (locale = 'C');
CREATE SCHEMA extra;
CREATE TABLE extra.notes (id int PRIMARY KEY, note text COLLATE plain_c);
INSERT INTO extra.notes SELECT g, 'note ' || g FROM generate_series(1, 200) g;
CREATE UNLOGGED TABLE scratch (id int PRIMARY KEY, v text);
INSERT INTO scratch SELECT g, 'v' || g FROM generate_series(1, 1000) g;
SELECT lo_from_bytea(424242, convert_to(repeat('large object ', 20000), 'UTF8'));
-- Deleted and updated rows, and a vacuum: free space and visibility maps.
DELETE FROM items WHERE id % 13 = 0;
UPDATE items SET body = 'changed' WHERE id % 17 = 0;
VACUUM (ANALYZE) items;
SELECT nextval('counter') FROM generate_series(1, 5);
"""


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
    src.initdb()
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
