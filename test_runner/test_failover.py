"""Pageservers that fail over (docs/storage-controller.md): two pageservers
and a storage controller beside each. The tenant is attached to one, kept
warm on the other; when the attached one dies the controller attaches the
secondary under a new generation and the computes follow, without
restarting PostgreSQL and without a failed transaction.

Every test starts the compute again after loading data, so that its
relation files are lazy: pgbench's reads keep going to the pageserver
across the failover."""

from __future__ import annotations

import re
import threading
import time

from fixtures import sk_protocol as skp
from fixtures.endpoint import Endpoint, start_endpoint
from fixtures.load import AckedWriters
from fixtures.minio import minio  # noqa: F401 - a fixture
from fixtures.processes import kill_and_wait
from fixtures.wait import wait_until

SCALE = 5
# pgbench transactions committed before a fault is injected: the load runs.
COMMITS_BEFORE_FAULT = 100
# Seconds between the heatmaps an attached pageserver publishes and its
# secondary reads (the default is 5).
HEATMAP_PERIOD = 1


def placement(cluster) -> tuple[str | None, int | None, list[str]]:
    """(attached pageserver, generation, secondaries) of the tenant, as `strata status --json` shows it."""
    t = cluster.status()["timelines"][0]
    return t["attached"], t["generation"], t["secondaries"]


def locations(cluster, name: str) -> dict:
    code, body = cluster.http(name, "GET", "/v1/status")
    assert code == 200, body
    return {loc["tenant_id"]: loc for loc in body["locations"]}


def controller_leader(cluster) -> str:
    def leader():
        for s in cluster.cluster_toml["services"]:
            if s["kind"] == "controller" and cluster.answers(s["name"]):
                code, body = cluster.http(s["name"], "GET", "/v1/status")
                if code == 200 and body["leader"]:
                    return s["name"]
        return None
    return wait_until("a leading controller", leader, timeout=60)


def two_pageservers(cluster_factory, remote: dict | None = None):
    """A cluster with two pageservers (with `remote` as their object storage,
    else the local directory); an endpoint with pgbench's tables, started
    again so that its relation files are lazy; the secondary warm."""
    cluster = cluster_factory(init_args=("--pageservers", "2"), start=False)
    for name in ("pageserver", "pageserver2"):
        # The secondary learns which layers to warm within a second.
        cluster.configure(name, {"heatmap_period": HEATMAP_PERIOD})
    if remote is not None:
        cluster.set_remote_storage(remote)
    cluster.start()
    ep = start_endpoint(cluster)
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    ep.sql("CREATE EXTENSION amcheck")
    cluster.run("timeline", "checkpoint")
    attached, generation, secondaries = placement(cluster)
    assert (attached, generation, secondaries) == ("pageserver", 1, ["pageserver2"])
    tenant = cluster.tenant_id()
    wait_until("the secondary warm", lambda: locations(cluster, "pageserver2")[tenant]["local_layers"] > 0
               or None, timeout=60)
    ep.restart()
    return cluster, ep, tenant


class Pgbench:
    """One pgbench run in the background; `result()` checks it ended well,
    `wait_committing()` waits until it commits."""

    def __init__(self, ep: Endpoint, seconds: int, clients: int = 4):
        self.ep = ep
        self.history = ep.sql("SELECT count(*) FROM pgbench_history")[0][0]
        self.proc = ep.popen(["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(seconds), "-P", "1"])

    def wait_committing(self, commits: int = COMMITS_BEFORE_FAULT, timeout: float = 60) -> None:
        """Until pgbench has committed `commits` transactions (rows of
        pgbench_history) since it started: the load runs."""
        wait_until(f"pgbench to commit {commits} transactions", lambda: self.proc.poll() is None and self.ep.sql(
            "SELECT count(*) FROM pgbench_history")[0][0] >= self.history + commits, timeout, interval=0.2,
            stop_if=lambda: self.proc.poll() is not None and f"pgbench exited: {self.proc.communicate()}")

    def result(self, timeout: float = 300) -> str:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"pgbench failed:\n{out}\n{err}"
        failed = re.search(r"number of failed transactions: (\d+)", out)
        assert failed and failed.group(1) == "0", out
        return out + err


class Probe:
    """Reads one random block of pgbench_accounts every 20 ms (a fresh
    block is likely not yet fetched by the lazy compute): the longest
    read is how long reads waited for the pageserver."""

    def __init__(self, ep: Endpoint):
        self.ep = ep
        self.longest = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import random
        with self.ep.connect() as conn:
            blocks = conn.execute("SELECT pg_relation_size('pgbench_accounts') / 8192").fetchone()[0]
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    conn.execute(f"SELECT count(*) FROM pgbench_accounts WHERE ctid = '({random.randrange(blocks)},1)'")
                except Exception as e:  # noqa: BLE001 - recorded and asserted on
                    self.errors.append(str(e))
                    return
                self.longest = max(self.longest, time.monotonic() - t)
                self._stop.wait(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self.errors, self.errors
        return self.longest


def check_after(ep: Endpoint, writers: AckedWriters) -> None:
    acked = writers.acked_ids()
    rows = {r[0] for r in ep.sql("SELECT id FROM acked")}
    lost = acked - rows
    assert not lost, f"{len(lost)} acknowledged commits lost: {sorted(lost)[:10]}"
    a, b, t, h = ep.sql("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM "
                        "pgbench_branches), (SELECT sum(tbalance) FROM pgbench_tellers), "
                        "(SELECT coalesce(sum(delta), 0) FROM pgbench_history)")[0]
    assert a == b == t == h, f"pgbench invariants: {a} {b} {t} {h}"
    ep.run(["pg_amcheck", "--heapallindexed", "-d", "postgres"], timeout=600)


def test_kill9_of_the_attached_pageserver_under_pgbench(cluster_factory):
    cluster, ep, tenant = two_pageservers(cluster_factory)
    writers = AckedWriters(ep, threads=2, backoff=(0.01, 0.1)).start()
    bench = Pgbench(ep, seconds=15)
    probe = Probe(ep)
    try:
        bench.wait_committing()
        killed = time.monotonic()
        cluster.kill9("pageserver", supervisor=True)
        moved = wait_until("the tenant on pageserver2", lambda: placement(cluster)[0] == "pageserver2" or None,
                           timeout=60)
        assert moved
        detected = time.monotonic() - killed
        out = bench.result()
    finally:
        longest = probe.stop()
        writers.stop()
    print(f"\nfailover: placed on pageserver2 {detected:.2f} s after the kill; longest probe read {longest:.2f} s")
    attached, generation, secondaries = placement(cluster)
    assert (attached, generation, secondaries) == ("pageserver2", 2, ["pageserver"])
    assert "failed transactions: 0" in out
    # The compute followed the tenant (PostgreSQL was not restarted).
    st = ep.agent_status()
    assert st["pageserver"]["name"] == "pageserver2" and st["pageserver"]["switches"] >= 1, st["pageserver"]
    assert st["restarts"] == 0, st
    check_after(ep, writers)

    # The failed pageserver returns: it is demoted to a secondary, and its
    # old generation never uploads again.
    cluster.start()
    wait_until("pageserver a secondary", lambda: locations(cluster, "pageserver").get(tenant, {}).get("mode")
               == "secondary" or None, timeout=60)
    assert placement(cluster) == ("pageserver2", 2, ["pageserver"])
    ep.run(["pgbench", "-n", "-c", "2", "-T", "3"], timeout=120)
    check_after(ep, writers)
    check_fenced(cluster, tenant, stale=1, current=2)

    # The agent killed now: its configuration still names the first
    # pageserver, which answers that it has no such timeline attached (it
    # is a secondary). The new agent asks again where the controller says
    # the tenant is, instead of failing its start over and over.
    kill_and_wait(ep.agent_pid())
    wait_until("the compute back after its agent was killed", lambda: ep.sql("SELECT 1") == [(1,)], timeout=90)
    assert ep.agent_status()["pageserver"]["name"] == "pageserver2"
    check_after(ep, writers)


def check_fenced(cluster, tenant: str, stale: int, current: int) -> None:
    """Every safekeeper has seen generation `current` stream the timeline
    and refuses a stream request of generation `stale`; a consumer that is
    not a pageserver (generation 0) is still served."""
    timeline = cluster.status()["timelines"][0]["timeline_id"]
    token = cluster.token_file("service").read_text().strip()
    for sk in cluster.safekeeper_names():
        code, st = cluster.http(sk, "GET", f"/v1/tenant/{tenant}/timeline/{timeline}")
        assert code == 200, st
        assert st["pageserver_generation"] == current, st
        hi, lo = st["flush_lsn"].split("/")
        flush = (int(hi, 16) << 32) | int(lo, 16)
        svc = next(s for s in cluster.cluster_toml["services"] if s["name"] == sk)
        address = f"127.0.0.1:{svc['ports']['listen']}"
        answer = skp.exchange(address, skp.start_streaming_frame(tenant, timeline, flush, token, generation=stale))
        assert answer.code == skp.ERR_STALE_GENERATION, (sk, answer)
        assert f"generation {current}" in answer.message, answer
        answer = skp.exchange(address, skp.start_streaming_frame(tenant, timeline, flush, token, generation=0))
        assert answer.tag == skp.TAG_STREAM_START, (sk, answer)


def test_the_leading_controller_killed_during_a_failover(cluster_factory):
    """The attached pageserver and the leading controller die at once:
    the other controller takes the lease over and finishes the failover,
    within the compute's retry window."""
    cluster, ep, tenant = two_pageservers(cluster_factory)
    leader = controller_leader(cluster)
    writers = AckedWriters(ep, threads=2, backoff=(0.01, 0.1)).start()
    bench = Pgbench(ep, seconds=20)
    try:
        bench.wait_committing()
        cluster.kill9("pageserver", supervisor=True)
        cluster.kill9(leader, supervisor=True)
        wait_until("the tenant on pageserver2", lambda: placement(cluster)[0] == "pageserver2" or None, timeout=60)
        bench.result()
    finally:
        writers.stop()
    other = controller_leader(cluster)
    assert other != leader
    assert placement(cluster)[:2] == ("pageserver2", 2)
    check_after(ep, writers)


def test_object_storage_down_during_a_failover(minio, cluster_factory):
    """MinIO as the object store, killed, then the attached pageserver: the
    controller cannot write its state, so nothing moves; commits go on
    through the safekeepers. When MinIO returns the failover completes and
    no acknowledged commit is lost. (MinIO outlives the cluster at
    teardown: the `minio` fixture comes first.)"""
    minio.start()
    cluster, ep, tenant = two_pageservers(cluster_factory, remote=minio.remote_storage("strata"))
    writers = AckedWriters(ep, threads=2, backoff=(0.05, 0.5)).start()
    try:
        wait_until("the writers to commit", lambda: writers.count() > 20, timeout=60, interval=0.05)
        minio.kill()
        cluster.kill9("pageserver", supervisor=True)
        acked_at_kill = len(writers.acked_ids())
        # Well past the offline period (2 s) and the lease (6 s): no
        # controller can write the new placement, so none is made.
        time.sleep(10)
        assert placement(cluster)[:2] == ("pageserver", 1)
        acked_while_down = len(writers.acked_ids()) - acked_at_kill
        # Commits need no object storage and no pageserver: the pages
        # they touch are in the compute.
        assert acked_while_down > 0
        minio.start()
        wait_until("the tenant on pageserver2", lambda: placement(cluster)[0] == "pageserver2" or None,
                   timeout=120)
        wait_until("pageserver2 attached", lambda: locations(cluster, "pageserver2")[tenant]["mode"]
                   == "attached" or None, timeout=60)
        # Commits after the failover, through the new attachment.
        acked_after = len(writers.acked_ids())
        wait_until("commits after the failover", lambda: len(writers.acked_ids()) > acked_after + 20 or None,
                   timeout=120)
    finally:
        writers.stop()
    print(f"\nobject storage down: {acked_while_down} commits acknowledged while it was down")
    assert placement(cluster) == ("pageserver2", 2, ["pageserver"])
    ep.run(["pgbench", "-n", "-c", "2", "-T", "3"], timeout=120)
    check_after(ep, writers)
    # The failed pageserver returns as a secondary; the safekeepers fence it.
    cluster.start()
    wait_until("pageserver a secondary", lambda: locations(cluster, "pageserver").get(tenant, {}).get("mode")
               == "secondary" or None, timeout=60)
    check_fenced(cluster, tenant, stale=1, current=2)


def test_drain_under_load_and_fill(cluster_factory):
    cluster, ep, tenant = two_pageservers(cluster_factory)
    writers = AckedWriters(ep, threads=2, backoff=(0.01, 0.1)).start()
    bench = Pgbench(ep, seconds=15)
    try:
        bench.wait_committing()
        out = cluster.run("pageserver", "drain", "pageserver").stdout
        assert "draining" in out, out
        wait_until("the tenant moved to pageserver2", lambda: placement(cluster)[0] == "pageserver2" or None,
                   timeout=60)
        bench.result()
    finally:
        writers.stop()
    # A live move: a new generation at the target, the origin its secondary.
    assert placement(cluster) == ("pageserver2", 2, ["pageserver"])
    wait_until("pageserver a secondary", lambda: locations(cluster, "pageserver")[tenant]["mode"] == "secondary"
               or None, timeout=60)
    check_after(ep, writers)
    check_fenced(cluster, tenant, stale=1, current=2)
    # The leader's state (the controllers start together: either may lead).
    leader = controller_leader(cluster)
    code, body = cluster.http(leader, "GET", "/v1/status")
    assert body["state"]["pageservers"] == {"pageserver": "draining"}, body["state"]
    cluster.run("pageserver", "fill", "pageserver")
    code, body = cluster.http(leader, "GET", "/v1/status")
    assert body["state"]["pageservers"] == {}, body["state"]
    # An unknown pageserver is refused.
    r = cluster.run("pageserver", "drain", "nope", check=False)
    assert r.returncode != 0 and "no pageserver named" in r.stderr, r.stderr


def test_a_branch_and_its_children_fail_over_together(cluster_factory):
    cluster, ep, tenant = two_pageservers(cluster_factory)
    cluster.run("branch", "create", "child")
    child = Endpoint(cluster, "c1", "child")
    child.start()
    child.run(["pgbench", "-n", "-c", "1", "-T", "2"], timeout=120)
    child.restart()
    benches = [Pgbench(ep, seconds=15, clients=2), Pgbench(child, seconds=15, clients=2)]
    for b in benches:
        b.wait_committing()
    cluster.kill9("pageserver", supervisor=True)
    wait_until("the tenant on pageserver2", lambda: placement(cluster)[0] == "pageserver2" or None, timeout=60)
    for b in benches:
        b.result()
    branches = {t["branch"]: t for t in cluster.status()["timelines"]}
    assert {b: (t["attached"], t["generation"]) for b, t in branches.items()} == {
        "main": ("pageserver2", 2), "child": ("pageserver2", 2)}
    for t in branches.values():
        assert t["pageserver"] and t["pageserver"]["state"] == "active", t
    assert child.sql("SELECT count(*) FROM pgbench_branches")[0][0] == SCALE
