#!/usr/bin/env python3
"""Two sites: what each WAL placement costs against one site and against
stock PostgreSQL's synchronous replication at the same latency
(docs/sites.md), pgbench RW (TPC-B-like) at several client counts, in one
run on this machine:

- one-site:      `strata init` (three safekeepers, no link proxy): every
                 commit on two of three safekeepers of one site
- local-quorum:  `strata init --sites 2 --site-latency-ms MS`: two
                 safekeepers in dc1 make the quorum, dc2's is asynchronous
                 behind the link proxy
- stretched:     the same cluster layout with `--placement stretched`: every
                 commit on safekeepers of both sites
- stock-sync:    stock PostgreSQL (fsync on) with one synchronous standby
                 (synchronous_commit = on: the standby has flushed) whose
                 replication connection goes through `strata link-proxy`
                 with the same latency

All four run at once; each round runs every system once per client count,
the systems in turn, so that the machine's noise falls on all of them. The
latency between the sites is changed at run time through the proxies'
HTTP APIs. Medians of --runs rounds per (latency, clients, system).

Goals: local-quorum >= 0.9 x one-site; stretched >= 1.0 x stock-sync.

Usage: .venv/bin/python -m bench.sites [--scale 10] [--seconds 10] [--runs 3]
           [--clients 1,8,32] [--latencies 3,10] [--quick]
Writes bench/results/sites.json and .txt (sites_quick.* with --quick).
"""

import argparse
import os
import sys
import time
from pathlib import Path

from bench.harness import (strata_to_measure, LinkProxy, bench_dir, client_env, machine_state, median_where,
                           new_cluster, parse_latency_ms, parse_tps, pgbench, pgbench_init, result_stem, run_timeout,
                           start_cluster, stock_cluster, stop_cluster, write_results)
from test_runner.fixtures.ports import free_port
from test_runner.fixtures.wait import wait_until

SYSTEMS = ("one-site", "local-quorum", "stretched", "stock-sync")
STOCK_SETTINGS = {"shared_buffers": "128MB", "max_wal_size": "2GB", "checkpoint_timeout": "30min", "fsync": "on"}


def rw_run(env: dict, clients: int, seconds: int) -> tuple[float, float]:
    """tps and average latency (ms) of one pgbench RW run."""
    out = pgbench(env, "-n", "-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2)),
                  timeout=run_timeout(seconds))
    return parse_tps(out), parse_latency_ms(out)


class StrataSystem:
    """A local cluster (with sites or without) and its writer endpoint."""

    def __init__(self, strata_bin: Path, workdir: Path, init_args: list[str]):
        self.cluster = new_cluster(strata_bin, workdir)
        self.init_args = init_args
        self.env: dict = {}

    def start(self, scale: int) -> None:
        start_cluster(self.cluster, *self.init_args)
        connstr = self.cluster.endpoint_start("w")
        self.env = client_env(connstr)
        pgbench_init(self.env, scale)

    def set_latency(self, ms: float) -> None:
        if any(s["kind"] == "link-proxy" for s in self.cluster.cluster_toml["services"]):
            code, body = self.cluster.http("link-proxy", "PUT", "/v1/route/*", {"delay_ms": ms / 2})
            assert code == 200, body

    def stop(self) -> None:
        stop_cluster(self.cluster)


class StockSync:
    """Stock PostgreSQL with one synchronous standby reached through a link proxy."""

    def __init__(self, strata_bin: Path, base: Path):
        self.strata_bin = strata_bin
        self.base = base
        self.primary = stock_cluster(base, "primary")
        self.standby = stock_cluster(base, "standby")
        self.proxy: LinkProxy | None = None
        self.env: dict = {}

    def start(self, scale: int) -> None:
        route_port = free_port()
        self.proxy = LinkProxy(self.strata_bin, self.base,
                               "[[routes]]\n"
                               'name = "replication"\n'
                               f'listen = "127.0.0.1:{route_port}"\n'
                               f'target = "127.0.0.1:{self.primary.port}"\n')
        self.primary.initdb()
        self.primary.start({**STOCK_SETTINGS, "listen_addresses": "127.0.0.1", "wal_level": "replica",
                            "max_wal_senders": 4, "synchronous_commit": "on",
                            "synchronous_standby_names": "standby"})
        self.standby.basebackup_from(self.primary, application_name="standby")
        # Replication through the proxy (the last primary_conninfo wins).
        with open(self.standby.pgdata / "postgresql.auto.conf", "a") as f:
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={route_port} user=postgres "
                    "application_name=standby'\n")
        self.standby.start({**STOCK_SETTINGS, "hot_standby": "on"})
        wait_until("the standby to be synchronous",
                   lambda: self.primary.sql("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
                   timeout=60)
        self.env = self.primary.client_env()
        pgbench_init(self.env, scale)
        self.primary.sql("CHECKPOINT")

    def set_latency(self, ms: float) -> None:
        self.proxy.set_delay(ms / 2)

    def stop(self) -> None:
        for c in (self.standby, self.primary):
            try:
                c.cleanup()
            except Exception as e:  # noqa: BLE001 - the other one is still cleaned up
                print(f"cleanup: {e}", file=sys.stderr)
        if self.proxy is not None:
            self.proxy.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--latencies", type=lambda s: [float(x) for x in s.split(",")], default=[3.0, 10.0])
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 1 round of 3 s, 4 clients, 3 ms")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs, args.clients, args.latencies = 2, 3, 1, [4], [3.0]
    strata_bin = strata_to_measure()
    results: dict = {"config": vars(args), **machine_state(), "runs": []}
    with bench_dir() as base:
        first = args.latencies[0]
        sites = ["--sites", "2", "--site-latency-ms", str(first)]
        systems = {
            "one-site": StrataSystem(strata_bin, base / "one-site", []),
            "local-quorum": StrataSystem(strata_bin, base / "local-quorum", [*sites, "--placement", "local-quorum"]),
            "stretched": StrataSystem(strata_bin, base / "stretched", [*sites, "--placement", "stretched"]),
            "stock-sync": StockSync(strata_bin, base / "stock"),
        }
        try:
            for name, system in systems.items():
                t = time.monotonic()
                system.start(args.scale)
                print(f"{name}: ready in {time.monotonic() - t:.0f} s", flush=True)
            for latency in args.latencies:
                for system in systems.values():
                    system.set_latency(latency)
                for rnd in range(args.runs):
                    for clients in args.clients:
                        for name, system in systems.items():
                            tps, lat = rw_run(system.env, clients, args.seconds)
                            results["runs"].append({"latency_ms": latency, "clients": clients, "system": name,
                                                    "round": rnd, "tps": tps, "latency_avg_ms": lat})
                            print(f"{latency:>4} ms {clients:>3} clients {name:<13} {tps:>8.0f} tps "
                                  f"{lat:>7.2f} ms", flush=True)
        finally:
            for system in systems.values():
                system.stop()
    results["loadavg_after"] = os.getloadavg()[0]

    def median(latency, clients, system):
        return median_where(results["runs"], "tps", latency_ms=latency, clients=clients, system=system)

    lines = [f"pgbench RW, scale {args.scale}, {args.seconds} s per run, medians of {args.runs} rounds "
             f"({os.cpu_count()} CPUs)", "",
             f"{'RTT':>5} {'clients':>7} " + " ".join(f"{s:>13}" for s in SYSTEMS)
             + f" {'lq/one-site':>12} {'str/stock':>10}"]
    summary = {}
    for latency in args.latencies:
        for clients in args.clients:
            m = {s: median(latency, clients, s) for s in SYSTEMS}
            lq, st = m["local-quorum"] / m["one-site"], m["stretched"] / m["stock-sync"]
            summary[f"{latency}ms/{clients}"] = {**m, "local_quorum_vs_one_site": lq, "stretched_vs_stock_sync": st}
            lines.append(f"{latency:>3.0f}ms {clients:>7} " + " ".join(f"{m[s]:>13.0f}" for s in SYSTEMS)
                         + f" {lq:>12.2f} {st:>10.2f}")
    lines += ["", "tps; goals: local-quorum >= 0.9 x one-site, stretched >= 1.0 x stock-sync"]
    results["medians"] = summary
    write_results(result_stem("sites", args.quick), results, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
