#!/usr/bin/env python3
"""A tenant of 1, 2 and 4 shards on one local cluster with four
pageservers (`strata tenant create --shards N`, docs/sharding.md), side by
side in one run:

- ingest:  a table of `--rows` rows (10 M; `INSERT … SELECT` from
           generate_series) loaded through a lazy endpoint. Raw WAL is the
           compute's LSN difference; wall is the time until every shard's
           pageserver has ingested it; per pageserver, CPU seconds
           (/proc/PID/stat, user + system) and the bytes of its WAL stream
           from the safekeepers (strata_pageserver_wal_stream_bytes: raw
           WAL, or decoded batches compressed), and the safekeepers' CPU.
           Ratios: bytes per pageserver / raw WAL, CPU per pageserver / the
           1-shard CPU.
- pgbench: `pgbench -i -s --scale`, then `--runs` runs of RW (`-c 4 -T
           --seconds`) and of -S; tps medians, ratio to 1 shard.
- GetPage: `strata pagebench` on pgbench_accounts, every shard at once
           (one connection per shard, depth 8): requests per second.

The issue's goals (docs/sharding.md) are bytes sent to pageservers ≤ 0.3×
raw WAL at 1 shard and ≤ 0.5× per shard at 4, decode CPU per pageserver
at 4 shards ≤ 0.35× one shard's, and no pgbench regression at 1 shard;
this prints each figure next to its goal. On a 2-core machine the four
pageservers, three safekeepers and the compute share two CPUs: wall times
do not scale with shards here, CPU seconds and bytes per pageserver do.

Layouts: 1, 2, 4 shards as a cluster runs them by default (sharded
tenants stream decoded WAL, the unsharded one raw WAL), and `1d`, one
shard streaming decoded WAL (a second cluster with `--wal-stream decoded`),
which is what the 1-shard bytes goal and the choice of `auto` rest on.

Usage: .venv/bin/python -m bench.sharding [--shards 1,1d,2,4] [--rows 10000000] [--scale 10] [--seconds 20]
           [--runs 3] [--stripe-blocks 2048] [--quick]
Writes bench/results/sharding.json and .txt (sharding_quick.* with --quick).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import psycopg

from bench.harness import (bench_dir, client_env, local_cluster, machine_state, pageserver_metric, parse_tps,
                           pgbench, pgbench_init, result_stem, run_timeout, strata_to_measure, write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.strata import http_json, http_text, parse_lsn

PAGESERVERS = ("pageserver", "pageserver2", "pageserver3", "pageserver4")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def snapshot(cluster: LocalCluster) -> dict[str, dict]:
    """Per pageserver: CPU seconds and WAL stream bytes received so far;
    the safekeepers' CPU seconds together."""
    out = {}
    for name in PAGESERVERS:
        text = http_text(cluster.http_url(name, "/metrics"), timeout=10)
        out[name] = {"cpu": cpu_seconds(cluster.pid(name)),
                     "wal_bytes": pageserver_metric(text, "wal_stream_bytes_total")}
    safekeepers = [s["name"] for s in cluster.cluster_toml["services"] if s["kind"] == "safekeeper"]
    out["safekeepers"] = {"cpu": sum(cpu_seconds(cluster.pid(n)) for n in safekeepers)}
    return out


def placements(cluster: LocalCluster, tenant_id: str) -> dict[str, str]:
    """The pageserver each shard of the tenant is attached to, by shard id."""
    for s in cluster.cluster_toml["services"]:
        if s["kind"] != "controller":
            continue
        code, body = http_json("GET", cluster.http_url(s["name"], "/v1/status"), timeout=10)
        if code == 200 and body["leader"]:
            return {t: p["attached"] for t, p in body["state"]["tenants"].items()
                    if t == tenant_id or t.startswith(tenant_id + "-")}
    raise RuntimeError("no leading controller")


def wait_shards(cluster: LocalCluster, tenant: dict, shard_ids: list[str], lsn: int, timeout: float = 3600) -> None:
    """Until every shard's pageserver has ingested the WAL up to `lsn`."""
    timeline = next(b["timeline_id"] for b in tenant["branches"] if b["name"] == "main")
    where = placements(cluster, tenant["tenant_id"])
    deadline = time.monotonic() + timeout
    for shard in shard_ids:
        url = cluster.http_url(where[shard], f"/v1/tenant/{shard}/timeline/{timeline}")
        while parse_lsn(http_json("GET", url, timeout=10)[1]["last_record_lsn"]) < lsn:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{shard} did not ingest up to {lsn:X}")
            time.sleep(0.05)


def one_layout(cluster: LocalCluster, strata, layout: str, args) -> dict:
    shards = int(layout.rstrip("d"))
    name = f"s{layout}"
    extra = ["--shards", str(shards), "--stripe-blocks", str(args.stripe_blocks)] if shards > 1 else []
    cluster.run("tenant", "create", name, *extra, timeout=600)
    tenant = cluster.tenant(name)
    tid = tenant["tenant_id"]
    shard_ids = [tid] if shards == 1 else [f"{tid}-{n}of{shards}" for n in range(shards)]
    connstr = cluster.endpoint_start(f"ep-{name}", "main", "--tenant", name)
    env = client_env(connstr)
    with psycopg.connect(connstr, autocommit=True) as conn:
        conn.execute("CREATE TABLE load (id bigint, v text)")
        start_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        before = snapshot(cluster)
        t0 = time.monotonic()
        conn.execute(f"INSERT INTO load SELECT g, md5(g::text) FROM generate_series(1, {args.rows}) g")
        end_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    wait_shards(cluster, tenant, shard_ids, end_lsn)
    wall = time.monotonic() - t0
    after = snapshot(cluster)
    raw = end_lsn - start_lsn
    where = placements(cluster, tid)
    used = sorted(set(where[s] for s in shard_ids))
    per_ps = {ps: {"cpu_s": after[ps]["cpu"] - before[ps]["cpu"],
                   "wal_bytes": after[ps]["wal_bytes"] - before[ps]["wal_bytes"]} for ps in used}
    ingest = {"raw_wal_bytes": raw, "wall_s": wall, "pageservers": per_ps,
              "safekeepers_cpu_s": after["safekeepers"]["cpu"] - before["safekeepers"]["cpu"],
              "bytes_per_pageserver_vs_raw": max(p["wal_bytes"] for p in per_ps.values()) / raw,
              "cpu_per_pageserver_s": max(p["cpu_s"] for p in per_ps.values())}

    pgbench_init(env, args.scale, timeout=3600)
    rw = [parse_tps(pgbench(env, "-n", "-c", "4", "-j", "2", "-T", str(args.seconds),
                            timeout=run_timeout(args.seconds))) for _ in range(args.runs)]
    ro = [parse_tps(pgbench(env, "-n", "-S", "-c", "4", "-j", "2", "-T", str(args.seconds),
                            timeout=run_timeout(args.seconds))) for _ in range(args.runs)]

    with psycopg.connect(connstr, autocommit=True) as conn:
        rel = conn.execute(
            "SELECT concat_ws('/', CASE reltablespace WHEN 0 THEN 1663 ELSE reltablespace END,"
            " (SELECT oid FROM pg_database WHERE datname = current_database()), relfilenode)"
            " FROM pg_class WHERE relname = 'pgbench_accounts'").fetchone()[0]
        flushed = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    wait_shards(cluster, tenant, shard_ids, flushed)
    ports = {s["name"]: s["ports"].get("pg") for s in cluster.cluster_toml["services"]}
    addrs = [f"127.0.0.1:{ports[where[s]]}" for s in shard_ids]
    token = cluster.workdir / f"{name}.token"
    token.touch(mode=0o600)
    token.write_text(cluster.run("auth", "token", "--scope", "tenant", "--tenant", name, "--ttl-secs", "0")
                     .stdout.strip())
    timeline = next(b["timeline_id"] for b in tenant["branches"] if b["name"] == "main")
    getpage = []
    for _ in range(args.runs):
        cmd = [str(strata), "pagebench", *[a for addr in addrs for a in ("--pageserver", addr)],
               "--shards", str(shards), "--stripe-blocks", str(args.stripe_blocks), "--tenant-id", tid,
               "--timeline-id", timeline, "--rel", rel, "--connections", "1", "--depth", "8",
               "--duration", str(min(args.seconds, 10)), "--json", "--token-file", str(token), *cluster.tls_args()]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"pagebench failed: {res.stderr[-2000:]}")
        getpage.append(json.loads(res.stdout)["requests_per_s"])
    cluster.endpoint_stop(f"ep-{name}")
    return {"layout": layout, "shards": shards, "placement": where, "ingest": ingest, "pgbench_rw_tps": rw, "pgbench_ro_tps": ro,
            "getpage_per_s": getpage}


def summary(rows: list[dict]) -> str:
    base = next((r for r in rows if r["layout"] == "1"), rows[0])
    med = statistics.median
    lines = ["layout  raw WAL MB  wall s  bytes/ps÷raw  cpu/ps s (÷1 shard)  safekeepers' cpu s  RW tps (÷1)"
             "  -S tps (÷1)  GetPage/s"]
    for r in rows:
        i = r["ingest"]
        cpu_ratio = i["cpu_per_pageserver_s"] / base["ingest"]["cpu_per_pageserver_s"]
        rw, ro = med(r["pgbench_rw_tps"]), med(r["pgbench_ro_tps"])
        lines.append(f"{r['layout']:>6}  {i['raw_wal_bytes'] / 1e6:>10.1f}  {i['wall_s']:>6.1f}  "
                     f"{i['bytes_per_pageserver_vs_raw']:>12.2f}  {i['cpu_per_pageserver_s']:>8.1f} ({cpu_ratio:.2f})"
                     f"        {i['safekeepers_cpu_s']:>10.1f}"
                     f"        {rw:>6.0f} ({rw / med(base['pgbench_rw_tps']):.2f})"
                     f"  {ro:>6.0f} ({ro / med(base['pgbench_ro_tps']):.2f})  {med(r['getpage_per_s']):>9.0f}")
    by = {r["layout"]: r for r in rows}
    goals = []
    if "1d" in by:
        goals.append(f"bytes to a pageserver at 1 shard, decoded: {by['1d']['ingest']['bytes_per_pageserver_vs_raw']:.2f}x"
                     " raw WAL (goal <= 0.3x)")
    if "4" in by:
        goals.append(f"bytes to a pageserver at 4 shards: {by['4']['ingest']['bytes_per_pageserver_vs_raw']:.2f}x raw "
                     "WAL (goal <= 0.5x)")
        goals.append(f"CPU per pageserver at 4 shards: "
                     f"{by['4']['ingest']['cpu_per_pageserver_s'] / base['ingest']['cpu_per_pageserver_s']:.2f}x one "
                     "shard's (goal <= 0.35x)")
    return "\n".join(lines + [""] + goals)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", default="1,1d,2,4",
                   help="layouts to measure, comma-separated: shard counts, `1d` one shard streaming decoded WAL")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stripe-blocks", type=int, default=2048)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 200k rows, scale 2, 3 s runs, one run each, stripes of 128 blocks")
    args = p.parse_args()
    if args.quick:
        # Stripes of 1 MiB: a 13 MB table still spans every shard.
        args.rows, args.scale, args.seconds, args.runs, args.stripe_blocks = 200_000, 2, 3, 1, 128
    layouts = args.shards.split(",")
    strata = strata_to_measure()
    rows = []
    with bench_dir() as base:
        # One cluster per WAL stream setting, each measured on its own.
        for stream in ("auto", "decoded"):
            mine = [l for l in layouts if l.endswith("d") == (stream == "decoded")]
            if not mine:
                continue
            with local_cluster(strata, base / f"cluster-{stream}", "--pageservers", str(len(PAGESERVERS)),
                               "--wal-stream", stream) as c:
                for layout in mine:
                    rows.append(one_layout(c, strata, layout, args))
                    print(json.dumps({"layout": layout, "ingest": rows[-1]["ingest"]}), file=sys.stderr)
    order = {l: i for i, l in enumerate(layouts)}
    rows.sort(key=lambda r: order[r["layout"]])
    text = summary(rows)
    results = {"config": vars(args), "machine": machine_state(), "runs": rows}
    write_results(result_stem("sharding", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
