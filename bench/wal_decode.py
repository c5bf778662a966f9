#!/usr/bin/env python3
"""WAL decoding throughput on WAL written by pgbench, next to the machine's
memory-copy and file-read bandwidth for the same bytes.

Starts a throw-away PostgreSQL 15 cluster, runs pgbench (initialisation and a
read-write run), stops it, and runs `strata wal bench` over its pg_wal for
two WAL flavours: plain (no images beyond full_page_writes) and with
wal_consistency_checking='all' + lz4 (every block change carries an image,
as Strata's computes write it for rmgrs without native redo).

Usage: .venv/bin/python -m bench.wal_decode [--scale 10] [--transactions 20000] [--runs 5]
Writes bench/results/wal_decode.json and prints a summary.
"""

import argparse
import sys
from pathlib import Path

from bench.harness import (strata_to_measure, RESULTS, bench_dir, pgbench, pgbench_init, stock_cluster, wal_bench,
                           write_json)
from test_runner.fixtures.pg import PgCluster


def generate_wal(base: Path, name: str, settings: dict, scale: int, transactions: int) -> PgCluster:
    """A stopped stock cluster whose pg_wal holds pgbench's WAL (the load and
    a read-write run) written with `settings`."""
    cluster = stock_cluster(base, name)
    cluster.initdb()
    cluster.start({"max_wal_size": "4GB", "wal_keep_size": "4GB", "checkpoint_timeout": "1h",
                   "fsync": "off", **settings})
    env = cluster.client_env()
    pgbench_init(env, scale, timeout=1200)
    pgbench(env, "-n", "-c", "4", "-j", "2", "-t", str(transactions // 4), timeout=1200)
    cluster.stop("fast")
    return cluster


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--transactions", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    results = {}
    flavours = {
        "plain": {},
        "consistency_all_lz4": {"wal_consistency_checking": "all", "wal_compression": "lz4"},
    }
    with bench_dir() as base:
        for name, settings in flavours.items():
            cluster = generate_wal(base, name, settings, args.scale, args.transactions)
            try:
                results[name] = wal_bench(strata_to_measure(), [cluster.waldir], args.runs)
            finally:
                cluster.cleanup()
    write_json(RESULTS / "wal_decode.json", results)
    print(f"{'WAL':<22}{'MB':>8}{'records':>10}{'decode MB/s':>13}{'rec/s':>12}"
          f"{'+images MB/s':>14}{'copy MB/s':>11}{'read MB/s':>11}{'decode/copy':>13}{'decode/read':>13}")
    for name, r in results.items():
        print(f"{name:<22}{r['wal_bytes'] / 1e6:>8.1f}{r['records']:>10}{r['decode_mb_per_s']:>13.0f}"
              f"{r['decode_records_per_s']:>12.0f}{r['decode_and_restore_images_mb_per_s']:>14.0f}"
              f"{r['copy_mb_per_s']:>11.0f}{r['read_mb_per_s']:>11.0f}{r['decode_vs_copy']:>13.3f}"
              f"{r['decode_vs_read']:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
