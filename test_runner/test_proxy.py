"""The proxy (docs/proxy.md): one PostgreSQL address for every endpoint of
every tenant. Clients name the endpoint by the TLS server name's first
label (`ep1.localhost`, verified against the cluster's CA) or by
`options=endpoint=NAME`; the proxy authenticates them with SCRAM itself
and wakes a sleeping compute, once however many clients arrive at once.

- psql, pgbench (with its invariants), pg_dump, psycopg and the
  PostgreSQL JDBC driver connect unchanged, and a query cancelled through
  the proxy stops;
- a client without TLS, of another role, naming no endpoint, with a
  wrong password or naming an unknown endpoint is refused with a reason
  (counted per reason) and wakes nothing; an unknown endpoint reads as a
  wrong password;
- concurrent first connections to a sleeping endpoint wake it once and
  every client is answered;
- a suspended read replica is woken once by a client naming it, which
  reads every row its writer committed (those of its sleep too) and whose
  write is refused as read-only;
- two tenants are isolated through the proxy (passwords, the per-tenant
  connection limit), and deleting one leaves the other whole;
- 50 endpoints over 10 tenants, asleep, are woken by clients in random
  order with pgbench's invariants intact;
- kill -9 of the proxy, of a waking compute, and of the agent and its
  supervisor while the compute suspends lose nothing: the next connection
  is served (and wakes the compute) with every committed row.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from fixtures.checks import assert_pgbench_invariants, pgbench_state
from fixtures.endpoint import Endpoint, current_lsn, start_endpoint
from fixtures.pg import libpq_env
from fixtures.processes import kill_and_wait, pid_alive, postgres_processes
from fixtures.strata import http_text, parse_lsn
from fixtures.wait import wait_until

IDLE = 2  # seconds without a client before a test's endpoints suspend
REPO = Path(__file__).resolve().parent.parent
JDBC = REPO / ".jdbc"  # the driver, fetched by scripts/setup-tests.sh
JAVA = Path(__file__).resolve().parent / "java"


class Proxy:
    """The cluster's proxy as its clients see it."""

    def __init__(self, cluster):
        self.cluster = cluster
        svc = next(s for s in cluster.cluster_toml["services"] if s["kind"] == "proxy")
        self.port = svc["ports"]["pg"]
        self.ca = cluster.ca
        assert self.ca is not None, "the test cluster has TLS"

    def conninfo(self, endpoint: str, password: str, *, sni: bool = True, **extra) -> dict:
        """libpq parameters: by server name (`NAME.localhost`, verified), or
        by `options` to the proxy's address."""
        info = {"port": self.port, "user": "app", "password": password, "dbname": "postgres",
                "sslmode": "verify-full", "sslrootcert": str(self.ca), "connect_timeout": 60}
        if sni:
            info |= {"host": f"{endpoint}.localhost", "hostaddr": "127.0.0.1"}
        else:
            info |= {"host": "127.0.0.1", "options": f"endpoint={endpoint}"}
        return info | extra

    def connect(self, endpoint: str, password: str, **kw) -> psycopg.Connection:
        return psycopg.connect(**self.conninfo(endpoint, password, **kw), autocommit=True)

    def status(self) -> dict:
        code, body = self.cluster.http("proxy", "GET", "/v1/status")
        assert code == 200, body
        return body

    def metrics_text(self) -> str:
        return http_text(self.cluster.http_url("proxy", "/metrics"))

    def refused(self) -> dict[str, float]:
        return {m[0]: float(m[1]) for m in
                re.findall(r'^strata_proxy_refused_total\{reason="([a-z_]+)"\} (\S+)$', self.metrics_text(), re.M)}

    def wakes(self) -> float:
        m = re.search(r"^strata_proxy_wakes_total (\S+)$", self.metrics_text(), re.M)
        return float(m.group(1)) if m else 0.0


def password(ep: Endpoint) -> str:
    return (ep.dir / "password").read_text().splitlines()[0]


def app_sql(ep: Endpoint, sql: str) -> None:
    """SQL as the application role (which the proxy logs in as), directly."""
    with ep.app_connect() as conn:
        conn.execute(sql)


def state(ep: Endpoint) -> str:
    return ep.status()["state"]


def wait_suspended(ep: Endpoint, timeout: float = 60) -> None:
    wait_until(f"endpoint {ep.name} to suspend", lambda: state(ep) == "suspended", timeout, interval=0.2,
               details=ep.logs)


def refusal(proxy: Proxy, endpoint: str, pw: str, **kw) -> str:
    """The error of a connection the proxy refuses."""
    with pytest.raises(psycopg.OperationalError) as e:
        proxy.connect(endpoint, pw, **kw).close()
    return str(e.value)


def libpq(proxy: Proxy, endpoint: str, pw: str) -> dict:
    """The environment for a libpq tool (psql, pgbench, pg_dump) through
    the proxy, by server name (libpq sends it as SNI and checks it
    against the proxy's certificate)."""
    info = proxy.conninfo(endpoint, pw)
    env = libpq_env(info)
    env["PGHOSTADDR"] = info["hostaddr"]
    return env


def test_clients_connect_through_the_proxy_and_refusals_wake_nothing(cluster):
    proxy = Proxy(cluster)
    ep = start_endpoint(cluster, "ep1", "--suspend-after", str(IDLE))
    pw = password(ep)
    with ep.app_connect() as conn:
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO kept SELECT g, md5(g::text) FROM generate_series(1, 1000) g")
        written = conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall()
    wait_suspended(ep)

    # psql by server name: the proxy wakes the compute.
    env = libpq(proxy, "ep1", pw)
    out = subprocess.run(["psql", "-XAtc", "SELECT count(*), current_user FROM kept"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "1000|app", out
    assert state(ep) == "running" and proxy.wakes() == 1

    # psycopg by option, without a server name; a cancelled query stops.
    with proxy.connect("ep1", pw, sni=False) as conn:
        assert conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall() == written
        threading.Timer(0.5, conn.cancel).start()
        t = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(60)")
        assert time.monotonic() - t < 30, "the cancel reached the compute"
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert proxy.status()["sessions_by_tenant"] == {"default": 1}

    # pgbench's load and its invariants; pg_dump.
    subprocess.run(["pgbench", "-i", "-s", "1", "-q"], env=env, check=True, capture_output=True, timeout=300)
    bench = subprocess.run(["pgbench", "-c", "4", "-j", "2", "-T", "3", "-n"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert bench.returncode == 0 and "number of failed transactions: 0" in bench.stdout, bench
    with proxy.connect("ep1", pw) as conn:
        assert_pgbench_invariants(pgbench_state(conn), 1)
    dump = subprocess.run(["pg_dump", "-t", "kept", "--data-only"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert dump.returncode == 0 and dump.stdout.count("\n") > 1000, dump.stderr

    # The PostgreSQL JDBC driver, by option (it sends no server name for
    # an address), the proxy's certificate verified.
    [jar] = sorted(JDBC.glob("postgresql-*.jar"))
    url = (f"jdbc:postgresql://127.0.0.1:{proxy.port}/postgres?sslmode=verify-full&sslrootcert={proxy.ca}"
           "&options=endpoint%3Dep1")
    java = subprocess.run(["java", "-cp", str(jar), str(JAVA / "ProxyClient.java"), url, "app", pw],
                          capture_output=True, text=True, timeout=300)
    assert java.returncode == 0, java.stdout + java.stderr
    v10 = next(v for i, v in written if i == 10)
    # The compute's side is its Unix socket (no TLS) unless the socket's
    # path is too long for the kernel, when it is TCP with TLS.
    assert java.stdout.split()[:3] == ["count=1000", "user=app", f"v10={v10}"], java.stdout
    assert java.stdout.split()[3] in ("compute_ssl=false", "compute_ssl=true"), java.stdout
    with ep.app_connect() as conn:
        assert conn.execute("SELECT v FROM kept WHERE id = -1").fetchone() == ("from jdbc",)
        conn.execute("DELETE FROM kept WHERE id = -1")

    # Refusals, each with its reason; none wakes the sleeping compute.
    wait_suspended(ep)
    before, wakes = proxy.refused(), proxy.wakes()
    assert "requires TLS" in refusal(proxy, "ep1", pw, sslmode="disable")
    assert "role app only" in refusal(proxy, "ep1", pw, user="postgres")
    assert "no endpoint named" in refusal(proxy, "ep1", pw, sni=False, options="")
    wrong = refusal(proxy, "ep1", pw + "x")
    unknown = refusal(proxy, "nosuch", pw)
    assert 'password authentication failed for user "app"' in wrong, wrong
    assert wrong.replace("ep1", "nosuch") == unknown, "an unknown endpoint reads as a wrong password"
    after = proxy.refused()
    for reason in ("no_tls", "role", "no_endpoint", "wrong_password", "unknown_endpoint"):
        assert after.get(reason, 0) == before.get(reason, 0) + 1, (reason, before, after)
    assert state(ep) == "suspended", "a refused client woke the compute"
    assert proxy.wakes() == wakes
    assert proxy.status()["refused"]["wrong_password"] >= 1

    # The endpoint's rows after it all, through the proxy.
    with proxy.connect("ep1", pw) as conn:
        assert conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall() == written


def test_concurrent_first_connections_wake_the_compute_once(cluster):
    proxy = Proxy(cluster)
    ep = start_endpoint(cluster, "ep1", "--suspend-after", str(IDLE))
    pw = password(ep)
    app_sql(ep, "CREATE TABLE t AS SELECT g FROM generate_series(1, 100) g")
    wait_suspended(ep)
    wakes = proxy.wakes()
    clients = 12
    barrier = threading.Barrier(clients)

    def client(i: int) -> tuple[int, float]:
        barrier.wait()
        t = time.monotonic()
        with proxy.connect("ep1", pw, sni=i % 2 == 0) as conn:
            return conn.execute("SELECT count(*) FROM t").fetchone()[0], time.monotonic() - t

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    assert [n for n, _ in results] == [100] * clients
    print(f"\nCONCURRENT WAKE: {clients} clients answered in {max(s for _, s in results):.3f} s (slowest)")
    assert proxy.wakes() == wakes + 1, "one start for every client"
    assert proxy.status()["waking"] == []


def suspending(ep: Endpoint) -> bool:
    """Whether the endpoint's agent is stopping PostgreSQL to suspend."""
    try:
        return json.loads((ep.dir / "suspended").read_text()).get("phase") == "suspending"
    except (OSError, ValueError):
        return False


def test_a_client_arriving_while_the_compute_suspends_is_answered(cluster):
    """The catalog says running until the agent exits, but PostgreSQL
    refuses or resets connections from its shutdown on: the proxy looks
    again until the compute is suspended, then wakes it."""
    proxy = Proxy(cluster)
    ep = start_endpoint(cluster, "ep1", "--suspend-after", str(IDLE))
    pw = password(ep)
    for round in range(2):
        # A dirty buffer pool makes the shutdown checkpoint last.
        app_sql(ep, f"CREATE TABLE ballast{round} AS SELECT g, repeat('x', 900) AS pad "
                    "FROM generate_series(1, 80000) g")
        wakes = proxy.wakes()
        wait_until("a suspension under way", lambda: suspending(ep), 60, interval=0.005, details=ep.logs)
        with proxy.connect("ep1", pw) as conn:
            assert conn.execute(f"SELECT count(*) FROM ballast{round}").fetchone() == (80000,)
        assert proxy.wakes() == wakes + 1, "it was woken once it had suspended"


def replayed_to(conn: psycopg.Connection, lsn: int) -> bool:
    """Whether the standby behind `conn` has replayed the WAL up to `lsn`."""
    replayed = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()[0]
    return replayed is not None and parse_lsn(replayed) >= lsn


def test_a_sleeping_replica_wakes_through_the_proxy_and_refuses_writes(cluster):
    proxy = Proxy(cluster)
    writer = start_endpoint(cluster, "ep1")  # never suspends
    app_sql(writer, "CREATE TABLE kept (id int PRIMARY KEY, v text)")
    app_sql(writer, "INSERT INTO kept SELECT g, md5(g::text) FROM generate_series(1, 1000) g")
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep1", "--suspend-after", str(IDLE))
    # A standby's role is its writer's, password and all.
    pw = password(replica)
    assert pw == password(writer)
    wait_until("the replica to replay the first rows", lambda: replica.sql("SELECT count(*) FROM kept") == [(1000,)],
               60)
    pids = [replica.supervisor_pid(), replica.agent_pid(), replica.postmaster_pid()]
    assert all(p is not None and pid_alive(p) for p in pids), pids
    wait_suspended(replica)
    st = replica.status()
    assert (st["state"], st["role"], st["pid"], st["supervisor_pid"]) == ("suspended", "replica", None, None), st
    assert [p for p in pids if pid_alive(p)] == [] and postgres_processes(replica.pgdata) == []
    assert state(writer) == "running", "the writer does not sleep with its replica"

    # The branch goes on while the replica sleeps.
    with writer.app_connect() as conn:
        conn.execute("INSERT INTO kept SELECT g, 'while asleep ' || g FROM generate_series(1001, 1500) g")
        conn.execute("UPDATE kept SET v = 'changed' WHERE id % 7 = 0")
        conn.execute("DELETE FROM kept WHERE id % 100 = 0")
        expected = conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall()
        end = current_lsn(conn)
    assert len(expected) == 1485 and (7, "changed") in expected and (1002, "while asleep 1002") in expected
    assert state(replica) == "suspended", "the writer's commits do not wake the replica"
    wakes = proxy.wakes()

    # A client names the replica: the proxy wakes it, and it reads every
    # row the writer committed, those of its sleep included.
    t = time.monotonic()
    with proxy.connect("r1", pw) as conn:
        woken = time.monotonic() - t
        assert conn.execute("SELECT pg_is_in_recovery(), current_user").fetchone() == (True, "app")
        wait_until("the woken replica to replay the writer's commits", lambda: replayed_to(conn, end), 60)
        assert conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall() == expected
        # A write is refused as on any standby, and the session goes on.
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
            conn.execute("INSERT INTO kept VALUES (0, 'through the replica')")
        assert "cannot execute INSERT in a read-only transaction" in str(refused.value), refused.value
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("UPDATE kept SET v = 'no' WHERE id = 1")
        assert conn.execute("SELECT count(*), min(id), max(id) FROM kept").fetchone() == (1485, 1, 1499)
        # A second client, by option, joins the running replica.
        with proxy.connect("r1", pw, sni=False) as other:
            assert other.execute("SELECT count(*) FROM kept WHERE v = 'changed'").fetchone() == (
                sum(1 for _, v in expected if v == "changed"),)
    print(f"\nREPLICA WAKE: the first client was answered in {woken:.3f} s")
    assert proxy.wakes() == wakes + 1, "one wake for both clients"
    assert proxy.refused().get("wake_failed", 0) == 0
    st = replica.status()
    assert (st["state"], st["role"]) == ("running", "replica"), st
    log = (replica.dir / "compute.log").read_text()
    assert log.count("woken from a suspension") == 1, log[-3000:]
    # Nothing reached the writer's rows.
    with writer.app_connect() as conn:
        assert conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall() == expected


def test_two_tenants_are_isolated_through_the_proxy(cluster):
    proxy = Proxy(cluster)
    for t in ("t1", "t2"):
        cluster.run("tenant", "create", t, timeout=180)
    a = Endpoint(cluster, "a")
    a.start("--tenant", "t1")
    b = Endpoint(cluster, "b")
    b.start("--tenant", "t2")
    app_sql(a, "CREATE TABLE mine AS SELECT 'a' AS who, g FROM generate_series(1, 500) g")
    app_sql(b, "CREATE TABLE mine AS SELECT 'b' AS who, g FROM generate_series(1, 300) g")
    pa, pb = password(a), password(b)
    assert pa != pb
    # One endpoint's password is no other's.
    assert "password authentication failed" in refusal(proxy, "b", pa)
    with proxy.connect("a", pa) as conn:
        assert conn.execute("SELECT who, count(*) FROM mine GROUP BY who").fetchall() == [("a", 500)]

    # At most two sessions of one tenant; the other tenant is not affected.
    cluster.configure("proxy", {"max_connections_per_tenant": 2})
    cluster.stop("--only", "proxy")
    cluster.start("--only", "proxy")
    wait_until("the proxy to answer", lambda: cluster.answers("proxy"), 30)
    held = [proxy.connect("a", pa), proxy.connect("a", pa)]
    third = refusal(proxy, "a", pa)
    assert "too many connections for tenant t1" in third, third
    with proxy.connect("b", pb) as conn:
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (300,)
        assert proxy.status()["sessions_by_tenant"] == {"t1": 2, "t2": 1}
    assert proxy.refused().get("tenant_limit") == 1
    held.pop().close()
    # The proxy learns of a client's close when its relay ends, not at once.
    wait_until("the closed session released", lambda: proxy.status()["sessions_by_tenant"].get("t1") == 1, 30)
    with proxy.connect("a", pa) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    held.pop().close()

    # Deleting t2 leaves t1 whole; b is then unknown.
    cluster.run("tenant", "delete", "t2", timeout=300)
    assert "password authentication failed" in refusal(proxy, "b", pb)
    with proxy.connect("a", pa) as conn:
        assert conn.execute("SELECT who, count(*) FROM mine GROUP BY who").fetchall() == [("a", 500)]


def test_many_endpoints_over_many_tenants_wake_in_random_order(cluster):
    """Endpoints of several tenants, each asleep, woken by their first
    client through the proxy in a random order, four at a time. CI runs
    four tenants of three endpoints; STRATA_PROXY_TENANTS=10
    STRATA_PROXY_ENDPOINTS=5 runs the fifty of issue 46 (six minutes here)."""
    proxy = Proxy(cluster)
    tenants = [f"t{i}" for i in range(int(os.environ.get("STRATA_PROXY_TENANTS", "4")))]
    per_tenant = int(os.environ.get("STRATA_PROXY_ENDPOINTS", "3"))
    endpoints = {}
    for t in tenants:
        cluster.run("tenant", "create", t, timeout=180)
        for j in range(per_tenant):
            name = f"{t}-e{j}"
            # On `main` (the first) or a branch of its own: one writer per branch.
            branch = f"b{j}" if j else "main"
            if j:
                cluster.run("branch", "create", branch, "--tenant", t, timeout=180)
            ep = Endpoint(cluster, name, branch=branch)
            ep.start("--tenant", t, "--suspend-after", str(IDLE))
            endpoints[name] = ep
    for name, ep in endpoints.items():
        subprocess.run(["pgbench", "-i", "-s", "1", "-q", "-I", "dtgvp"], env=libpq(proxy, name, password(ep)),
                       check=True, capture_output=True, timeout=300)
    wait_until("every endpoint to suspend", lambda: all(state(ep) == "suspended" for ep in endpoints.values()),
               120, interval=1)
    order = list(endpoints)
    random.Random(46).shuffle(order)
    wakes = proxy.wakes()

    def work(name: str) -> float:
        env = libpq(proxy, name, password(endpoints[name]))
        t = time.monotonic()
        out = subprocess.run(["pgbench", "-c", "2", "-t", "20", "-n"], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0 and "number of failed transactions: 0" in out.stdout, (name, out)
        return time.monotonic() - t

    with ThreadPoolExecutor(4) as pool:
        seconds = list(pool.map(work, order))
    n = len(order)
    print(f"\n{n} ENDPOINTS: woken and loaded, median {sorted(seconds)[n // 2]:.3f} s, slowest {max(seconds):.3f} s")
    assert proxy.wakes() >= wakes + n
    for name in order:
        with proxy.connect(name, password(endpoints[name])) as conn:
            assert_pgbench_invariants(pgbench_state(conn), 1)


def test_kill9_of_the_proxy_and_of_a_waking_compute_lose_nothing(cluster):
    proxy = Proxy(cluster)
    ep = start_endpoint(cluster, "ep1", "--suspend-after", str(IDLE))
    pw = password(ep)
    app_sql(ep, "CREATE TABLE acked (id int PRIMARY KEY)")
    acked: list[int] = []
    with proxy.connect("ep1", pw) as conn:
        for i in range(200):
            conn.execute("INSERT INTO acked VALUES (%s)", (i,))
            acked.append(i)
        # The proxy dies under a session: the client loses its connection,
        # the supervisor starts the proxy again.
        pid = cluster.pid("proxy")
        kill_and_wait(pid)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO acked VALUES (1000)")
    wait_until("the proxy to be started again", lambda: cluster.pid("proxy") not in (None, pid)
               and cluster.answers("proxy"), 60)
    with proxy.connect("ep1", pw) as conn:
        got = [r[0] for r in conn.execute("SELECT id FROM acked WHERE id < 1000 ORDER BY id").fetchall()]
    assert got == acked

    # A compute killed while it wakes: the next client wakes it.
    wait_suspended(ep)
    errors = []

    def client() -> None:
        try:
            with proxy.connect("ep1", pw) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as e:
            errors.append(str(e))

    waking = threading.Thread(target=client)
    waking.start()
    wait_until("the compute to start waking", lambda: ep.agent_pid() is not None and pid_alive(ep.agent_pid()),
               60, interval=0.01)
    agent = ep.agent_pid()
    kill_and_wait(agent)
    waking.join(120)
    assert not waking.is_alive()
    print(f"\nKILLED WHILE WAKING: the waking client {'failed: ' + errors[0] if errors else 'was answered'}")
    with proxy.connect("ep1", pw) as conn:
        got = [r[0] for r in conn.execute("SELECT id FROM acked WHERE id < 1000 ORDER BY id").fetchall()]
    assert got == acked

    # The agent and its supervisor killed while the compute suspends (a
    # dirty buffer pool makes its shutdown checkpoint last): the marker
    # stays, and the next client through the proxy wakes the endpoint.
    ep.sql("CREATE TABLE ballast AS SELECT g, repeat('x', 900) AS pad FROM generate_series(1, 80000) g")

    wait_until("a suspension under way", lambda: suspending(ep), 60, interval=0.005, details=ep.logs)
    hit = True
    try:
        kill_and_wait(ep.supervisor_pid())
        kill_and_wait(ep.agent_pid())
    except (ProcessLookupError, TypeError):
        hit = False  # it was over first
    print(f"\nKILLED WHILE SUSPENDING: {'mid-suspension' if hit and suspending(ep) else 'after it'}")
    wait_until("nothing of the endpoint to run", lambda: state(ep) in ("suspended", "stopped"), 60)
    with proxy.connect("ep1", pw) as conn:
        got = [r[0] for r in conn.execute("SELECT id FROM acked WHERE id < 1000 ORDER BY id").fetchall()]
    assert got == acked
    assert state(ep) == "running"
