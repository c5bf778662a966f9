#!/usr/bin/env python3
"""What an idle tenant costs, and how long one takes to make, side by side
in one run:

- strata: a local cluster (`strata init`: three safekeepers, a pageserver,
          a storage controller). Per service, its RSS, threads and open
          files are read from /proc before and after N tenants are made,
          each with `strata tenant create`, a `dev` branch
          (`strata branch create --tenant`) and, with --endpoints, an
          endpoint started and then stopped (asleep: no process); the
          difference over N is the cost of one idle tenant. Each tenant
          creation is timed as a user runs it (the CLI).
- stock:  what a tenant costs as a PostgreSQL of its own, which is how a
          team gives each customer a database without Strata: one idle
          stock PostgreSQL 15 (initdb, started): the RSS of its processes
          (their proportional share, PSS, so shared memory counts once),
          its processes and its open files; and the time of `initdb` plus
          the first start.

Goals (issue 46): at most 256 KiB of RSS and no thread per idle tenant in
every service; tenant creation p50 under 1 s. Idle means: nothing ran on
the tenant for --settle-secs after the last was made, which is longer than
the pageserver's `idle_after` (30 s), so that its timelines have gone idle
(docs/pageserver.md, "Idle timelines").

Usage: .venv/bin/python -m bench.tenants [--tenants 200] [--settle-secs 45] [--endpoints] [--quick]
Writes bench/results/tenants.json and .txt (tenants_quick.* with --quick).
"""

import argparse
import re
import statistics
import time
from pathlib import Path

from bench.harness import (RESULTS, bench_dir, local_cluster, machine_state, nearest_rank, result_stem,
                           stock_cluster, strata_to_measure, write_results)
from test_runner.fixtures.strata import http_text

SERVICES = ("pageserver", "sk1", "sk2", "sk3", "controller")


def proc_cost(pid: int) -> dict:
    """A process's resident memory (KiB), threads and open files, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "rss_kib": int(status["VmRSS"].split()[0]),
        "threads": int(status["Threads"]),
        "fds": len(list(Path(f"/proc/{pid}/fd").iterdir())),
    }


def pss_kib(pid: int) -> int:
    """A process's proportional set size: shared pages split among their users."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def services_cost(cluster) -> dict:
    return {name: proc_cost(cluster.pid(name)) for name in SERVICES}


def pageserver_timelines(cluster) -> dict:
    """The pageserver's timelines by state (active, idle), from its metrics."""
    text = http_text(cluster.http_url("pageserver", "/metrics"))
    found = re.findall(r'^strata_pageserver_timelines\{state="(\w+)"\} (\S+)$', text, re.M)
    return {state: int(float(v)) for state, v in found}


def children(pid: int) -> list[int]:
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = (task / "children").read_text().split()
            todo.extend(int(k) for k in kids)
    return out


def run_strata(strata_bin: Path, base: Path, n: int, settle: float, endpoints: bool) -> dict:
    with local_cluster(strata_bin, base / "cluster") as cluster:
        # The cluster's own tenant's timelines are running; let start-up settle.
        time.sleep(settle)
        before = services_cost(cluster)
        creates = []
        for i in range(n):
            name = f"t{i}"
            t = time.perf_counter()
            cluster.run("tenant", "create", name, timeout=300)
            creates.append(time.perf_counter() - t)
            cluster.run("branch", "create", "dev", "--tenant", name, timeout=300)
            if endpoints:
                cluster.run("endpoint", "start", f"{name}-ep", "--tenant", name, timeout=300)
                cluster.run("endpoint", "stop", f"{name}-ep", timeout=300)
        time.sleep(settle)
        after = services_cost(cluster)
        timelines = pageserver_timelines(cluster)
        per_tenant = {
            s: {k: (after[s][k] - before[s][k]) / n for k in ("rss_kib", "threads", "fds")} for s in SERVICES
        }
        return {
            "tenants": n,
            "before": before,
            "after": after,
            "per_idle_tenant": per_tenant,
            "pageserver_timelines": timelines,
            "create_seconds": creates,
            "create_p50_s": statistics.median(creates),
            "create_p90_s": nearest_rank(creates, 0.9),
            "create_max_s": max(creates),
        }


def run_stock(base: Path) -> dict:
    """One idle stock PostgreSQL: what each tenant would cost as a server of its own."""
    c = stock_cluster(base, "stock")
    try:
        t = time.perf_counter()
        c.initdb()
        c.start()
        made = time.perf_counter() - t
        time.sleep(2)
        pids = children(int((c.pgdata / "postmaster.pid").read_text().split("\n", 1)[0]))
        costs = [proc_cost(p) for p in pids]
        return {
            "processes": len(pids),
            "pss_kib": sum(pss_kib(p) for p in pids),
            "rss_kib": sum(x["rss_kib"] for x in costs),
            "fds": sum(x["fds"] for x in costs),
            "initdb_and_start_s": made,
        }
    finally:
        c.cleanup()


def summary(r: dict) -> str:
    s, stock = r["strata"], r["stock"]
    lines = [f"{s['tenants']} tenants, each with a branch" + (" and a sleeping endpoint" if r["endpoints"] else ""),
             f"pageserver timelines after: {s.get('pageserver_timelines')}",
             "per idle tenant (after - before) / N:",
             f"  {'service':<11} {'RSS KiB':>9} {'threads':>8} {'files':>6}"]
    for name, v in s["per_idle_tenant"].items():
        lines.append(f"  {name:<11} {v['rss_kib']:>9.1f} {v['threads']:>8.2f} {v['fds']:>6.2f}")
    total = sum(v["rss_kib"] for v in s["per_idle_tenant"].values())
    lines += [
        f"  all services {total:>8.1f} KiB",
        f"stock PostgreSQL per tenant: {stock['pss_kib']} KiB PSS ({stock['rss_kib']} KiB RSS), "
        f"{stock['processes']} processes, {stock['fds']} open files",
        f"ratio (stock / strata, memory per tenant): {stock['pss_kib'] / max(total, 1):.1f}x",
        f"tenant create: p50 {s['create_p50_s']:.3f} s, p90 {s['create_p90_s']:.3f} s, max {s['create_max_s']:.3f} s; "
        f"stock initdb + start {stock['initdb_and_start_s']:.2f} s",
        "goals: <= 256 KiB RSS and 0 threads per idle tenant in each service; create p50 < 1 s",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--settle-secs", type=float, default=45)
    p.add_argument("--endpoints", action="store_true", help="an endpoint per tenant, started then stopped")
    p.add_argument("--quick", action="store_true", help="20 tenants, 40 s to settle: a smoke run")
    args = p.parse_args()
    n, settle = (20, 40.0) if args.quick else (args.tenants, args.settle_secs)
    strata_bin = strata_to_measure()
    results = {"machine": machine_state(), "endpoints": args.endpoints, "results_dir": str(RESULTS)}
    with bench_dir() as base:
        results["stock"] = run_stock(base)
        results["strata"] = run_strata(strata_bin, base, n, settle, args.endpoints)
    write_results(result_stem("tenants", args.quick), results, summary(results))


if __name__ == "__main__":
    main()
