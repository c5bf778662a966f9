#!/usr/bin/env python3
"""A replica in dc2 reading its own site's pageserver against one reading
dc1's across the link (docs/sites.md, "A pageserver per site"): the field
report this project started from found a DC2 replica reading DC1's
pageservers at about 30% of the read throughput.

One local cluster made through the CLI, `strata init --sites 2
--site-latency-ms MS`, a writer in dc1 loaded with pgbench -i, and three
replicas of it, each with a small cache so that most reads go to a
pageserver:

- dc1-local: on dc1's host, reading dc1's (attached) pageserver;
- dc2-own:   on dc2's host, reading dc2's pageserver (the tenant's reader
             there, fed by dc2's safekeeper): `--site dc2`;
- dc2-far:   on dc2's host, reading dc1's pageserver through the link
             proxy: `--host dc2 --site dc1`.

Each round runs pgbench -S (select-only, random accounts) at each client
count against each replica in turn, the others idle; the link's latency is
changed at run time through the proxy's HTTP API. Every run starts with
the kernel's page cache dropped (`/proc/sys/vm/drop_caches`, as root), so
that what a replica's own cache does not hold comes from a pageserver
(otherwise the files the lazy file system served stay in the page cache
and later runs read no pageserver at all). Medians of --runs rounds per
(latency, clients, replica), and the ratio dc2-own / dc2-far.

Usage: .venv/bin/python -m bench.site_reads [--scale 10] [--seconds 10] [--runs 3]
           [--clients 1,8] [--latencies 3,10] [--cache-mb 8] [--quick]
Writes bench/results/site_reads.json and .txt (site_reads_quick.* with --quick).
"""

import argparse
import os
import sys

from bench.harness import (strata_to_measure, bench_dir, client_env, last_line, local_cluster, machine_state,
                           median_where, pgbench_init, pgbench_tps, psql, result_stem, run_timeout, write_results)
from test_runner.fixtures.endpoint import Endpoint
from test_runner.fixtures.strata import drop_os_caches
from test_runner.fixtures.wait import wait_until

# name: (host, site it reads)
REPLICAS = {"dc1-local": ("dc1", "dc1"), "dc2-own": ("dc2", "dc2"), "dc2-far": ("dc2", "dc1")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--latencies", type=lambda s: [float(x) for x in s.split(",")], default=[3.0, 10.0])
    ap.add_argument("--cache-mb", type=int, default=8, help="each replica's block cache (shared_buffers the same)")
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 1 round of 3 s, 4 clients, 3 ms")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs, args.clients, args.latencies = 2, 3, 1, [4], [3.0]
    results: dict = {"config": vars(args), **machine_state(), "runs": []}
    sites = ["--sites", "2", "--site-latency-ms", str(args.latencies[0])]
    with bench_dir() as base, local_cluster(strata_to_measure(), base / "cluster", *sites) as c:
        writer = c.endpoint_start("w")
        pgbench_init(client_env(writer), args.scale)
        psql(client_env(writer), "CHECKPOINT")
        replicas = {}
        for name, (host, site) in REPLICAS.items():
            out = c.run("endpoint", "start", name, "--replica-of", "w", "--host", host, "--site", site,
                        "--cache-mb", str(args.cache_mb), "--shared-buffers", f"{args.cache_mb}MB",
                        timeout=300).stdout
            replicas[name] = last_line(out)
            used = wait_until(f"{name} to read the pageserver of {site}",
                              lambda n=name, s=site: (lambda p: p if (p["reader"] == (s == "dc2")) else None)(
                                  Endpoint(c, n).agent_status()["pageserver"]), timeout=120)
            results.setdefault("pageservers", {})[name] = used
            print(f"{name}: on {host}, reads {used['name']} (reader: {used['reader']})", flush=True)
        for latency in args.latencies:
            code, body = c.http("link-proxy", "PUT", "/v1/route/*", {"delay_ms": latency / 2})
            assert code == 200, body
            for rnd in range(args.runs):
                for clients in args.clients:
                    for name, connstr in replicas.items():
                        run = ["-n", "-S", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(args.seconds)]
                        cold = drop_os_caches(1)
                        tps = pgbench_tps(client_env(connstr), *run, timeout=run_timeout(args.seconds))
                        results["runs"].append({"latency_ms": latency, "clients": clients, "replica": name,
                                                "round": rnd, "tps": tps, "page_cache_dropped": cold})
                        print(f"{latency:>4} ms {clients:>3} clients {name:<10} {tps:>9.0f} tps", flush=True)
    results["loadavg_after"] = os.getloadavg()[0]

    def median(latency, clients, replica):
        return median_where(results["runs"], "tps", latency_ms=latency, clients=clients, replica=replica)

    cold = all(r["page_cache_dropped"] for r in results["runs"])
    lines = [f"pgbench -S on replicas, scale {args.scale}, cache {args.cache_mb} MiB, {args.seconds} s per run,"
             f" medians of {args.runs} rounds ({os.cpu_count()} CPUs);"
             f" page cache {'dropped before every run' if cold else 'NOT dropped (not root): later runs are warm'}", "",
             f"{'RTT':>5} {'clients':>7} " + " ".join(f"{n:>10}" for n in REPLICAS) + f" {'own/far':>8}"]
    summary = {}
    for latency in args.latencies:
        for clients in args.clients:
            m = {n: median(latency, clients, n) for n in REPLICAS}
            ratio = m["dc2-own"] / m["dc2-far"]
            summary[f"{latency}ms/{clients}"] = {**m, "own_vs_far": ratio}
            lines.append(f"{latency:>3.0f}ms {clients:>7} " + " ".join(f"{m[n]:>10.0f}" for n in REPLICAS)
                         + f" {ratio:>8.2f}")
    lines += ["", "tps; dc2-own reads dc2's own pageserver, dc2-far reads dc1's across the link"]
    results["medians"] = summary
    write_results(result_stem("site_reads", args.quick), results, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
