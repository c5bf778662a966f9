#!/usr/bin/env python3
"""PostgreSQL 18's asynchronous I/O (`io_method`) on Strata's lazy file
system, against stock PostgreSQL 18 on local disk with the same method,
side by side in one run (docs/lazy-compute.md, "PostgreSQL 18's
asynchronous I/O"):

- strata: a local cluster made through the CLI (`strata init --pg-version
          18`), a lazy endpoint started with `--io-method M`;
- stock:  PostgreSQL 18 on local disk, `io_method = M`.

Per method and run, each side restarted first (Strata: a new compute,
every page fetched from the pageserver again; stock: a new server, its
files in the OS page cache):
- a cold sequential scan of a table of --mb MiB (`count(*)`), seconds;
- pgbench -S (built-in select-only) at --clients clients for --seconds
  over pgbench's tables (scale --scale), tps, its first run after the
  restart, so it reads its pages in.
Reported: medians and every run; Strata / stock per method (for the scan,
stock's seconds over Strata's: 1.0 is as fast).

Usage: .venv/bin/python -m bench.io_method [--mb 512] [--scale 20] [--seconds 10] [--clients 8] [--runs 3] [--quick]
Writes bench/results/io_method.json and .txt (io_method_quick.* with --quick).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.harness import (bench_dir, client_env, local_cluster, machine_state, pgbench_init, pgbench_tps, psql,
                           result_stem, run_timeout, strata_to_measure, write_results)
from test_runner.fixtures.pg import PgCluster

METHODS = ("sync", "worker", "io_uring")
BIN = Path("/usr/lib/postgresql/18/bin")
SETTINGS = {"shared_buffers": "128MB", "max_wal_size": "4GB", "checkpoint_timeout": "30min"}


def fill(env: dict, mb: int, scale: int) -> None:
    """The scanned table (about `mb` MiB) and pgbench's tables."""
    rows = mb * 1024 * 1024 // 300
    psql(env, "CREATE TABLE scan AS SELECT g AS id, repeat(md5(g::text), 8) AS pad"
              f" FROM generate_series(1, {rows}) g", timeout=3600)
    pgbench_init(env, scale)
    psql(env, "CHECKPOINT")


def measure(env: dict, args) -> dict:
    """The cold scan's wall time (psql's start included: milliseconds) and
    the first pgbench -S run's tps."""
    t0 = time.monotonic()
    psql(env, "SELECT count(*) FROM scan", timeout=3600)
    scan = time.monotonic() - t0
    tps = pgbench_tps(env, "-n", "-S", "-c", str(args.clients), "-j", "2", "-T", str(args.seconds),
                      timeout=run_timeout(args.seconds))
    return {"scan_seconds": scan, "select_tps": tps}


def summary(results: dict, args) -> str:
    med = statistics.median
    lines = [f"table {args.mb} MiB, pgbench scale {args.scale}, -S {args.clients} clients x {args.seconds} s;"
             f" {args.runs} runs; {results['cpus']} CPUs, load {results['loadavg_before']:.2f} before", "",
             f"{'io_method':>9} {'scan stock s':>13} {'scan strata s':>14} {'scan ratio':>11}"
             f" {'-S stock':>9} {'-S strata':>10} {'-S ratio':>9}"]
    for m in args.methods:
        r = results["methods"][m]
        ss, ts = med(x["scan_seconds"] for x in r["stock"]), med(x["scan_seconds"] for x in r["strata"])
        sq, tq = med(x["select_tps"] for x in r["stock"]), med(x["select_tps"] for x in r["strata"])
        r["scan_ratio"], r["select_ratio"] = ss / ts, tq / sq
        lines.append(f"{m:>9} {ss:>13.2f} {ts:>14.2f} {r['scan_ratio']:>11.2f} {sq:>9.0f} {tq:>10.0f}"
                     f" {r['select_ratio']:>9.2f}")
    lines.append("")
    for m in args.methods:
        for who in ("stock", "strata"):
            runs = results["methods"][m][who]
            lines.append(f"{m} {who:>6}: scan " + ", ".join(f"{x['scan_seconds']:.2f}" for x in runs)
                         + " s; -S " + ", ".join(f"{x['select_tps']:.0f}" for x in runs))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512, help="size of the scanned table, MiB")
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    ap.add_argument("--quick", action="store_true", help="smoke run: 32 MiB, scale 2, 2 runs of 3 s")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.scale, args.seconds, args.runs = 32, 2, 3, 2
    if not (BIN / "postgres").exists():
        print("no PostgreSQL 18 here (scripts/postgres-build.sh 18)", file=sys.stderr)
        return 2
    results: dict = {"config": vars(args), **machine_state(),
                     "methods": {m: {"stock": [], "strata": []} for m in args.methods}}
    with bench_dir() as base, local_cluster(strata_to_measure(), base / "cluster", "--pg-version", "18") as c:
        stock = PgCluster(BIN, base / "stock", traverse_root=base)
        try:
            stock.initdb()
            stock.start(SETTINGS)
            fill(stock.client_env(), args.mb, args.scale)
            connstr = c.endpoint_start("ep", "main", "--shared-buffers", SETTINGS["shared_buffers"])
            fill(client_env(connstr), args.mb, args.scale)
            for _ in range(args.runs):
                for m in args.methods:
                    stock.stop()
                    stock.start({**SETTINGS, "io_method": m})
                    results["methods"][m]["stock"].append(measure(stock.client_env(), args))
                    c.endpoint_stop("ep")
                    connstr = c.endpoint_start("ep", "main", "--io-method", m, "--shared-buffers",
                                               SETTINGS["shared_buffers"])
                    results["methods"][m]["strata"].append(measure(client_env(connstr), args))
        finally:
            stock.cleanup()
    write_results(result_stem("io_method", args.quick), results, summary(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
