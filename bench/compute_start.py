#!/usr/bin/env python3
"""Compute start time against database size, eager and lazy mode, next to
stock PostgreSQL starting on a local data directory of the same size:

- eager:  `strata endpoint start --eager` on a local cluster whose database
          was loaded with pgbench -i -s N (then the endpoint was stopped):
          sync the safekeepers, wait for the pageserver, download and unpack
          the full basebackup, start PostgreSQL and its WAL proposer. Timed
          from the command to the first successful query; the agent's own
          phase durations are read from its /v1/status (`timings`).
- lazy:   the same with `--lazy` (docs/lazy-compute.md): the basebackup
          carries no relation data, relation files are served through FUSE
          and their blocks fetched as PostgreSQL reads them. Its local disk
          use is what the data directory and the backing directory hold
          (allocated bytes, FUSE mounts not crossed).
- stock:  the same database in a local data directory, cleanly shut down
          (pg_ctl stop -m fast), then `pg_ctl start -w` and the same first
          query.

Both read from a warm page cache. For each scale, --runs starts of each;
medians, and the ratio strata/stock. Eager start grows with the database
(the whole of it is copied before PostgreSQL starts); this is the baseline
that a lazy start (pages fetched on demand) must beat: about a second,
whatever the size.

Usage: .venv/bin/python -m bench.compute_start [--scales 1,10,30] [--runs 5] [--quick]
Writes bench/results/compute_start.json and .txt (compute_start_quick.* with --quick) and prints
medians and ratios.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.harness import (FIRST_QUERY, bench_dir, client_env, first_query, local_cluster, machine_state,
                           pgbench_init, result_stem, stock_cluster, strata_to_measure, timeline_url, wait_ingested,
                           write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.endpoint import Endpoint
from test_runner.fixtures.strata import http_json

PHASES = ["timeline_lookup_seconds", "sync_seconds", "wait_seconds", "basebackup_seconds", "config_seconds",
          "mount_seconds", "postgres_start_seconds", "proposer_start_seconds", "total_seconds"]


def du(path: Path) -> int:
    """Apparent bytes under `path` (`du -sb`)."""
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def du_local(path: Path) -> int:
    """Bytes allocated under `path`, not crossing into other file systems (the FUSE mounts)."""
    out = subprocess.run(["du", "-sx", "--block-size=1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def strata_scale(strata_bin: Path, base: Path, scale: int, runs: int) -> dict:
    """Both modes on one cluster loaded once: {"eager": ..., "lazy": ...}."""
    with local_cluster(strata_bin, base / f"strata-s{scale}") as cluster:
        tl_url = timeline_url(cluster)
        connstr = cluster.endpoint_start("main")
        pgbench_init(client_env(connstr), scale, timeout=1800)
        cluster.endpoint_stop("main")
        return {mode: strata_mode(cluster, tl_url, mode, runs) for mode in ("eager", "lazy")}


def strata_mode(cluster: LocalCluster, tl_url: str, mode: str, runs: int) -> dict:
    """`runs` starts of the endpoint in `mode` (eager or lazy)."""
    starts = []
    first = mode == "eager"
    for i in range(runs):
        # Start from a quiet cluster: the pageserver holds all the WAL and,
        # the first time, has written it to layer files.
        wait_ingested(cluster, tl_url)
        if i == 0 and first:
            code, body = http_json("POST", f"{tl_url}/checkpoint", timeout=300)
            assert code == 200, body
        t0 = time.monotonic()
        connstr = cluster.endpoint_start("main", "main", f"--{mode}")
        t_cmd = time.monotonic()
        first_query(lambda: psycopg.connect(connstr, autocommit=True, connect_timeout=10))
        t1 = time.monotonic()
        agent = Endpoint(cluster, "main").agent_status()
        with psycopg.connect(connstr, autocommit=True) as conn:
            db_bytes = conn.execute("SELECT sum(pg_database_size(oid)) FROM pg_database").fetchone()[0]
        pgdata = cluster.workdir / "endpoints" / "main" / "pgdata"
        local = du_local(pgdata)
        if (backing := pgdata.with_name("pgdata.lazy")).exists() and mode == "lazy":
            local += du_local(backing)
        starts.append({"seconds": t1 - t0, "command_seconds": t_cmd - t0, "timings": agent["timings"],
                       "database_bytes": int(db_bytes), "pgdata_bytes": local})
        cluster.endpoint_stop("main")
    return {
        "seconds": statistics.median(s["seconds"] for s in starts),
        "command_seconds": statistics.median(s["command_seconds"] for s in starts),
        "phases": {p: statistics.median(s["timings"][p] for s in starts) for p in PHASES},
        "basebackup_bytes": statistics.median(s["timings"]["basebackup_bytes"] for s in starts),
        "database_bytes": starts[-1]["database_bytes"],
        "pgdata_bytes": starts[-1]["pgdata_bytes"],
        "runs": starts,
    }


def stock_scale(base: Path, scale: int, runs: int) -> dict:
    c = stock_cluster(base, f"stock-s{scale}")
    try:
        c.initdb()
        c.start({"max_wal_size": "2GB"})
        pgbench_init(c.client_env(), scale, timeout=1800)
        c.sql("CHECKPOINT")
        db_bytes = int(c.sql("SELECT sum(pg_database_size(oid)) FROM pg_database")[0][0])
        c.stop("fast")
        starts = []
        for _ in range(runs):
            t0 = time.monotonic()
            c.start()  # pg_ctl start -w, then a connection
            first_query(lambda: c.connect(connect_timeout=10))
            starts.append(time.monotonic() - t0)
            c.stop("fast")
        return {"seconds": statistics.median(starts), "database_bytes": db_bytes, "pgdata_bytes": du(c.pgdata),
                "runs": starts}
    finally:
        c.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 30])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smoke run: scales 1 and 3, 2 runs each")
    args = ap.parse_args()
    if args.quick:
        args.scales, args.runs = [1, 3], 2
    strata = strata_to_measure()
    results: dict = {"config": vars(args), **machine_state(), "first_query": FIRST_QUERY, "scales": []}
    with bench_dir() as base:
        for scale in args.scales:
            stock = stock_scale(base, scale, args.runs)
            modes = strata_scale(strata, base, scale, args.runs)
            results["scales"].append({"scale": scale, "stock": stock, "strata": modes["eager"], "lazy": modes["lazy"],
                                      "ratio": modes["eager"]["seconds"] / stock["seconds"],
                                      "lazy_ratio": modes["lazy"]["seconds"] / stock["seconds"]})

    lines = [
        f"start to first query ({FIRST_QUERY}); medians of {args.runs} starts",
        "",
        f"{'scale':>6}{'db MB':>8}{'stock s':>9}{'eager s':>9}{'lazy s':>8}{'lazy/stock':>11}{'lazy/eager':>11}"
        f"{'eager local MB':>15}{'lazy local MB':>14}",
    ]
    for r in results["scales"]:
        s, e, z = r["stock"], r["strata"], r["lazy"]
        lines.append(
            f"{r['scale']:>6}{s['database_bytes'] / 1e6:>8.0f}{s['seconds']:>9.3f}{e['seconds']:>9.3f}"
            f"{z['seconds']:>8.3f}{r['lazy_ratio']:>11.2f}{z['seconds'] / e['seconds']:>11.2f}"
            f"{e['pgdata_bytes'] / 1e6:>15.1f}{z['pgdata_bytes'] / 1e6:>14.1f}")
    for mode, key in (("eager", "strata"), ("lazy", "lazy")):
        lines += [
            "",
            f"{mode} mode, by phase:",
            "",
            f"{'scale':>6}{'db MB':>8}{'stock s':>9}{'strata s':>10}{'ratio':>8}{'basebackup MB':>15}"
            f"{'sync':>7}{'wait':>7}{'bbackup':>9}{'config':>8}{'mount':>7}{'pg start':>9}{'proposer':>9}"
            f"{'agent':>7}{'other':>7}",
        ]
        for r in results["scales"]:
            s, t = r["stock"], r[key]
            p = t["phases"]
            lines.append(
                f"{r['scale']:>6}{s['database_bytes'] / 1e6:>8.0f}{s['seconds']:>9.3f}{t['seconds']:>10.3f}"
                f"{t['seconds'] / s['seconds']:>8.1f}{t['basebackup_bytes'] / 1e6:>15.0f}{p['sync_seconds']:>7.3f}"
                f"{p['wait_seconds']:>7.3f}{p['basebackup_seconds']:>9.3f}{p['config_seconds']:>8.3f}"
                f"{p['mount_seconds']:>7.3f}{p['postgres_start_seconds']:>9.3f}{p['proposer_start_seconds']:>9.3f}"
                f"{p['total_seconds']:>7.3f}{t['seconds'] - p['total_seconds']:>7.3f}")
    lines += [
        "",
        "seconds: strata = `strata endpoint start` to the first successful query; stock = pg_ctl start -w"
        " to the same query; ratio = strata / stock",
        "phases (s): the agent's timings; other = the command's own polling, process start and the query",
        "Eager start grows with the database size; a lazy one should not (goal: under 1 s at every size).",
        "local MB: the endpoint's data directory (and, lazy, its backing directory) right after the first query.",
    ]
    text = "\n".join(lines)
    # A smoke run keeps the real figures.
    write_results(result_stem("compute_start", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
