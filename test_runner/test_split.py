"""Online splits (docs/sharding.md, "Split, step by step"): `strata tenant
split NAME --shards N` while writers and pgbench run. The controllers
record each step; the parent's pageserver writes each child's index naming
the parent's layers (nothing is copied); the children are attached where
their parents are, catch up, and take over; the running compute switches
to them by itself.

Failure points (`STRATA_FAILPOINTS=@FILE`, `service/src/failpoint.rs`)
interrupt each step: object storage failing while the children's indexes
are written (the split rolls back, the children's objects are removed),
the controller exiting after each step it records, and the parent's
pageserver exiting between two children's indexes. Each time the split
either completes or rolls back, and no acknowledged commit is lost."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.endpoint import Endpoint
from fixtures.load import AckedWriters, PgbenchLoop
from fixtures.wait import wait_until

STRIPE = 8


def leader_state(cluster) -> dict:
    """The leading controller's state. The failure points exit controllers
    right after they record a step, so this waits for a leader to answer."""
    def ask():
        for s in cluster.cluster_toml["services"]:
            if s["kind"] == "controller" and cluster.answers(s["name"]):
                code, body = cluster.http(s["name"], "GET", "/v1/status")
                if code == 200 and body["leader"] and body.get("state"):
                    return body["state"]
        return None
    return wait_until("a leading controller", ask, timeout=60)


def split_record(cluster, tenant_id: str) -> dict | None:
    return leader_state(cluster).get("splits", {}).get(tenant_id)


def placements(cluster, tenant_id: str) -> dict[str, dict]:
    return {t: p for t, p in leader_state(cluster).get("tenants", {}).items() if t.startswith(tenant_id)}


def held(cluster, tenant_id: str) -> dict[str, set[str]]:
    """The locations of the tenant's shards each pageserver holds attached."""
    out = {}
    for s in cluster.cluster_toml["services"]:
        if s["kind"] == "pageserver" and cluster.answers(s["name"]):
            code, body = cluster.http(s["name"], "GET", "/v1/status")
            if code == 200:
                out[s["name"]] = {loc["tenant_id"] for loc in body["locations"]
                                  if loc["tenant_id"].startswith(tenant_id) and loc["mode"] == "attached"}
    return out


def object_prefixes(cluster, tenant_id: str) -> set[str]:
    """The shards of the tenant that object storage holds objects of."""
    store = Path(cluster.service_config("pageserver")["remote_storage"]["path"]) / "tenants"
    return {d.name for d in store.iterdir() if d.name.startswith(tenant_id) and any(d.rglob("*.json*"))}


def contents(ep: Endpoint) -> list:
    return ep.sql(
        "SELECT (SELECT md5(string_agg(a::text, ',' ORDER BY aid)) FROM pgbench_accounts a),"
        " (SELECT md5(string_agg(t::text, ',' ORDER BY tid)) FROM pgbench_tellers t),"
        " (SELECT count(*) FROM pgbench_history), (SELECT count(*) FROM acked)")[0]


@pytest.fixture
def failpoints(tmp_path, monkeypatch):
    """The file every service of the clusters started from here reads its
    failure points from (empty: none)."""
    path = tmp_path / "failpoints"
    path.write_text("")
    monkeypatch.setenv("STRATA_FAILPOINTS", f"@{path}")
    return path


def test_splits_under_load_complete_or_roll_back_at_every_step(cluster_factory, failpoints):
    cluster = cluster_factory(init_args=("--pageservers", "2"))
    cluster.run("tenant", "create", "sp", timeout=300)
    tenant_id = cluster.tenant("sp")["tenant_id"]
    ep = Endpoint(cluster, "e1")
    ep.start("--tenant", "sp")
    ep.run(["pgbench", "-i", "-s", "1", "-q"], timeout=300)
    ep.sql("CREATE EXTENSION amcheck")
    writers = AckedWriters(ep).start()
    bench = PgbenchLoop(ep).start()
    wait_until("commits", lambda: writers.count() >= 30 or None, timeout=60)

    # 1. Object storage fails while the children's indexes are written: the
    # split rolls back, the children's objects go, the tenant serves on.
    failpoints.write_text("split-between-child-indexes=error")
    r = cluster.run("tenant", "split", "sp", "--shards", "2", "--stripe-blocks", str(STRIPE), check=False,
                    timeout=600)
    assert r.returncode != 0 and "rolled back" in r.stderr and "failure point" in r.stderr, r.stderr
    rolled = wait_until("the rolled back split swept", lambda: (s := split_record(cluster, tenant_id))
                        and s["phase"] == "rolled_back" and s.get("swept") and s, timeout=60)
    assert object_prefixes(cluster, tenant_id) == {tenant_id}, object_prefixes(cluster, tenant_id)
    assert list(placements(cluster, tenant_id)) == [tenant_id]
    assert cluster.tenant("sp").get("shards") is None
    t = time.monotonic()
    wait_until("commits after the rollback", lambda: len(writers.acked_between(t, time.monotonic())) >= 20 or None,
               timeout=60)

    # 2. The controller exits right after each step it records (prepared,
    # copied, done); restarted by its supervisor, it carries the split on.
    failpoints.write_text("controller-split-prepared=exit,controller-split-copied=exit,controller-split-done=exit")
    out = cluster.run("tenant", "split", "sp", "--shards", "2", "--stripe-blocks", str(STRIPE), timeout=600).stdout
    assert f"tenant sp: 1 shard -> 2 shards of {STRIPE} blocks" in out, out
    controllers = [s["name"] for s in cluster.cluster_toml["services"] if s["kind"] == "controller"]
    restarts = sum(cluster.service(name)["restarts"] for name in controllers)
    assert restarts >= 3, [cluster.service(name) for name in controllers]
    done = split_record(cluster, tenant_id)
    assert done["phase"] == "done" and done["from"]["count"] == 1 and done["to"]["count"] == 2, done
    # The children's generations are above every object the rolled back attempt left.
    assert min(done["generations"]) > max(rolled["generations"]), (rolled, done)
    assert cluster.tenant("sp")["shards"] == {"count": 2, "stripe_blocks": STRIPE}
    assert sorted(placements(cluster, tenant_id)) == [f"{tenant_id}-0of2", f"{tenant_id}-1of2"]
    # The parent is detached wherever it was; the children hold the tenant.
    wait_until("the parent detached", lambda: all(tenant_id not in h for h in held(cluster, tenant_id).values())
               or None, timeout=60)
    # The children's indexes name the parent's layers: the parent's objects stay.
    assert tenant_id in object_prefixes(cluster, tenant_id)
    # The running compute switched to the children and goes on committing.
    assert "strata_compute_shard_layout_switches_total 1" in ep.agent_metrics(), ep.agent_metrics()
    t = time.monotonic()
    wait_until("commits after the split", lambda: len(writers.acked_between(t, time.monotonic())) >= 20 or None,
               timeout=120)

    # 3. 2 -> 4: the parents' pageserver exits between two children's
    # indexes; restarted, it is asked again and the split completes.
    failpoints.write_text("split-between-child-indexes=exit")
    victim = placements(cluster, tenant_id)[f"{tenant_id}-0of2"]["attached"]
    old_pid = cluster.pid(victim)
    proc = subprocess.Popen([str(cluster.strata_bin), "tenant", "split", "sp", "--shards", "4", "--workdir",
                             str(cluster.workdir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    restarted = cluster.wait_restarted(victim, old_pid, timeout=120)
    failpoints.write_text("")
    assert "exiting on purpose" in (cluster.workdir / victim / f"{victim}.log").read_text(), restarted
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "2 shards -> 4 shards" in out, out
    assert split_record(cluster, tenant_id)["phase"] == "done"
    assert sorted(placements(cluster, tenant_id)) == [f"{tenant_id}-{n}of4" for n in range(4)]
    # Every earlier layout's objects stay: the children's indexes name their layers.
    assert {tenant_id, f"{tenant_id}-0of2", f"{tenant_id}-1of2"} <= object_prefixes(cluster, tenant_id)
    assert not split_record(cluster, tenant_id).get("swept")
    t = time.monotonic()
    wait_until("commits after the second split",
               lambda: len(writers.acked_between(t, time.monotonic())) >= 20 or None, timeout=120)

    wait_until("the compute on four shards",
               lambda: "strata_compute_shards 4" in ep.agent_metrics() or None, timeout=60)
    bench.stop()
    writers.stop()
    # What the compute that switched twice reads equals what a new compute
    # reads (every page from the four shards); nothing acknowledged is lost.
    before = contents(ep)
    got = {r[0] for r in ep.sql(f"SELECT id FROM {writers.table}")}
    assert not writers.acked_ids() - got, f"{len(writers.acked_ids() - got)} acknowledged commits lost"

    # Past the sweep's settling time: the children's compaction may have
    # rewritten every layer of their parents they named (the parents' L0
    # deltas), and then the earlier layouts' objects are swept; either way
    # a compute started now reads every page from the shards' indexes.
    time.sleep(max(0.0, 25 - (time.monotonic() - t)))
    earlier = {tenant_id, f"{tenant_id}-0of2", f"{tenant_id}-1of2"}
    if split_record(cluster, tenant_id).get("swept"):
        assert not earlier & object_prefixes(cluster, tenant_id)
    else:
        assert earlier <= object_prefixes(cluster, tenant_id)
    ep.restart()
    assert contents(ep) == before
    got = {r[0] for r in ep.sql(f"SELECT id FROM {writers.table}")}
    assert not writers.acked_ids() - got, f"{len(writers.acked_ids() - got)} acknowledged commits lost after a restart"
    ep.run(["pg_amcheck", "--heapallindexed", "--install-missing", "-d", "postgres"], timeout=300)


def test_the_size_policy_splits_a_growing_tenant_by_itself(cluster_factory):
    """`[split_policy]` of the controllers: a tenant one of whose shards
    holds more than `shard_bytes` of its own layers is split by the leader
    alone; the running compute follows, and the next start of an endpoint
    writes the new layout into the cluster file."""
    cluster = cluster_factory(init_args=("--pageservers", "2"), start=False)
    limit = 20 << 20
    for s in cluster.cluster_toml["services"]:
        if s["kind"] == "controller":
            path = cluster.service_config_path(s["name"])
            text, n = re.subn(r"\n\[split_policy\]\n(?:(?!\[).*\n?)*",
                              f"\n[split_policy]\nshard_bytes = {limit}\nfirst_shards = 2\nmax_shards = 2\n"
                              "stripe_blocks = 8\n", path.read_text(), count=1)
            assert n == 1, text
            path.write_text(text)
    # A short PITR window: garbage collection drops what the children's own images replace.
    for name in ("pageserver", "pageserver2"):
        cluster.configure(name, {"pitr_interval": 1.0, "gc_horizon": 0, "gc_period": 3600.0})
    cluster.start()
    cluster.run("tenant", "create", "big", timeout=300)
    tenant_id = cluster.tenant("big")["tenant_id"]
    ep = Endpoint(cluster, "e1")
    ep.start("--tenant", "big")
    writers = AckedWriters(ep).start()
    ep.run(["pgbench", "-i", "-s", "6", "-q"], timeout=300)
    cluster.run("timeline", "checkpoint", "--tenant", "big", timeout=300)
    done = wait_until("the size policy's split", lambda: (s := split_record(cluster, tenant_id))
                      and s["phase"] == "done" and s, timeout=180)
    assert (done["from"]["count"], done["to"]["count"], done["to"]["stripe_blocks"]) == (1, 2, 8), done
    # Nothing split again: the children hold next to nothing of their own yet, and 2 is the most.
    assert split_record(cluster, tenant_id)["version"] == done["version"]
    wait_until("the compute on two shards", lambda: "strata_compute_shards 2" in ep.agent_metrics() or None,
               timeout=60)
    t = time.monotonic()
    wait_until("commits after the split", lambda: len(writers.acked_between(t, time.monotonic())) >= 20 or None,
               timeout=120)
    writers.stop()
    before = ep.sql("SELECT sum(abalance), count(*) FROM pgbench_accounts")[0]
    # The cluster file learns the layout at the next start of an endpoint.
    assert cluster.tenant("big").get("shards") is None
    ep.stop()
    ep.start()
    assert cluster.tenant("big")["shards"] == {"count": 2, "stripe_blocks": 8}
    assert ep.sql("SELECT sum(abalance), count(*) FROM pgbench_accounts")[0] == before
    got = {r[0] for r in ep.sql(f"SELECT id FROM {writers.table}")}
    assert not writers.acked_ids() - got, f"{len(writers.acked_ids() - got)} acknowledged commits lost"

    # The children's own images replace their parent's layers, garbage
    # collection drops those from their indexes, and then the leader
    # removes the parent's objects (the sweep).
    assert tenant_id in object_prefixes(cluster, tenant_id)
    assert not split_record(cluster, tenant_id).get("swept")
    timeline = next(b["timeline_id"] for b in cluster.tenant("big")["branches"] if b["name"] == "main")
    where = placements(cluster, tenant_id)

    def checkpoint(child: str, query: str) -> dict:
        code, body = cluster.http(where[child]["attached"], "POST",
                                  f"/v1/tenant/{child}/timeline/{timeline}/checkpoint?{query}", timeout=180)
        assert code == 200, body
        return body

    children = [f"{tenant_id}-{n}of2" for n in range(2)]
    for child in children:
        assert checkpoint(child, "compact=true")["compaction"]["images_written"] > 0
    time.sleep(2)
    ep.sql("CREATE TABLE after_images AS SELECT 1 AS x")
    time.sleep(1.5)
    for child in children:
        checkpoint(child, "gc=true&upload_timeout=60")
    wait_until("the parent's objects swept", lambda: split_record(cluster, tenant_id).get("swept")
               and tenant_id not in object_prefixes(cluster, tenant_id) or None, timeout=120)
    # Every page is still there, read from the children's own layers.
    ep.restart()
    assert ep.sql("SELECT sum(abalance), count(*) FROM pgbench_accounts")[0] == before
    ep.run(["pg_amcheck", "--heapallindexed", "--install-missing", "-d", "postgres"], timeout=300)
