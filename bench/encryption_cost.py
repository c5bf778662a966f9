#!/usr/bin/env python3
"""What encryption at rest in object storage costs, in one run: clusters
made through the CLI in two modes, alternating run by run, each run a new
cluster of each mode (sealed objects cannot be read as plain ones, so the
mode is chosen at `strata init`):

- encrypted:   as `strata init` makes it (a storage key; tenants' layers,
               indexes and offloaded WAL sealed before upload, opened and
               authenticated on download)
- unencrypted: `strata init --no-encryption-at-rest`

Measured in each run:

- bulk load: `pgbench -i` at --scale through an endpoint, then `strata
  timeline checkpoint`, which returns once object storage holds every
  layer (the upload is where sealing costs); the sum is the figure;
- cold read from object storage: every layer evicted from the
  pageserver's disk (`POST …/evict`), then a full scan of pgbench_accounts
  from a new endpoint, so that every layer the scan needs is downloaded
  (and opened) again; --scans times per cluster, the median kept.

Ratios encrypted / unencrypted of the medians (target <= 1.03 for both).
The bytes the store holds under `tenants/` and `wal/` are reported too,
and, as the storage layer's own baseline, `strata storage bench`: a file
uploaded to and downloaded from a local-directory store, sealed and plain
(what sealing costs per byte, without PostgreSQL, WAL or layers).

Usage: .venv/bin/python -m bench.encryption_cost [--scale 10] [--runs 3] [--scans 3] [--quick]
Writes bench/results/encryption_cost.json and .txt (encryption_cost_quick.* with --quick).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import subprocess

import psycopg

from bench.harness import (bench_dir, client_env, http_json, local_cluster, machine_state, pgbench_init,
                           result_stem, strata_to_measure, timeline_url, wait_ingested, write_results)

MODES = {"encrypted": [], "unencrypted": ["--no-encryption-at-rest"]}


def store_bytes(store: Path, tenant: str) -> int:
    """Bytes of the tenant's objects (layers, indexes, WAL) in a local store."""
    return sum(p.stat().st_size for top in ("tenants", "wal") for p in (store / top / tenant).rglob("*")
               if p.is_file() and "#" not in p.name)


def cold_scan(c, tl_url: str, rows: int) -> float:
    """Seconds of a full scan of pgbench_accounts from a new endpoint, every
    layer evicted first."""
    code, evicted = http_json("POST", f"{tl_url}/evict", timeout=600)
    assert code == 200, evicted
    connstr = c.endpoint_start("main")
    start = time.monotonic()
    with psycopg.connect(connstr, autocommit=True) as conn:
        got = conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone()[0]
    took = time.monotonic() - start
    assert got == rows, got
    c.endpoint_stop("main")
    return took


def one_run(strata: Path, workdir: Path, init_args: list[str], scale: int, scans: int) -> dict:
    """A new cluster: the bulk load and its upload, then cold full scans."""
    with local_cluster(strata, workdir, *init_args) as c:
        tl_url = timeline_url(c)
        connstr = c.endpoint_start("main")
        started = time.monotonic()
        pgbench_init(client_env(connstr), scale, timeout=1800)
        loaded = time.monotonic()
        c.endpoint_stop("main")
        wait_ingested(c, tl_url)
        before_upload = time.monotonic()
        c.run("timeline", "checkpoint", timeout=1800)
        uploaded = time.monotonic()
        scan_s = [cold_scan(c, tl_url, scale * 100_000) for _ in range(scans)]
        metrics = c.metrics("pageserver")
        store = Path(c.service_config("pageserver")["remote_storage"]["path"])
        return {
            "pgbench_init_s": loaded - started,
            "upload_s": uploaded - before_upload,
            "bulk_load_s": (loaded - started) + (uploaded - before_upload),
            "cold_scan_s": statistics.median(scan_s),
            "cold_scan_runs_s": scan_s,
            "layers_downloaded": metrics.get("strata_pageserver_layers_downloaded_total"),
            "download_errors": metrics.get("strata_pageserver_download_errors_total"),
            "store_bytes": store_bytes(store, c.tenant_id()),
        }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scans", type=int, default=3, help="cold scans per cluster")
    ap.add_argument("--storage-mb", type=int, default=256, help="file size of the storage layer's bench")
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 1 run, 1 scan")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.runs, args.scans, args.storage_mb = 2, 1, 1, 16
    strata = strata_to_measure()
    results: dict = {"config": vars(args), "strata": str(strata), **machine_state()}
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with bench_dir() as base:
        for i in range(args.runs):
            for mode, init_args in MODES.items():
                runs[mode].append(one_run(strata, base / f"{mode}-{i}", init_args, args.scale, args.scans))
        layer = subprocess.run([str(strata), "storage", "bench", "--dir", str(base / "storage-bench"),
                                "--mb", str(args.storage_mb), "--runs", str(max(args.runs, 5))],
                               capture_output=True, text=True, check=True, timeout=1800)
        storage = json.loads(layer.stdout)
    figures = ("bulk_load_s", "pgbench_init_s", "upload_s", "cold_scan_s")
    median = {m: {f: statistics.median(r[f] for r in runs[m]) for f in figures} for m in MODES}
    spread = {m: {f: (min(r[f] for r in runs[m]), max(r[f] for r in runs[m])) for f in figures} for m in MODES}
    ratio = {f: median["encrypted"][f] / median["unencrypted"][f] for f in figures}
    store = {m: statistics.median(r["store_bytes"] for r in runs[m]) for m in MODES}
    results.update({"runs": runs, "median": median, "range": spread, "ratio": ratio, "store_bytes": store,
                    "storage_layer": storage})
    lines = [
        f"scale {args.scale}; medians (min-max) of {args.runs} runs, a new cluster of each mode per run,"
        f" alternating; {os.cpu_count()} CPUs, load {results['loadavg_before']:.2f} before",
        "",
        f"{'':<24}{'encrypted':>22}{'unencrypted':>22}{'ratio':>8}",
    ]
    for f in figures:
        cells = "".join(f"{median[m][f]:>8.2f}s ({spread[m][f][0]:.2f}-{spread[m][f][1]:.2f})" for m in MODES)
        lines.append(f"{f:<24}{cells}{ratio[f]:>8.3f}")
    lines += [
        f"{'store bytes (tenant)':<24}{store['encrypted']:>22.0f}{store['unencrypted']:>22.0f}"
        f"{store['encrypted'] / store['unencrypted']:>8.4f}",
        "",
        f"storage layer alone ({args.storage_mb} MiB file, local directory, medians of {storage['runs']}):"
        + "".join(f" {op} sealed {storage['sealed'][op]['median_s']:.3f}s, plain {storage['plain'][op]['median_s']:.3f}s,"
                  f" ratio {storage[op + '_ratio']:.3f};" for op in ("upload", "download")),
        "",
        "bulk load = pgbench -i + strata timeline checkpoint (every layer uploaded);"
        " cold scan = count(*) of pgbench_accounts from a new endpoint after every layer was evicted;"
        " target: ratios <= 1.03",
    ]
    errors = sum(r["download_errors"] or 0 for m in MODES for r in runs[m])
    if errors:
        lines.append(f"ERRORS: {errors} failed layer downloads")
    text = "\n".join(lines)
    write_results(result_stem("encryption_cost", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
