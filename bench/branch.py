#!/usr/bin/env python3
"""Branch creation and the first query on a branch, against database size,
side by side in one run:

- strata: a local cluster (`strata init`, three safekeepers, a pageserver,
          an endpoint on `main`) holding pgbench data of each size in turn.
          Per run: the pageserver's branch creation alone (its HTTP API),
          `strata branch create` as a user runs it (the CLI, safekeeper
          timelines and cluster.toml included), and a compute on the new
          branch from `strata endpoint start` to its first answered query.
- stock:  PostgreSQL 15 on local disk with the same data: `CREATE DATABASE
          … TEMPLATE` (the in-server copy), and `pg_basebackup` (a new
          server's copy) followed by the first query on the copy started.

Goal (docs/branches.md): creation under 100 ms at every size. Medians of
--runs runs per size. Computes are eager today (a compute restores the
whole database before it starts; lazy computes are the next step), which
the first-query column shows.

Usage: .venv/bin/python -m bench.branch [--sizes-mb 100,1024,5120] [--runs 3] [--quick]
Writes bench/results/branch.json and .txt (branch_quick.* with --quick).
"""

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import psycopg

from bench.harness import (PG_BIN, RESULTS, bench_dir, client_env, first_query, local_cluster, pgbench_init,
                           result_stem, stock_cluster, stock_postgres, strata_to_measure, write_json)
from test_runner.fixtures.strata import http_json

MB_PER_SCALE = 15  # pgbench's data per unit of scale, about


def scale_for(mb: int) -> int:
    """The pgbench scale that makes about `mb` MB of data."""
    return max(1, round(mb / MB_PER_SCALE))


def connect(connstr: str):
    """A connection for `first_query`, each attempt given 5 s."""
    return lambda: psycopg.connect(connstr, autocommit=True, connect_timeout=5)


def db_bytes(connstr: str, db: str = "postgres") -> int:
    with psycopg.connect(connstr, autocommit=True) as conn:
        return conn.execute("SELECT pg_database_size(%s)", (db,)).fetchone()[0]


def run_strata(strata_bin: Path, base: Path, sizes: list[int], runs: int) -> dict:
    out = {}
    with local_cluster(strata_bin, base / "cluster") as cluster:
        connstr = cluster.endpoint_start("main")
        env = client_env(connstr)
        tenant = cluster.tenant_id()
        main_tl = cluster.timeline_id()
        ps_url = cluster.http_url("pageserver", f"/v1/tenant/{tenant}/timeline")
        n = 0
        for mb in sizes:
            pgbench_init(env, scale_for(mb), timeout=7200)
            size = db_bytes(connstr)
            api, cli, start = [], [], []
            for _ in range(runs):
                n += 1
                # The pageserver alone: metadata only, then deleted again.
                tl = os.urandom(16).hex()
                t = time.perf_counter()
                code, body = http_json("POST", ps_url, {"timeline_id": tl, "ancestor_timeline_id": main_tl},
                                       timeout=120)
                api.append(time.perf_counter() - t)
                assert code == 201, body
                code, body = http_json("DELETE", f"{ps_url}/{tl}", timeout=120)
                assert code == 200, body
                # As a user creates a branch, and a compute on it.
                name = f"b{n}"
                t = time.perf_counter()
                cluster.run("branch", "create", name, timeout=600)
                cli.append(time.perf_counter() - t)
                t = time.perf_counter()
                ep_conn = cluster.endpoint_start(f"ep{n}", name)
                first_query(connect(ep_conn), timeout=600)
                start.append(time.perf_counter() - t)
                cluster.endpoint_stop(f"ep{n}")
                cluster.run("branch", "delete", name, timeout=600)
            out[str(mb)] = {"database_bytes": size, "create_api_s": api, "create_cli_s": cli,
                            "endpoint_first_query_s": start}
            print(f"strata {mb} MB ({size >> 20} MiB): create {statistics.median(api) * 1e3:.1f} ms (API), "
                  f"{statistics.median(cli) * 1e3:.0f} ms (CLI); compute to first query "
                  f"{statistics.median(start):.2f} s", flush=True)
    return out


def run_stock(base: Path, sizes: list[int], runs: int) -> dict:
    out = {}
    with stock_postgres(base, "stock", {"shared_buffers": "128MB", "fsync": "on"}) as c:
        c.sql("CREATE DATABASE bench")
        env = c.client_env("bench")
        info = c.conninfo()
        n = 0
        for mb in sizes:
            pgbench_init(env, scale_for(mb), timeout=7200)
            size = c.sql("SELECT pg_database_size('bench')")[0][0]
            template, backup, backup_start = [], [], []
            for _ in range(runs):
                n += 1
                t = time.perf_counter()
                c.sql(f"CREATE DATABASE copy{n} TEMPLATE bench")
                template.append(time.perf_counter() - t)
                c.sql(f"DROP DATABASE copy{n}")
                # A new server's copy: pg_basebackup, then the copy started and queried.
                copy = stock_cluster(base, f"copy{n}")
                t = time.perf_counter()
                copy._run_server_tool([str(PG_BIN / "pg_basebackup"), "-D", str(copy.pgdata), "-h", str(c.socket_dir),
                                       "-p", str(c.port), "-U", info["user"], "-c", "fast", "-X", "stream"],
                                      timeout=7200)
                backup.append(time.perf_counter() - t)
                copy.start()
                first_query(connect(" ".join(f"{k}={v}" for k, v in copy.conninfo("bench").items())), timeout=600)
                backup_start.append(time.perf_counter() - t)
                copy.stop()
                copy.cleanup()
                shutil.rmtree(copy.base_dir, ignore_errors=True)
            out[str(mb)] = {"database_bytes": size, "create_database_template_s": template,
                            "pg_basebackup_s": backup, "pg_basebackup_to_first_query_s": backup_start}
            print(f"stock  {mb} MB ({size >> 20} MiB): CREATE DATABASE TEMPLATE "
                  f"{statistics.median(template) * 1e3:.0f} ms; pg_basebackup {statistics.median(backup):.2f} s, "
                  f"to a first query {statistics.median(backup_start):.2f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="100,1024,5120")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="20 and 100 MB, 2 runs")
    ap.add_argument("--strata-bin", type=Path, default=strata_to_measure())
    args = ap.parse_args()
    sizes = [20, 100] if args.quick else [int(s) for s in args.sizes_mb.split(",")]
    runs = 2 if args.quick else args.runs
    with bench_dir("strata-bench-branch-") as base:
        strata = run_strata(args.strata_bin, base / "s", sizes, runs)
        stock = run_stock(base / "p", sizes, runs)
    lines = ["size      create (API)  create (CLI)  CREATE DATABASE TEMPLATE  ratio  compute->query  pg_basebackup->query"]
    for mb in sizes:
        s, p = strata[str(mb)], stock[str(mb)]
        api = statistics.median(s["create_api_s"])
        tpl = statistics.median(p["create_database_template_s"])
        lines.append(f"{mb:>5} MB  {api * 1e3:>9.1f} ms  {statistics.median(s['create_cli_s']) * 1e3:>9.0f} ms"
                     f"  {tpl * 1e3:>21.0f} ms  {tpl / api:>5.0f}x  {statistics.median(s['endpoint_first_query_s']):>12.2f} s"
                     f"  {statistics.median(p['pg_basebackup_to_first_query_s']):>18.2f} s")
    text = "\n".join(lines)
    print("\n" + text)
    name = result_stem("branch", args.quick)
    write_json(RESULTS / f"{name}.json", {"sizes_mb": sizes, "runs": runs, "strata": strata, "stock": stock})
    (RESULTS / f"{name}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
