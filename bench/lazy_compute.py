#!/usr/bin/env python3
"""A lazy compute's read and pgbench speed, side by side with stock
PostgreSQL on local disk and with the same compute in eager mode
(docs/lazy-compute.md, "Cache" and "Prefetch"):

- cold scan: `SELECT count(*) FROM pgbench_accounts` right after a start,
  the kernel's page cache dropped first (when this user may: otherwise the
  figures say "warm os cache"). Stock: `pg_ctl start` on a local data
  directory of the same database. Lazy: `strata endpoint start --lazy`, so
  every block comes from the pageserver through the file system.
- warm pgbench RW (the TPC-B-like script) and RO (`-S`): an eager endpoint
  on the loaded branch and a lazy one on a branch made from it, both
  running at once, both warmed by reading every table and index once
  (pg_prewarm's 'read' mode: through the file system, not into shared
  buffers). Then --slices rounds of one --slice-seconds pgbench run on each
  endpoint, in turn first: with both up, the rounds alternate every few
  seconds without a restart between, so the shared machine's drift weighs
  on both alike. One uncounted run on each first; RO after a checkpoint of
  both. Also reported: the first RW run after the start, before the warm-up
  read (the cache filling).

Scan figures are medians of --runs runs; ratios are stock / lazy for the
scan (speed: the target is >= 0.5) and lazy / eager for pgbench (tps), both
of the medians and, less at the mercy of the machine's noise, the median of
each round's ratio (a round: one scan or pgbench run of each kind, in turn
first).

Usage: .venv/bin/python -m bench.lazy_compute [--scale 20] [--runs 5] [--slices 10] [--slice-seconds 5]
           [--quick] [--scan-only]
Writes bench/results/lazy_compute.json and .txt (lazy_compute_quick.* with --quick,
lazy_compute_scan.* with --scan-only: the cold scans alone).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import psycopg

from bench.harness import (bench_dir, client_env, local_cluster, machine_state, pgbench_init, pgbench_tps, psql,
                           result_stem, run_timeout, stock_cluster, strata_to_measure, timeline_url, wait_ingested,
                           write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.endpoint import Endpoint
from test_runner.fixtures.pg import PgCluster
from test_runner.fixtures.strata import drop_os_caches, http_json

SCAN = "SELECT count(*) FROM pgbench_accounts WHERE filler IS NOT NULL"  # a heap scan (count(*) alone scans the index)


def timed_scan(connect) -> float:
    """Seconds of one SCAN on a new connection."""
    with connect() as conn:
        t0 = time.monotonic()
        n = conn.execute(SCAN).fetchone()[0]
        elapsed = time.monotonic() - t0
    assert n > 0
    return elapsed


def timed_tps(env: dict, args: list[str], seconds: int) -> float:
    """tps of one pgbench run of `seconds`."""
    return pgbench_tps(env, "-n", "-T", str(seconds), *args, timeout=run_timeout(seconds))


def stock_prepare(base: Path, scale: int) -> tuple[PgCluster, int]:
    """A stopped stock cluster of the pgbench database, and the database's size."""
    c = stock_cluster(base, "stock")
    c.initdb()
    c.start({"max_wal_size": "2GB"})
    pgbench_init(c.client_env(), scale, timeout=1800)
    c.sql("VACUUM ANALYZE")
    c.sql("CHECKPOINT")
    db_bytes = int(c.sql("SELECT pg_database_size(current_database())")[0][0])
    c.stop("fast")
    return c, db_bytes


def stock_scan(c: PgCluster) -> tuple[float, bool]:
    """One cold scan on the stock cluster, and whether the OS cache was dropped."""
    cold = drop_os_caches(3)
    c.start()
    try:
        return timed_scan(lambda: c.connect(connect_timeout=10)), cold
    finally:
        c.stop("fast")


def agent_lazy(cluster: LocalCluster, name: str = "main") -> dict | None:
    """The lazy file system's counters in the endpoint's agent status."""
    return Endpoint(cluster, name).agent_status().get("lazy")


PREWARM = ("SELECT sum(pg_prewarm(oid, 'read')) FROM pg_class"
           " WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i')")


def pgbench_rounds(cluster: LocalCluster, tl_url: str, slices: int, seconds: int, clients: int) -> dict:
    """Warm pgbench on an eager endpoint of main and a lazy one of a branch
    of it, both up at once, in alternating runs (module docstring)."""
    wait_ingested(cluster, tl_url)
    cluster.run("branch", "create", "twin", timeout=120)
    twin_url = timeline_url(cluster, "twin")
    envs = {"eager": client_env(cluster.endpoint_start("main", "main", "--eager")),
            "lazy": client_env(cluster.endpoint_start("twin", "twin", "--lazy"))}
    common = ["-c", str(clients), "-j", str(min(clients, 2))]
    tps: dict = {f"{m}_{n}": [] for m in ("eager", "lazy") for n in ("rw", "ro")}
    try:
        # The cache filling: the first run after the start, nothing read yet.
        for mode in ("eager", "lazy"):
            tps[f"{mode}_first_rw"] = timed_tps(envs[mode], common, seconds)
        for mode, env in envs.items():
            psql(env, "CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            t0 = time.monotonic()
            psql(env, PREWARM)
            tps[f"{mode}_prewarm_seconds"] = time.monotonic() - t0
        for name, extra in (("rw", []), ("ro", ["-S"])):
            if name == "ro":
                for env in envs.values():
                    psql(env, "CHECKPOINT")
                for url in (tl_url, twin_url):
                    wait_ingested(cluster, url)
            for mode in ("eager", "lazy"):
                timed_tps(envs[mode], [*common, *extra], seconds)  # warm-up, not counted
            for r in range(slices):
                for mode in ("eager", "lazy") if r % 2 == 0 else ("lazy", "eager"):
                    tps[f"{mode}_{name}"].append(timed_tps(envs[mode], [*common, *extra], seconds))
        tps["lazy_status"] = agent_lazy(cluster, "twin")
    finally:
        cluster.endpoint_stop("main")
        cluster.endpoint_stop("twin")
    return tps


def strata_runs(strata_bin: Path, base: Path, stock: PgCluster, scale: int, runs: int, slices: int,
                slice_seconds: int, clients: int, pgbench: bool = True) -> dict:
    """The cold scans, in rounds with the stock ones, and (`pgbench`) the
    pgbench rounds, on one cluster loaded like `stock`."""
    with local_cluster(strata_bin, base / "strata") as cluster:
        tl_url = timeline_url(cluster)
        env = client_env(cluster.endpoint_start("main", "main", "--eager"))
        pgbench_init(env, scale, timeout=1800)
        psql(env, "VACUUM ANALYZE")
        cluster.endpoint_stop("main")
        wait_ingested(cluster, tl_url)
        # Compacted, as a pageserver's background work leaves a database
        # that is read more than written: pages come from image layers.
        code, body = http_json("POST", f"{tl_url}/checkpoint?compact=true", timeout=600)
        assert code == 200, body

        # Rounds of one stock and one lazy scan, in turn first: the machine's
        # speed drifts (it is shared), and a round's ratio compares two scans
        # made under the same conditions. The cluster is idle during a stock
        # scan (its WAL ingested, its layers compacted).
        scans, stock_scans, fetched, cold = [], [], [], True
        for r in range(runs):
            for which in ("stock", "lazy") if r % 2 == 0 else ("lazy", "stock"):
                wait_ingested(cluster, tl_url)
                if which == "stock":
                    took, dropped = stock_scan(stock)
                    stock_scans.append(took)
                    cold = dropped and cold
                    continue
                cold = drop_os_caches(3) and cold
                connstr = cluster.endpoint_start("main", "main", "--lazy")
                scans.append(timed_scan(lambda: psycopg.connect(connstr, autocommit=True, connect_timeout=10)))
                fetched.append(agent_lazy(cluster)["blocks_fetched"])
                cluster.endpoint_stop("main")

        tps = pgbench_rounds(cluster, tl_url, slices, slice_seconds, clients) if pgbench else {}
        return {"scan_seconds": statistics.median(scans), "scans": scans, "blocks_fetched": fetched,
                "stock_scan_seconds": statistics.median(stock_scans), "stock_scans": stock_scans,
                "os_cache_dropped": cold, "tps": tps}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5, help="cold scans of each kind")
    ap.add_argument("--slices", type=int, default=10, help="pgbench rounds of each kind (RW, RO)")
    ap.add_argument("--slice-seconds", type=int, default=5, help="each pgbench run")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs, 2 rounds of 3 s")
    ap.add_argument("--scan-only", action="store_true", help="the cold scans alone, no pgbench rounds")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.runs, args.slices, args.slice_seconds = 2, 2, 2, 3
    results: dict = {"config": vars(args), **machine_state()}
    with bench_dir() as base:
        stock, db_bytes = stock_prepare(base, args.scale)
        try:
            z = strata_runs(strata_to_measure(), base, stock, args.scale, args.runs, args.slices,
                            args.slice_seconds, args.clients, pgbench=not args.scan_only)
        finally:
            stock.cleanup()
    results["strata"] = z
    results["database_bytes"] = db_bytes
    stock_med = z["stock_scan_seconds"]
    results["scan_speed_vs_stock"] = stock_med / z["scan_seconds"]
    # Paired: each round's stock scan against the lazy scan of the same round.
    results["scan_speed_paired"] = statistics.median(s / l for s, l in zip(z["stock_scans"], z["scans"]))
    cache = "cold os cache" if z["os_cache_dropped"] else "warm os cache"
    lines = [
        f"scale {args.scale} ({db_bytes / 1e6:.0f} MB); medians (and, paired, the median of the rounds' ratios,"
        f" each of two runs of one round); {cache}",
        "",
        f"cold scan ({SCAN}) right after a start, {args.runs} rounds:",
        f"  stock (local disk)      {stock_med:8.3f} s   runs {', '.join(f'{t:.3f}' for t in z['stock_scans'])}",
        f"  lazy (from pageserver)  {z['scan_seconds']:8.3f} s   runs {', '.join(f'{t:.3f}' for t in z['scans'])}",
        f"  lazy speed vs stock {results['scan_speed_vs_stock']:.2f}, paired {results['scan_speed_paired']:.2f}"
        f"   (target >= 0.5; blocks fetched {statistics.median(z['blocks_fetched']):.0f})",
    ]
    if not args.scan_only:
        t = z["tps"]
        med = {k: statistics.median(v) for k, v in t.items() if isinstance(v, list)}
        # Paired: each round's lazy figure against the eager one of the same round.
        pairs = {
            "rw": statistics.median(l / e for l, e in zip(z["tps"]["lazy_rw"], z["tps"]["eager_rw"])),
            "ro": statistics.median(l / e for l, e in zip(z["tps"]["lazy_ro"], z["tps"]["eager_ro"])),
        }
        results.update(paired_ratios=pairs, rw_vs_eager=med["lazy_rw"] / med["eager_rw"],
                       ro_vs_eager=med["lazy_ro"] / med["eager_ro"])
        lines += [
            "",
            f"warm pgbench, {args.clients} clients, {args.slices} rounds of {args.slice_seconds} s on each endpoint (tps):",
            f"  RW  eager {med['eager_rw']:9.1f}   lazy {med['lazy_rw']:9.1f}   lazy/eager"
            f" {results['rw_vs_eager']:.2f}, paired {pairs['rw']:.2f}   (target >= 0.9)",
            f"  RO  eager {med['eager_ro']:9.1f}   lazy {med['lazy_ro']:9.1f}   lazy/eager"
            f" {results['ro_vs_eager']:.2f}, paired {pairs['ro']:.2f}   (target >= 0.95)",
            f"  RW rounds lazy/eager: {', '.join(f'{l / e:.2f}' for l, e in zip(t['lazy_rw'], t['eager_rw']))}",
            f"  RO rounds lazy/eager: {', '.join(f'{l / e:.2f}' for l, e in zip(t['lazy_ro'], t['eager_ro']))}",
            f"  first RW run after the start (the lazy cache empty): eager {t['eager_first_rw']:.1f}"
            f"   lazy {t['lazy_first_rw']:.1f}   lazy/eager {t['lazy_first_rw'] / t['eager_first_rw']:.2f}",
            f"  warm-up read of every table and index: eager {t['eager_prewarm_seconds']:.2f} s"
            f"   lazy {t['lazy_prewarm_seconds']:.2f} s",
            "",
            f"lazy file system after pgbench: {json.dumps(t.get('lazy_status'))}",
        ]
    text = "\n".join(lines)
    stem = "lazy_compute_scan" if args.scan_only and not args.quick else result_stem("lazy_compute", args.quick)
    write_results(stem, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
