"""A major upgrade as a branch (docs/postgres-versions.md, "Major
upgrade"): `strata branch upgrade main --to 18` makes a new branch holding
main's database upgraded by 18's own pg_upgrade. The oracle is the
upgrade PostgreSQL documents as the other way: main dumped with 18's
pg_dumpall and restored into a stock 18 server. The new branch's pg_dump
equals that server's, rows of a table in any order (a restore packs
them, pg_upgrade keeps their places); comparing with the old branch's own
dump would show what a new server prints differently for the same
catalog (18 deparses a view's columns without their table's name). 18's pg_amcheck finds nothing; the branch takes
writes and reads them back from storage, and its own branches are of 18
too; main is untouched and goes on."""

from __future__ import annotations

import difflib

from fixtures.checks import split_sequences
from fixtures.endpoint import Endpoint
from fixtures.objects import OBJECTS
from fixtures.versions import MAJORS

NEW = max(MAJORS)
NEW_BIN = f"/usr/lib/postgresql/{NEW}/bin"


def dump(ep: Endpoint, db: str) -> tuple[str, dict]:
    """One major's pg_dump of a database, without the line naming the
    server's version, sequences apart."""
    text = ep.run(["pg_dump", "--restrict-key=strata", "--no-unlogged-table-data"], dbname=db, timeout=300).stdout
    lines = [line for line in text.splitlines() if not line.startswith("-- Dumped from database version")]
    return split_sequences("\n".join(sorted_copies(lines)))


def sorted_copies(lines: list[str]) -> list[str]:
    """Each COPY block's rows sorted: a restore writes a table's rows in
    the dump's order, pg_upgrade keeps them where they lay."""
    out, block = [], None
    for line in lines:
        if block is not None:
            if line == "\\.":
                out += sorted(block) + [line]
                block = None
            else:
                block.append(line)
        else:
            out.append(line)
            if line.startswith("COPY ") and line.endswith(" FROM stdin;"):
                block = []
    assert block is None, "a COPY block without its end"
    return out


def assert_same(before: str, after: str, what: str) -> None:
    if before != after:
        diff = difflib.unified_diff(before.splitlines(), after.splitlines(), "before", "after", lineterm="", n=2)
        raise AssertionError(f"pg_dump of {what} differs after the upgrade:\n" + "\n".join(list(diff)[:200]))


def test_a_branch_upgraded_to_a_new_major_holds_the_same_database(cluster, pg_cluster_factory, tmp_path):
    old = Endpoint(cluster, "old")
    old.start()
    old.sql("CREATE DATABASE objects")
    (tmp_path / "objects.sql").write_text(OBJECTS)
    old.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(tmp_path / "objects.sql")], dbname="objects",
            timeout=300)
    old.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    # The old branch's compute, seen through the new major's clients.
    old_seen_by_new = Endpoint(cluster, "old", pg_bin_dir=NEW_BIN)
    old_seen_by_new.connstr = old.connstr
    objects_before = dump(old_seen_by_new, "objects")

    # The oracle: a dump and restore into stock 18, as the new major's
    # pg_dumpall makes it.
    everything = old_seen_by_new.run(["pg_dumpall", "--restrict-key=strata", "--no-role-passwords"],
                                     timeout=300).stdout
    (tmp_path / "all.sql").write_text(everything)
    ref = pg_cluster_factory("ref", major=NEW)
    ref.initdb(["--no-data-checksums"])
    ref.start()
    # Roles and databases that exist already (the superuser, postgres) are
    # said to exist; everything else must restore.
    r = ref.run(["psql", "-X", "-q", "-f", str(tmp_path / "all.sql")], timeout=600, check=False)
    errors = [line for line in r.stderr.splitlines() if "ERROR" in line and "already exists" not in line]
    assert not errors, errors[:20]
    expected = {db: dump(ref, db) for db in ("objects", "postgres")}

    out = cluster.run("branch", "upgrade", "main", "--to", str(NEW), timeout=900).stdout
    assert f"branch main-pg{NEW}:" in out and f"from PostgreSQL 15 to {NEW}" in out, out
    branch = next(b for b in cluster.tenant()["branches"] if b["name"] == f"main-pg{NEW}")
    assert branch["pg_version"] == NEW and "parent" not in branch, branch
    code, status = cluster.http("pageserver", "GET", cluster.timeline_path(f"main-pg{NEW}"))
    assert code == 200 and status["pg_version"] == NEW, (code, status)

    up = Endpoint(cluster, "up", branch=f"main-pg{NEW}", pg_bin_dir=NEW_BIN)
    up.start()
    assert up.sql("SELECT current_setting('server_version_num')::int / 10000") == [(NEW,)]
    for db, (text, seqs) in expected.items():
        after_text, after_seqs = dump(up, db)
        assert_same(text, after_text, db)
        # A sequence is as its WAL left it: up to 32 values ahead of what it
        # handed out (the objects' largest increment is 7), as after a crash.
        assert after_seqs.keys() == seqs.keys()
        for k, (v, _) in seqs.items():
            assert 0 <= after_seqs[k][0] - v <= 32 * 7, (db, k, seqs[k], after_seqs[k])
    assert up.sql("SELECT length(lo_get(424242))", dbname="objects") == [(13 * 20000,)]
    for db in ("objects", "postgres"):
        up.sql("CREATE EXTENSION IF NOT EXISTS amcheck", dbname=db)
    up.run(["pg_amcheck", "--all", "--heapallindexed", "--rootdescend"], timeout=600)

    # It takes writes, and a new compute reads them back from storage.
    up.run(["pgbench", "-n", "-c", "2", "-t", "200"], timeout=300)
    up.stop()
    up.start()
    assert up.sql("SELECT sum(abalance) = (SELECT sum(delta) FROM pgbench_history) FROM pgbench_accounts") == [
        (True,)]
    history = up.sql("SELECT count(*) FROM pgbench_history")[0][0]
    assert history == 2 * 200, history  # pgbench -i leaves the history empty

    # A branch of the upgraded branch is of the new major too.
    cluster.run("branch", "create", "child", "--from", f"main-pg{NEW}")
    child = next(b for b in cluster.tenant()["branches"] if b["name"] == "child")
    assert child.get("pg_version") == NEW, child
    kid = Endpoint(cluster, "kid", branch="child", pg_bin_dir=NEW_BIN)
    kid.start()
    assert kid.sql("SELECT count(*) FROM pgbench_history")[0][0] == history
    kid.stop()
    up.stop()

    # The old branch is untouched: the same database, still of 15, still
    # taking writes. An upgrade to a major not newer is refused.
    assert dump(old_seen_by_new, "objects") == objects_before
    assert old.sql("SHOW server_version_num")[0][0].startswith("15")
    old.run(["pgbench", "-n", "-c", "2", "-t", "50"], timeout=300)
    r = cluster.run("branch", "upgrade", f"main-pg{NEW}", "--to", "15", check=False)
    assert r.returncode != 0 and "is not an upgrade of it" in r.stderr, r
    old.stop()



def test_a_sharded_tenants_branch_upgrades_on_every_shard(cluster_factory):
    """A tenant of two shards (stripes of 8 blocks, so that every table
    spans both): `branch upgrade` reads main from both shards (shard 0's
    lazy basebackup, then every relation file from the shard that holds
    it) and imports the upgraded data directory into every shard, each
    keeping its own keys. The new branch reads as main did, 18's pg_amcheck
    finds nothing, and it takes writes that a new compute reads back."""
    cluster = cluster_factory(init_args=("--pageservers", "2"))
    cluster.run("tenant", "create", "sh", "--shards", "2", "--stripe-blocks", "8", timeout=300)
    old = Endpoint(cluster, "old")
    old.start("--tenant", "sh")
    old.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    old.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    digest = ("SELECT (SELECT md5(string_agg(a::text, ',' ORDER BY aid)) FROM pgbench_accounts a),"
              " (SELECT md5(string_agg(t::text, ',' ORDER BY tid)) FROM pgbench_tellers t),"
              " (SELECT count(*) FROM pgbench_history)")
    before = old.sql(digest)[0]

    out = cluster.run("branch", "upgrade", "main", "--to", str(NEW), "--tenant", "sh", timeout=900).stdout
    assert f"from PostgreSQL 15 to {NEW}" in out and "from its shards" in out, out
    branch = next(b for b in cluster.tenant("sh")["branches"] if b["name"] == f"main-pg{NEW}")
    tenant_id = cluster.tenant_id("sh")
    # Each shard holds the new timeline, on one pageserver.
    for n, name in enumerate(("pageserver", "pageserver2")):
        owners = [ps for ps in ("pageserver", "pageserver2") if cluster.http(
            ps, "GET", f"/v1/tenant/{tenant_id}-{n}of2/timeline/{branch['timeline_id']}")[0] == 200]
        assert len(owners) == 1, (n, owners)

    up = Endpoint(cluster, "up", branch=f"main-pg{NEW}", pg_bin_dir=NEW_BIN)
    up.start("--tenant", "sh")
    assert up.sql("SELECT current_setting('server_version_num')::int / 10000") == [(NEW,)]
    assert up.sql(digest)[0] == before
    up.run(["pg_amcheck", "--heapallindexed", "--install-missing", "-d", "postgres"], timeout=300)
    up.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    written = up.sql(digest)[0]
    assert written[2] == before[2] + 200, (before, written)
    up.restart()
    assert up.sql(digest)[0] == written
    # The old branch goes on, of 15.
    assert old.sql("SHOW server_version_num")[0][0].startswith("15")
    old.run(["pgbench", "-n", "-t", "20"], timeout=300)
