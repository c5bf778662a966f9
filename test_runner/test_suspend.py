"""Scale to zero (docs/compute.md, "Suspend"; docs/local-cluster.md,
"Suspended endpoints"): an endpoint started with `--suspend-after N` that
has had no client connection for N seconds stops cleanly and holds
nothing (no agent, supervisor or postgres process, no FUSE mount); it is
`suspended` in `strata status --json` and `strata endpoint list`, and
`strata endpoint start` wakes it with every committed row. Replicas and
read-only endpoints sleep and wake the same way. An agent killed while
suspending is started again by its supervisor (and suspends again
later); with its supervisor killed too, the next `endpoint start` wakes
the endpoint. Each wake prints how long `endpoint start` took; nothing is
asserted about timing.
"""

from __future__ import annotations

import json
import re
import statistics
import time

import pytest

from fixtures.checks import run_amcheck
from fixtures.endpoint import Endpoint, current_lsn, start_endpoint
from fixtures.processes import kill_and_wait, pid_alive, postgres_processes
from fixtures.strata import format_lsn
from fixtures.wait import wait_until

IDLE = 2  # seconds without a client before an endpoint suspends
MARKER = "suspended"


def report(case: str, seconds: float) -> None:
    print(f"\nWAKE {case}: {seconds:.3f} s")


def state(ep: Endpoint) -> str:
    return ep.status()["state"]


def listed_state(cluster, name: str) -> str:
    """The STATE column of `strata endpoint list` for one endpoint."""
    lines = cluster.run("endpoint", "list").stdout.splitlines()
    # Columns are separated by two spaces or more ("LAST CAUSE" holds one).
    columns = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    start = dict((c, s) for s, c in columns)["STATE"]
    end = dict((c, s) for s, c in columns)["RESTARTS"]
    for line in lines[1:]:
        if line.split()[0] == name:
            return line[start:end].strip()
    raise AssertionError(f"no endpoint {name} in:\n{lines}")


def marker(ep: Endpoint) -> dict | None:
    try:
        return json.loads((ep.dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def wait_suspended(ep: Endpoint, timeout: float = 60) -> float:
    """Waits (without connecting) until the endpoint is `suspended`;
    returns the seconds it took."""
    t = time.monotonic()
    wait_until(f"endpoint {ep.name} to suspend", lambda: state(ep) == "suspended", timeout, interval=0.2,
               details=ep.logs)
    return time.monotonic() - t


def assert_nothing_runs(ep: Endpoint, pids: list[int]) -> None:
    """No process of the endpoint is left (those seen running before are
    gone, and no postgres works in its data directory), no FUSE mount."""
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"processes of {ep.name} still alive: {alive}"
    assert ep.agent_pid() is None or not pid_alive(ep.agent_pid())
    assert ep.supervisor_pid() is None or not pid_alive(ep.supervisor_pid())
    assert postgres_processes(ep.pgdata) == []
    assert ep.lazy_mounts() == [], ep.lazy_mounts()
    with open("/proc/self/mounts") as f:
        mounts = f.read()
    assert str(ep.dir) not in mounts, mounts


def process_ids(ep: Endpoint) -> list[int]:
    pids = [ep.supervisor_pid(), ep.agent_pid(), ep.postmaster_pid()]
    assert all(p is not None and pid_alive(p) for p in pids), pids
    return pids + postgres_processes(ep.pgdata)


def rows(ep: Endpoint) -> list[tuple]:
    return ep.sql("SELECT id, v FROM kept ORDER BY id")


def wake(ep: Endpoint, case: str) -> float:
    """`strata endpoint start` of a suspended endpoint; reports its time."""
    assert state(ep) == "suspended"
    t = time.monotonic()
    ep.start()
    seconds = time.monotonic() - t
    report(case, seconds)
    assert marker(ep) is None, "the marker goes once the endpoint runs"
    assert state(ep) == "running"
    return seconds


def test_an_idle_endpoint_suspends_holds_nothing_and_wakes_with_every_commit(cluster):
    ep = start_endpoint(cluster, "ep", "--suspend-after", str(IDLE))
    with ep.app_connect() as conn:
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY, v text)")
        for i in range(5):  # several transactions, each committed
            conn.execute(f"INSERT INTO kept SELECT g, md5(g::text) FROM generate_series({i * 2000 + 1}, "
                         f"{(i + 1) * 2000}) g")
        conn.execute("UPDATE kept SET v = 'changed' WHERE id % 7 = 0")
        written = conn.execute("SELECT id, v FROM kept ORDER BY id").fetchall()
        pids = process_ids(ep)
        # An application's connection (TCP, TLS, the application role),
        # idle all along, keeps the compute running well past the period.
        time.sleep(2 * IDLE + 1)
        assert all(pid_alive(p) for p in pids[:3]), pids
        assert state(ep) == "running" and marker(ep) is None
        assert conn.execute("SELECT 1").fetchone() == (1,)
    print(f"\nSUSPENDED after the last client left: {wait_suspended(ep):.3f} s")

    m = marker(ep)
    assert m is not None and m["phase"] == "suspended" and m["idle_secs"] >= IDLE, m
    assert_nothing_runs(ep, pids)
    st = ep.status()
    assert st["state"] == "suspended" and st["pid"] is None and st["supervisor_pid"] is None, st
    assert st["last_exit"] == f"suspended after {m['idle_secs']} s idle", st
    assert listed_state(cluster, "ep") == "suspended"
    assert "suspended after" in cluster.run("status").stdout
    # A stop leaves it as it is.
    out = ep.stop()
    assert "suspended; nothing to stop" in out, out
    assert state(ep) == "suspended" and marker(ep) == m

    times = [wake(ep, "writer")]
    assert rows(ep) == written, "a committed row differs after the wake"
    run_amcheck(ep)
    ep.sql("INSERT INTO kept VALUES (0, 'after the wake')")
    written = rows(ep)
    # The idle period is the endpoint's own from now on: a plain start
    # keeps it, and the endpoint sleeps and wakes again and again.
    for i in range(3):
        wait_suspended(ep)
        assert_nothing_runs(ep, [])
        times.append(wake(ep, f"writer, again ({i + 1})"))
    assert rows(ep) == written
    report("writer, median", statistics.median(times))


def test_a_replica_and_a_read_only_endpoint_sleep_and_wake(cluster):
    writer = start_endpoint(cluster, "ep")  # never suspends
    writer.sql("CREATE TABLE kept (id int PRIMARY KEY, v text)")
    writer.sql("INSERT INTO kept SELECT g, 'row ' || g FROM generate_series(1, 5000) g")
    with writer.connect() as conn:
        at = current_lsn(conn)
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep", "--suspend-after", str(IDLE))
    wait_until("the replica to replay the rows", lambda: replica.sql("SELECT count(*) FROM kept")[0][0] == 5000,
               timeout=60)
    pids = process_ids(replica)
    wait_suspended(replica)
    assert_nothing_runs(replica, pids)
    st = replica.status()
    assert st["role"] == "replica" and st["last_exit"].startswith("suspended after"), st
    assert listed_state(cluster, "r1") == "suspended"
    assert state(writer) == "running", "the writer does not sleep with its replica"

    # The branch goes on while the replica sleeps; woken, it follows it.
    writer.sql("INSERT INTO kept SELECT g, 'later ' || g FROM generate_series(5001, 6000) g")
    expected = writer.sql("SELECT id, v FROM kept ORDER BY id")
    wake(replica, "replica")
    assert replica.sql("SELECT pg_is_in_recovery()")[0][0] is True
    wait_until("the woken replica to replay the later rows", lambda: rows(replica) == expected, timeout=60)

    # A read-only endpoint at an LSN sleeps and wakes at the same point.
    past = Endpoint(cluster, "past")
    past.start("--at", format_lsn(at), "--suspend-after", str(IDLE))
    assert past.sql("SELECT count(*) FROM kept")[0][0] == 5000
    pids = process_ids(past)
    wait_suspended(past)
    assert_nothing_runs(past, pids)
    wake(past, "read-only")
    assert past.sql("SELECT count(*) FROM kept")[0][0] == 5000


def kill_while_suspending(ep: Endpoint, also_supervisor: bool, timeout: float = 60) -> bool:
    """Waits (without connecting) for the marker of a suspension under way
    and SIGKILLs the agent then (its supervisor first if asked). Returns
    whether the kill came while the agent was still suspending (a
    suspension may be over before the marker is seen)."""
    def under_way():
        m = marker(ep)
        return m if m is not None and m["phase"] == "suspending" else None

    wait_until(f"endpoint {ep.name} to start suspending", under_way, timeout, interval=0.005, details=ep.logs)
    agent, supervisor = ep.agent_pid(), ep.supervisor_pid()
    if agent is None or supervisor is None:
        return False
    try:
        if also_supervisor:
            kill_and_wait(supervisor)
        kill_and_wait(agent)
    except ProcessLookupError:
        return False
    return under_way() is not None


def make_shutdown_slow(ep: Endpoint) -> None:
    """Dirties most of shared_buffers, so that the shutdown checkpoint of
    the next suspension writes them back (through the lazy file system)
    and the suspension lasts long enough to be interrupted."""
    ep.sql("CREATE TABLE IF NOT EXISTS ballast (g int, pad text)")
    ep.sql("TRUNCATE ballast")
    ep.sql("INSERT INTO ballast SELECT g, repeat('x', 900) FROM generate_series(1, 80000) g")


@pytest.mark.parametrize("also_supervisor", [False, True], ids=["agent", "agent-and-supervisor"])
def test_a_crash_while_suspending_leaves_an_endpoint_that_wakes_with_its_data(cluster, also_supervisor):
    ep = start_endpoint(cluster, "ep", "--suspend-after", str(IDLE))
    ep.sql("CREATE TABLE kept (id int PRIMARY KEY, v text)")
    ep.sql("INSERT INTO kept SELECT g, md5(g::text) FROM generate_series(1, 10000) g")
    written = rows(ep)
    for attempt in range(3):
        make_shutdown_slow(ep)
        if kill_while_suspending(ep, also_supervisor):
            break
        # Suspended before the kill came: wake it and try again.
        wait_suspended(ep)
        wake(ep, f"before another try ({attempt + 1})")
    else:
        pytest.fail("no suspension lasted long enough to be interrupted in three tries")

    if also_supervisor:
        # Nothing starts it again: it is seen suspended (a PostgreSQL may
        # be left running), and the next start wakes it.
        st = ep.status()
        assert st["state"] == "suspended" and st["pid"] is None, st
        assert marker(ep)["phase"] == "suspending"
        wake(ep, "after a crash of agent and supervisor while suspending")
    else:
        # Its supervisor starts the agent again (the exit was SIGKILL, not
        # a suspension): it runs, then sleeps again after another period.
        sup = ep.cluster.workdir / "endpoints" / "ep" / "compute.supervisor.json"
        wait_until("the supervisor to start the agent again",
                   lambda: json.loads(sup.read_text())["restarts"] >= 1, timeout=30)
        assert json.loads(sup.read_text())["last_exit"] == "signal 9: SIGKILL"
        # Running again: the marker goes just before `running` (and comes
        # back at the next suspension, an idle period later).
        wait_until("the endpoint to run again", lambda: marker(ep) is None, timeout=60, interval=0.01,
                   details=ep.logs)
        # Said once the marker is gone: the log line may follow a moment later.
        wait_until("the agent to say it was woken",
                   lambda: "woken from a suspension" in (ep.dir / "compute.log").read_text(), timeout=30)
        wait_suspended(ep)
        assert ep.status()["last_exit"].startswith("suspended after")
        assert_nothing_runs(ep, [])
        wake(ep, "after a crash of the agent while suspending")
    assert rows(ep) == written, "a committed row differs after the crash"
    run_amcheck(ep)
