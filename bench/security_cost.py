#!/usr/bin/env python3
"""What TLS and tokens cost, in one run, on one local cluster made through
the CLI, restarted between runs in each of two modes:

- secure:   as `strata init` makes it and users run it: tokens on every
            call, TLS with the cluster's CA on every link that has it
- insecure: the same cluster with its services' [auth] and [tls] removed
            (and the workdir's keys and CA moved aside), which is what
            `strata init --insecure-loopback` makes: no tokens, no TLS

One cluster, not two: a GetPage's cost depends far more on the
pageserver's layer layout, which two clusters do not share, than on TLS,
and two clusters loaded alike gave pgbench ratios a few percent apart for
the same build. Measured, the modes alternating run by run (medians of
--runs runs):

- GetPage p50: `strata pagebench`, 1 connection, depth 1, random blocks of
  pgbench_accounts (loaded with pgbench -i, the endpoint stopped and the
  pageserver checkpointed, so reads go to layer files);
- what TLS alone costs a round trip on this machine: `strata pagebench
  --loopback-baseline` (an in-process server answering every GetPage with
  a fixed page) with and without `--loopback-tls`;
- pgbench RW (TPC-B-like) at 8 clients against a new endpoint of the
  cluster, its tables and indexes prewarmed (pg_prewarm) so that the run
  measures the write path rather than a lazy compute's first reads.

Ratios secure / insecure: tps (target >= 0.95) and GetPage p50 latency
(target <= 1.05).

Usage: .venv/bin/python -m bench.security_cost [--scale 10] [--seconds 30] [--getpage-seconds 10] [--runs 3] [--quick]
Writes bench/results/security_cost.json and .txt (security_cost_quick.* with --quick).
"""

import argparse
import os
import shutil
import statistics
import sys

from bench.harness import (PGBENCH_PREWARM, strata_to_measure, bench_dir, client_env, cluster_credentials,
                           load_getpage_table, local_cluster, machine_state, pagebench, pagebench_target,
                           pgbench_tps, psql, result_stem, run_timeout, write_results)
from test_runner.fixtures.cluster import LocalCluster

MODES = {"secure": [], "insecure": ["--insecure-loopback"]}


def strip_tables(text: str, names: tuple[str, ...]) -> str:
    """A TOML text without the tables `[name]` of `names` (each up to the
    next table header)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        header = line.strip()
        if header.startswith("["):
            skipping = header.strip("[]") in names
        if not skipping:
            out.append(line)
    return "".join(out)


def set_security(c: LocalCluster, on: bool) -> None:
    """Restarts cluster `c` on the same data with its services' [auth] and
    [tls] on or off. Off, the workdir's `tls/` and `auth/` (the CA the CLI
    trusts, the key it signs with) are moved aside, so the CLI speaks
    plaintext without tokens, as to a `--insecure-loopback` cluster."""
    c.run("stop", timeout=600)
    # Restarted either way, so that each mode is measured after a restart.
    if (c.workdir / "tls").exists() == on:
        c.start()
        return
    for svc in c.cluster_toml["services"]:
        conf = c.workdir / svc["config"]
        saved = conf.with_name(conf.name + ".secure")
        if on:
            saved.replace(conf)
        else:
            shutil.copyfile(conf, saved)
            conf.write_text(strip_tables(conf.read_text(), ("auth", "tls")))
    for d in ("tls", "auth"):
        live, aside = c.workdir / d, c.workdir / f"{d}.off"
        (aside.rename(live) if on else live.rename(aside))
    c.start()


def prewarm(connstr: str) -> None:
    """Reads every page of the pgbench tables and indexes into the new
    compute's cache, so that each run measures the write path, not the
    first reads of a lazy compute."""
    psql(client_env(connstr), f"CREATE EXTENSION IF NOT EXISTS pg_prewarm; {PGBENCH_PREWARM}")


def pgbench_rw(connstr: str, clients: int, seconds: int) -> float:
    """tps of one pgbench TPC-B-like run (no vacuum: the tables are shared by runs)."""
    return pgbench_tps(client_env(connstr), "-n", "-c", str(clients), "-j", "2", "-T", str(seconds),
                       timeout=run_timeout(seconds))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=30, help="length of each pgbench run")
    ap.add_argument("--getpage-seconds", type=float, default=10, help="length of each pagebench run")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs of 3 s")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.getpage_seconds, args.runs = 2, 3, 3, 2
    strata_bin = strata_to_measure()
    results: dict = {"config": vars(args), **machine_state()}
    with bench_dir() as base, local_cluster(strata_bin, base / "cluster") as c:
        data = load_getpage_table(c, args.scale)
        plain = pagebench_target(data)
        targets = {"secure": [*plain, *cluster_credentials(c)], "insecure": plain}
        getpage: dict[str, list[dict]] = {m: [] for m in MODES}
        loopback: dict[str, list[dict]] = {m: [] for m in MODES}
        tps: dict[str, list[float]] = {m: [] for m in MODES}
        try:
            for _ in range(args.runs):
                for mode in MODES:
                    set_security(c, mode == "secure")
                    pagebench(strata_bin, targets[mode], 1, 1, min(args.getpage_seconds, 3))  # warm
                    getpage[mode].append(pagebench(strata_bin, targets[mode], 1, 1, args.getpage_seconds))
                    flags = ["--loopback-baseline", *(["--loopback-tls"] if mode == "secure" else [])]
                    loopback[mode].append(pagebench(strata_bin, flags, 1, 1, args.getpage_seconds))
                    connstr = c.endpoint_start("main")
                    prewarm(connstr)
                    pgbench_rw(connstr, args.clients, min(args.seconds, 5))  # warm
                    tps[mode].append(pgbench_rw(connstr, args.clients, args.seconds))
                    c.endpoint_stop("main")
        finally:
            if not (c.workdir / "tls").exists():
                set_security(c, True)
    p50 = {m: statistics.median(r["latency_us"]["p50"] for r in getpage[m]) for m in MODES}
    loop_p50 = {m: statistics.median(r["latency_us"]["p50"] for r in loopback[m]) for m in MODES}
    tps_median = {m: statistics.median(tps[m]) for m in MODES}
    results.update({
        "getpage_runs": getpage, "tps_runs": tps, "getpage_p50_us": p50, "tps": tps_median,
        "getpage_p50_ratio": p50["secure"] / p50["insecure"],
        "loopback_runs": loopback, "loopback_p50_us": loop_p50,
        "loopback_p50_ratio": loop_p50["secure"] / loop_p50["insecure"],
        "tps_ratio": tps_median["secure"] / tps_median["insecure"],
        "errors": sum(r["errors"] for m in MODES for r in getpage[m]),
    })
    lines = [
        f"scale {args.scale}; medians of {args.runs} runs, alternating (GetPage: one cluster's data, its"
        " services restarted with and without [auth] and [tls]; pgbench: a new endpoint of that cluster, prewarmed);"
        f" {os.cpu_count()} CPUs, load {results['loadavg_before']:.2f} before",
        "",
        f"{'':<28}{'secure':>12}{'insecure':>12}{'ratio':>8}",
        f"{'GetPage p50 (1 conn, depth 1)':<28}{p50['secure']:>10.0f}us{p50['insecure']:>10.0f}us"
        f"{results['getpage_p50_ratio']:>8.3f}",
        f"{f'pgbench RW, {args.clients} clients, tps':<28}{tps_median['secure']:>12.0f}{tps_median['insecure']:>12.0f}"
        f"{results['tps_ratio']:>8.3f}",
        f"{'loopback round trip p50':<28}{loop_p50['secure']:>10.1f}us{loop_p50['insecure']:>10.1f}us"
        f"{results['loopback_p50_ratio']:>8.3f}   (TLS alone: in-process server, fixed page)",
        "",
        "secure: tokens and TLS (strata init); insecure: strata init --insecure-loopback;"
        " targets: GetPage p50 ratio <= 1.05, tps ratio >= 0.95",
        "tps runs: " + "; ".join(f"{m} {', '.join(f'{t:.0f}' for t in tps[m])}" for m in MODES),
    ]
    if results["errors"]:
        lines.append(f"ERRORS: {results['errors']} failed GetPage requests")
    text = "\n".join(lines)
    write_results(result_stem("security_cost", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
