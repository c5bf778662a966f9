#!/usr/bin/env python3
"""GetPage@LSN latency and throughput of the pageserver, next to the
loopback limit of the same client on this machine, in one run:

- strata:   `strata pagebench` against the pageserver of a local cluster,
            reading random blocks of pgbench_accounts (pgbench -i -s 10,
            written through an endpoint; the endpoint is then stopped and the
            pageserver checkpointed, so reads go to layer files, not only to
            memory)
- loopback: `strata pagebench --loopback-baseline` with the same connections
            and depth: an in-process server answering every GetPage with a
            prebuilt page, no lookup: what the client, the codec and the
            loopback network cost by themselves

Configurations: 1 and 8 connections at depth 1 (one request in flight per
connection), and the same with pipelining (depth 16). Each configuration
runs --runs times for --seconds, Strata and loopback alternating; medians
of the runs. Ratios strata/loopback: throughput (1.0 is the limit) and p50
latency (1.0 is the limit, higher is slower).

Usage: .venv/bin/python -m bench.getpage [--scale 10] [--seconds 10] [--runs 3] [--connections 1,8]
           [--depths 1,16] [--quick]
Writes bench/results/getpage.json and .txt (getpage_quick.* with --quick) and prints
medians and ratios.
"""

import argparse
import statistics
import sys

from bench.harness import (strata_to_measure, bench_dir, cluster_credentials, load_getpage_table, local_cluster,
                           machine_state, pagebench, pagebench_target, pageserver_metric, result_stem,
                           write_results)
from test_runner.fixtures.strata import http_text


def getpage_counters(text: str) -> dict[str, float]:
    """The pageserver's GetPage counters, to tell how many pages each
    batched lookup served."""
    return {name: pageserver_metric(text, f"{name}_total")
            for name in ("getpage_requests", "getpage_batches", "request_errors")}


def summary(runs: list[dict]) -> dict:
    """Medians of pagebench runs of one configuration."""
    return {
        "requests_per_s": statistics.median(r["requests_per_s"] for r in runs),
        "mb_per_s": statistics.median(r["mb_per_s"] for r in runs),
        "p50_us": statistics.median(r["latency_us"]["p50"] for r in runs),
        "p99_us": statistics.median(r["latency_us"]["p99"] for r in runs),
        "max_us": statistics.median(r["latency_us"]["max"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "requests_per_s_runs": [r["requests_per_s"] for r in runs],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs of 2 s")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs = 2, 2, 2
    strata_bin = strata_to_measure()
    configs = [(c, d) for d in args.depths for c in args.connections]
    results: dict = {"config": vars(args), **machine_state(), "configurations": []}
    with bench_dir() as base, local_cluster(strata_bin, base / "cluster") as cluster:
        data = load_getpage_table(cluster, args.scale)
        results["data"] = data
        target = [*pagebench_target(data), *cluster_credentials(cluster)]
        # One short unmeasured pass: connections, page cache, layer files opened.
        pagebench(strata_bin, target, 1, 16, min(args.seconds, 3))
        for connections, depth in configs:
            strata_runs, loop_runs = [], []
            before = getpage_counters(http_text(data["metrics_url"]))
            for _ in range(args.runs):
                strata_runs.append(pagebench(strata_bin, target, connections, depth, args.seconds))
                loop_runs.append(pagebench(strata_bin, ["--loopback-baseline"], connections, depth, args.seconds))
            after = getpage_counters(http_text(data["metrics_url"]))
            batches = after["getpage_batches"] - before["getpage_batches"]
            row = {"connections": connections, "depth": depth, "strata": summary(strata_runs),
                   "loopback": summary(loop_runs),
                   "pages_per_batch": (after["getpage_requests"] - before["getpage_requests"]) / batches
                   if batches else float("nan"),
                   "strata_runs": strata_runs, "loopback_runs": loop_runs}
            row["throughput_ratio"] = row["strata"]["requests_per_s"] / row["loopback"]["requests_per_s"]
            row["p50_ratio"] = row["strata"]["p50_us"] / row["loopback"]["p50_us"]
            row["p99_ratio"] = row["strata"]["p99_us"] / row["loopback"]["p99_us"]
            results["configurations"].append(row)

    data = results["data"]
    lines = [
        f"pgbench_accounts ({data['rel']}): {data['blocks']} blocks, {data['table_mb']:.0f} MB, scale {args.scale};"
        f" random blocks at the latest LSN; medians of {args.runs} x {args.seconds:g} s;"
        f" {data['timeline_after_checkpoint']['delta_layers']} delta layers after the checkpoint",
        "",
        f"{'conn':>5}{'depth':>6}{'strata req/s':>13}{'loop req/s':>12}{'req/s ratio':>12}"
        f"{'strata p50':>11}{'loop p50':>10}{'p50 ratio':>10}{'strata p99':>11}{'loop p99':>10}"
        f"{'strata MB/s':>12}{'pages/batch':>12}",
    ]
    for r in results["configurations"]:
        s, lb = r["strata"], r["loopback"]
        lines.append(
            f"{r['connections']:>5}{r['depth']:>6}{s['requests_per_s']:>13.0f}{lb['requests_per_s']:>12.0f}"
            f"{r['throughput_ratio']:>12.3f}{s['p50_us']:>9.0f}us{lb['p50_us']:>8.0f}us{r['p50_ratio']:>10.2f}"
            f"{s['p99_us']:>9.0f}us{lb['p99_us']:>8.0f}us{s['mb_per_s']:>12.0f}{r['pages_per_batch']:>12.2f}")
    lines += ["", "req/s ratio = strata / loopback (1.0 = the limit of this client and machine);"
              " p50 ratio = strata / loopback latency (1.0 = the limit, higher = slower)"]
    errors = sum(r["strata"]["errors"] + r["loopback"]["errors"] for r in results["configurations"])
    if errors:
        lines.append(f"ERRORS: {errors} failed requests")
    text = "\n".join(lines)
    # A smoke run keeps the real figures.
    write_results(result_stem("getpage", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
