"""Histories under random faults (`docs/consistency.md`, "Under faults"):
a cluster with two pageservers, a writer and a replica, the disks of a
safekeeper and a pageserver on faultfs, MinIO as object storage behind a
link proxy, the list-append, bank and register workloads, and faults
from a fixed seed, several at a time (`fixtures.chaos`), with a second
tenant's writer and histories under the same faults. Then the same
across two sites, the replica in the other one, with the link's faults
too (partitions both ways and one way, a slow and a lossy link,
connections reset), pageservers drained to the other site, a safekeeper
replaced and the replica promoted (the workloads follow the writer),
under either WAL placement; and a whole site lost and promoted, under
either placement (under `local-quorum` the loss must be what the
rejoin reports).
And across seven hosts made of network namespaces in two sites, with the
faults of machines and networks: hosts powered off and cut off, two
hosts partitioned from each other, both ways or one way (nftables), a
host's wall clock stepped (libfaketime), endpoints moved between hosts,
every client through the proxy. Nothing forbidden at the run's level
may show, no acknowledged append may be lost, and every bank read keeps
the total. `bench/chaos.py` runs the same for an hour over many seeds."""

from __future__ import annotations

import re
import time

import pytest

from fixtures import netns
from fixtures.chaos import (CHAOS_HOSTS, CLOCK_HOSTS, DISK_KINDS, HOST_KINDS, INSTANT, KINDS, LINK_KINDS,
                            SITE_KINDS, STOCK_KINDS, STORE_KINDS, SiteFailover, Store, host_schedule, run_chaos,
                            run_host_chaos, run_workloads, schedule, stock_schedule)
from fixtures.consistency import OK, Op
from fixtures.endpoint import Endpoint, start_endpoint
from fixtures.hosted import hosted_cluster
from fixtures.pg import temp_root
from fixtures.wait import wait_until

SECONDS = 45
# The services whose disks fail now and then (fsync with EIO, writes with ENOSPC).
DISKS = ("sk1", "pageserver")


def test_the_schedule_is_a_function_of_the_seed():
    services, endpoints = ["sk1", "sk2", "sk3", "pageserver", "pageserver2", "controller"], ["ep", "r1"]
    disks = ["pageserver", "sk1"]
    pageservers, safekeepers = ["pageserver", "pageserver2"], ["sk2", "sk3"]
    a = schedule(7, 600, services, endpoints, disks, store=True, pageservers=pageservers, safekeepers=safekeepers)
    assert a == schedule(7, 600, services, endpoints, disks, store=True, pageservers=pageservers,
                         safekeepers=safekeepers), "the same seed gives the same faults"
    assert a != schedule(8, 600, services, endpoints, disks, store=True, pageservers=pageservers,
                         safekeepers=safekeepers)
    assert {f.kind for f in a} == set(KINDS), "600 s of faults use every kind"
    assert {f.target for f in a if f.kind in DISK_KINDS} == set(disks)
    assert {f.target for f in a if f.kind in STORE_KINDS} == {"store"}
    assert {f.target for f in a if f.kind == "one-way"} == {"dc1>dc2", "dc2>dc1"}
    assert {f.target for f in a if f.kind == "migrate"} == set(pageservers)
    assert {f.target for f in a if f.kind == "replace-safekeeper"} <= set(safekeepers)
    for f in a:
        # A replacement runs alone; a promotion with no other fault on an endpoint.
        meanwhile = [g for g in a if g is not f and (g.at <= f.at < g.at + g.duration or f.at <= g.at < f.at + f.duration)]
        if f.kind == "replace-safekeeper":
            assert not meanwhile, (f, meanwhile)
        if f.kind == "promote":
            assert not {g.target for g in meanwhile if g.kind not in LINK_KINDS} & set(endpoints), (f, meanwhile)
    plain = {f.kind for f in schedule(7, 600, services, endpoints)}
    assert not plain & {*DISK_KINDS, *STORE_KINDS, *SITE_KINDS}, \
        "no disk, storage or site faults without faultfs, a store or sites"
    for f in a:
        assert f.at + f.duration <= 600
        assert (f.duration == 0) == (f.kind in INSTANT)
        during = [g for g in a if g.at <= f.at < g.at + g.duration]
        assert len(during) <= 2, f"more than two faults in force at {f.at}: {during}"
        assert sum(g.target == f.target for g in during) <= 1, f"two faults on {f.target} at {f.at}"
        assert sum(g.kind in LINK_KINDS for g in during) <= 1, f"two faults of the link at {f.at}: {during}"
    stock = stock_schedule(7, 600)
    assert stock == stock_schedule(7, 600) and stock != stock_schedule(8, 600)
    assert {f.kind for f in stock} == set(STOCK_KINDS) and {f.target for f in stock} == {"primary", "standby"}
    assert all(a.at + a.duration < b.at for a, b in zip(stock, stock[1:])), "stock's faults come one at a time"


def test_the_schedule_of_hosts_is_a_function_of_the_seed():
    hosts = ["sk-a", "sk-b", "sk-c", "ps1", "ps2", "cp1", "cp2"]
    movable = ["ep", "r1"]
    a = host_schedule(7, 600, hosts, store=True, movable=movable)
    assert a == host_schedule(7, 600, hosts, store=True, movable=movable)
    assert a != host_schedule(8, 600, hosts, store=True, movable=movable)
    assert {f.kind for f in a} == {*HOST_KINDS, *STORE_KINDS}
    assert not {f.kind for f in host_schedule(7, 600, hosts)} & {*STORE_KINDS, "move"}
    assert {f.target for f in a if f.kind == "move"} == set(movable)
    net = ("partition-hosts", "one-way-hosts")
    for f in a:
        assert f.at + f.duration <= 600 and f.duration > 0
        during = [g for g in a if g.at <= f.at < g.at + g.duration]
        if f.kind == "move":
            # A move begins alone, and nothing begins while it lasts.
            assert during == [f] and not [g for g in a if f.at < g.at < f.at + f.duration], f
            continue
        names = f.target.split("@")[0].replace("|", " ").replace(">", " ").split()
        assert f.kind in STORE_KINDS or (set(names) <= set(hosts) and len(set(names)) == len(names)), f
        assert len(during) <= 2, during
        assert sum(g.kind in net for g in during) <= 1, f"two partitions at {f.at}: {during}"
        host = f.target.split("@")[0]
        assert sum(g.target.split("@")[0] == host for g in during if g.kind not in net) <= 1, during
        if f.kind == "clock-step":
            assert 30 <= abs(int(f.target.split("@")[1])) <= 3600, f


@pytest.fixture
def store(strata_bin, tmp_path):
    """MinIO behind a link proxy; asked for before the cluster, so that it
    closes after the cluster stopped."""
    s = Store(strata_bin, tmp_path / "store")
    yield s
    s.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_histories_hold_under_random_faults(store, cluster_factory, tmp_path, seed):
    cluster = cluster_factory(init_args=("--pageservers", "2"), faultfs=DISKS, start=False)
    cluster.set_remote_storage(store.remote_storage("chaos"))
    cluster.start()
    writer = start_endpoint(cluster)
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep")
    # A second tenant, its own writer and histories, under the same faults
    # of the services they share.
    cluster.run("tenant", "create", "t2", timeout=180)
    other = Endpoint(cluster, "t2w")
    other.start("--tenant", "t2")
    outcome = run_chaos(cluster, writer, replica, seed=seed, seconds=SECONDS, out_dir=tmp_path / "chaos",
                        store=store, others=[other])
    check(outcome, seed)
    assert outcome.ops["list-append (t2w)"].get("ok", 0) > 100, outcome.ops
    assert outcome.ops["bank (t2w)"].get("ok", 0) > 100, outcome.ops


@pytest.mark.parametrize("seed,placement", [(16, "stretched"), (7, "local-quorum")])
def test_histories_hold_under_random_faults_across_two_sites(store, cluster_factory, tmp_path, seed, placement):
    cluster = cluster_factory(init_args=("--sites", "2", "--site-latency-ms", "4", "--placement", placement),
                              faultfs=DISKS, start=False)
    cluster.set_remote_storage(store.remote_storage("chaos"))
    cluster.start()
    writer = start_endpoint(cluster)
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep", "--site", "dc2")
    outcome = run_chaos(cluster, writer, replica, seed=seed, seconds=SECONDS, out_dir=tmp_path / "chaos",
                        store=store)
    check(outcome, seed)
    made = {f["kind"] for f in outcome.faults if f["what"] == "begin"}
    assert made & set(SITE_KINDS), f"no fault of the sites was made: {made}"


def site_failover(cluster_factory, tmp_path, placement: str):
    """A writer in dc1 and a replica in dc2 under `placement`, the workloads
    of seed 2 with `SiteFailover` (dc1 lost at 12 s, back at 30 s); the
    outcome and the nemesis (its reports), once no fault failed."""
    cluster = cluster_factory(init_args=("--sites", "2", "--site-latency-ms", "4", "--placement", placement))
    writer = start_endpoint(cluster)
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "ep", "--site", "dc2")
    nemesis = SiteFailover(cluster, {"ep": writer, "r1": replica}, lose_at=12, back_at=30)
    outcome = run_workloads(writer, replica, "r1", nemesis, seed=2, seconds=SECONDS, out_dir=tmp_path / "chaos")
    print(f"\n{outcome.level}: ops {outcome.ops}\n  " + "\n  ".join(nemesis.reports))
    assert not outcome.nemesis_errors, outcome.nemesis_errors
    return outcome, nemesis


def test_histories_hold_across_a_site_failover_and_rejoin(cluster_factory, tmp_path):
    """Under `stretched`, the workloads run on a writer in dc1 and a replica
    in dc2; at 12 s dc1 is lost whole and `strata site promote dc2` moves
    the writer there (the workloads follow it, and a new replica of it in
    dc2); at 30 s dc1 is back and rejoins. Nothing acknowledged is lost,
    and nothing forbidden shows across the move."""
    outcome, nemesis = site_failover(cluster_factory, tmp_path, "stretched")
    assert [f["what"] for f in outcome.faults] == ["begin", "end"], outcome.faults
    assert any("nothing lost" in r for r in nemesis.reports), nemesis.reports
    assert outcome.forbidden() == {}, outcome.examples
    # The writer's clients committed on both sides of the move.
    assert outcome.ops["list-append"].get("ok", 0) > 100, outcome.ops


def test_a_site_failover_under_local_quorum_loses_only_what_it_reports(cluster_factory, tmp_path):
    """The same failover under `local-quorum`: dc1 commits alone for the
    second between the cut and its loss, so dc2 never receives that tail.
    The rejoin's report counts the transactions dc1 acknowledged in it.
    Against the histories: every acknowledged append missing from the end
    state is of a transaction that completed before the promotion, there
    are no more such transactions than the report counts, nothing
    acknowledged after it is missing, and every bank read kept its total
    (a transfer is one transaction: any prefix of the WAL keeps it)."""
    outcome, nemesis = site_failover(cluster_factory, tmp_path, "local-quorum")
    promoted = nemesis._t0 + next(f["t"] for f in outcome.faults if f["what"] == "begin")
    counts = [re.search(r"(\d+) transactions acknowledged by dc1 and never received", r) for r in nemesis.reports]
    reported = [int(m[1]) for m in counts if m]
    assert reported and reported[-1] > 0, f"no lost tail was reported: {nemesis.reports}"

    ops = [Op.from_json(line) for line in (tmp_path / "chaos" / "lists-2.jsonl").read_text().splitlines()]
    final = {k: set(v) for op in ops if op.process == 999 for (_, k, v) in op.mops}
    lost = [op for op in ops if op.status == OK and op.process != 999 and
            any(m[0] == "append" and m[2] not in final.get(m[1], ()) for m in op.mops)]
    print(f"  lost: {len(lost)} list-append transactions of the {reported[-1]} reported; "
          f"anomalies: {outcome.anomalies}")
    assert lost, "the histories show no loss although the report does"
    late = [op for op in lost if op.complete > promoted]
    assert not late, f"acknowledged after the promotion and lost: {late[:3]}"
    assert len(lost) <= reported[-1], (len(lost), nemesis.reports)
    assert outcome.anomalies["bank"] == {}, outcome.examples["bank"]


def test_histories_hold_under_random_faults_across_hosts(strata_bin, pg_bin_dir, tmp_path, tmp_path_factory):
    reason = netns.available()
    if reason:
        pytest.skip(reason)
    seed, stores = 34, []

    def remote(gateway: str) -> dict:
        stores.append(Store(strata_bin, tmp_path / "store", host=gateway))
        return stores[-1].remote_storage("chaos")

    try:
        with hosted_cluster(strata_bin, pg_bin_dir, tmp_path, temp_root(tmp_path_factory), CHAOS_HOSTS,
                            remote=remote, own_clocks=CLOCK_HOSTS) as hosted:
            writer = hosted.endpoint("ep", "cp1")
            replica = hosted.endpoint("r1", "cp2", "--replica-of", "ep")

            # A clock step reaches the processes of its host alone.
            def offset(ep) -> float:
                return float(ep.sql("SELECT extract(epoch FROM clock_timestamp())")[0][0]) - time.time()
            hosted.step_clock("cp1", 3600)
            wait_until("cp1's clock an hour ahead", lambda: abs(offset(writer) - 3600) < 10 or None, timeout=30)
            assert abs(offset(replica)) < 10, "cp2's clock moved with cp1's"
            hosted.step_clock("cp1", 0)
            wait_until("cp1's clock back", lambda: abs(offset(writer)) < 10 or None, timeout=30)
            hosted.cluster.run("tenant", "create", "t2", timeout=180)
            other = hosted.endpoint("t2w", "cp2", "--tenant", "t2")
            outcome = run_host_chaos(hosted, writer, replica, {"ep": "cp1", "r1": "cp2"}, seed, SECONDS,
                                     tmp_path / "chaos", store=stores[0], others=[other])
            check(outcome, seed)
            assert outcome.ops["bank (t2w)"].get("ok", 0) > 100, outcome.ops
            made = {f["kind"] for f in outcome.faults if f["what"] == "begin"}
            assert made >= {"power-off", "host-cut", "partition-hosts", "clock-step", "move"}, made
    finally:
        for s in stores:
            s.close()


def check(outcome, seed: int) -> None:
    print(f"\nseed {seed}, {outcome.level}: {len(outcome.faults)} fault events, ops {outcome.ops}")
    for f in outcome.faults:
        print(f"  {f}")
    print(f"  examples: {outcome.examples}")
    assert not outcome.nemesis_errors, outcome.nemesis_errors
    began = [f for f in outcome.faults if f["what"] == "begin"]
    assert len(began) >= SECONDS / 8, f"only {len(began)} faults were made"
    assert outcome.forbidden() == {}, outcome.examples
    assert outcome.ops["list-append"].get("ok", 0) > 100, outcome.ops
    assert outcome.ops["bank"].get("ok on r1", 0) > 10, outcome.ops
