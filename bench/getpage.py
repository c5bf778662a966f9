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

Usage: .venv/bin/python bench/getpage.py [--scale 10] [--seconds 10] [--runs 3] [--connections 1,8] [--depths 1,16] [--quick]
Writes bench/results/getpage.json and .txt (getpage_quick.* with --quick) and prints
medians and ratios.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "test_runner"))

from report import write_results  # noqa: E402
from fixtures.cluster import LocalCluster  # noqa: E402
from fixtures.pg import libpq_env  # noqa: E402
from fixtures.strata import http_json, http_text, parse_lsn  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def getpage_counters(text: str) -> dict[str, float]:
    out = {}
    for name in ("getpage_requests", "getpage_batches", "request_errors"):
        m = re.search(rf"^strata_pageserver_{name}_total (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def pagebench(strata_bin: Path, extra: list[str], connections: int, depth: int, seconds: float) -> dict:
    cmd = [str(strata_bin), "pagebench", *extra, "--connections", str(connections), "--depth", str(depth),
           "--duration", str(seconds), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 3 + 120, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def client_env(connstr: str) -> dict:
    """The environment of PostgreSQL's client programs (pgbench, psql) for
    an endpoint's connection string (password and TLS included)."""
    return libpq_env(conninfo_to_dict(connstr))


def prepare(cluster: LocalCluster, scale: int) -> dict:
    """Loads pgbench data through an endpoint, stops it, waits for the
    pageserver to hold all of its WAL and checkpoints it; returns what
    pagebench needs."""
    ct = cluster.cluster_toml
    ps = next(s for s in ct["services"] if s["kind"] == "pageserver")
    tenant = ct["tenant_id"]
    timeline = next(b["timeline_id"] for b in ct["branches"] if b["name"] == "main")
    http = f"http://127.0.0.1:{ps['ports']['http']}"
    tl_url = f"{http}/v1/tenant/{tenant}/timeline/{timeline}"
    connstr = cluster.endpoint_start("main")
    env = client_env(connstr)
    subprocess.run([str(PG_BIN / "pgbench"), "-i", "-q", "-s", str(scale)], env=env, check=True,
                   capture_output=True, timeout=1800, stdin=subprocess.DEVNULL)
    with psycopg.connect(connstr, autocommit=True) as conn:
        spc, db, rel, blocks = conn.execute(
            "SELECT CASE c.reltablespace WHEN 0 THEN (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default')"
            " ELSE c.reltablespace END, (SELECT oid FROM pg_database WHERE datname = current_database()),"
            " pg_relation_filenode(c.oid), pg_relation_size(c.oid) / 8192"
            " FROM pg_class c WHERE c.relname = 'pgbench_accounts'").fetchone()
    cluster.endpoint_stop("main")
    # Everything the safekeepers hold, ingested, then written to layer files.
    end = max(parse_lsn(sk["commit_lsn"]) for sk in cluster.status()["timelines"][0]["safekeepers"])
    deadline = time.monotonic() + 300
    while parse_lsn(http_json("GET", tl_url)[1]["last_record_lsn"]) < end:
        if time.monotonic() > deadline:
            raise TimeoutError("the pageserver did not ingest the endpoint's WAL")
        time.sleep(0.05)
    code, status = http_json("POST", f"{tl_url}/checkpoint", timeout=300)
    assert code == 200, status
    return {"pageserver": f"127.0.0.1:{ps['ports']['pg']}", "metrics_url": f"{http}/metrics",
            "tenant_id": tenant, "timeline_id": timeline, "rel": f"{spc}/{db}/{rel}", "blocks": blocks,
            "table_mb": blocks * 8192 / 1e6, "timeline_after_checkpoint": status}


def summary(runs: list[dict]) -> dict:
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
    strata_bin = REPO / "target" / "release" / "strata"
    configs = [(c, d) for d in args.depths for c in args.connections]
    results: dict = {"config": vars(args), "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()[0],
                     "configurations": []}
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # PostgreSQL runs as another user
        cluster = LocalCluster(strata_bin, base / "cluster", PG_BIN)
        (base / "cluster").mkdir()
        try:
            cluster.init()
            cluster.start()
            data = prepare(cluster, args.scale)
            results["data"] = data
            target = ["--pageserver", data["pageserver"], "--tenant-id", data["tenant_id"],
                      "--timeline-id", data["timeline_id"], "--rel", data["rel"],
                      "--token-file", str(cluster.token_file()), *cluster.tls_args()]
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
        finally:
            if (cluster.workdir / "cluster.toml").exists():
                if cluster.run("stop", check=False, timeout=600).returncode != 0:
                    cluster.run("stop", "--immediate", check=False, timeout=600)

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
    write_results("getpage_quick" if args.quick else "getpage", results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
