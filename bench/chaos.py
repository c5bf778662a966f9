#!/usr/bin/env python3
"""Chaos for an hour (`docs/consistency.md`, "Under faults"): transactional
histories checked under random faults, seed after seed, as a user runs
the cluster (`strata init --pageservers 2`, every service on, a writer
endpoint and a replica). Each seed gets a fresh cluster and `--seconds`
of the list-append (its isolation level by the seed), bank and register
workloads while faults from the seed hit it, several at a time: SIGKILL
of any service (restarted at once, or kept down a while), SIGSTOP of a
service (a host cut off without a reset), SIGKILL of either endpoint's
PostgreSQL or agent, endpoint restarts, fsync failures and full disks on
a safekeeper and a pageserver, and object storage (MinIO behind a link
proxy) killed or slow (`fixtures.chaos`). Then every
fault heals and the histories are checked. A second tenant's writer
(`t2w`) runs a list-append and two bank clients of its own under the same
faults of the services the tenants share; its histories are checked
apart. Seeds run until `--minutes` have passed.

Side by side: stock PostgreSQL 15 with a streaming hot standby under the
same workloads for `--seconds`, with the faults that apply to it (SIGKILL
of either server and `pg_ctl start`, SIGSTOP of either), checked the same
way. The figures are the anomalies each shows (the goal for Strata: none
that the level forbids) and the transactions each completed.

With `--sites`, every seed's cluster is two sites instead (`strata init
--sites 2`: two safekeepers, a pageserver and a controller in dc1, one
safekeeper, a pageserver and a controller in dc2, every byte between them
through the link proxy), the replica in dc2, the WAL placement
`stretched` for even seeds and `local-quorum` for odd ones; half of the
faults are then the sites' own: partitions both ways and one way, a
slow link, a lossy one, every connection between the sites reset, and a
pageserver drained to the other site.

With `--hosts` (root), every seed's cluster runs on seven hosts made of
network namespaces in two sites (`fixtures.chaos.CHAOS_HOSTS`:
three safekeeper hosts, a pageserver host and a compute host in each
site), the clients and MinIO on the operator's machine, and the faults
are those of machines and networks (`fixtures.chaos.HostNemesis`): hosts
powered off and cut off, two hosts partitioned both ways or one way, a
host's wall clock stepped up to an hour either way, an endpoint moved
to the other compute host, object storage down or slow. The clients
reach every endpoint through the proxy on its host.

A failing seed replays the same faults: `--first-seed N --minutes 0`
runs seed N alone (with `--sites` or `--hosts` if it ran so).

Usage: .venv/bin/python -m bench.chaos [--minutes 60] [--seconds 120] [--first-seed 1] [--sites|--hosts] [--quick]
Writes bench/results/chaos.json and .txt (chaos_sites.* with --sites,
chaos_hosts.* with --hosts, *_quick.* with --quick);
the histories and faults of a seed that found something are copied to
bench/results/chaos-failed/seed-N/ to be checked again
(`fixtures.consistency.load_history`).
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from bench.harness import (PG_BIN, RESULTS, bench_dir, local_cluster, machine_state, result_stem, stock_cluster,
                           strata_to_measure, write_results)
from test_runner.fixtures.chaos import (CHAOS_HOSTS, CLOCK_HOSTS, Store, StockNemesis, run_chaos, run_host_chaos,
                                        run_workloads, stock_schedule)
from test_runner.fixtures.endpoint import Endpoint, start_endpoint
from test_runner.fixtures.hosted import hosted_cluster


# The services whose disks fail now and then (strata-faultfs mounts).
DISKS = ("sk1", "pageserver")


# The round trip between the sites, and each seed's WAL placement.
SITE_LATENCY_MS = 4


def placement(seed: int) -> str:
    return "stretched" if seed % 2 == 0 else "local-quorum"


def strata_seed(strata: Path, base: Path, seed: int, seconds: float, sites: bool = False) -> dict:
    made = []
    store = Store(strata, base / f"store-{seed}")

    def prepare(cluster) -> None:
        made.append(cluster)
        for name in DISKS:
            cluster.put_data_on_faultfs(name)
        cluster.set_remote_storage(store.remote_storage(f"seed-{seed}"))

    try:
        init = (("--sites", "2", "--site-latency-ms", str(SITE_LATENCY_MS), "--placement", placement(seed)) if sites
                else ("--pageservers", "2"))
        with local_cluster(strata, base / f"cluster-{seed}", *init, prepare=prepare) as cluster:
            writer = start_endpoint(cluster)
            replica = Endpoint(cluster, "r1")
            replica.start("--replica-of", "ep", *(("--site", "dc2") if sites else ()))
            cluster.run("tenant", "create", "t2", timeout=180)
            other = Endpoint(cluster, "t2w")
            other.start("--tenant", "t2")
            outcome = run_chaos(cluster, writer, replica, seed, seconds, base / "histories", store=store,
                                others=[other])
    finally:
        for cluster in made:
            cluster.unmount_faultfs()
        store.close()
    result = json.loads(outcome.to_json())
    if sites:
        result["placement"] = placement(seed)
    return result


def hosts_seed(strata: Path, base: Path, seed: int, seconds: float) -> dict:
    stores = []

    def remote(gateway: str) -> dict:
        stores.append(Store(strata, base / f"store-{seed}", host=gateway))
        return stores[-1].remote_storage(f"seed-{seed}")

    where = base / f"hosts-{seed}"
    where.mkdir()
    try:
        with hosted_cluster(strata, PG_BIN, where, base, CHAOS_HOSTS, remote=remote, own_clocks=CLOCK_HOSTS) as hosted:
            writer = hosted.endpoint("ep", "cp1")
            replica = hosted.endpoint("r1", "cp2", "--replica-of", "ep")
            hosted.cluster.run("tenant", "create", "t2", timeout=180)
            other = hosted.endpoint("t2w", "cp2", "--tenant", "t2")
            outcome = run_host_chaos(hosted, writer, replica, {"ep": "cp1", "r1": "cp2"}, seed, seconds,
                                     base / "histories", store=stores[0], others=[other])
    finally:
        for s in stores:
            s.close()
    return json.loads(outcome.to_json())


def stock_run(base: Path, seed: int, seconds: float) -> dict:
    primary, standby = stock_cluster(base, "primary"), stock_cluster(base, "standby")
    try:
        primary.initdb()
        primary.start({"max_connections": 50})
        standby.basebackup_from(primary, application_name="standby")
        standby.start({"hot_standby": "on", "max_connections": 50})
        nemesis = StockNemesis({"primary": primary, "standby": standby}, stock_schedule(seed, seconds))
        outcome = run_workloads(primary, standby, "standby", nemesis, seed, seconds, base / "stock-histories")
    finally:
        for c in (standby, primary):
            c.cleanup()
    return json.loads(outcome.to_json())


def summary(name: str, o: dict) -> str:
    faults = sum(1 for f in o["faults"] if f["what"] == "begin")
    skipped = sum(1 for f in o["faults"] if f["what"].startswith("skipped"))
    ops = {w: sum(v for k, v in counts.items() if k.startswith("ok")) for w, counts in o["ops"].items()}
    found = {w: a for w, a in o["anomalies"].items() if a}
    where = f" {o['placement']:<12}" if "placement" in o else ""
    return (f"{name} seed {o['seed']:>3} {o['level']:<16}{where} {faults:>3} faults ({skipped} skipped)  ok: " +
            ", ".join(f"{w} {n}" for w, n in ops.items()) +
            f"  forbidden: {found or 'none'}" + (f"  also stock's: {o['known']}" if o.get("known") else "") +
            (f"  nemesis errors: {o['nemesis_errors']}" if o["nemesis_errors"] else ""))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60, help="run seeds until this much time has passed")
    ap.add_argument("--seconds", type=float, default=120, help="of faults per seed")
    ap.add_argument("--first-seed", type=int, default=1)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--sites", action="store_true", help="a cluster of two sites, with the link's faults")
    where.add_argument("--hosts", action="store_true", help="a cluster on seven network-namespace hosts (root)")
    ap.add_argument("--quick", action="store_true", help="smoke run: one seed of 30 s, and stock for 30 s")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.seconds = 0, 30
    strata = strata_to_measure()
    results = {"config": vars(args), "machine": machine_state(), "strata": [], "stock": None}
    lines = []
    started = time.monotonic()
    with bench_dir("strata-chaos-") as base:
        seed = args.first_seed
        while True:
            try:
                o = (hosts_seed(strata, base, seed, args.seconds) if args.hosts
                     else strata_seed(strata, base, seed, args.seconds, args.sites))
            except Exception as e:  # noqa: BLE001 - a seed that could not run is a failed seed; the others go on
                o = {"seed": seed, "level": "-", "faults": [], "ops": {}, "anomalies": {}, "known": {},
                     "nemesis_errors": [f"the seed did not run: {str(e)[-2000:]}"]}
            results["strata"].append(o)
            if any(o["anomalies"].values()) or o["nemesis_errors"]:
                kind = "sites-" if args.sites else "hosts-" if args.hosts else ""
                keep = RESULTS / "chaos-failed" / f"{kind}seed-{seed}"
                keep.mkdir(parents=True, exist_ok=True)
                for f in (base / "histories").glob(f"*-{seed}.*"):
                    shutil.copy(f, keep / f.name)
            lines.append(summary("strata", o))
            print(lines[-1], flush=True)
            seed += 1
            if time.monotonic() - started >= args.minutes * 60:
                break
        results["stock"] = stock_run(base, args.first_seed, args.seconds)
        lines.append(summary("stock ", results["stock"]))
        print(lines[-1], flush=True)
    bad = [o["seed"] for o in results["strata"] if any(o["anomalies"].values()) or o["nemesis_errors"]]
    lines.append(f"{len(results['strata'])} seeds in {(time.monotonic() - started) / 60:.1f} min; "
                 f"seeds with a forbidden anomaly or a failed fault: {bad or 'none'}")
    print(lines[-1])
    name = "chaos_sites" if args.sites else "chaos_hosts" if args.hosts else "chaos"
    write_results(result_stem(name, args.quick), results, "\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
