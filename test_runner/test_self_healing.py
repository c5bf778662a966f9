"""Computes and services come back by themselves.

A backend, the postmaster or the compute agent killed with SIGKILL: the
compute is started afresh (sync-safekeepers, a basebackup at the latest
commit, PostgreSQL on the same port) without anyone running `strata`. A
safekeeper or the pageserver killed with SIGKILL: its supervisor starts it
again. Each case prints its downtime: from the kill to the first
successful `SELECT 1` (on the new server) through the same connection
string, or, for a service, to its status API answering again. Nothing is
asserted about timing.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from fixtures.endpoint import Endpoint
from fixtures.metrics import parse_metrics
from fixtures.processes import pid_alive, postgres_processes
from fixtures.wait import wait_until

SERVICES = ("sk1", "sk2", "sk3", "pageserver", "controller", "proxy")
ROWS = 1000


def report(case: str, seconds: float) -> None:
    print(f"\nDOWNTIME {case}: {seconds:.3f} s")


def fill(ep: Endpoint) -> None:
    ep.sql("CREATE TABLE kept (id int PRIMARY KEY, v text)")
    ep.sql(f"INSERT INTO kept SELECT g, 'row ' || g FROM generate_series(1, {ROWS}) g")


def assert_rows(ep: Endpoint, extra: int = 0) -> None:
    n = ROWS + extra
    assert ep.sql("SELECT count(*), sum(id) FROM kept") == [(n, n * (n + 1) // 2)]


def listed(cluster, name: str) -> dict[str, str]:
    """The row of `strata endpoint list` for one endpoint, by column."""
    lines = cluster.run("endpoint", "list").stdout.splitlines()
    # Columns are separated by two spaces or more; a header may hold one ("LAST CAUSE").
    columns = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    for line in lines[1:]:
        if line.split()[0] == name:
            ends = [start for start, _ in columns[1:]] + [None]
            return {col: line[start:end].strip() for (start, col), end in zip(columns, ends)}
    raise AssertionError(f"no endpoint {name} in:\n{lines}")


def wait_agent(ep: Endpoint, what: str, check, timeout: float = 60) -> dict:
    """Polls the agent's status until `check(status)` holds; returns it."""
    def probe():
        st = ep.agent_status()
        return st if check(st) else None
    return wait_until(f"endpoint {ep.name}: {what}", probe, timeout)


@pytest.mark.parametrize("victim", ["backend", "postmaster"])
def test_postgres_kill9_restarts_compute(cluster, victim):
    ep = Endpoint(cluster, "ep")
    connstr = ep.start()
    fill(ep)
    agent, supervisor, postmaster = ep.agent_pid(), ep.supervisor_pid(), ep.postmaster_pid()
    before = ep.server_started_at()
    with ep.connect() as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        old_processes = postgres_processes(ep.pgdata)
        assert backend in old_processes and postmaster in old_processes, old_processes
        started = time.monotonic()
        os.kill(backend if victim == "backend" else postmaster, signal.SIGKILL)
        ep.wait_new_server(before)
        report(f"{victim} SIGKILL", time.monotonic() - started)

    st = wait_agent(ep, "running again", lambda s: s["state"] == "running")
    assert st["restarts"] == 1, st
    cause = st["last_restart_cause"]
    if victim == "backend":
        assert cause.startswith("PostgreSQL exited (exit code 1)"), cause
        assert f"server process (PID {backend}) was terminated by signal 9" in cause, cause
    else:
        assert cause.startswith("PostgreSQL exited (signal 9: SIGKILL)"), cause
    assert st["last_restart_at"] is not None and st["crash_loop"] is False, st
    assert 0 < st["last_restart_downtime_seconds"] < 60, st
    assert st["error"] is None and st["pg_port"] == int(ep.conninfo()["port"])
    metrics = ep.agent_metrics()
    assert "strata_compute_restarts_total 1" in metrics, metrics
    assert "strata_compute_crash_loop 0" in metrics, metrics
    downtime = parse_metrics(metrics).get("strata_compute_last_restart_downtime_seconds")
    assert downtime is not None and abs(downtime - st["last_restart_downtime_seconds"]) < 1e-3, metrics

    # The same agent, a new PostgreSQL; nothing of the old one is left.
    assert ep.agent_pid() == agent and ep.supervisor_pid() == supervisor
    assert ep.postmaster_pid() != postmaster
    assert not any(pid_alive(p) for p in old_processes), "the old server's processes are gone"
    assert ep.connstr == connstr
    assert_rows(ep)
    ep.sql("INSERT INTO kept VALUES (%s, 'after the restart')", (ROWS + 1,))
    assert_rows(ep, 1)

    row = listed(cluster, "ep")
    assert row["STATE"] == "running" and row["RESTARTS"] == "1", row
    assert row["LAST CAUSE"].startswith("PostgreSQL exited"), row
    entry = ep.status()
    assert (entry["restarts"], entry["postgres_restarts"], entry["agent_restarts"]) == (1, 1, 0), entry
    assert entry["last_restart_cause"] == cause and entry["last_cause"] == cause and entry["crash_loop"] is False


def test_agent_kill9_supervisor_restarts_it(cluster):
    ep = Endpoint(cluster, "ep")
    connstr = ep.start()
    fill(ep)
    agent, supervisor, postmaster = ep.agent_pid(), ep.supervisor_pid(), ep.postmaster_pid()
    old_processes = postgres_processes(ep.pgdata)
    assert postmaster in old_processes and len(old_processes) > 3, old_processes
    before = ep.server_started_at()
    started = time.monotonic()
    os.kill(agent, signal.SIGKILL)
    # The old PostgreSQL keeps answering reads until the new agent stops it.
    ep.wait_new_server(before)
    report("agent SIGKILL", time.monotonic() - started)

    st = wait_agent(ep, "running again", lambda s: s["state"] == "running")
    assert st["restarts"] == 0, "a new agent process: it restarted no PostgreSQL itself"
    new_agent = ep.agent_pid()
    assert new_agent not in (None, agent) and pid_alive(new_agent)
    assert ep.supervisor_pid() == supervisor
    assert not pid_alive(postmaster)
    assert not set(old_processes) & set(postgres_processes(ep.pgdata)), "the old server's processes are gone"
    assert ep.postmaster_pid() != postmaster
    log = (ep.dir / "compute.log").read_text()
    assert f"a PostgreSQL left by an earlier agent runs in the data directory; stopping it pid={postmaster}" in log
    assert "endpoint ep exited (signal 9: SIGKILL)" in log
    assert ep.connstr == connstr
    assert_rows(ep)
    ep.sql("INSERT INTO kept VALUES (%s, 'after the restart')", (ROWS + 1,))
    assert_rows(ep, 1)

    entry = ep.status()
    assert entry["state"] == "running" and entry["supervised"] is True, entry
    assert (entry["restarts"], entry["agent_restarts"], entry["postgres_restarts"]) == (1, 1, 0), entry
    assert entry["last_exit"] == "signal 9: SIGKILL", entry
    assert entry["last_cause"] == "the compute agent exited (signal 9: SIGKILL)", entry
    row = listed(cluster, "ep")
    assert row["RESTARTS"] == "1" and row["LAST CAUSE"] == "the compute agent exited (signal 9: SIGKILL)", row


def test_safekeeper_and_pageserver_kill9_come_back(cluster):
    ep = Endpoint(cluster, "ep")
    ep.start()
    fill(ep)
    for name in ("sk2", "pageserver"):
        supervisor = cluster.supervisor_pid(name)
        started = time.monotonic()
        pid = cluster.kill9(name)
        entry = cluster.wait_restarted(name, pid)
        report(f"{name} SIGKILL (until its status answers)", time.monotonic() - started)
        assert entry["restarts"] == 1 and entry["last_exit"] == "signal 9: SIGKILL", entry
        assert entry["supervisor_pid"] == supervisor and entry["supervised"] is True, entry
        assert entry["crash_loop"] is False and pid_alive(entry["pid"]), entry
        assert cluster.pid(name) == entry["pid"]
        state = cluster.supervisor_state(name)
        assert state["restarts"] == 1 and state["child_pid"] == entry["pid"], state
        log = cluster.log(name)
        assert f"{name} exited (signal 9: SIGKILL)" in log and "restart 1 in" in log, log[-2000:]
        # The compute commits throughout.
        ep.sql("INSERT INTO kept VALUES (%s, %s)", (ROWS + 1 + (name == "pageserver"), name))

    st = cluster.status()
    assert {s["name"]: s["state"] for s in st["services"]} == {n: "running" for n in SERVICES}
    assert {s["name"]: s["restarts"] for s in st["services"]} == {"sk1": 0, "sk2": 1, "sk3": 0, "pageserver": 1,
                                                                          "controller": 0, "proxy": 0}
    human = cluster.run("status").stdout
    assert re.search(r"^sk2\s+safekeeper\s+running\s+\d+\s+1\s+.*signal 9: SIGKILL$", human, re.M), human
    # A new compute restores everything from the restarted pageserver.
    ep.restart()
    assert_rows(ep, 2)


def test_stop_leaves_no_process_behind(cluster):
    ep = Endpoint(cluster, "ep")
    ep.start()
    fill(ep)
    # Some history first: a restarted safekeeper and compute.
    cluster.wait_restarted("sk1", cluster.kill9("sk1"))
    before = ep.server_started_at()
    os.kill(ep.postmaster_pid(), signal.SIGKILL)
    ep.wait_new_server(before)
    with ep.connect() as conn:
        conn.execute("SELECT 1")
        pids = cluster.all_pids()
    roles = set(pids)
    assert {"sk1", "sk1 supervisor", "pageserver", "pageserver supervisor", "ep agent", "ep agent supervisor",
            "ep postmaster"} <= roles, pids
    assert any(r.startswith("ep postgres ") for r in roles), pids
    out = cluster.stop()
    assert "endpoint ep: stopped" in out and "sk1: stopped" in out, out
    alive = {role: pid for role, pid in pids.items() if pid_alive(pid)}
    assert not alive, f"left running after strata stop: {alive}"
    for name in SERVICES:
        assert not cluster.pidfile(name).exists() and not cluster.supervisor_pidfile(name).exists()
    assert not (ep.dir / "compute.pid").exists() and not (ep.dir / "compute.supervisor.pid").exists()

    # --immediate too, with two supervisors killed beforehand (their
    # services run on alone and must still be stopped).
    cluster.start()
    ep.start()
    os.kill(cluster.supervisor_pid("sk3"), signal.SIGKILL)
    os.kill(ep.supervisor_pid(), signal.SIGKILL)
    wait_until("supervisors gone", lambda: not pid_alive(ep.supervisor_pid()) and not pid_alive(
        cluster.supervisor_pid("sk3")), timeout=10)
    st = cluster.status()
    sk3 = next(s for s in st["services"] if s["name"] == "sk3")
    assert sk3["state"] == "running" and sk3["supervised"] is False, sk3
    assert ep.status()["supervised"] is False
    pids = cluster.all_pids()
    assert "sk3" in pids and "sk3 supervisor" not in pids and "ep postmaster" in pids, pids
    out = cluster.stop("--immediate")
    assert "sk3: killed" in out and "endpoint ep: killed" in out, out
    alive = {role: pid for role, pid in pids.items() if pid_alive(pid)}
    assert not alive, f"left running after strata stop --immediate: {alive}"
    # A lazy compute's mounts go with it, even with its agent killed.
    mounts = [line.split()[1] for line in open("/proc/self/mounts") if str(cluster.workdir) in line]
    assert not mounts, f"mounts left after strata stop --immediate: {mounts}"


def test_crash_loop_is_reported_and_the_compute_recovers(cluster):
    ep = Endpoint(cluster, "ep")
    ep.start("--crash-loop-restarts", "3", "--crash-loop-window-secs", "600")
    fill(ep)
    before = ep.server_started_at()
    # Without the pageserver no restart can get a basebackup.
    cluster.stop("--only", "pageserver")
    started = time.monotonic()
    os.kill(ep.postmaster_pid(), signal.SIGKILL)
    st = wait_agent(ep, "a crash loop", lambda s: s["crash_loop"], timeout=120)
    print(f"\ncrash loop reported {time.monotonic() - started:.1f} s after the kill")
    assert st["state"] == "restarting" and st["restarts"] >= 3, st
    assert "the start failed: pageserver" in st["last_restart_cause"], st
    assert "pageserver" in st["error"], st
    assert "strata_compute_crash_loop 1" in ep.agent_metrics()
    assert 'strata_compute_state{state="restarting"} 1' in ep.agent_metrics()
    entry = ep.status()
    assert entry["crash_loop"] is True and entry["compute_state"] == "restarting", entry
    assert entry["postgres_restarts"] >= 3, entry
    assert listed(cluster, "ep")["STATE"] == "running (restarting, crash loop)"
    assert "(crash loop)" in cluster.run("status").stdout

    # The cause fixed, the compute comes back by itself.
    cluster.start("--only", "pageserver")
    ep.wait_new_server(before, timeout=120)
    report("postmaster SIGKILL with the pageserver down until restarted", time.monotonic() - started)
    st = wait_agent(ep, "running again", lambda s: s["state"] == "running")
    assert st["error"] is None and st["crash_loop"] is True, "the loop stays reported for its window"
    assert_rows(ep)
    ep.sql("INSERT INTO kept VALUES (%s, 'after the loop')", (ROWS + 1,))
    assert_rows(ep, 1)


def test_stop_during_restart_backoff_is_prompt(cluster):
    """A compute waiting to restart stops at once, and leaves nothing behind."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    cluster.stop("--only", "pageserver")
    postmaster = ep.postmaster_pid()
    os.kill(postmaster, signal.SIGKILL)
    wait_agent(ep, "restarting", lambda s: s["state"] == "restarting" and s["restarts"] >= 1)
    agent, supervisor = ep.agent_pid(), ep.supervisor_pid()
    started = time.monotonic()
    out = ep.stop()
    took = time.monotonic() - started
    assert "endpoint ep: stopped" in out, out
    assert took < 15, f"stopping a restarting compute took {took:.1f} s"
    assert not pid_alive(agent) and not pid_alive(supervisor)
    assert ep.status()["state"] == "stopped"
    assert "stop requested" in (ep.dir / "compute.log").read_text()
