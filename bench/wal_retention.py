#!/usr/bin/env python3
"""WAL held on local disks under sustained writes, side by side in one run:

- strata: a local cluster (`strata init`, three safekeepers, a pageserver,
          one endpoint, object storage in a local directory); pgbench
          (4 clients) beside bulk writes until --gib GiB of WAL are written.
          Every second: each safekeeper's local WAL (its segment files) and
          the pageserver's lag. Then the whole cluster restarts: every
          acknowledged pgbench commit must be there; and pg_waldump decodes
          the offloaded WAL from the end of the load to the end.
- stock:  PostgreSQL 15 on local disk (max_wal_size 1GB, the default), the
          same workload and volume; every second the size of pg_wal.

The ratio that matters: the peak local WAL of a safekeeper against the
peak pg_wal of stock PostgreSQL (a stock server keeps up to max_wal_size
between checkpoints; a safekeeper keeps what is not yet offloaded, below
the pageserver's remote_consistent_lsn or held by the control file).

Usage: .venv/bin/python -m bench.wal_retention [--gib 3] [--runs 1] [--quick]
Writes bench/results/wal_retention.json and .txt (wal_retention_quick.* with --quick).
"""

import argparse
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from bench.harness import (PG_BIN, bench_dir, client_env, dir_bytes, local_cluster, machine_state, pgbench_init,
                           pgbench_process, result_stem, stock_postgres, strata_to_measure, write_results)
from test_runner.fixtures.checks import assert_pgbench_invariants, pgbench_state
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.strata import http_json, parse_lsn

SAFEKEEPERS = ("sk1", "sk2", "sk3")
SCALE = 4
BULK = "CREATE TABLE bulk AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 100000) g"
SEGMENT_NAME_LEN = 24
SEGMENT = 16 << 20


def segment_bytes(d: Path) -> int:
    """Bytes of the WAL segment files in `d`."""
    return sum(f.stat().st_size for f in d.iterdir() if len(f.name) == SEGMENT_NAME_LEN) if d.exists() else 0


class Sampler:
    """Calls `sample()` every `interval` seconds on a thread, keeping the maxima."""

    def __init__(self, sample, interval: float = 1.0):
        self.peaks: dict[str, float] = {}
        self.sample, self.interval = sample, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                for k, v in self.sample().items():
                    self.peaks[k] = max(self.peaks.get(k, 0), v)
            except Exception as e:  # a sample lost to a restart is no measurement error
                print("sample:", e, file=sys.stderr)
            self.stop.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def load(connstr: str, env: dict, gib: float) -> dict:
    """pgbench -c 4 beside bulk writes until `gib` GiB of WAL are written."""
    pgbench_init(env, SCALE)
    with psycopg.connect(connstr, autocommit=True) as conn:
        start = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        bench = pgbench_process(env, "-n", "-c", "4", "-j", "2", "-T", "86400", output=False)
        t0 = time.monotonic()
        try:
            while True:
                lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
                if lsn - start >= gib * 2**30:
                    break
                conn.execute(BULK)
                conn.execute("DROP TABLE bulk")
        finally:
            bench.terminate()
            bench.wait(timeout=120)
        seconds = time.monotonic() - t0
        end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    return {"start_lsn": start, "end_lsn": end, "wal_bytes": end - start, "seconds": seconds}


def small_layers(cluster: LocalCluster) -> None:
    """Small in-memory layers: the pageserver uploads, and so reports, often."""
    conf = cluster.workdir / "pageserver" / "pageserver.toml"
    conf.write_text(re.sub(r"^checkpoint_distance = .*$", "checkpoint_distance = 8388608", conf.read_text(), flags=re.M))


def run_strata(strata_bin: Path, base: Path, gib: float) -> dict:
    """The workload on a local cluster: peak local WAL of each safekeeper,
    what they hold after the upload, commits kept across a restart, and
    pg_waldump of the offloaded WAL."""
    with local_cluster(strata_bin, base / "cluster", prepare=small_layers) as cluster:
        connstr = cluster.endpoint_start("main")
        env = client_env(connstr)
        ct = cluster.cluster_toml
        tl_dirs = {n: cluster.data_dir(n) / cluster.tenant_id() / cluster.timeline_id() for n in SAFEKEEPERS}
        ps_path = cluster.timeline_path()

        def sample():
            out = {n: segment_bytes(d) for n, d in tl_dirs.items()}
            code, st = cluster.http("pageserver", "GET", ps_path)
            if code == 200:
                out["pageserver_lag"] = max(0, parse_lsn(st["safekeeper_commit_lsn"]) - parse_lsn(st["last_record_lsn"]))
            return out

        with Sampler(sample) as s:
            w = load(connstr, env, gib)
        with psycopg.connect(connstr, autocommit=True) as conn:
            before = pgbench_state(conn)
        wal_dir = cluster.workdir / "remote_storage" / "wal" / cluster.tenant_id() / cluster.timeline_id()
        cluster.run("timeline", "checkpoint", timeout=3600)

        def removal():
            return {n: http_json("GET", cluster.http_url(n, ps_path))[1]["removal"] for n in SAFEKEEPERS}

        # Everything is uploaded: removal reaches the last segment boundary (but one) within seconds.
        boundary = (w["end_lsn"] // SEGMENT - 1) * SEGMENT
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(parse_lsn(r["removed_before"]) >= boundary for r in removal().values()):
                break
            time.sleep(1)
        after_load = {n: segment_bytes(d) for n, d in tl_dirs.items()}
        removal_after = removal()
        # pg_waldump (below) reads what is offloaded up to the end of the load.
        while time.monotonic() < deadline + 120:
            offloaded_end = min(parse_lsn(http_json("GET", cluster.http_url(n, ps_path))[1]["offload"]
                                          ["offloaded_lsn"]) for n in SAFEKEEPERS)
            if offloaded_end >= boundary:
                break
            time.sleep(1)

        # The whole cluster restarts: every acknowledged commit is there.
        cluster.endpoint_stop("main")
        cluster.stop()
        cluster.start()
        connstr = cluster.endpoint_start("main")
        with psycopg.connect(connstr, autocommit=True) as conn:
            after = pgbench_state(conn)
        assert after == before, (before, after)
        assert_pgbench_invariants(after, SCALE)

        # Stock pg_waldump decodes the offloaded WAL of the load. It opens the
        # segment holding its end (and a record may run into the next).
        segsize = SEGMENT
        dump_end = offloaded_end - segsize
        dump = subprocess.run([str(PG_BIN / "pg_waldump"), "-p", str(wal_dir), "-s",
                               f"{(w['start_lsn'] // segsize + 1) * segsize >> 32:X}/"
                               f"{(w['start_lsn'] // segsize + 1) * segsize & 0xFFFFFFFF:X}",
                               "-e", f"{dump_end >> 32:X}/{dump_end & 0xFFFFFFFF:X}", "--stats"],
                              capture_output=True, text=True, timeout=3600)
        assert dump.returncode == 0, (dump.stderr[-2000:], hex(w["start_lsn"]), hex(offloaded_end),
                                      sorted(p.name for p in wal_dir.iterdir()))
        total = next(line for line in dump.stdout.splitlines() if line.startswith("Total"))
        return {**w, "peak_local_wal": {n: s.peaks.get(n, 0) for n in SAFEKEEPERS},
                "peak_pageserver_lag": s.peaks.get("pageserver_lag", 0), "local_wal_after_upload": after_load,
                "removal_after_upload": removal_after,
                "offloaded_wal_bytes": dir_bytes(wal_dir), "offloaded_lsn": offloaded_end,
                "pg_waldump_total": total, "acknowledged_commits_kept": True}


def run_stock(base: Path, gib: float) -> dict:
    """The workload on stock PostgreSQL: the peak size of pg_wal."""
    with stock_postgres(base, "stock", {"shared_buffers": "128MB", "max_wal_size": "1GB", "fsync": "on"}) as c:
        info = c.conninfo()
        connstr = " ".join(f"{k}={v}" for k, v in info.items())
        with Sampler(lambda: {"pg_wal": segment_bytes(c.pgdata / "pg_wal")}) as s:
            w = load(connstr, c.client_env(), gib)
        return {**w, "peak_pg_wal": s.peaks.get("pg_wal", 0)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=3.0, help="GiB of WAL written under load")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smoke run: 0.3 GiB, one run")
    args = ap.parse_args()
    if args.quick:
        args.gib, args.runs = 0.3, 1
    results: dict = {"config": vars(args), **machine_state(), "strata": [], "stock": []}
    for _ in range(args.runs):
        with bench_dir() as base:
            results["stock"].append(run_stock(base, args.gib))
        with bench_dir() as base:
            results["strata"].append(run_strata(strata_to_measure(), base, args.gib))

    med = statistics.median
    peak_sk = med(max(r["peak_local_wal"].values()) for r in results["strata"])
    peak_pg = med(r["peak_pg_wal"] for r in results["stock"])
    results["peak_safekeeper_wal_bytes"] = peak_sk
    results["peak_stock_pg_wal_bytes"] = peak_pg
    results["ratio"] = peak_sk / peak_pg
    s0 = results["strata"][-1]
    mib = 2**20
    lines = [
        f"WAL written under pgbench and bulk writes: Strata {med(r['wal_bytes'] for r in results['strata']) / 2**30:.2f}"
        f" GiB in {med(r['seconds'] for r in results['strata']):.0f} s, stock"
        f" {med(r['wal_bytes'] for r in results['stock']) / 2**30:.2f} GiB in"
        f" {med(r['seconds'] for r in results['stock']):.0f} s (medians of {args.runs})",
        f"peak local WAL of a safekeeper {peak_sk / mib:.0f} MiB"
        f" (each: { {n: round(v / mib) for n, v in s0['peak_local_wal'].items()} })"
        f" vs stock pg_wal {peak_pg / mib:.0f} MiB (max_wal_size 1GB): {results['ratio']:.2f}x",
        f"after the upload: { {n: round(v / mib) for n, v in s0['local_wal_after_upload'].items()} } MiB held;"
        f" offloaded {s0['offloaded_wal_bytes'] / 2**30:.2f} GiB; pageserver lag at most"
        f" {s0['peak_pageserver_lag'] / mib:.0f} MiB",
        f"every acknowledged pgbench commit kept across a restart of the whole cluster; pg_waldump of the"
        f" offloaded WAL: {s0['pg_waldump_total']}",
    ]
    text = "\n".join(lines)
    write_results(result_stem("wal_retention", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
