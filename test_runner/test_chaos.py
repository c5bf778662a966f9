"""Chaos under load: every component of a local cluster killed with SIGKILL
in turn while clients write, and nothing acknowledged is lost.

Load: pgbench (started again whenever it aborts: it does not reconnect) and
writer threads that insert unique ids one per transaction, reconnecting
after any error (``fixtures.load``). An id is acknowledged once its COMMIT
returned; an error leaves it in doubt.

Victims, one at a time with a few seconds of steady load between them: a
client's backend, the postmaster, the compute agent (the compute comes back
by itself: the agent starts PostgreSQL afresh, the supervisor starts a new
agent), a safekeeper and the pageserver (their supervisors start them
again; commits need only a quorum of safekeepers, and the compute does not
read from the pageserver once started). Printed for each: the downtime seen
by the writers (from the kill until they commit again) for compute-side
victims, and for services the time until the service's status API answers
again and whether the writers kept committing meanwhile. Nothing is
asserted about timing.

At the end, every acknowledged id is in the table, also on a fresh compute
restored from the pageserver; pgbench's sums agree; pg_amcheck is clean.
"""

from __future__ import annotations

import os
import signal
import time

from fixtures.checks import assert_pgbench_invariants, history_rows, pgbench_state, run_amcheck
from fixtures.endpoint import Endpoint
from fixtures.load import AckedWriters, PgbenchLoop
from fixtures.processes import pid_alive
from fixtures.wait import wait_until

SCALE = 1
WRITERS = 3
STEADY = 3.0  # seconds of steady load before each kill
COMPUTE_VICTIMS = ("backend", "postmaster", "agent")
SERVICE_VICTIMS = ("sk2", "pageserver", "controller")


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def steady_load(ep: Endpoint, writers: AckedWriters, seconds: float) -> None:
    """Lets the load run for `seconds`; both kinds of client must commit meanwhile."""
    t0 = time.monotonic()
    history = wait_until("the compute to answer", lambda: [history_rows(ep)], timeout=60)[0]
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    more = wait_until("pgbench to commit again", lambda: (n := history_rows(ep)) > history and n, timeout=60)
    acks = writers.acked_between(t0, time.monotonic())
    assert acks, f"no writer committed in {seconds} s of steady load"
    print(f"  steady load: {len(acks)} writer commits and {more - history} pgbench transactions "
          f"in {time.monotonic() - t0:.1f} s")


def pgbench_backend(ep: Endpoint) -> int:
    """The pid of one of pgbench's backends (waits for pgbench to be connected)."""
    rows = wait_until("a pgbench backend", lambda: ep.sql(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' AND backend_type = 'client backend' "
        "ORDER BY pid LIMIT 1"), timeout=60)
    return rows[0][0]


def kill_compute_side(ep: Endpoint, writers: AckedWriters, victim: str) -> dict:
    """Kills one compute-side process; returns the downtime the writers saw."""
    pid = {"backend": lambda: pgbench_backend(ep), "postmaster": ep.postmaster_pid,
           "agent": ep.agent_pid}[victim]()
    assert pid is not None and pid_alive(pid), (victim, pid)
    agent = ep.agent_pid()
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    first = writers.wait_committing(t_kill, every_writer=False)
    every = writers.wait_committing(t_kill, every_writer=True)
    assert not pid_alive(pid), f"{victim} (pid {pid}) survived SIGKILL"
    # The agent's own view of the restart (the new agent's, after an agent kill).
    st = wait_until("the agent running", lambda: (s := ep.agent_status())["state"] == "running" and s, timeout=60)
    if victim == "agent":
        assert ep.agent_pid() not in (None, agent) and st["restarts"] == 0, st
    else:
        assert ep.agent_pid() == agent and st["restarts"] >= 1, st
    return {"victim": victim, "pid": pid, "first_commit": first - t_kill, "every_writer": every - t_kill,
            "agent_downtime": st["last_restart_downtime_seconds"] if victim != "agent" else None,
            "errors": len(writers.errors_between(t_kill, every))}


def kill_service(cluster, writers: AckedWriters, name: str) -> dict:
    """Kills a safekeeper or the pageserver; measures until its status API
    answers again, and whether the writers kept committing meanwhile."""
    old = cluster.pid(name)
    before = cluster.service(name)["restarts"]
    t_kill = time.monotonic()
    cluster.kill9(name)
    wait_until(f"{name} to answer again", lambda: cluster.answers(name, timeout=0.5), timeout=60, interval=0.01,
               retry=())
    t_up = time.monotonic()
    entry = cluster.wait_restarted(name, old, restarts=before + 1)
    assert entry["last_exit"] == "signal 9: SIGKILL" and entry["crash_loop"] is False, entry
    # Whether writes went on: commits while it was down, and the longest
    # pause of all writers from the kill until a second after it answered.
    time.sleep(1.0)
    t_end = time.monotonic()
    during = writers.acked_between(t_kill, t_up)
    return {"victim": name, "pid": old, "down": t_up - t_kill,
            "commits_while_down": len(during), "longest_pause": writers.longest_pause(t_kill, t_end),
            "errors": len(writers.errors_between(t_kill, t_end))}


def test_kill9_each_component_under_load(cluster):
    t_begin = time.monotonic()
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.run(["pgbench", "-i", "-s", SCALE, "-q"], timeout=600)
    # A short backoff (at most 0.1 s) bounds how late a writer notices the compute is back.
    writers = AckedWriters(ep, threads=WRITERS, backoff=(0.01, 0.1)).start()
    bench = PgbenchLoop(ep).start()
    results = []
    try:
        steady_load(ep, writers, STEADY)
        for victim in COMPUTE_VICTIMS + SERVICE_VICTIMS:
            if victim in COMPUTE_VICTIMS:
                r = kill_compute_side(ep, writers, victim)
                print(f"\nDOWNTIME {victim} SIGKILL: writers commit again after {r['first_commit']:.3f} s "
                      f"(all {WRITERS} writers: {r['every_writer']:.3f} s; agent's own measure: "
                      f"{fmt(r['agent_downtime'])}; "
                      f"writer errors: {r['errors']})")
            else:
                r = kill_service(cluster, writers, victim)
                went_on = r["commits_while_down"] > 0 and r["errors"] == 0
                print(f"\nDOWNTIME {victim} SIGKILL: status API answers again after {r['down']:.3f} s; "
                      f"writes continued: {'yes' if went_on else 'NO'} ({r['commits_while_down']} commits while "
                      f"it was down, longest pause of all writers {r['longest_pause']:.3f} s, "
                      f"writer errors {r['errors']})")
            results.append(r)
            steady_load(ep, writers, STEADY)
    finally:
        bench.stop()
        writers.stop()

    acked = writers.acked_ids()
    in_doubt = writers.in_doubt
    print(f"\nacknowledged: {len(acked)} ids; in doubt: {len(in_doubt)}; writer errors: {len(writers.errors)}; "
          f"reconnects: {sum(writers.connects) - WRITERS}; pgbench runs ended: {bench.restarts()} "
          f"(exit codes {sorted({code for _, code, _ in bench.runs})})")
    assert acked and not acked & in_doubt

    # Every acknowledged id is there, nothing that was never sent is.
    ids = {r[0] for r in ep.sql("SELECT id FROM acked")}
    missing = sorted(acked - ids)
    assert not missing, f"{len(missing)} acknowledged ids are missing, e.g. {missing[:10]}"
    assert ids <= writers.attempted, sorted(ids - writers.attempted)[:10]
    print(f"in-doubt ids that committed: {len(in_doubt & ids)} of {len(in_doubt)}")
    with ep.connect() as conn:
        before = pgbench_state(conn)
    assert_pgbench_invariants(before, SCALE)

    # A fresh compute from the pageserver (which was killed too) has it all.
    ep.stop()
    ep.start()
    after_ids = {r[0] for r in ep.sql("SELECT id FROM acked")}
    assert after_ids == ids, (f"{len(ids - after_ids)} rows lost, {len(after_ids - ids)} appeared "
                              "across the compute restart")
    with ep.connect() as conn:
        after = pgbench_state(conn)
    assert after == before, f"pgbench tables changed across the compute restart:\n{before}\n{after}"
    assert_pgbench_invariants(after, SCALE)
    run_amcheck(ep, ["postgres"])

    st = cluster.status()
    restarts = {s["name"]: (s["state"], s["restarts"], s["crash_loop"]) for s in st["services"]}
    assert restarts == {"sk1": ("running", 0, False), "sk2": ("running", 1, False), "sk3": ("running", 0, False),
                        "pageserver": ("running", 1, False), "controller": ("running", 1, False),
                        "proxy": ("running", 0, False)}, restarts
    print(f"\nSUMMARY (test took {time.monotonic() - t_begin:.1f} s)")
    for r in results:
        if "down" in r:
            print(f"  {r['victim']:<10} status API back after {r['down']:.3f} s; "
                  f"{r['commits_while_down']} commits meanwhile; longest write pause {r['longest_pause']:.3f} s")
        else:
            print(f"  {r['victim']:<10} writers commit again after {r['first_commit']:.3f} s "
                  f"(all: {r['every_writer']:.3f} s)")
