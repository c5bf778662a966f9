#!/usr/bin/env python3
"""An online split of a tenant under load (`strata tenant split`,
docs/sharding.md, "Split, step by step"), as a user runs it: one local
cluster with two pageservers, every service on, and per run a fresh
tenant with pgbench's tables (`--scale`, 50: about 750 MB), checkpointed
so that its layers are in object storage. pgbench RW (`-c 4`, progress
every second) runs throughout: `--seconds` of load, then `strata tenant
split NAME --shards 2` (its wall time: from the request to the layout
recorded, through prepared, copied and done), then `--seconds` more while
the children part onto the two pageservers.

Side by side in each run: the tenant's own tps before the split (the same
cluster and load, unsplit) against its tps during the split and after;
and the bytes a copying split would move (the tenant's objects in object
storage) against what this one wrote under the children's prefixes by the
time it was done (their indexes, and the first layers they uploaded).
Stock PostgreSQL has no split to set beside it: its reference is the
tenant before the split. On a 2-core machine the compute, pgbench and
every service share two CPUs; the after-split tps is two pageservers'
work on those same two CPUs.

Usage: .venv/bin/python -m bench.split [--scale 50] [--seconds 20] [--runs 3] [--stripe-blocks 2048] [--quick]
Writes bench/results/split.json and .txt (split_quick.* with --quick).
"""

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

from bench.harness import (bench_dir, client_env, local_cluster, machine_state, pgbench_init, pgbench_process,
                           result_stem, strata_to_measure, write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.strata import http_json

PROGRESS = re.compile(r"^progress: ([0-9.]+) s, ([0-9.]+) tps", re.M)
# How long the load may run past the split and the time after it.
SPLIT_ALLOWANCE_S = 900


def objects_bytes(cluster: LocalCluster, tenant_id: str) -> dict[str, int]:
    """Bytes of the tenant's objects in object storage (the cluster's local
    directory), by prefix: the tenant's own and each shard's."""
    root = cluster.workdir / "remote_storage" / "tenants"
    out = {}
    for d in sorted(root.glob(f"{tenant_id}*")):
        out[d.name] = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())
    return out


def placements(cluster: LocalCluster, tenant_id: str) -> dict[str, str]:
    """The pageserver each shard of the tenant is attached to, by shard id."""
    for s in cluster.cluster_toml["services"]:
        if s["kind"] == "controller":
            code, body = http_json("GET", cluster.http_url(s["name"], "/v1/status"), timeout=10)
            if code == 200 and body["leader"]:
                return {t: p["attached"] for t, p in body["state"]["tenants"].items() if t.startswith(tenant_id)}
    return {}


def window(progress: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """The per-second tps pgbench reported between `start` and `end` (seconds of its run)."""
    return [tps for t, tps in progress if start < t <= end]


def one_run(cluster: LocalCluster, n: int, args) -> dict:
    name = f"big{n}"
    cluster.run("tenant", "create", name, timeout=600)
    tid = cluster.tenant(name)["tenant_id"]
    env = client_env(cluster.endpoint_start(f"ep-{name}", "main", "--tenant", name))
    pgbench_init(env, args.scale)
    cluster.run("timeline", "checkpoint", "--tenant", name, timeout=3600)
    parent_bytes = sum(objects_bytes(cluster, tid).values())
    load = pgbench_process(env, "-n", "-c", "4", "-j", "2", "-P", "1",
                           "-T", str(2 * args.seconds + SPLIT_ALLOWANCE_S))
    started = time.monotonic()
    time.sleep(args.seconds)
    split_from = time.monotonic() - started
    out = cluster.run("tenant", "split", name, "--shards", "2", "--stripe-blocks", str(args.stripe_blocks),
                      timeout=SPLIT_ALLOWANCE_S).stdout
    split_to = time.monotonic() - started
    by_prefix = objects_bytes(cluster, tid)
    time.sleep(args.seconds)
    load.terminate()
    _, err = load.communicate(timeout=60)
    progress = [(float(t), float(tps)) for t, tps in PROGRESS.findall(err)]
    before = window(progress, 1, split_from)
    during = window(progress, split_from, split_to)
    after = window(progress, split_to, split_to + args.seconds)
    if not before or not after:
        raise RuntimeError(f"pgbench reported too little progress:\n{err[-2000:]}")
    children = sum(b for p, b in by_prefix.items() if p != tid)
    where = placements(cluster, tid)
    cluster.endpoint_stop(f"ep-{name}")
    cluster.run("tenant", "delete", name, timeout=600)
    return {"split_s": split_to - split_from, "output": out.strip().splitlines()[-1:],
            "tps_before": statistics.median(before), "tps_during": statistics.median(during or [0.0]),
            "tps_during_min": min(during or [0.0]), "tps_after": statistics.median(after),
            "seconds_at_zero_tps": sum(1 for t in during + after if t == 0),
            "parent_object_bytes": parent_bytes, "children_object_bytes_at_done": children,
            "placement_after": where, "progress": progress}


def summary(runs: list[dict], args) -> str:
    med = statistics.median

    def figure(key: str, fmt: str = "{:.1f}") -> str:
        values = [r[key] for r in runs]
        return f"{fmt.format(med(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"

    ratio = lambda a, b: [r[a] / r[b] for r in runs if r[b]]  # noqa: E731
    lines = [f"split 1 -> 2 of a pgbench scale {args.scale} tenant under pgbench RW -c 4, {len(runs)} runs "
             "(median, range)",
             f"  split wall s:                         {figure('split_s')}",
             f"  tps before / during / after:          {figure('tps_before', '{:.0f}')} / "
             f"{figure('tps_during', '{:.0f}')} / {figure('tps_after', '{:.0f}')}",
             f"  tps during ÷ before:                  {med(ratio('tps_during', 'tps_before')):.2f}",
             f"  tps after ÷ before:                   {med(ratio('tps_after', 'tps_before')):.2f}",
             f"  lowest second's tps during:           {figure('tps_during_min', '{:.0f}')}",
             f"  seconds at 0 tps (during + after):    {figure('seconds_at_zero_tps', '{:.0f}')}",
             f"  the tenant's objects (a copy's bytes): {figure('parent_object_bytes', '{:.0f}')}",
             f"  written under the children by done:    {figure('children_object_bytes_at_done', '{:.0f}')}",
             f"  written ÷ a copy's:                    "
             f"{med(ratio('children_object_bytes_at_done', 'parent_object_bytes')):.4f}"]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=50)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stripe-blocks", type=int, default=2048)
    p.add_argument("--quick", action="store_true", help="a smoke run: scale 5, 5 s windows, one run")
    args = p.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs = 5, 5, 1
    strata = strata_to_measure()
    runs = []
    with bench_dir() as base:
        with local_cluster(strata, base / "cluster", "--pageservers", "2") as c:
            for n in range(args.runs):
                runs.append(one_run(c, n, args))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "progress"}), file=sys.stderr)
    text = summary(runs, args)
    write_results(result_stem("split", args.quick), {"config": vars(args), "machine": machine_state(), "runs": runs},
                  text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
