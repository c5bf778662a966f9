"""Read replicas (docs/replicas.md): stock PostgreSQL hot standbys of a
branch that stream its WAL from the safekeepers.

So far the ground they stand on: a stock standby made from a base backup of
a writer (without its WAL) streams the branch from a safekeeper's
replication service, over TLS with a tenant token, follows the writer's
commits, and moves to another safekeeper when its own is stopped.
"""

from __future__ import annotations

import os
import pwd
import shutil

import psycopg
import pytest

from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.pg import SERVER_USER, PgCluster
from fixtures.strata import parse_lsn
from fixtures.wait import wait_until


def _give_to_server_user(path) -> None:
    """pg_basebackup ran as this user; the standby runs as the server user."""
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(SERVER_USER)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, pw.pw_uid, pw.pw_gid)


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
    ct = cluster.cluster_toml
    sks = [s for s in ct["services"] if s["kind"] == "safekeeper"]
    ca = standby.base_dir / "ca.pem"
    shutil.copyfile(cluster.ca, ca)
    token = cluster.token_file("tenant").read_text().strip()
    conninfo = (f"host={','.join('127.0.0.1' for _ in sks)} port={','.join(str(s['ports']['pg']) for s in sks)} "
                f"user=postgres password={token} sslmode=verify-full sslrootcert={ca} "
                f"application_name=replica1 options='-c strata.timeline={ct['tenant_id']}/{cluster.timeline_id()}'")
    (standby.pgdata / "standby.signal").write_text("")
    standby._include_settings()
    _give_to_server_user(standby.base_dir)
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
