#!/usr/bin/env python3
"""Compaction, images and GC of the pageserver, measured in one run of the
CLI's cluster (every service on):

- ingest:      pgbench -i -s SCALE, then pgbench -c 8 for --seconds through
               an endpoint; WAL bytes ingested per second of the workload
- compaction:  the pageserver runs with compaction held back during the
               load (compaction_threshold 1000), so the timeline ends with
               only L0 deltas; `checkpoint?compact=true` then merges them and
               writes images: MB/s of L0 input, and its ratio to the ingest rate
- GetPage:     `strata pagebench` (1 connection, depth 1) on random blocks of
               pgbench_accounts at the latest LSN: on the fresh database
               (after pgbench -i, compacted), after the workload before
               compaction (every L0 searched) and after (the image ends the
               search): medians of --runs runs; ratios compacted /
               uncompacted and compacted / fresh
- storage:     after GC with no PITR window and no horizon, the bytes of the
               layer files, and of every object in the pageserver's object
               storage once uploaded, next to the compute's data directory
               (base/ and global/, what PostgreSQL stores for the same database)
- cold GetPage: one page read right after every layer was evicted (its layer
               downloaded from object storage on demand) vs the next page of
               the same layer (warm), over HTTP: medians of --runs x 5 reads

Usage: .venv/bin/python -m bench.compaction [--scale 10] [--seconds 60] [--runs 3] [--quick] [--name STEM]
Writes bench/results/compaction.json and .txt (compaction_quick.* with --quick).
"""

import argparse
import json
import random
import re
import statistics
import sys
import time

import psycopg

from bench.harness import (bench_dir, client_env, cluster_credentials, dir_bytes, local_cluster, machine_state,
                           page_service, pagebench, pagebench_target, pageserver_metric, pgbench, pgbench_init,
                           parse_tps, result_stem, run_timeout, strata_to_measure, timeline_url, wait_ingested,
                           wait_pageserver_lsn, write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.strata import http_json, http_text, parse_lsn, urlopen

SETTINGS = {
    "checkpoint_distance": 8 << 20,
    "compaction_threshold": 1000,
    "l0_backpressure_threshold": 2000,
    "pitr_interval": 0.0,
    "gc_horizon": 0,
    "gc_period": 86400.0,
}


def hold_compaction_back(cluster: LocalCluster) -> None:
    """Writes SETTINGS into the pageserver's configuration before it starts."""
    conf = cluster.workdir / "pageserver" / "pageserver.toml"
    text = conf.read_text()
    for key, value in SETTINGS.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {json.dumps(value)}", text, flags=re.M)
    conf.write_text(text)


def cold_warm(tl_url: str, spc: int, db: int, rel: int, n: int) -> tuple[list[float], list[float]]:
    """Milliseconds of one page read right after evicting every layer
    (downloaded on demand), and of the next block read after it (warm)."""
    cold, warm = [], []

    def read(block: int) -> float:
        t0 = time.monotonic()
        url = f"{tl_url}/page?rel={spc}/{db}/{rel}&block={block}"
        with urlopen(url, timeout=120) as r:
            assert r.status == 200 and len(r.read()) == 8192
        return (time.monotonic() - t0) * 1000
    for _ in range(n):
        code, done = http_json("POST", f"{tl_url}/evict", timeout=120)
        assert code == 200 and done["evicted_layers"] > 0, done
        block = random.randrange(0, 1000)
        cold.append(read(block))
        warm.append(read(block + 1))
    return cold, warm


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--getpage-seconds", type=float, default=5)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 10 s of pgbench, 2 runs of 2 s")
    ap.add_argument("--name", default=None, help="results file stem (default: compaction, or compaction_quick)")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs, args.getpage_seconds = 2, 10, 2, 2
    strata = strata_to_measure()
    results: dict = {"config": vars(args), "settings": SETTINGS, **machine_state()}
    with bench_dir() as base, local_cluster(strata, base / "cluster", prepare=hold_compaction_back) as cluster:
        tenant, timeline = cluster.tenant_id(), cluster.timeline_id()
        metrics_url = cluster.http_url("pageserver", "/metrics")
        tl_url = timeline_url(cluster)
        connstr = cluster.endpoint_start("main")
        env = client_env(connstr)
        pgbench_init(env, args.scale)
        with psycopg.connect(connstr, autocommit=True) as conn:
            spc, db, rel = conn.execute(
                "SELECT (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default'),"
                " (SELECT oid FROM pg_database WHERE datname = current_database()),"
                " pg_relation_filenode('pgbench_accounts')").fetchone()
            fresh_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        target = [*pagebench_target({"pageserver": page_service(cluster), "tenant_id": tenant,
                                     "timeline_id": timeline, "rel": f"{spc}/{db}/{rel}"}),
                  *cluster_credentials(cluster)]
        # The fresh database: loaded, compacted and imaged.
        wait_pageserver_lsn(tl_url, fresh_lsn, timeout=3600)
        # Every measurement runs with nothing being uploaded (uploads of
        # the files just written would compete with the reads).
        code, st = http_json("POST", f"{tl_url}/checkpoint?compact=true&upload_timeout=3600", timeout=7200)
        assert code == 200, st
        pagebench(strata, target, 1, 1, 1)
        fresh = [pagebench(strata, target, 1, 1, args.getpage_seconds) for _ in range(args.runs)]
        wal0 = pageserver_metric(http_text(metrics_url), "wal_bytes_ingested_total")
        t0 = time.monotonic()
        out = pgbench(env, "-n", "-c", "8", "-j", "2", "-T", str(int(args.seconds)),
                      timeout=run_timeout(args.seconds))
        pgbench_s = time.monotonic() - t0
        tps = parse_tps(out)
        with psycopg.connect(connstr, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        pgdata = cluster.workdir / "endpoints" / "main" / "pgdata"
        pg_bytes = dir_bytes(pgdata / "base") + dir_bytes(pgdata / "global")
        cluster.endpoint_stop("main")
        wait_ingested(cluster, tl_url, timeout=3600)
        wal = pageserver_metric(http_text(metrics_url), "wal_bytes_ingested_total") - wal0
        code, st = http_json("POST", f"{tl_url}/checkpoint?upload_timeout=3600", timeout=7200)
        assert code == 200, st
        results["workload"] = {"pgbench_seconds": pgbench_s, "tps": tps, "wal_mb": wal / 1e6,
                               "ingest_mb_per_s": wal / 1e6 / pgbench_s, "pg_data_bytes": pg_bytes}
        results["uncompacted"] = {k: st[k] for k in ("l0_layers", "l1_layers", "image_layers", "layer_bytes")}
        pagebench(strata, target, 1, 1, 1)  # warm: files opened, page cache
        before = [pagebench(strata, target, 1, 1, args.getpage_seconds) for _ in range(args.runs)]

        m0 = http_text(metrics_url)
        t0 = time.monotonic()
        code, st = http_json("POST", f"{tl_url}/checkpoint?compact=true", timeout=3600)
        compact_s = time.monotonic() - t0
        assert code == 200, st
        m1 = http_text(metrics_url)
        read = (pageserver_metric(m1, "compaction_bytes_read_total")
                - pageserver_metric(m0, "compaction_bytes_read_total"))
        images = (pageserver_metric(m1, "image_bytes_written_total")
                  - pageserver_metric(m0, "image_bytes_written_total"))
        results["compaction"] = {"seconds": compact_s, "l0_bytes_read": read, "image_bytes_written": images,
                                 "input_mb_per_s": read / 1e6 / compact_s,
                                 "layers": {k: st[k] for k in ("l0_layers", "l1_layers", "image_layers",
                                                               "layer_bytes")}}
        code, _ = http_json("POST", f"{tl_url}/checkpoint?upload_timeout=3600", timeout=7200)
        assert code == 200
        pagebench(strata, target, 1, 1, 1)
        after = [pagebench(strata, target, 1, 1, args.getpage_seconds) for _ in range(args.runs)]

        code, st = http_json("POST", f"{tl_url}/checkpoint?gc=true", timeout=3600)
        assert code == 200, st
        results["gc"] = {"outcome": st["gc"], "layer_bytes": st["layer_bytes"],
                         "layers": {k: st[k] for k in ("l0_layers", "l1_layers", "image_layers")}}
        # Object storage: everything uploaded, then the stored bytes.
        code, st = http_json("POST", f"{tl_url}/checkpoint?upload_timeout=600", timeout=900)
        assert code == 200, st
        deadline = time.monotonic() + 600
        while True:
            st = http_json("GET", tl_url)[1]
            r = st["remote"]
            if r["upload_queue_layers"] == 0 and r["remote_layers"] == (
                    st["l0_layers"] + st["l1_layers"] + st["image_layers"]):
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.2)
        time.sleep(2)  # the deletion queue runs after the index
        # The pageserver's objects only: the safekeepers' offloaded WAL
        # (`wal/`, the archive of the whole run) is another matter.
        results["remote"] = {"object_bytes": dir_bytes(cluster.workdir / "remote_storage" / "tenants"),
                             "wal_archive_bytes": dir_bytes(cluster.workdir / "remote_storage" / "wal"),
                             "index_layer_bytes": r["remote_bytes"], "layers": r["remote_layers"]}
        cold, warm = cold_warm(tl_url, spc, db, rel, args.runs * 5)
        results["cold_getpage"] = {"cold_ms": cold, "warm_ms": warm}

    def med(runs, q):
        return statistics.median(r["latency_us"][q] for r in runs)

    gp = {"fresh": {"p50_us": med(fresh, "p50"), "p99_us": med(fresh, "p99")},
          "uncompacted": {"p50_us": med(before, "p50"), "p99_us": med(before, "p99")},
          "compacted": {"p50_us": med(after, "p50"), "p99_us": med(after, "p99")}}
    gp["p50_ratio"] = gp["compacted"]["p50_us"] / gp["uncompacted"]["p50_us"]
    gp["p99_ratio"] = gp["compacted"]["p99_us"] / gp["uncompacted"]["p99_us"]
    gp["p50_vs_fresh"] = gp["compacted"]["p50_us"] / gp["fresh"]["p50_us"]
    gp["p99_vs_fresh"] = gp["compacted"]["p99_us"] / gp["fresh"]["p99_us"]
    results["getpage"] = gp
    w, c = results["workload"], results["compaction"]
    c["input_vs_ingest_ratio"] = c["input_mb_per_s"] / w["ingest_mb_per_s"]
    results["storage_ratio"] = w["pg_data_bytes"] / results["gc"]["layer_bytes"]
    results["remote_storage_ratio"] = w["pg_data_bytes"] / results["remote"]["object_bytes"]
    cw = results["cold_getpage"]
    cw["cold_p50_ms"], cw["warm_p50_ms"] = statistics.median(cw["cold_ms"]), statistics.median(cw["warm_ms"])
    cw["cold_vs_warm"] = cw["cold_p50_ms"] / cw["warm_p50_ms"]
    lines = [
        f"pgbench -s {args.scale}, {w['pgbench_seconds']:.0f} s at 8 clients ({w['tps']:.0f} TPS):"
        f" {w['wal_mb']:.0f} MB of WAL ingested, {w['ingest_mb_per_s']:.1f} MB/s",
        f"before compaction: {results['uncompacted']}",
        f"compaction: {c['l0_bytes_read'] / 1e6:.0f} MB of L0 read in {c['seconds']:.1f} s ="
        f" {c['input_mb_per_s']:.1f} MB/s, {c['input_vs_ingest_ratio']:.1f}x the ingest rate;"
        f" {c['image_bytes_written'] / 1e6:.0f} MB of images; after: {c['layers']}",
        f"GetPage (1 connection, depth 1, medians of {args.runs} x {args.getpage_seconds:g} s):"
        f" p50 {gp['uncompacted']['p50_us']:.0f} -> {gp['compacted']['p50_us']:.0f} us (ratio {gp['p50_ratio']:.2f}),"
        f" p99 {gp['uncompacted']['p99_us']:.0f} -> {gp['compacted']['p99_us']:.0f} us (ratio {gp['p99_ratio']:.2f});"
        f" the fresh database (loaded and compacted): p50 {gp['fresh']['p50_us']:.0f} us, p99 {gp['fresh']['p99_us']:.0f} us;"
        f" after the workload and compaction vs fresh: p50 {gp['p50_vs_fresh']:.2f}x, p99 {gp['p99_vs_fresh']:.2f}x",
        f"after GC (no PITR window): {results['gc']['layer_bytes'] / 1e6:.1f} MB of layers"
        f" {results['gc']['layers']} vs {w['pg_data_bytes'] / 1e6:.1f} MB of PostgreSQL data files:"
        f" {results['storage_ratio']:.2f}x smaller",
        f"in object storage: {results['remote']['object_bytes'] / 1e6:.1f} MB in all (index and"
        f" {results['remote']['layers']} layers) vs {w['pg_data_bytes'] / 1e6:.1f} MB of PostgreSQL data files:"
        f" {results['remote_storage_ratio']:.2f}x smaller",
        f"GetPage over HTTP right after evicting every layer (downloaded on demand) vs warm, medians of"
        f" {len(cw['cold_ms'])}: {cw['cold_p50_ms']:.1f} ms vs {cw['warm_p50_ms']:.2f} ms ({cw['cold_vs_warm']:.0f}x)",
    ]
    text = "\n".join(lines)
    write_results(args.name or result_stem("compaction", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
