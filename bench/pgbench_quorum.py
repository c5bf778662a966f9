#!/usr/bin/env python3
"""pgbench read-write TPS and latency, side by side in one run:

- stock:    PostgreSQL 15 on local disk, fsync=on, synchronous_commit=on
- strata:   PostgreSQL 15 (fsync=off: the compute is disposable) whose commits
            wait for a quorum of 3 safekeepers (fsync on) via the proposer
- sync_any2: stock PostgreSQL with two synchronous standbys, ANY 2 (the same
            durability as a 2-of-3 quorum), all fsync=on

Usage: .venv/bin/python -m bench.pgbench_quorum [--scale 10] [--seconds 10] [--runs 3] [--clients 1,8,32]
Writes bench/results/pgbench_quorum.json and prints medians and ratios.
"""

import argparse
import statistics
import sys
from pathlib import Path

from bench.harness import (strata_to_measure, RESULTS, any2_postgres, bench_dir, parse_latency_ms, parse_tps, pgbench,
                           pgbench_init, run_timeout, stock_cluster, stock_postgres, write_json)
from test_runner.fixtures.pg import PgCluster
from test_runner.fixtures.strata import WalService

COMMON = {"shared_buffers": "128MB", "max_wal_size": "2GB", "checkpoint_timeout": "30min"}


def rw_run(cluster: PgCluster, clients: int, seconds: int) -> tuple[float, float]:
    """tps and average latency (ms) of one pgbench RW run."""
    out = pgbench(cluster.client_env(), "-n", "-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2)),
                  timeout=run_timeout(seconds))
    return parse_tps(out), parse_latency_ms(out)


def measure(cluster: PgCluster, args) -> dict:
    """pgbench's tables, then --runs runs at each client count: medians."""
    pgbench_init(cluster.client_env(), args.scale, timeout=1800)
    cluster.sql("CHECKPOINT")
    results = {}
    for clients in args.clients:
        runs = [rw_run(cluster, clients, args.seconds) for _ in range(args.runs)]
        results[clients] = {"tps": statistics.median(r[0] for r in runs),
                            "latency_ms": statistics.median(r[1] for r in runs),
                            "tps_runs": [r[0] for r in runs]}
    return results


def stock(base: Path, args) -> dict:
    with stock_postgres(base, "stock", {**COMMON, "fsync": "on", "synchronous_commit": "on"}) as c:
        return measure(c, args)


def strata(strata_bin: Path, base: Path, args) -> dict:
    c = stock_cluster(base, "strata-pg")
    svc = WalService(strata_bin, base / "strata", c)
    (base / "strata").mkdir(exist_ok=True)
    try:
        svc.start(extra_settings=COMMON)
        return measure(c, args)
    finally:
        svc.stop()
        c.cleanup()


def sync_any2(base: Path, args) -> dict:
    primary = {**COMMON, "fsync": "on", "wal_level": "replica", "max_wal_senders": 10, "synchronous_commit": "on"}
    with any2_postgres(base, primary, {**COMMON, "fsync": "on", "hot_standby": "on"}) as (first, *_):
        return measure(first, args)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    args = ap.parse_args()
    with bench_dir() as base:
        results = {"stock": stock(base, args), "strata": strata(strata_to_measure(), base, args),
                   "sync_any2": sync_any2(base, args)}
    write_json(RESULTS / "pgbench_quorum.json", results)
    print(f"{'clients':>8} {'stock tps':>10} {'strata tps':>11} {'any2 tps':>9} {'strata/stock':>13} {'strata/any2':>12}"
          f" {'lat stock':>10} {'lat strata':>11} {'lat any2':>9}")
    for c in args.clients:
        s, t, a = results["stock"][c], results["strata"][c], results["sync_any2"][c]
        print(f"{c:>8} {s['tps']:>10.0f} {t['tps']:>11.0f} {a['tps']:>9.0f} {t['tps'] / s['tps']:>13.2f}"
              f" {t['tps'] / a['tps']:>12.2f} {s['latency_ms']:>10.2f} {t['latency_ms']:>11.2f} {a['latency_ms']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
