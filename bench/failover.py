#!/usr/bin/env python3
"""Pageserver failover (docs/storage-controller.md), measured as a user runs
it: a local cluster made through the CLI with two pageservers (a storage
controller beside each), one endpoint, pgbench RW at --clients clients.

Each run starts the endpoint again (its relation files are lazy, so
pgbench's reads go to the pageserver), runs pgbench, and after 5 s kills
the attached pageserver and its supervisor with SIGKILL. Meanwhile:

- a probe reads one random block of pgbench_accounts every 20 ms; the
  **read outage** is the longest any probe read took among those in flight
  at or after the kill (how long reads waited for the new pageserver);
- a writer commits numbered rows, one at a time; every acknowledged row is
  checked afterwards;
- the time until `strata status` names the other pageserver is recorded.

pgbench must report 0 failed transactions. The killed pageserver is
started again (it becomes the secondary) and the next run kills the one
attached then. Two clusters: **warm** (the secondary downloads the hot
layers, the default) and **cold** (`secondary_cache_bytes = 0`: every layer
is downloaded on demand after the failover).

With `--store minio` the object storage is MinIO behind a link proxy
(`strata link-proxy`, `docs/sites.md`) that holds every byte for
`--store-latency-ms` each way and at most 1 MiB in flight per direction
(about 100 MB/s at 10 ms): object storage across a network, where a cold
secondary pays for its downloads. The default is the workdir's local
directory.

Target: reads served again within 5 s (median of --runs), no failed transaction.

Usage: .venv/bin/python -m bench.failover [--scale 10] [--clients 8] [--runs 5] [--quick]
                                           [--store local|minio] [--store-latency-ms 10]
Writes bench/results/failover.json and .txt (failover_quick.* with --quick,
failover_minio.* with --store minio).
"""

import argparse
import os
import random
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

from bench.harness import (LinkProxy, bench_dir, client_env, last_line, local_cluster,
                           machine_state, pgbench_init, pgbench_process, result_stem, strata_to_measure,
                           write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.minio import Minio
from test_runner.fixtures.ports import free_port


class Probe(threading.Thread):
    """Reads one random block of pgbench_accounts every 20 ms, keeping when
    each read started and ended."""

    def __init__(self, connstr: str):
        super().__init__(daemon=True)
        self.connstr = connstr
        self.reads: list[tuple[float, float]] = []  # (start, end)
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.connstr, autocommit=True) as conn:
            blocks = conn.execute("SELECT pg_relation_size('pgbench_accounts') / 8192").fetchone()[0]
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    conn.execute(f"SELECT count(*) FROM pgbench_accounts WHERE ctid = '({random.randrange(blocks)},1)'")
                except Exception as e:  # noqa: BLE001 - reported
                    self.errors.append(str(e))
                    return
                self.reads.append((t0, time.monotonic()))
                self.stop.wait(0.02)

    def outage(self, killed: float) -> float:
        """The longest wait of a read in flight at or after `killed`."""
        return max((end - max(start, killed) for start, end in self.reads if end >= killed), default=0.0)


class Writer(threading.Thread):
    """Commits numbered rows one at a time, keeping the acknowledged ones."""

    def __init__(self, connstr: str):
        super().__init__(daemon=True)
        self.connstr = connstr
        self.acked: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        with psycopg.connect(self.connstr, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS acked (id bigint PRIMARY KEY)")
            n = conn.execute("SELECT coalesce(max(id), 0) FROM acked").fetchone()[0]
            while not self.stop.is_set():
                try:
                    conn.execute("INSERT INTO acked VALUES (%s)", (n + 1,))
                except Exception as e:  # noqa: BLE001 - reported
                    self.errors.append(str(e))
                    return
                n += 1
                self.acked.append(n)


def attached(c: LocalCluster) -> str | None:
    """The pageserver the timeline is attached to, as `strata status` says."""
    return c.status()["timelines"][0]["attached"]


class SlowStore:
    """MinIO behind a link proxy: object storage `latency_ms` away each way."""

    def __init__(self, strata_bin: Path, base: Path, latency_ms: float):
        self.minio = Minio(base / "minio")
        self.minio.start()
        self.port = free_port()
        self.proxy = LinkProxy(strata_bin, base,
                               f'max_in_flight_bytes = {1 << 20}\n'
                               f'[[routes]]\nname = "store"\nlisten = "127.0.0.1:{self.port}"\n'
                               f'target = "127.0.0.1:{self.minio.port}"\ndelay_ms = {latency_ms}\n')

    def remote_storage(self, prefix: str) -> dict:
        table = self.minio.remote_storage(prefix)
        return {**table, "endpoint": f"http://127.0.0.1:{self.port}"}

    def close(self) -> None:
        self.proxy.stop()
        self.minio.kill()


def wait_warm(c: LocalCluster, secondary: str, timeout: float = 300) -> int:
    """Until the secondary's warm bytes stop growing for 6 s (a heatmap is
    published every 5 s); returns them."""
    last, since, deadline = -1, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, body = c.http(secondary, "GET", "/v1/status")
        now = sum(loc.get("local_layer_bytes") or 0 for loc in body.get("locations", [])
                  if loc.get("mode") == "secondary") if code == 200 else -1
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 6:
            return now
        time.sleep(0.5)
    return last


def one_cluster(strata_bin: Path, base: Path, name: str, args, cold: bool, store: SlowStore | None) -> list[dict]:
    """--runs failovers on one cluster of two pageservers: warm secondaries,
    or `cold` ones that keep no layers; object storage in `store` if given."""

    def prepare(c: LocalCluster) -> None:
        if cold:
            for ps in ("pageserver", "pageserver2"):
                c.configure(ps, {"secondary_cache_bytes": 0})
        if store is not None:
            c.set_remote_storage(store.remote_storage(name))

    runs = []
    with local_cluster(strata_bin, base / name, "--pageservers", "2", prepare=prepare) as c:
        connstr = last_line(c.run("endpoint", "start", "ep", timeout=300).stdout)
        pgbench_init(client_env(connstr), args.scale)
        c.run("timeline", "checkpoint", timeout=600)
        for run in range(args.runs):
            victim = attached(c)
            # The secondary has read the newest heatmap (published every 5 s)
            # and downloaded what it lists.
            time.sleep(6)
            warm = wait_warm(c, "pageserver2" if victim == "pageserver" else "pageserver")
            c.run("endpoint", "stop", "ep", timeout=300)
            c.run("endpoint", "start", "ep", timeout=300)
            probe, writer = Probe(connstr), Writer(connstr)
            probe.start()
            writer.start()
            bench = pgbench_process(client_env(connstr), "-n", "-c", str(args.clients), "-j", "2", "-T",
                                    str(args.seconds))
            time.sleep(5)
            killed = time.monotonic()
            c.kill9(victim, supervisor=True)
            placed = None
            while time.monotonic() - killed < 60:
                if attached(c) not in (None, victim):
                    placed = time.monotonic() - killed
                    break
                time.sleep(0.05)
            out, err = bench.communicate(timeout=600)
            probe.stop.set()
            writer.stop.set()
            probe.join(120)
            writer.join(120)
            failed = re.search(r"number of failed transactions: (\d+)", out)
            tps = re.search(r"tps = ([0-9.]+)", out)
            with psycopg.connect(connstr, autocommit=True) as conn:
                present = {r[0] for r in conn.execute("SELECT id FROM acked").fetchall()}
            lost = len(set(writer.acked) - present)
            runs.append({
                "victim": victim, "secondary_warm_bytes": warm, "placed_seconds": placed, "read_outage_seconds": probe.outage(killed),
                "pgbench_exit": bench.returncode, "failed_transactions": int(failed.group(1)) if failed else None,
                "tps": float(tps.group(1)) if tps else None, "acked": len(writer.acked), "lost": lost,
                "probe_errors": probe.errors[:3], "writer_errors": writer.errors[:3], "pgbench_stderr": err[-500:],
            })
            print(name, runs[-1], flush=True)
            c.start()  # the killed one comes back as the secondary
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=20, help="length of each pgbench run")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs of 12 s")
    ap.add_argument("--store", choices=("local", "minio"), default="local",
                    help="object storage: the workdir's directory, or MinIO behind a link proxy")
    ap.add_argument("--store-latency-ms", type=float, default=10.0, help="one-way delay to MinIO (--store minio)")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs = 2, 12, 2
    strata_bin = strata_to_measure()
    results: dict = {"config": vars(args), **machine_state()}
    with bench_dir() as base:
        store = SlowStore(strata_bin, base, args.store_latency_ms) if args.store == "minio" else None
        try:
            for name, cold in (("warm", False), ("cold", True)):
                results[name] = one_cluster(strata_bin, base, name, args, cold, store)
        finally:
            if store is not None:
                store.close()
    med = statistics.median
    where = ("the workdir's directory" if args.store == "local" else
             f"MinIO {args.store_latency_ms:g} ms away each way (link proxy)")
    lines = [f"pageserver failover under pgbench RW, scale {args.scale}, {args.clients} clients, "
             f"{args.runs} runs per mode, {os.cpu_count()} CPUs, object storage: {where}"]
    ok = True
    for name in ("warm", "cold"):
        runs = results[name]
        outages = [r["read_outage_seconds"] for r in runs]
        placed = [r["placed_seconds"] for r in runs if r["placed_seconds"] is not None]
        failed = sum(r["failed_transactions"] or 0 for r in runs)
        lost = sum(r["lost"] for r in runs)
        bad = [r for r in runs if r["pgbench_exit"] != 0 or r["failed_transactions"] != 0 or r["probe_errors"]]
        ok &= not bad and lost == 0
        results[f"{name}_summary"] = {"read_outage_median": med(outages), "read_outage_max": max(outages),
                                      "placed_median": med(placed) if placed else None,
                                      "failed_transactions": failed, "lost_commits": lost}
        lines.append(f"  {name}: reads served again after median {med(outages):.2f} s (max {max(outages):.2f} s); "
                     f"placed elsewhere after median {med(placed) if placed else float('nan'):.2f} s; "
                     f"failed transactions {failed}; acknowledged commits lost {lost}")
    lines.append(f"  target: reads within 5 s (median), 0 failed transactions: {'met' if ok else 'NOT met'}")
    stem = result_stem("failover" + ("_minio" if args.store == "minio" else ""), args.quick)
    write_results(stem, results, "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
