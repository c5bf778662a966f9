"""Replacing a safekeeper with `strata safekeeper replace OLD NEW`
(docs/safekeeper-membership.md): the new safekeeper catches up from its
peers and from object storage, every timeline moves through a joint
configuration to the new set, and writes go on throughout; a member
briefly away is waited for."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import psycopg

from fixtures.checks import assert_pgbench_invariants, pgbench_state
from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.strata import SEGMENT, parse_lsn
from fixtures.wait import wait_until
from fixtures.workload import bulk_write, switch_segment


def membership(cluster, name: str) -> dict:
    code, m = cluster.http(name, "GET", cluster.timeline_path() + "/membership")
    assert code == 200, m
    return m


def member_ids(m: dict) -> list[int]:
    return sorted(x["id"] for x in m["members"])


def test_a_wiped_safekeeper_is_replaced_while_writes_go_on(cluster):
    """sk3 dies and its disk is wiped while a client commits row after row
    and pgbench runs. `strata safekeeper replace sk3 sk4` adds sk4, which
    takes what sk1 and sk2 removed from object storage and the rest from
    them; the timeline goes through generations 1 (the old set), 2 (joint)
    and 3 (sk1, sk2, sk4). The compute is re-elected under each without a
    restart and no commit fails. Then sk1 dies too: sk2 and sk4 are the
    quorum, and every acknowledged commit is there, also after the compute
    restarts."""
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    ep.sql("CREATE TABLE acked (id int PRIMARY KEY)")
    # Enough WAL that sk1 and sk2 remove some: the new safekeeper must take
    # that part from object storage.
    with ep.connect() as conn:
        bulk_write(ep, current_lsn(conn) + 3 * SEGMENT)
    switch_segment(ep)
    cluster.run("timeline", "checkpoint", timeout=600)
    start = parse_lsn(cluster.timeline_status("sk1")["timeline_start_lsn"])
    wait_until("sk1 and sk2 removed old WAL",
               lambda: all(parse_lsn(cluster.timeline_status(n)["removal"]["removed_before"]) > start + SEGMENT
                           for n in ("sk1", "sk2")), timeout=180)

    cluster.kill9("sk3", supervisor=True)
    shutil.rmtree(cluster.data_dir("sk3"))
    postmaster = ep.postmaster_pid()

    acknowledged: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    slowest = [0.0]

    def writer() -> None:
        try:
            with ep.connect() as conn:
                n = 0
                while not stop.is_set():
                    n += 1
                    t = time.monotonic()
                    conn.execute("INSERT INTO acked (id) VALUES (%s)", (n,))
                    slowest[0] = max(slowest[0], time.monotonic() - t)
                    acknowledged.append(n)
        except psycopg.Error as e:
            errors.append(e)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    bench = ep.popen(["pgbench", "-n", "-c", "2", "-T", "600"])
    try:
        wait_until("the writer commits with sk3 gone", lambda: len(acknowledged) > 50, timeout=60)
        before = len(acknowledged)
        out = cluster.run("safekeeper", "replace", "sk3", "sk4", timeout=900).stdout
        print("\n" + out)
        during = len(acknowledged) - before
        time.sleep(2)
        assert thread.is_alive(), f"the writer failed: {errors}"
    finally:
        stop.set()
        bench.terminate()
        bench.wait(timeout=60)
    thread.join(timeout=60)
    assert not errors, errors
    assert during > 0, "no commit went through during the replacement"
    print(f"commits during the replacement: {during}; slowest commit {slowest[0]:.2f}s")
    assert ep.postmaster_pid() == postmaster, "the compute restarted"

    # The cluster now has sk1, sk2, sk4; every member holds generation 3.
    names = [s["name"] for s in cluster.cluster_toml["services"]]
    assert "sk3" not in names and "sk4" in names, names
    sk4_id = cluster.service_config("sk4")["id"]
    for n in ("sk1", "sk2", "sk4"):
        m = membership(cluster, n)
        assert m["generation"] == 3 and m.get("new_members") is None, (n, m)
        assert member_ids(m) == sorted([1, 2, sk4_id]), (n, m)
    assert "generation 2: joint" in out, out
    proposer = ep.agent_status()["proposer"]
    assert proposer["membership_generation"] == 3, proposer
    assert proposer["elections"] >= 3, proposer
    ps_config = cluster.service_config("pageserver")
    assert cluster.service("sk4")["ports"]["listen"] in [int(a.split(":")[1]) for a in ps_config["safekeepers"]]

    # sk4 took the removed WAL from object storage and holds all of it now.
    assert cluster.metrics("sk4")["strata_safekeeper_segments_recovered_from_object_storage_total"] >= 1
    with ep.connect() as conn:
        end = current_lsn(conn)
    wait_until("sk4 caught up", lambda: parse_lsn(cluster.timeline_status("sk4")["flush_lsn"]) >= end, timeout=120)

    # sk1 goes: sk2 and sk4 are a majority of the new set.
    cluster.kill9("sk1", supervisor=True)
    with ep.connect() as conn:
        before_state = pgbench_state(conn)
    ep.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    ids = [r[0] for r in ep.sql("SELECT id FROM acked ORDER BY id")]
    missing = sorted(set(acknowledged) - set(ids))
    assert not missing, f"{len(missing)} acknowledged commits lost, first {missing[:10]}"
    with ep.connect() as conn:
        after = pgbench_state(conn)
    assert after.counts["pgbench_history"] == before_state.counts["pgbench_history"] + 200
    ep.stop()
    ep.start()
    assert [r[0] for r in ep.sql("SELECT id FROM acked ORDER BY id")] == ids
    with ep.connect() as conn:
        assert pgbench_state(conn) == after
    assert_pgbench_invariants(after, 2)


def test_an_interrupted_replacement_resumes_and_without_a_compute_elects_itself(cluster):
    """The command is killed (-9) once the joint configuration is installed:
    the timeline stays joint, and running the command again finishes the
    change. With no compute running nobody would be elected under the
    joint configuration, so the command elects a proposer itself (which
    commits the epoch on a majority of both sets). The live sk3 is
    stopped, the data is all there on a compute of the new set, and sk3
    cannot be replaced twice."""
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 1000) g")
    ep.stop()
    cmd = [str(cluster.strata_bin), "safekeeper", "replace", "sk3", "sk4", "--workdir", str(cluster.workdir)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL)
    seen = []
    try:
        for line in first.stdout:
            seen.append(line)
            if "joint" in line:
                first.kill()
                break
    finally:
        first.kill()
        first.wait(timeout=30)
    assert any("joint" in line for line in seen), "".join(seen)
    m = membership(cluster, "sk1")
    assert m["generation"] == 2 and m["new_members"] is not None, m

    out = cluster.run("safekeeper", "replace", "sk3", "sk4", timeout=600).stdout
    assert "resuming" in out and "electing a proposer" in out, out
    assert cluster.pid("sk3") is None, "sk3 still runs"
    for n in ("sk1", "sk2", "sk4"):
        assert membership(cluster, n)["generation"] == 3
    status = cluster.run("status").stdout
    assert status.count("membership_generation=3") == 3 and "sk3" not in status, status
    ep.start()
    assert ep.sql("SELECT count(*) FROM t") == [(1000,)]
    ep.sql("INSERT INTO t VALUES (1001)")
    assert ep.agent_status()["proposer"]["membership_generation"] == 3

    again = cluster.run("safekeeper", "replace", "sk3", "sk5", check=False)
    assert again.returncode == 2 and "no safekeeper named" in again.stderr, again
    again = cluster.run("safekeeper", "replace", "sk1", "pageserver", check=False)
    assert again.returncode == 2 and "another service" in again.stderr, again


def test_a_replacement_waits_for_a_member_briefly_away(cluster_factory):
    """Under `local-quorum` dc1's quorum needs both of its safekeepers.
    sk1's disk fails its writes (faultfs), so its timeline stops accepting
    and answers 503 until it is re-read from disk, when the replacement of
    sk3 by sk4 begins; the disk heals seconds later and sk1 heals itself.
    The change waits for it (each configuration is offered again for up
    to `INSTALL_PATIENCE`) instead of failing at the first install."""
    cluster = cluster_factory(init_args=("--sites", "2", "--placement", "local-quorum"), faultfs=("sk1",))
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE t (id int)")
    ep.sql("INSERT INTO t SELECT generate_series(1, 1000)")
    cluster.faultfs["sk1"].set_faults("write")
    # A commit makes sk1 write, and fail; it waits for sk1 (dc1's quorum).
    stalled = threading.Thread(target=lambda: ep.sql("INSERT INTO t SELECT generate_series(1001, 2000)"), daemon=True)
    stalled.start()

    def sk1_failed():
        return cluster.timeline_status("sk1").get("failure") or None
    wait_until("sk1's timeline to stop accepting", sk1_failed, timeout=60)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(
        r=cluster.run("safekeeper", "replace", "sk3", "sk4", check=False, timeout=300)))
    started = time.monotonic()
    runner.start()
    try:
        # sk4 catches up from sk2 within a second or two; the first install
        # then finds sk1's timeline failed.
        time.sleep(6)
        assert runner.is_alive(), f"the replacement ended while sk1 was away: {result['r'].stderr}"
    finally:
        cluster.faultfs["sk1"].set_faults("")
    runner.join(timeout=300)
    r = result["r"]
    assert r.returncode == 0, r.stderr
    took = time.monotonic() - started
    assert took < 60, f"the replacement took {took:.0f} s"
    stalled.join(timeout=60)
    assert not stalled.is_alive(), "the commit that waited for sk1 did not finish"
    sets = {sk: member_ids(membership(cluster, sk)) for sk in ("sk1", "sk2", "sk4")}
    assert len({tuple(x) for x in sets.values()}) == 1 and sets["sk1"][:2] == [1, 2] and 3 not in sets["sk1"], sets
    ep.sql("INSERT INTO t SELECT generate_series(2001, 3000)")
    assert ep.sql("SELECT count(*) FROM t") == [(3000,)]
