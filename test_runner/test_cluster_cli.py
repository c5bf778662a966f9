"""The local cluster command line: `strata init`, `start`, `stop`,
`status --json` and `endpoint start|stop|list`, each run as the `strata`
binary against a temporary workdir."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from fixtures.cluster import StrataCommandFailed
from fixtures.endpoint import Endpoint
from fixtures.processes import kill_and_wait, pid_alive

SAFEKEEPERS = ["sk1", "sk2", "sk3"]
SERVICES = SAFEKEEPERS + ["pageserver", "controller", "proxy"]
HEX32 = re.compile(r"^[0-9a-f]{32}$")
LSN = re.compile(r"^[0-9A-F]+/[0-9A-F]+$")


def all_ports(c) -> list[int]:
    return [p for s in c.cluster_toml["services"] for p in s["ports"].values()]


def states(status: dict) -> dict[str, str]:
    return {s["name"]: s["state"] for s in status["services"]}


def test_init_writes_every_config(cluster_factory):
    c = cluster_factory(start=False)
    ct = c.cluster_toml
    assert ct["format_version"] == 3
    # The one-host case of a cluster across hosts: every service on loopback.
    [host] = ct["hosts"]
    assert (host["name"], host["address"], host["computes"]) == ("local", "127.0.0.1", True), host
    assert {s["host"] for s in ct["services"]} == {"local"}
    # One tenant, `default`, with its `main` branch; the cluster has an id of its own.
    [tenant] = ct["tenants"]
    assert tenant["name"] == "default" and "state" not in tenant, tenant
    assert HEX32.match(tenant["tenant_id"]) and HEX32.match(ct["cluster_id"])
    assert [b["name"] for b in tenant["branches"]] == ["main"]
    assert HEX32.match(tenant["branches"][0]["timeline_id"])
    assert [(s["name"], s["kind"]) for s in ct["services"]] == [
        ("sk1", "safekeeper"), ("sk2", "safekeeper"), ("sk3", "safekeeper"), ("pageserver", "pageserver"),
        ("controller", "controller"), ("proxy", "proxy")]

    ports = all_ports(c)
    # Three per safekeeper, two for the pageserver, the controller's, the proxy's two.
    assert len(ports) == 3 * 3 + 2 + 1 + 2 and len(set(ports)) == len(ports), ports

    by_name = {s["name"]: s for s in ct["services"]}
    for i, name in enumerate(SAFEKEEPERS, start=1):
        cfg = c.service_config(name)
        ports = by_name[name]["ports"]
        assert cfg["id"] == i
        assert cfg["listen"] == f"127.0.0.1:{ports['listen']}"
        assert cfg["listen_http"] == f"127.0.0.1:{ports['http']}"
        assert cfg["listen_pg"] == f"127.0.0.1:{ports['pg']}"
        assert cfg["data_dir"] == str(c.workdir.resolve() / name / "data")
        peers = {p["id"]: p["address"] for p in cfg["peers"]}
        assert peers == {j: f"127.0.0.1:{by_name[f'sk{j}']['ports']['listen']}" for j in (1, 2, 3) if j != i}
        assert (c.workdir / name / "data").is_dir()

    ps = c.service_config("pageserver")
    assert ps["safekeepers"] == [f"127.0.0.1:{by_name[n]['ports']['listen']}" for n in SAFEKEEPERS]
    assert ps["listen_http"] == f"127.0.0.1:{by_name['pageserver']['ports']['http']}"
    assert ps["listen_pg"] == f"127.0.0.1:{by_name['pageserver']['ports']['pg']}"
    assert ps["data_dir"] == str(c.workdir.resolve() / "pageserver" / "data")
    assert ps["id"] not in (1, 2, 3)
    # The storage controller places the tenant on the pageserver.
    assert ps["controller"] is True
    ctl = c.service_config("controller")
    assert ctl["tenants"] == [tenant["tenant_id"]]
    assert ctl["pageservers"] == [{"name": "pageserver", "pg": ps["listen_pg"], "http": ps["listen_http"],
                                   "site": "local"}]
    assert ctl["listen_http"] == f"127.0.0.1:{by_name['controller']['ports']['http']}"

    # A second init is refused and changes nothing.
    before = (c.workdir / "cluster.toml").read_text()
    second = c.run("init", check=False)
    assert second.returncode == 1
    assert "cluster.toml" in second.stderr and "exists" in second.stderr
    assert (c.workdir / "cluster.toml").read_text() == before

    # Nothing runs yet; status says so without failing.
    st = c.status()
    assert set(states(st).values()) == {"stopped"}
    assert all(s["pid"] is None for s in st["services"])
    assert st["timelines"][0]["pageserver"] is None


def test_usage_and_missing_workdir_errors(cluster_factory, tmp_path):
    fresh = cluster_factory(init=False, start=False)
    assert fresh.run("init", "--safekeepers", "0", check=False).returncode == 2
    assert not (fresh.workdir / "cluster.toml").exists()
    c = cluster_factory(start=False)
    assert c.run("start", "--immediate", check=False).returncode == 2
    assert c.run("start", "--only", "nosuch", check=False).returncode == 2
    assert c.run("endpoint", "start", "bad/name", check=False).returncode == 2
    assert c.run("status", "--bogus", check=False).returncode == 2
    missing = subprocess.run([str(c.strata_bin), "status", "--workdir", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "cluster.toml" in missing.stderr and "strata init" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr


def test_init_safekeeper_count(cluster_factory):
    c = cluster_factory(start=False, init_args=("--safekeepers", "1"))
    names = [s["name"] for s in c.cluster_toml["services"]]
    assert names == ["sk1", "pageserver", "controller", "proxy"]
    assert c.service_config("sk1").get("peers", []) == []
    assert c.run("init", check=False).returncode == 1  # already initialised


def test_safekeepers_only_start_and_restart(cluster_factory):
    """`--only` starts just the safekeepers; after a kill -9 of one with its
    supervisor, `start` restarts only the dead one."""
    c = cluster_factory(start=False)
    out = c.start("--only", ",".join(SAFEKEEPERS))
    for name in SAFEKEEPERS:
        assert f"{name}: started" in out
    st = c.status()
    assert states(st) == {"sk1": "running", "sk2": "running", "sk3": "running", "pageserver": "stopped",
                          "controller": "stopped", "proxy": "stopped"}
    pids = {s["name"]: s["pid"] for s in st["services"]}
    assert all(pid_alive(pids[n]) for n in SAFEKEEPERS)
    assert all(s["supervised"] and pid_alive(s["supervisor_pid"]) for s in st["services"] if s["name"] in SAFEKEEPERS)

    c.kill9("sk1", supervisor=True)
    assert c.service("sk1")["state"] == "stopped"
    out = c.start("--only", ",".join(SAFEKEEPERS))
    assert "sk1: started" in out
    assert "sk2: already running" in out and "sk3: already running" in out
    after = {s["name"]: s["pid"] for s in c.status()["services"]}
    assert after["sk2"] == pids["sk2"] and after["sk3"] == pids["sk3"]
    assert after["sk1"] not in (None, pids["sk1"])

    out = c.stop("--only", "sk2")
    assert "sk2: stopped" in out
    assert states(c.status())["sk2"] == "stopped" and not c.pidfile("sk2").exists()
    assert not c.supervisor_pidfile("sk2").exists() and not pid_alive(after["sk2"])


def test_start_and_status(cluster):
    st = cluster.status()
    assert states(st) == {n: "running" for n in SERVICES}
    for s in st["services"]:
        assert pid_alive(s["pid"]), s
        kinds = {"pageserver": "pageserver", "controller": "controller", "proxy": "proxy"}
        assert s["kind"] == kinds.get(s["name"], "safekeeper")
        assert s["ports"] == next(x["ports"] for x in cluster.cluster_toml["services"] if x["name"] == s["name"])
    assert st["endpoints"] == []

    [tl] = st["timelines"]
    assert tl["branch"] == "main"
    assert tl["tenant_id"] == cluster.tenant_id()
    assert tl["timeline_id"] == cluster.timeline_id()
    ps = tl["pageserver"]
    assert ps is not None and ps["state"] == "active", ps
    assert LSN.match(ps["last_record_lsn"]) and LSN.match(ps["start_lsn"])
    assert [s["name"] for s in tl["safekeepers"]] == SAFEKEEPERS
    for sk in tl["safekeepers"]:
        assert LSN.match(sk["flush_lsn"] or "") and LSN.match(sk["commit_lsn"] or ""), sk

    human = cluster.run("status").stdout
    for name in SERVICES:
        assert re.search(rf"^{name}\s+\w+\s+running\s+\d+", human, re.M), human

    # A second start changes nothing.
    out = cluster.start()
    for name in SERVICES:
        assert f"{name}: already running" in out
    assert {s["name"]: s["pid"] for s in cluster.status()["services"]} == {s["name"]: s["pid"] for s in st["services"]}


def test_kill9_safekeeper_comes_back_by_itself(cluster):
    """A killed safekeeper is started again by its supervisor; nothing else changes."""
    before = {s["name"]: s for s in cluster.status()["services"]}
    old = cluster.kill9("sk2")
    entry = cluster.wait_restarted("sk2", old)
    assert entry["restarts"] == 1 and entry["last_exit"] == "signal 9: SIGKILL", entry
    assert entry["supervisor_pid"] == before["sk2"]["supervisor_pid"], entry
    assert cluster.pid("sk2") == entry["pid"] and pid_alive(entry["pid"])
    after = {s["name"]: s for s in cluster.status()["services"]}
    for name in ("sk1", "sk3", "pageserver"):
        assert (after[name]["pid"], after[name]["restarts"]) == (before[name]["pid"], 0), after[name]
    # Its timeline survived the crash.
    sk2 = next(s for s in cluster.status()["timelines"][0]["safekeepers"] if s["name"] == "sk2")
    assert sk2["flush_lsn"] is not None
    # `start` leaves a running, supervised service alone.
    assert "sk2: already running" in cluster.start()


def test_kill9_safekeeper_with_supervisor_then_start_restarts_only_it(cluster):
    before = {s["name"]: s["pid"] for s in cluster.status()["services"]}
    cluster.kill9("sk2", supervisor=True)
    st = cluster.status()
    assert states(st) == {"sk1": "running", "sk2": "stopped", "sk3": "running", "pageserver": "running",
                          "controller": "running", "proxy": "running"}

    out = cluster.start()
    assert "sk2: started" in out, out
    for name in ("sk1", "sk3", "pageserver"):
        assert f"{name}: already running" in out, out
    after = {s["name"]: s for s in cluster.status()["services"]}
    assert all(after[n]["pid"] == before[n] for n in ("sk1", "sk3", "pageserver"))
    assert after["sk2"]["pid"] not in (None, before["sk2"]) and pid_alive(after["sk2"]["pid"])
    assert after["sk2"]["supervised"] and after["sk2"]["restarts"] == 0, after["sk2"]
    sk2 = next(s for s in cluster.status()["timelines"][0]["safekeepers"] if s["name"] == "sk2")
    assert sk2["flush_lsn"] is not None


def test_service_without_its_supervisor(cluster):
    """A service whose supervisor was killed keeps running, unsupervised;
    `start` puts it under a new supervisor without a second copy, and `stop`
    stops a service running alone too."""
    old_sup, old_pid = cluster.supervisor_pid("sk1"), cluster.pid("sk1")
    kill_and_wait(old_sup)
    entry = cluster.service("sk1")
    assert (entry["state"], entry["pid"], entry["supervised"], entry["supervisor_pid"]) == (
        "running", old_pid, False, None), entry
    # Unsupervised, a crash is not repaired.
    kill_and_wait(old_pid)
    assert cluster.service("sk1")["state"] == "stopped"
    cluster.start("--only", "sk1")

    kill_and_wait(cluster.supervisor_pid("sk1"))
    alone = cluster.pid("sk1")
    out = cluster.start("--only", "sk1")
    assert f"sk1: runs without its supervisor (pid {alone}); restarting it under a new one" in out, out
    assert "sk1: started" in out, out
    assert not pid_alive(alone), "no second copy: the unsupervised one was stopped"
    entry = cluster.service("sk1")
    assert entry["state"] == "running" and entry["supervised"] and entry["pid"] != alone, entry
    copies = [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
              if pid_alive(p) and str(cluster.service_config_path("sk1")) in _cmdline(p)
              and _cmdline(p).startswith(os.path.realpath(cluster.strata_bin) + " safekeeper")]
    assert copies == [entry["pid"]], copies

    kill_and_wait(cluster.supervisor_pid("sk1"))
    out = cluster.stop("--only", "sk1")
    assert f"sk1: stopped (pid {entry['pid']})" in out, out
    assert not pid_alive(entry["pid"]) and not cluster.pidfile("sk1").exists()


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_two_clusters_side_by_side(cluster_factory):
    a = cluster_factory()
    b = cluster_factory()
    assert not set(all_ports(a)) & set(all_ports(b))
    assert a.tenant_id() != b.tenant_id()
    assert set(states(a.status()).values()) == {"running"}
    assert set(states(b.status()).values()) == {"running"}
    a.stop()
    assert set(states(a.status()).values()) == {"stopped"}
    assert set(states(b.status()).values()) == {"running"}
    b.stop()


def test_stop_is_idempotent(cluster):
    services = cluster.status()["services"]
    pids = [s["pid"] for s in services] + [s["supervisor_pid"] for s in services]
    assert all(pid_alive(p) for p in pids), services
    out = cluster.stop()
    for name in SERVICES:
        assert f"{name}: stopped" in out, out
        assert not cluster.pidfile(name).exists() and not cluster.supervisor_pidfile(name).exists()
        assert cluster.supervisor_state(name) is None
    assert not any(pid_alive(p) for p in pids)
    out = cluster.stop()
    for name in SERVICES:
        assert f"{name}: not running" in out, out
    st = cluster.status()
    assert set(states(st).values()) == {"stopped"}
    assert st["timelines"][0]["pageserver"] is None and st["timelines"][0]["safekeepers"] == []
    # And it starts again from its own data.
    out = cluster.start()
    for name in SERVICES:
        assert f"{name}: started" in out, out
    assert cluster.status()["timelines"][0]["pageserver"]["state"] == "active"


def test_endpoint_start_stop_keeps_rows(cluster, pg_bin_dir):
    out = cluster.run("endpoint", "start", "ep1").stdout
    connstr = out.strip().splitlines()[-1]
    # Last, the local string: the endpoint's password, over TLS verified
    # against the cluster's CA, loopback included (on a loopback host it
    # is the only one).
    ca = cluster.workdir / "tls" / "ca.pem"
    m = re.fullmatch(r"postgresql://app:([A-Za-z0-9]{32})@127\.0\.0\.1:(\d+)/postgres"
                     rf"\?sslmode=verify-full&sslrootcert={re.escape(str(ca))}", connstr)
    assert m, out
    assert "over TLS: " not in out, out
    password, port = m.group(1), int(m.group(2))
    assert port not in all_ports(cluster)
    password_file = cluster.workdir / "endpoints" / "ep1" / "password"
    assert password_file.read_text().strip() == password
    assert password_file.stat().st_mode & 0o777 == 0o600

    psql = subprocess.run([str(pg_bin_dir / "psql"), "-X", "-A", "-t", "-c", "SELECT 1", connstr],
                          capture_output=True, text=True, timeout=60)
    assert psql.returncode == 0 and psql.stdout.strip() == "1", psql.stderr

    with psycopg.connect(connstr, autocommit=True, connect_timeout=30) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
        # Over TLS 1.3, as the application role, which owns the database
        # and is no superuser.
        assert conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == \
            (True, "TLSv1.3")
        assert conn.execute("SELECT current_user, rolsuper, pg_get_userbyid(datdba) FROM pg_roles, pg_database "
                            "WHERE rolname = current_user AND datname = current_database()").fetchone() == \
            ("app", False, "app")
    # The role's password is a SCRAM verifier, the superuser has none, and
    # the agent's WAL proposer streams through the Unix socket.
    ep = Endpoint(cluster, "ep1")
    ep.connstr = connstr
    with ep.connect() as conn:
        assert conn.execute("SELECT rolname, rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid "
                            "WHERE rolname IN ('app', 'postgres') ORDER BY 1").fetchall() == \
            [("app", True), ("postgres", None)]
        assert conn.execute("SELECT count(*) FROM pg_stat_replication WHERE client_addr IS NULL "
                            "AND application_name = 'strata_proposer' AND state = 'streaming'").fetchone() == (1,)
    # A wrong password and none are refused.
    for bad in (connstr.replace(password, "x" * 32), connstr.replace(f":{password}@", "@")):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(bad, connect_timeout=30, password="" if f":{password}@" not in bad else None)

    listed = cluster.run("endpoint", "list").stdout
    assert re.search(r"^NAME\s+BRANCH\s+PORT\s+STATE\s+RESTARTS\s+LAST CAUSE\s+CONNECTION$", listed, re.M), listed
    # Listed without the password.
    plain = f"postgresql://app@127.0.0.1:{port}/postgres"
    assert re.search(rf"^ep1\s+main\s+{port}\s+running\s+0\s+-\s+{re.escape(plain)}$", listed, re.M), listed
    assert password not in listed and password not in json.dumps(cluster.status())
    [ep] = cluster.status()["endpoints"]
    assert (ep["name"], ep["kind"], ep["branch"], ep["state"]) == ("ep1", "compute", "main", "running")
    assert ep["ports"]["pg"] == port and pid_alive(ep["pid"]) and pid_alive(ep["supervisor_pid"])
    assert (ep["restarts"], ep["last_cause"], ep["crash_loop"]) == (0, None, False), ep
    agent_pids = (ep["pid"], ep["supervisor_pid"])

    # One writer per branch; no second start of a running endpoint.
    with pytest.raises(StrataCommandFailed) as e:
        cluster.endpoint_start("ep2")
    assert "ep1" in e.value.stderr
    with pytest.raises(StrataCommandFailed):
        cluster.endpoint_start("ep1")

    cluster.endpoint_stop("ep1")
    assert cluster.status()["endpoints"][0]["state"] == "stopped"
    assert not any(pid_alive(p) for p in agent_pids)
    assert "endpoint ep1: not running" in cluster.endpoint_stop("ep1")

    # Restarted: same port, same rows.
    assert cluster.endpoint_start("ep1") == connstr
    with psycopg.connect(connstr, autocommit=True, connect_timeout=30) as conn:
        assert conn.execute("SELECT count(*), sum(id) FROM t").fetchone() == (1000, 500500)
        conn.execute("INSERT INTO t VALUES (1001, 'after restart')")

    # The whole cluster stopped (endpoints first) and started again.
    out = cluster.stop()
    assert out.index("endpoint ep1: stopped") < out.index("pageserver: stopped"), out
    cluster.start()
    assert cluster.endpoint_start("ep1") == connstr
    with psycopg.connect(connstr, autocommit=True, connect_timeout=30) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1001,)


def test_a_deep_workdir_gets_a_socket_directory_that_goes_with_the_endpoint(cluster_factory):
    # A socket path past sun_path's 107 bytes: PostgreSQL could not listen
    # in the data directory.
    c = cluster_factory(under="d" * 60 + "/" + "e" * 60)
    connstr = c.endpoint_start("ep1")
    pgdata = c.workdir / "endpoints" / "ep1" / "pgdata"
    conf = (pgdata / "postgresql.conf").read_text()
    m = re.search(r"^unix_socket_directories = '([^']*)'", conf, re.M)
    assert m, conf
    sockets = Path(m.group(1))
    assert sockets != pgdata and len(str(sockets)) < 100, sockets
    assert list(sockets.glob(".s.PGSQL.*")), "PostgreSQL listens in the socket directory"
    with psycopg.connect(connstr, autocommit=True, connect_timeout=30) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS x")
    # Stopped, the endpoint leaves nothing in the temporary directory;
    # started again, it makes the directory again.
    c.endpoint_stop("ep1")
    assert not sockets.exists()
    assert c.endpoint_start("ep1") == connstr
    assert list(sockets.glob(".s.PGSQL.*"))
    with psycopg.connect(connstr, autocommit=True, connect_timeout=30) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (1,)
    # Also when its agent was killed.
    [ep] = c.status()["endpoints"]
    kill_and_wait(ep["supervisor_pid"])
    kill_and_wait(ep["pid"])
    c.endpoint_stop("ep1")
    assert not sockets.exists()


def test_endpoint_needs_the_storage(cluster_factory):
    c = cluster_factory(start=False)
    c.start("--only", ",".join(SAFEKEEPERS))
    r = c.run("endpoint", "start", "ep1", check=False)
    assert r.returncode == 1
    assert "pageserver is not running" in r.stderr
    assert "no endpoints" in c.run("endpoint", "list").stdout


def test_a_closed_stdout_ends_a_command_quietly(strata_bin, pg_bin_dir, tmp_path):
    """A reader that went away (`strata init | head -0`) ends the command
    as SIGPIPE would in a shell, with 141 and nothing on stderr, never with
    a panic about a broken pipe."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    for args in (["init", "--pg-bin-dir", str(pg_bin_dir)], ["status"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            res = subprocess.run([str(strata_bin), *args, "--workdir", str(workdir)], stdout=write_end,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=60)
        finally:
            os.close(write_end)
        assert (res.returncode, res.stderr) == (141, ""), (args, res)
    assert (workdir / "cluster.toml").is_file(), "init did its work before it printed"
