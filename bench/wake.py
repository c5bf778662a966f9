#!/usr/bin/env python3
"""Waking through the proxy (docs/proxy.md), next to stock PostgreSQL:

- wake:   a lazy endpoint (`--lazy --suspend-after 1`) of a database of
          each size sleeps; one client connects through the proxy by
          server name (TLS, verify-full) and runs the first query. Timed
          from the connect to the first result, `--wakes` times per size.
- stock:  the same database in a local data directory, cleanly shut
          down; `pg_ctl start -w` and the same first query, `--wakes`
          times per size.
- relay:  on a running endpoint, `pgbench -S -c 8 -j 2` through the proxy
          and directly to the compute (TLS both), alternating, `--runs`
          each; the proxy's added cost is the ratio of their tps, and the
          CPU time per transaction of the proxy, PostgreSQL and pgbench.
          Twice: every process on every core, then the proxy on a core of
          its own, as on a host of its own (bench/relay_cpu.py).

Goals (issue 46): wake p50 < 0.5 s and p99 < 1 s at both sizes; through
the proxy >= 0.9x direct on pgbench -S at 8 clients. Every service of the
cluster runs (the CLI's cluster, its proxy), and the machine's cores are
shared by the client, the proxy and the compute.

Usage: .venv/bin/python -m bench.wake [--sizes-gb 0.1,5] [--wakes 20] [--runs 5] [--seconds 10] [--quick]
Writes bench/results/wake.json and .txt (wake_quick.* with --quick) and prints medians, p99 and ratios.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

from bench import relay_cpu
from bench.harness import (FIRST_QUERY, bench_dir, client_env, local_cluster, machine_state, pgbench, pgbench_init,
                           parse_tps, result_stem, run_timeout, stock_cluster, strata_to_measure, write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.endpoint import Endpoint

# pgbench's tables take about 15 MB per unit of scale.
MB_PER_SCALE = 15


def scale_of(gb: float) -> int:
    return max(1, round(gb * 1000 / MB_PER_SCALE))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict:
    return {"p50": statistics.median(values), "p99": percentile(values, 99), "min": min(values),
            "max": max(values), "runs": values}


def proxy_env(cluster: LocalCluster, endpoint: str) -> dict:
    """libpq's environment for a client through the proxy, by server name."""
    svc = next(s for s in cluster.cluster_toml["services"] if s["kind"] == "proxy")
    password = (cluster.workdir / "endpoints" / endpoint / "password").read_text().splitlines()[0]
    env = client_env(f"postgresql://app:{password}@127.0.0.1:{svc['ports']['pg']}/postgres"
                     f"?sslmode=verify-full&sslrootcert={cluster.ca}")
    env.update(PGHOST=f"{endpoint}.localhost", PGHOSTADDR="127.0.0.1")
    return env


def proxy_connect(env: dict) -> psycopg.Connection:
    return psycopg.connect(host=env["PGHOST"], hostaddr=env["PGHOSTADDR"], port=env["PGPORT"], user=env["PGUSER"],
                           password=env["PGPASSWORD"], dbname="postgres", sslmode="verify-full",
                           sslrootcert=env["PGSSLROOTCERT"], autocommit=True, connect_timeout=60)


def wait_suspended(ep: Endpoint, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while ep.status()["state"] != "suspended":
        if time.monotonic() > deadline:
            raise RuntimeError(f"endpoint {ep.name} did not suspend:\n{ep.logs()}")
        time.sleep(0.1)


def strata_size(strata: Path, base: Path, gb: float, wakes: int) -> dict:
    """`wakes` wakes of a sleeping lazy endpoint of `gb` through the proxy."""
    with local_cluster(strata, base / f"strata-{gb}") as cluster:
        connstr = cluster.endpoint_start("w", "main", "--lazy", "--suspend-after", "1")
        pgbench_init(client_env(connstr), scale_of(gb), timeout=7200)
        ep = Endpoint(cluster, "w")
        env = proxy_env(cluster, "w")
        seconds = []
        for _ in range(wakes):
            wait_suspended(ep)
            t0 = time.monotonic()
            with proxy_connect(env) as conn:
                conn.execute(FIRST_QUERY).fetchone()
            seconds.append(time.monotonic() - t0)
        return summary(seconds)


def stock_size(base: Path, gb: float, wakes: int) -> dict:
    """`wakes` starts of a stock PostgreSQL of `gb` and its first query."""
    c = stock_cluster(base, f"stock-{gb}")
    try:
        c.initdb()
        c.start({"max_wal_size": "4GB"})
        pgbench_init(c.client_env(), scale_of(gb), timeout=7200)
        c.sql("CHECKPOINT")
        c.stop("fast")
        seconds = []
        for _ in range(wakes):
            t0 = time.monotonic()
            c.start()  # pg_ctl start -w
            with c.connect(connect_timeout=10) as conn:
                conn.execute(FIRST_QUERY).fetchone()
            seconds.append(time.monotonic() - t0)
            c.stop("fast")
        return summary(seconds)
    finally:
        c.cleanup()


def relay(strata: Path, base: Path, runs: int, secs: int) -> dict:
    """pgbench -S at 8 clients through the proxy and directly, alternating:
    with every process on every core, then with the proxy on a core of its
    own (bench/relay_cpu.py)."""
    with local_cluster(strata, base / "strata-relay") as cluster:
        connstr = cluster.endpoint_start("r")
        direct = client_env(connstr)
        pgbench_init(direct, 10)
        through = proxy_env(cluster, "r")
        proxy = relay_cpu.proxy_pids(cluster.workdir)
        out = {"shared": relay_cpu.measure(direct, through, proxy, runs, secs)}
        if (os.cpu_count() or 1) >= 2:
            relay_cpu.pin(proxy)
            try:
                out["pinned"] = relay_cpu.measure(direct, through, proxy, runs, secs)
            finally:
                relay_cpu.unpin(proxy)
    return out


def relay_lines(relay: dict, runs: int, secs: int) -> list[str]:
    lines = [f"pgbench -S, 8 clients, {runs} runs of {secs} s each, alternating; CPU per transaction:"]
    for placement, r in relay.items():
        p, d = r["medians"]["proxy"], r["medians"]["direct"]
        lines.append(f"  {placement:<7} through the proxy {p['tps']:.0f} tps, direct {d['tps']:.0f} tps, ratio"
                     f" {r['ratio']:.2f} (runs {min(r['ratios']):.2f}-{max(r['ratios']):.2f}); proxy"
                     f" {p['proxy_us']:.1f} us, postgres {p['postgres_us']:.1f} us (direct {d['postgres_us']:.1f}),"
                     f" pgbench {p['pgbench_us']:.1f} us (direct {d['pgbench_us']:.1f})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-gb", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 5.0])
    ap.add_argument("--wakes", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="smoke run: 0.05 GB, 5 wakes, 3 runs of 5 s")
    args = ap.parse_args()
    if args.quick:
        args.sizes_gb, args.wakes, args.runs, args.seconds = [0.05], 5, 3, 5
    strata = strata_to_measure()
    results: dict = {"config": vars(args), **machine_state(), "first_query": FIRST_QUERY, "sizes": []}
    with bench_dir() as base:
        results["relay"] = relay(strata, base, args.runs, args.seconds)
        for gb in args.sizes_gb:
            stock = stock_size(base, gb, args.wakes)
            wake = strata_size(strata, base, gb, args.wakes)
            results["sizes"].append({"gb": gb, "scale": scale_of(gb), "stock": stock, "wake": wake,
                                     "ratio": wake["p50"] / stock["p50"]})
    lines = [f"connect to first result ({FIRST_QUERY}); {args.wakes} wakes per size", "",
             f"{'GB':>6}{'wake p50':>10}{'p99':>8}{'range':>16}{'stock p50':>11}{'p99':>8}{'wake/stock':>12}"]
    for r in results["sizes"]:
        w, s = r["wake"], r["stock"]
        lines.append(f"{r['gb']:>6}{w['p50']:>10.3f}{w['p99']:>8.3f}{w['min']:>8.3f}-{w['max']:<7.3f}"
                     f"{s['p50']:>11.3f}{s['p99']:>8.3f}{r['ratio']:>12.2f}")
    lines += ["", *relay_lines(results["relay"], args.runs, args.seconds),
              "", "Goals: wake p50 < 0.5 s and p99 < 1 s at each size; proxy >= 0.9x direct."]
    text = "\n".join(lines)
    write_results(result_stem("wake", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
