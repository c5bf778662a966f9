"""Applications log in as the endpoint's application role, which owns the
database and is no superuser; the superuser has no password, is refused
over TCP and stays with the agent (`docs/security.md`, "Roles").

Each hole an endpoint's password used to open, tried again as the
application: reading the server's files, running a program, making roles,
becoming a superuser, logging in as the superuser. And what an
application needs still works: tables, databases, trusted extensions,
CHECKPOINT, statistics.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from fixtures.endpoint import start_endpoint


def test_applications_are_no_superuser_and_own_their_database(cluster):
    ep = start_endpoint(cluster, "ep")
    with ep.app_connect() as conn:
        assert conn.execute("SELECT current_user, rolsuper, rolcreaterole, rolreplication, rolbypassrls, "
                            "pg_get_userbyid(datdba) FROM pg_roles, pg_database "
                            "WHERE rolname = current_user AND datname = current_database()").fetchone() == \
            ("app", False, False, False, False, "app")
        # What a database's owner does.
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO orders SELECT g, 'order ' || g FROM generate_series(1, 100) g")
        conn.execute("CREATE EXTENSION pgcrypto")  # a trusted extension
        assert conn.execute("SELECT length(digest('x', 'sha256'))").fetchone() == (32,)
        conn.execute("CREATE DATABASE shop")
        conn.execute("CHECKPOINT")
        # pg_monitor: the agent's proposer is seen streaming (without it,
        # everything but its pid reads NULL).
        assert conn.execute("SELECT state FROM pg_stat_replication WHERE application_name = 'strata_proposer'"
                            ).fetchall() == [("streaming",)]
        # What it may not: the server's files, a shell, roles, superuser.
        for sql, refusal in (
            ("SELECT pg_read_file('server.key')", errors.InsufficientPrivilege),
            ("SELECT pg_read_file('/etc/passwd')", errors.InsufficientPrivilege),
            ("SELECT pg_ls_dir('.')", errors.InsufficientPrivilege),
            ("COPY orders FROM PROGRAM 'id'", errors.InsufficientPrivilege),
            ("COPY orders TO '/tmp/orders.csv'", errors.InsufficientPrivilege),
            ("CREATE ROLE intruder SUPERUSER", errors.InsufficientPrivilege),
            ("CREATE ROLE helper", errors.InsufficientPrivilege),
            ("ALTER ROLE app SUPERUSER", errors.InsufficientPrivilege),
            ("GRANT pg_execute_server_program TO app", errors.InsufficientPrivilege),
            ("ALTER SYSTEM SET log_statement = 'all'", errors.InsufficientPrivilege),
            ("CREATE EXTENSION file_fdw", errors.InsufficientPrivilege),  # untrusted
            ("SET ROLE postgres", errors.InsufficientPrivilege),
        ):
            with pytest.raises(refusal):
                conn.execute(sql)
    with ep.app_connect("shop") as conn:
        assert conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'shop'").fetchone() == \
            ("app",)
    # The superuser over TCP, with the endpoint's password: refused by
    # pg_hba.conf before any password is asked for.
    info = ep.app_conninfo()
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection"):
        psycopg.connect(**dict(info, user="postgres"), connect_timeout=30)
    # The superuser, through the socket, has no password at all.
    assert ep.sql("SELECT rolname, rolpassword IS NULL FROM pg_authid WHERE rolname IN ('app', 'postgres') "
                  "ORDER BY 1") == [("app", False), ("postgres", True)]


def test_the_roles_are_put_back_at_every_start_and_a_replica_logs_in_with_the_branchs(cluster):
    """Whatever happened to the roles in the branch (an operator's superuser
    session, a branch made before the application role existed), the next
    start of a primary makes them what they must be; a start that finds
    them in order writes nothing."""
    ep = start_endpoint(cluster, "ep")
    ep.sql("CREATE TABLE kept AS SELECT generate_series(1, 10) AS x")
    ep.sql("GRANT SELECT ON kept TO app")
    # As a superuser might, or as a branch from before looked.
    for sql in ("ALTER ROLE app SUPERUSER CREATEROLE", "GRANT pg_execute_server_program TO app",
                "REVOKE pg_checkpoint FROM app", "ALTER ROLE postgres PASSWORD 'was-the-endpoints'",
                "ALTER DATABASE postgres OWNER TO postgres", "ALTER ROLE app PASSWORD 'another'"):
        ep.sql(sql)
    ep.restart()
    assert ep.sql("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = 'app'") == [(False, False)]
    # The role's verifier is the endpoint's own, salt included: the one the
    # proxy checks clients against (docs/proxy.md), private to its owner.
    verifier = ep.dir / "password.scram"
    assert verifier.stat().st_mode & 0o777 == 0o600
    assert verifier.read_text().startswith("SCRAM-SHA-256$4096:")
    assert ep.sql("SELECT rolpassword FROM pg_authid WHERE rolname = 'app'") == [(verifier.read_text().strip(),)]
    assert ep.sql("SELECT rolpassword IS NULL FROM pg_authid WHERE rolname = 'postgres'") == [(True,)]
    granted = {r[0] for r in ep.sql("SELECT pg_get_userbyid(roleid) FROM pg_auth_members "
                                    "WHERE member = 'app'::regrole")}
    assert granted == {"pg_checkpoint", "pg_monitor", "pg_signal_backend"}, granted
    with ep.app_connect() as conn:
        assert conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'postgres'"
                            ).fetchone() == ("app",)
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (10,)
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("COPY kept FROM PROGRAM 'id'")
    # In order: a restart changes nothing, so it writes no WAL of its own
    # before PostgreSQL's shutdown checkpoint.
    log = (ep.dir / "compute.log").read_text()
    assert log.count("the branch's roles made the endpoint's") == 2, "the first start and the repair"
    ep.restart()
    assert (ep.dir / "compute.log").read_text().count("the branch's roles made the endpoint's") == 2

    # A replica logs in with the branch's roles: the application role with
    # the endpoint's password, the superuser not over TCP.
    replica = start_endpoint(cluster, "r1", "--replica-of", "ep")
    assert (replica.dir / "password.scram").read_text() == verifier.read_text(), "the writer's, salt included"
    with replica.app_connect() as conn:
        assert conn.execute("SELECT current_user, pg_is_in_recovery(), count(*) FROM kept").fetchone() == \
            ("app", True, 10)
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection"):
        psycopg.connect(**dict(replica.app_conninfo(), user="postgres"), connect_timeout=30)
