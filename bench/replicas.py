#!/usr/bin/env python3
"""Read replicas (docs/replicas.md), measured as a user runs them: one
local cluster made through the CLI, a writer endpoint and replicas made
with `strata endpoint start NAME --replica-of EP`.

- Start: `strata endpoint start R --replica-of EP` until the replica
  answers its first query, wall clock (the writer's checkpoint, the
  standby basebackup, the mount, replay to consistency), and the agent's
  own total. A new replica for every run, with the writer idle, and
  another while the writer runs pgbench RW.
- Replay lag under pgbench RW (TPC-B-like) at --clients clients on the
  writer: a probe reads the writer's WAL position and polls the replica
  until its replay has passed it; the time between is one sample. One
  probe at a time, back to back, for the whole run.
- Read-only throughput: pgbench -S at --clients clients against the
  replica and against the writer, one after the other (the other idle),
  both prewarmed (pg_prewarm).
- Promotion: `strata endpoint promote R` until an INSERT commits on it.

Targets on this machine: lag median < 50 ms and max < 1 s; replica -S
>= 0.9x the writer's; start < 1 s; promotion < 2 s.

Usage: .venv/bin/python -m bench.replicas [--scale 10] [--seconds 30] [--clients 8] [--runs 3] [--quick]
Writes bench/results/replicas.json and .txt (replicas_quick.* with --quick).
"""

import argparse
import os
import statistics
import sys
import threading
import time

import psycopg

from bench.harness import (PGBENCH_PREWARM, strata_to_measure, bench_dir, client_env, last_line, local_cluster,
                           machine_state, nearest_rank, pgbench_init, pgbench_process, pgbench_tps, psql,
                           result_stem, write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.endpoint import Endpoint
from test_runner.fixtures.strata import parse_lsn


def pgbench(connstr: str, args: list[str]) -> float:
    """tps of one pgbench run (no vacuum: the tables are shared by runs)."""
    return pgbench_tps(client_env(connstr), "-n", *args, timeout=3600)


def start_replica(c: LocalCluster, name: str, of: str) -> tuple[str, float, dict]:
    """Starts replica `name` of `of`; its connection string, the wall time
    until it answered a query, and the agent's timings of its start."""
    t0 = time.monotonic()
    connstr = last_line(c.run("endpoint", "start", name, "--replica-of", of, timeout=300).stdout)
    with psycopg.connect(connstr, autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
    wall = time.monotonic() - t0
    timings = Endpoint(c, name).agent_status()["timings"]
    return connstr, wall, timings


def lag_probe(writer: str, replica: str, stop: threading.Event, samples: list[float]) -> None:
    """Back-to-back samples: the writer's WAL position, then the time until
    the replica's replay passes it."""
    with psycopg.connect(writer, autocommit=True) as w, psycopg.connect(replica, autocommit=True) as r:
        while not stop.is_set():
            t0 = time.monotonic()
            target = parse_lsn(w.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
            while parse_lsn(r.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()[0]) < target:
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("the replica did not replay within 60 s")
                time.sleep(0.002)
            samples.append(time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=30, help="length of each pgbench run")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs of 5 s")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs = 2, 5, 2
    results: dict = {"config": vars(args), **machine_state()}
    starts, agent_starts, lag_runs, ro = [], [], [], {"replica": [], "writer": []}
    starts_loaded: list[float] = []
    loaded_timings: list[dict] = []
    promotions = []
    with bench_dir() as base, local_cluster(strata_to_measure(), base / "cluster") as c:
        writer_name = "w0"
        writer = c.endpoint_start(writer_name)
        pgbench_init(client_env(writer), args.scale)
        psql(client_env(writer), "CREATE EXTENSION pg_prewarm")
        psql(client_env(writer), PGBENCH_PREWARM)
        for run in range(args.runs):
            name = f"r{run}"
            replica, wall, timings = start_replica(c, name, writer_name)
            starts.append(wall)
            agent_starts.append(timings["total_seconds"])
            # Replay lag under pgbench RW on the writer.
            samples: list[float] = []
            stop = threading.Event()
            probe = threading.Thread(target=lag_probe, args=(writer, replica, stop, samples), daemon=True)
            probe.start()
            tps_rw = pgbench(writer, ["-c", str(args.clients), "-j", "2", "-T", str(args.seconds)])
            stop.set()
            probe.join(120)
            lag_runs.append({"tps_rw": tps_rw, "samples": len(samples), "median_ms": statistics.median(samples) * 1e3,
                             "p99_ms": nearest_rank(samples, 0.99) * 1e3, "max_ms": max(samples) * 1e3})
            # Read-only throughput, replica then writer, each prewarmed.
            psql(client_env(replica), PGBENCH_PREWARM)
            for who, connstr in (("replica", replica), ("writer", writer)):
                pgbench(connstr, ["-S", "-c", str(args.clients), "-j", "2", "-T", "3"])  # warm
                ro[who].append(pgbench(connstr, ["-S", "-c", str(args.clients), "-j", "2", "-T", str(args.seconds)]))
            # Start while the writer is under pgbench RW (its checkpoint
            # then writes what the load dirtied).
            loaded = pgbench_process(client_env(writer), "-n", "-c", str(args.clients), "-j", "2", "-T",
                                     str(max(10, args.seconds // 2)), output=False)
            time.sleep(3)
            _, wall, timings = start_replica(c, f"{name}-loaded", writer_name)
            starts_loaded.append(wall)
            loaded_timings.append(timings)
            c.run("endpoint", "stop", f"{name}-loaded", timeout=300)
            loaded.wait(timeout=600)
            # Promotion: the replica becomes the writer of the next run.
            t0 = time.monotonic()
            c.run("endpoint", "promote", name, timeout=300)
            with psycopg.connect(replica, autocommit=True) as conn:
                conn.execute("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 0, now())")
            promotions.append(time.monotonic() - t0)
            writer_name, writer = name, replica
            psql(client_env(writer), PGBENCH_PREWARM)
    med = statistics.median
    results.update({
        "start_seconds": starts, "agent_start_seconds": agent_starts, "start_under_load_seconds": starts_loaded,
        "start_under_load_agent_timings": loaded_timings, "lag_runs": lag_runs, "read_only_tps": ro,
        "promotion_seconds": promotions,
        "lag_median_ms": med(r["median_ms"] for r in lag_runs), "lag_p99_ms": med(r["p99_ms"] for r in lag_runs),
        "lag_max_ms": max(r["max_ms"] for r in lag_runs),
        "read_only_ratio": med(ro["replica"]) / med(ro["writer"]),
    })
    lines = [
        f"scale {args.scale}; {args.runs} runs, a new replica each; pgbench runs of {args.seconds} s at"
        f" {args.clients} clients; {os.cpu_count()} CPUs, load {results['loadavg_before']:.2f} before",
        "",
        f"start to first query (median)      {med(starts):8.3f} s   (agent {med(agent_starts):.3f} s)   target < 1 s",
        f"start, writer under pgbench RW     {med(starts_loaded):8.3f} s   (agent"
        f" {med(t['total_seconds'] for t in loaded_timings):.3f} s, of which waiting for the checkpoint's ingest"
        f" {med(t['sync_seconds'] for t in loaded_timings):.3f} s, PostgreSQL to consistency"
        f" {med(t['postgres_start_seconds'] for t in loaded_timings):.3f} s)",
        f"replay lag under pgbench RW        median {results['lag_median_ms']:.1f} ms, p99 {results['lag_p99_ms']:.1f} ms,"
        f" max {results['lag_max_ms']:.1f} ms   targets < 50 ms, max < 1000 ms",
        "  (writer RW tps during: " + ", ".join(f"{r['tps_rw']:.0f}" for r in lag_runs)
        + "; samples: " + ", ".join(str(r["samples"]) for r in lag_runs) + ")",
        f"pgbench -S tps, replica / writer   {med(ro['replica']):.0f} / {med(ro['writer']):.0f}"
        f" = {results['read_only_ratio']:.3f}   target >= 0.9",
        f"promotion until a commit (median)  {med(promotions):8.3f} s   target < 2 s",
        "",
        "runs: start " + ", ".join(f"{s:.3f}" for s in starts) + "; promotion " + ", ".join(f"{p:.3f}" for p in promotions)
        + "; -S replica " + ", ".join(f"{t:.0f}" for t in ro["replica"]) + "; -S writer "
        + ", ".join(f"{t:.0f}" for t in ro["writer"]),
    ]
    text = "\n".join(lines)
    write_results(result_stem("replicas", args.quick), results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
