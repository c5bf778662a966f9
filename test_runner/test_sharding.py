"""Sharded tenants (docs/sharding.md): `strata tenant create --shards N`
spreads a tenant's pages over pageservers in stripes of blocks; the
storage controllers place each shard on a pageserver of its own, and a
lazy compute reads each page from the shard that holds it.

Stripes of 8 blocks (the smallest) make every table of a few hundred kB
span both shards, so that scans, index lookups and the reads after a
restart all cross shards."""

from __future__ import annotations

import json
import os
import subprocess
import time

from fixtures.endpoint import Endpoint
from fixtures.load import AckedWriters
from fixtures.strata import parse_lsn
from fixtures.wait import wait_until

STRIPE = 8
SCALE = 2
GETPAGE = "strata_pageserver_getpage_requests_total"
ERRORS = "strata_pageserver_request_errors_total"
DECODED = "strata_pageserver_decoded_batches_total"
STREAM_BYTES = "strata_pageserver_wal_stream_bytes_total"
WAL_BYTES = "strata_pageserver_wal_bytes_ingested_total"


def contents(ep: Endpoint) -> list:
    """A digest of every table the tests write: equal digests, equal rows."""
    return ep.sql(
        "SELECT (SELECT md5(string_agg(a::text, ',' ORDER BY aid)) FROM pgbench_accounts a),"
        " (SELECT md5(string_agg(b::text, ',' ORDER BY bid)) FROM pgbench_branches b),"
        " (SELECT md5(string_agg(t::text, ',' ORDER BY tid)) FROM pgbench_tellers t),"
        " (SELECT count(*) FROM pgbench_history)")[0]


def pagebench(cluster, *args: str) -> subprocess.CompletedProcess:
    """`strata pagebench ARGS` (a tool of no cluster directory)."""
    return subprocess.run([str(cluster.strata_bin), "pagebench", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def controller_placements(cluster, tenant_id: str) -> dict[str, dict]:
    """The controllers' placement of each shard of the tenant, by shard id."""
    for s in cluster.cluster_toml["services"]:
        if s["kind"] == "controller" and cluster.answers(s["name"]):
            code, body = cluster.http(s["name"], "GET", "/v1/status")
            if code == 200 and body["leader"]:
                return {t: p for t, p in body["state"]["tenants"].items() if t.startswith(tenant_id + "-")}
    return {}


def sharded_cluster(cluster_factory, shards: int = 2):
    """Two pageservers and a tenant `sh` of `shards` shards, its shards
    spread; an endpoint on it with pgbench's tables, started again so that
    every relation file is read from the pageservers."""
    cluster = cluster_factory(init_args=("--pageservers", "2"))
    for bad, why in ((("--shards", "65"), "1 to 64 shards"), (("--shards", "2", "--stripe-blocks", "12"), "power of two"),
                     (("--shards", "0"), "1 to 64 shards")):
        r = cluster.run("tenant", "create", "bad", *bad, check=False)
        assert r.returncode != 0 and why in r.stderr, (bad, r.stderr)
    assert "bad" not in [t["name"] for t in cluster.cluster_toml["tenants"]]
    out = cluster.run("tenant", "create", "sh", "--shards", str(shards), "--stripe-blocks", str(STRIPE),
                      timeout=300).stdout
    assert "tenant sh:" in out, out
    tenant = cluster.tenant("sh")
    assert tenant["shards"] == {"count": shards, "stripe_blocks": STRIPE}, tenant
    listed = {t["name"]: t for t in json.loads(cluster.run("tenant", "list", "--json").stdout)}
    assert (listed["sh"]["shards"], listed["default"]["shards"]) == (shards, 1), listed
    ep = Endpoint(cluster, "e1")
    ep.start("--tenant", "sh")
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    ep.sql("CREATE EXTENSION amcheck")
    return cluster, ep, tenant["tenant_id"]


def test_a_sharded_tenant_is_spread_over_pageservers_and_reads_the_same_after_a_restart(cluster_factory):
    cluster, ep, tenant_id = sharded_cluster(cluster_factory)
    placed = controller_placements(cluster, tenant_id)
    assert sorted(placed) == [f"{tenant_id}-0of2", f"{tenant_id}-1of2"], placed
    attached = sorted(p["attached"] for p in placed.values())
    assert attached == ["pageserver", "pageserver2"], placed

    # `strata status` shows every shard where it is attached, and its timeline there.
    st = {t["name"]: t for t in cluster.status()["tenants"]}
    assert sorted(st["sh"]["attached"].split(",")) == ["pageserver", "pageserver2"], st["sh"]
    main = next(t for t in cluster.status()["timelines"] if t["tenant"] == "sh" and t["branch"] == "main")
    assert main["attached"] == placed[f"{tenant_id}-0of2"]["attached"], main
    assert [s["shard"] for s in main["shards"]] == [f"{tenant_id}-1of2"], main
    assert main["shards"][0]["attached"] == placed[f"{tenant_id}-1of2"]["attached"], main
    assert main["pageserver"]["last_record_lsn"] and main["shards"][0]["pageserver"]["last_record_lsn"], main
    table = cluster.run("status").stdout
    assert "(0of2)" in table and "(1of2)" in table, table

    # Each pageserver holds its own shard attached, the other's as a secondary.
    for name in ("pageserver", "pageserver2"):
        code, body = cluster.http(name, "GET", "/v1/status")
        assert code == 200, body
        modes = {loc["tenant_id"]: loc["mode"] for loc in body["locations"] if loc["tenant_id"].startswith(tenant_id)}
        mine = [t for t, p in placed.items() if p["attached"] == name]
        assert len(mine) == 1 and modes.get(mine[0]) == "attached", (name, modes)
        # A sharded tenant is never served by its bare id.
        assert tenant_id not in modes, modes

    # pagebench reads each block of pgbench_accounts from the shard that holds it.
    pg_ports = {s["name"]: s["ports"].get("pg") for s in cluster.cluster_toml["services"]}
    shard_addrs = [f"127.0.0.1:{pg_ports[placed[f'{tenant_id}-{n}of2']['attached']]}" for n in range(2)]
    rel = ep.sql("SELECT concat_ws('/', CASE WHEN reltablespace = 0 THEN 1663 ELSE reltablespace END,"
                 " (SELECT oid FROM pg_database WHERE datname = current_database()), relfilenode)"
                 " FROM pg_class WHERE relname = 'pgbench_accounts'")[0][0]
    token = cluster.workdir / "sh.token"
    token.touch(mode=0o600)
    token.write_text(cluster.run("auth", "token", "--scope", "tenant", "--tenant", "sh", "--ttl-secs", "0").stdout.strip())
    timeline = next(b["timeline_id"] for b in cluster.tenant("sh")["branches"] if b["name"] == "main")
    bench = pagebench(cluster, *[a for addr in shard_addrs for a in ("--pageserver", addr)], "--shards", "2",
                      "--stripe-blocks", str(STRIPE), "--tenant-id", tenant_id, "--timeline-id", timeline,
                      "--rel", rel, "--connections", "2", "--depth", "4", "--duration", "1", "--json",
                      "--token-file", str(token), *cluster.tls_args())
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert report["requests"] > 0 and report["errors"] == 0, report
    assert report["address"] == ",".join(shard_addrs), report
    # One shard only, or the wrong shard's address, is refused up front or answered WrongShard.
    wrong = pagebench(cluster, "--pageserver", shard_addrs[1], "--tenant-id", tenant_id, "--timeline-id",
                      timeline, "--rel", rel, "--duration", "0.5", "--token-file", str(token), *cluster.tls_args())
    assert wrong.returncode != 0, wrong.stdout

    ep.run(["pgbench", "-n", "-c", "4", "-j", "2", "-t", "200"], timeout=300)
    before = contents(ep)
    assert before[3] == 800, before
    # Every page the restarted compute reads comes from the pageservers.
    served = {name: cluster.metrics(name).get(GETPAGE, 0) for name in ("pageserver", "pageserver2")}
    errors = {name: cluster.metrics(name).get(ERRORS, 0) for name in ("pageserver", "pageserver2")}
    ep.restart()
    assert contents(ep) == before
    ep.run(["pg_amcheck", "--heapallindexed", "--install-missing", "-d", "postgres"], timeout=300)
    for name in ("pageserver", "pageserver2"):
        m = cluster.metrics(name)
        assert m.get(GETPAGE, 0) > served[name], (name, served, m.get(GETPAGE))
        # No read went to a shard that does not hold its page (WrongShard).
        assert m.get(ERRORS, 0) == errors[name], (name, errors, m.get(ERRORS))
        # Each shard's WAL came decoded, in fewer bytes than the WAL
        # (`docs/sharding.md`, "WAL decoded once").
        assert m.get(DECODED, 0) > 0, (name, m.get(DECODED))
        assert m.get(STREAM_BYTES, 0) < m.get(WAL_BYTES, 0) / 2, (name, m.get(STREAM_BYTES), m.get(WAL_BYTES))

    # A replica of the writer replays its WAL and reads its pages from both shards.
    replica = Endpoint(cluster, "r1")
    replica.start("--replica-of", "e1")
    ep.sql("UPDATE pgbench_branches SET bbalance = bbalance + 7")
    end = parse_lsn(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
    wait_until("the replica to replay the writer's WAL", lambda: parse_lsn(
        replica.agent_status()["replica"]["replay_lsn"] or "0/0") >= end or None, timeout=60)
    assert contents(replica) == contents(ep)
    assert replica.agent_status()["lazy"]["blocks_fetched"] > 0
    replica.stop()

    # The tenant's branches are every shard's: a branch at an LSN before a
    # change reads as the tenant did then, on both shards.
    lsn = ep.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    at = contents(ep)
    ep.sql("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 3 = 0")
    cluster.run("branch", "create", "past", "--tenant", "sh", "--at", lsn, timeout=120)
    past = Endpoint(cluster, "past", branch="past")
    past.start("--tenant", "sh")
    assert contents(past) == at
    assert contents(ep) != at
    # And a read-only endpoint at that LSN (PITR) too.
    ro = Endpoint(cluster, "ro")
    ro.start("--tenant", "sh", "--at", lsn)
    assert contents(ro) == at
    now = contents(ep)
    for e in (ro, past, ep):
        e.stop()

    # Eager computes (`--eager`): every relation file written from both
    # shards before PostgreSQL starts, nothing mounted. One at that LSN
    # reads as the tenant did then; a writer goes on from the lazy one.
    eager_ro = Endpoint(cluster, "eager-ro")
    eager_ro.start("--tenant", "sh", "--at", lsn, "--eager")
    assert contents(eager_ro) == at
    eager_ro.stop()
    eager = Endpoint(cluster, "eager")
    eager.start("--tenant", "sh", "--eager")
    pgdata = cluster.workdir / "endpoints" / "eager" / "pgdata"
    assert not os.path.ismount(pgdata / "base") and not os.path.ismount(pgdata / "global")
    assert eager.agent_status()["lazy"] is None
    assert contents(eager) == now
    eager.run(["pgbench", "-n", "-c", "2", "-t", "100"], timeout=300)
    eager.run(["pg_amcheck", "--heapallindexed", "--install-missing", "-d", "postgres"], timeout=300)
    written = contents(eager)
    assert written[3] == now[3] + 200, (now, written)
    eager.stop()
    ep.start()
    assert contents(ep) == written
    ep.stop()

    # Deleted, nothing of any shard is left on the pageservers.
    cluster.run("tenant", "delete", "sh", timeout=300)
    for name in ("pageserver", "pageserver2"):
        code, body = cluster.http(name, "GET", "/v1/status")
        assert not [loc for loc in body["locations"] if loc["tenant_id"].startswith(tenant_id)], body


def test_the_pageserver_of_one_shard_killed_under_load_loses_no_acknowledged_commit(cluster_factory):
    cluster, ep, tenant_id = sharded_cluster(cluster_factory)
    # What each shard uploaded is where its new pageserver starts from.
    cluster.run("timeline", "checkpoint", "--tenant", "sh", timeout=300)
    writers = AckedWriters(ep).start()
    wait_until("commits", lambda: writers.count() >= 50 or None, timeout=60)
    placed = controller_placements(cluster, tenant_id)
    victim = placed[f"{tenant_id}-1of2"]["attached"]
    survivor = placed[f"{tenant_id}-0of2"]["attached"]
    cluster.kill9(victim, supervisor=True)
    # The controller fails the shard over to the pageserver that serves
    # shard 0; the other shard does not move.
    def moved():
        p = controller_placements(cluster, tenant_id)
        return p if p[f"{tenant_id}-1of2"]["attached"] == survivor else None
    after = wait_until("shard 1 failed over", moved, timeout=120)
    assert after[f"{tenant_id}-0of2"]["attached"] == survivor
    assert after[f"{tenant_id}-0of2"]["generation"] == placed[f"{tenant_id}-0of2"]["generation"]
    t = time.monotonic()
    wait_until("commits after the failover", lambda: len(writers.acked_between(t, time.monotonic())) >= 50 or None,
               timeout=120)
    writers.stop()
    # Every page read again from the pageservers, one of them the survivor alone.
    ep.restart()
    got = {r[0] for r in ep.sql(f"SELECT id FROM {writers.table}")}
    missing = writers.acked_ids() - got
    assert not missing, f"{len(missing)} acknowledged commits lost"
    ep.run(["pg_amcheck", "--heapallindexed", "--install-missing", "-d", "postgres"], timeout=300)
    assert contents(ep)[0] is not None
