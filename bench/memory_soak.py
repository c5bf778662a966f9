#!/usr/bin/env python3
"""Memory over a long run, side by side in one run:

- strata: a local cluster (`strata init`: three safekeepers, a pageserver,
          a storage controller) and an endpoint on `main` under pgbench RW
          at --clients; every --interval seconds a branch is made from
          `main`, an endpoint started on it, pgbench_accounts read whole,
          the endpoint stopped and the branch deleted. The RSS of every
          service and of the writer's compute agent is read from /proc
          every --sample seconds.
- stock:  stock PostgreSQL 15 under the same pgbench; every --interval
          seconds a copy of pgbench_accounts is made, read whole and
          dropped (what a branch is to a stock server). The RSS of its
          processes is summed over the same samples, for --stock-minutes.

Figures per process: RSS after the warm-up (the first quarter of the run:
caches and in-memory layers fill), at the end, the highest, and the slope
over the rest of the run (least squares, MiB per hour). Goal (issue 49):
every service's RSS flat after the warm-up, whatever the number of branches
made and deleted: the slope within the noise of stock's, and no process
above its bound (the pageserver's: its in-memory layers, about three times
`checkpoint_distance`, plus its caches).

The pageserver's layers keep part of each file in memory (index summaries,
key filters), which grows with the history kept until
`layer_index_cache_bytes`; the report gives it beside the local layer
bytes, and --layer-index-mib sets that budget for a run.

Usage: .venv/bin/python -m bench.memory_soak [--minutes 120] [--interval 60] [--layer-index-mib N] [--quick]
Writes bench/results/memory_soak.json and .txt (memory_soak_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.harness import (RESULTS, bench_dir, client_env, local_cluster, machine_state, pgbench_init,
                           pgbench_process, psql, result_stem, stock_postgres, strata_to_measure, write_results)
from test_runner.fixtures.processes import read_pid

SERVICES = ("pageserver", "sk1", "sk2", "sk3", "controller")
SCAN = "SELECT count(*), sum(abalance) FROM pgbench_accounts"


def rss_kib(pid: int | None) -> int:
    """A process's resident memory in KiB (0 if it is gone)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(root: int) -> int:
    """The RSS of a process and all its descendants, summed (a stock
    PostgreSQL's postmaster, backends and auxiliary processes; shared
    buffers count in each that touched them, as `ps` shows them)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(d.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss_kib(pid)
        todo += children.get(pid, [])
    return total


def slope_mib_per_hour(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, KiB) points, in MiB per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / den * 3600 / 1024


def summarize(samples: list[dict], names: list[str]) -> dict:
    """Per process: RSS (MiB) after the warm-up quarter, at the end, the
    highest, and the slope after the warm-up."""
    if not samples:
        return {}
    end = samples[-1]["t"]
    warm = [s for s in samples if s["t"] >= end / 4] or samples
    out = {}
    for name in names:
        series = [(s["t"], s["rss_kib"][name]) for s in warm if s["rss_kib"].get(name)]
        if not series:
            continue
        out[name] = {
            "after_warmup_mib": series[0][1] / 1024,
            "end_mib": series[-1][1] / 1024,
            "max_mib": max(v for _, v in series) / 1024,
            "slope_mib_per_hour": slope_mib_per_hour(series),
        }
    return out


def sample_under_load(load, minutes: float, args, rss, cycle) -> tuple[list[dict], int]:
    """Samples `rss()` every `args.sample` seconds for `minutes` while
    `load` (a pgbench process) runs, calling `cycle(n)` every
    `args.interval` seconds; stops the load at the end. The samples and
    the cycles done."""
    samples, cycles = [], 0
    try:
        started = time.monotonic()
        next_cycle = started + args.interval
        while (now := time.monotonic()) - started < minutes * 60:
            if load.poll() is not None:
                raise RuntimeError(f"pgbench exited early ({load.returncode})")
            samples.append({"t": now - started, "cycles": cycles, "rss_kib": rss()})
            if now >= next_cycle:
                cycle(cycles)
                cycles += 1
                next_cycle += args.interval
            time.sleep(max(0.0, min(args.sample, next_cycle - time.monotonic())))
    finally:
        load.terminate()
        load.wait(timeout=60)
    return samples, cycles


def strata_run(base: Path, strata: Path, args) -> dict:
    settings = {} if args.layer_index_mib is None else {"layer_index_cache_bytes": args.layer_index_mib << 20}
    with local_cluster(strata, base / "strata",
                       prepare=lambda c: c.configure("pageserver", settings) if settings else None) as cluster:
        env = client_env(cluster.endpoint_start("writer"))
        pgbench_init(env, args.scale)
        agent = base / "strata" / "endpoints" / "writer" / "compute.pid"
        load = pgbench_process(env, "-c", str(args.clients), "-j", "2", "-T", str(int(args.minutes * 60) + 600),
                               "-n", output=False)

        def rss() -> dict:
            out = {name: rss_kib(cluster.pid(name)) for name in SERVICES}
            out["agent"] = rss_kib(read_pid(agent))
            # What the pageserver's layers keep in memory of their files
            # (bounded by layer_index_cache_bytes) and their bytes on disk:
            # the history's share of its RSS.
            try:
                m = cluster.metrics("pageserver")
                out["layer_index_kib"] = int(m.get("strata_pageserver_layer_index_bytes", 0)) // 1024
                out["local_layer_kib"] = int(m.get("strata_pageserver_local_layer_bytes", 0)) // 1024
            except OSError:
                pass
            return out

        samples, cycles = sample_under_load(load, args.minutes, args, rss, lambda n: branch_cycle(cluster, n))
    return {"samples": samples, "cycles": cycles, "summary": summarize(samples, [*SERVICES, "agent"]),
            "history": summarize([x for x in samples if "layer_index_kib" in x["rss_kib"]],
                                 ["layer_index_kib", "local_layer_kib"])}


def branch_cycle(cluster, n: int) -> None:
    """A branch made from main, an endpoint on it reading every account,
    the endpoint stopped and the branch deleted."""
    name = f"soak{n}"
    cluster.run("branch", "create", name, timeout=300)
    env = client_env(cluster.endpoint_start(f"e-{name}", name))
    psql(env, SCAN, timeout=600)
    cluster.endpoint_stop(f"e-{name}")
    cluster.run("branch", "delete", name, timeout=300)


def stock_run(base: Path, args) -> dict:
    with stock_postgres(base, "stock") as pg:
        env = pg.client_env()
        pgbench_init(env, args.scale)
        load = pgbench_process(env, "-c", str(args.clients), "-j", "2", "-T",
                               str(int(args.stock_minutes * 60) + 600), "-n", output=False)
        postmaster = pg._postmaster_pid()

        def table_cycle(n: int) -> None:
            # Stock's counterpart of a branch: a copy of the accounts, read and dropped.
            psql(env, f"CREATE TABLE soak{n} AS SELECT * FROM pgbench_accounts;"
                      f" SELECT count(*), sum(abalance) FROM soak{n}; DROP TABLE soak{n}", timeout=600)

        samples, cycles = sample_under_load(load, args.stock_minutes, args,
                                            lambda: {"postgres": tree_rss_kib(postmaster)}, table_cycle)
    return {"samples": samples, "cycles": cycles, "summary": summarize(samples, ["postgres"])}


def report(results: dict) -> str:
    s, k = results["strata"], results["stock"]
    lines = [f"memory soak: {results['config']['minutes']} min, a branch every {results['config']['interval']} s "
             f"({s['cycles']} made, read and deleted), pgbench RW -c {results['config']['clients']} "
             f"at scale {results['config']['scale']}",
             f"  {'process':<11} {'after warm-up':>14} {'end':>8} {'highest':>8} {'slope MiB/h':>12}"]
    rows = [*s["summary"].items(), *(("stock " + n, v) for n, v in k["summary"].items())]
    for name, v in rows:
        lines.append(f"  {name:<11} {v['after_warmup_mib']:>14.1f} {v['end_mib']:>8.1f} {v['max_mib']:>8.1f} "
                     f"{v['slope_mib_per_hour']:>12.1f}")
    lines.append(f"  stock ran {results['config']['stock_minutes']} min ({k['cycles']} table copies made, read, dropped)")
    h = s.get("history", {})
    mib = results["config"].get("layer_index_mib")
    budget = "the default" if mib is None else f"{mib} MiB"
    if h.get("layer_index_kib") and h.get("local_layer_kib"):
        lines.append(f"  pageserver layer indexes in memory: {h['layer_index_kib']['after_warmup_mib']:.1f} -> "
                     f"{h['layer_index_kib']['end_mib']:.1f} MiB (layer_index_cache_bytes: {budget}), for "
                     f"{h['local_layer_kib']['after_warmup_mib']:.0f} -> {h['local_layer_kib']['end_mib']:.0f} MiB "
                     f"of local layers")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=120)
    p.add_argument("--stock-minutes", type=float, default=20)
    p.add_argument("--interval", type=float, default=60, help="seconds between branches")
    p.add_argument("--sample", type=float, default=10, help="seconds between RSS samples")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--layer-index-mib", type=int, default=None,
                   help="the pageserver's layer_index_cache_bytes in MiB (default: its own default, 128)")
    p.add_argument("--quick", action="store_true", help="3 minutes, a branch every 15 s")
    args = p.parse_args()
    if args.quick:
        args.minutes, args.stock_minutes, args.interval, args.sample, args.scale = 3, 1, 15, 5, 2
    strata = strata_to_measure()
    machine = machine_state()
    with bench_dir("strata-memory-soak-") as base:
        results = {"config": vars(args) | {"strata": str(strata)}, "machine": machine,
                   "strata": strata_run(base, strata, args), "stock": stock_run(base, args)}
    text = report(results)
    print(text)
    write_results(result_stem("memory_soak", args.quick), results, text)


if __name__ == "__main__":
    main()
