#!/usr/bin/env python3
"""Each PostgreSQL major on Strata against stock PostgreSQL of the same
major, side by side in one run (docs/postgres-versions.md):

- strata: one local cluster made through the CLI (`strata init`), a tenant
          per major (`strata tenant create vNN --pg-version NN`: one
          cluster serves them all) and an endpoint on each, as `strata
          endpoint start` makes it.
- stock:  that major's PostgreSQL on local disk (fsync on), with its
          initdb's defaults (18 with data checksums, as the tenant).

Per major and run, stock and Strata one after the other:
- bulk load: `pgbench -i -s SCALE` (the tables dropped and made again:
  COPY of SCALE x 100,000 rows, primary keys, VACUUM), wall time;
- pgbench RW (TPC-B-like) at --clients clients for --seconds, tps.
Reported: medians, the range of the runs, and Strata / stock per major
(for the load, stock's seconds over Strata's: 1.0 is as fast).

Usage: .venv/bin/python -m bench.versions [--majors 15,18] [--scale 10] [--seconds 20] [--clients 8] [--runs 3] [--quick]
Writes bench/results/versions.json and .txt (versions_quick.* with --quick).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.harness import (bench_dir, client_env, local_cluster, machine_state, pgbench, pgbench_tps, result_stem,
                           run_timeout, strata_to_measure, write_results)
from test_runner.fixtures.pg import PgCluster

STOCK = {"shared_buffers": "128MB", "max_wal_size": "2GB", "checkpoint_timeout": "30min", "fsync": "on"}


def bin_dir(major: int) -> Path:
    return Path(f"/usr/lib/postgresql/{major}/bin")


def load_seconds(env: dict, scale: int) -> float:
    """Wall time of `pgbench -i -s SCALE` (its tables dropped first)."""
    t0 = time.monotonic()
    pgbench(env, "-i", "-q", "-s", str(scale), timeout=3600)
    return time.monotonic() - t0


def rw_tps(env: dict, args) -> float:
    return pgbench_tps(env, "-n", "-c", str(args.clients), "-j", "2", "-T", str(args.seconds),
                       timeout=run_timeout(args.seconds))


def one_run(env: dict, args) -> dict:
    return {"load_seconds": load_seconds(env, args.scale), "tps": rw_tps(env, args)}


def summary(results: dict, args) -> str:
    med = statistics.median
    lines = [f"scale {args.scale}; pgbench RW {args.clients} clients x {args.seconds} s; {args.runs} runs;"
             f" {results['cpus']} CPUs, load {results['loadavg_before']:.2f} before", "",
             f"{'major':>5} {'load stock s':>13} {'load strata s':>14} {'load ratio':>11}"
             f" {'tps stock':>10} {'tps strata':>11} {'tps ratio':>10}"]
    for major in args.majors:
        r = results["majors"][str(major)]
        s_load, t_load = med(x["load_seconds"] for x in r["stock"]), med(x["load_seconds"] for x in r["strata"])
        s_tps, t_tps = med(x["tps"] for x in r["stock"]), med(x["tps"] for x in r["strata"])
        r["load_ratio"], r["tps_ratio"] = s_load / t_load, t_tps / s_tps
        lines.append(f"{major:>5} {s_load:>13.2f} {t_load:>14.2f} {r['load_ratio']:>11.2f}"
                     f" {s_tps:>10.0f} {t_tps:>11.0f} {r['tps_ratio']:>10.2f}")
    lines.append("")
    for major in args.majors:
        r = results["majors"][str(major)]
        for who in ("stock", "strata"):
            lines.append(f"{major} {who:>6}: load " + ", ".join(f"{x['load_seconds']:.2f}" for x in r[who])
                         + " s; tps " + ", ".join(f"{x['tps']:.0f}" for x in r[who]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--majors", type=lambda s: [int(x) for x in s.split(",")], default=[15, 18])
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=20, help="length of each pgbench RW run")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs of 5 s")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs = 2, 5, 2
    missing = [m for m in args.majors if not (bin_dir(m) / "postgres").exists()]
    if missing:
        print(f"no PostgreSQL {', '.join(map(str, missing))} here (scripts/postgres-build.sh MAJOR)", file=sys.stderr)
        return 2
    results: dict = {"config": vars(args), **machine_state(),
                     "majors": {str(m): {"stock": [], "strata": []} for m in args.majors}}
    with bench_dir() as base, local_cluster(strata_to_measure(), base / "cluster") as c:
        strata_env, stock = {}, {}
        try:
            for major in args.majors:
                tenant = f"v{major}"
                c.run("tenant", "create", tenant, "--pg-version", str(major), timeout=300)
                connstr = c.endpoint_start(f"{tenant}-ep", "main", "--tenant", tenant)
                strata_env[major] = client_env(connstr)
                pg = PgCluster(bin_dir(major), base / f"stock{major}", traverse_root=base)
                pg.initdb()
                pg.start(STOCK)
                stock[major] = pg
            for _ in range(args.runs):
                for major in args.majors:
                    runs = results["majors"][str(major)]
                    runs["stock"].append(one_run(stock[major].client_env(), args))
                    runs["strata"].append(one_run(strata_env[major], args))
        finally:
            for pg in stock.values():
                pg.cleanup()
    write_results(result_stem("versions", args.quick), results, summary(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
