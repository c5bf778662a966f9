"""What the proxy's relay costs, for bench/wake.py: pgbench -S through the
proxy and directly, with the CPU time per transaction of the proxy, the
compute's PostgreSQL processes and pgbench, read from /proc.

Two placements: `shared` (every process on every core, as the CLI's
cluster runs on one machine) and `pinned` (the proxy on a core of its own,
everything else on another: the proxy on a host of its own, as a
deployment may place it; `--hosts` with a `proxy` role).
"""

import os
import statistics
import subprocess
import time

from bench.harness import pgbench, parse_tps, run_timeout

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User and system time of the processes and of their reaped children
    (a PostgreSQL backend's time is its postmaster's once it exits)."""
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / TICK


def pids(*pgrep_args: str) -> list[int]:
    out = subprocess.run(["pgrep", *pgrep_args], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def proxy_pids(workdir) -> list[int]:
    """The cluster's proxy and its supervisor (by their config's path)."""
    return pids("-f", f"{workdir}/proxy/proxy.toml")


def pin(proxy: list[int]) -> None:
    """The proxy's threads on core 1; this process (so pgbench) and every
    running PostgreSQL process (so the backends they fork) on core 0."""
    os.sched_setaffinity(0, {0})
    for pid in pids("-x", "postgres"):
        os.sched_setaffinity(pid, {0})
    for pid in proxy:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), {1})


def unpin(proxy: list[int]) -> None:
    every = set(range(os.cpu_count() or 1))
    os.sched_setaffinity(0, every)
    for pid in pids("-x", "postgres"):
        os.sched_setaffinity(pid, every)
    for pid in proxy:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), every)


def one_run(env: dict, proxy: list[int], secs: int) -> dict:
    """pgbench -S -c 8 for `secs`; its tps and CPU microseconds per transaction."""
    before = cpu_seconds(proxy), cpu_seconds(pids("-x", "postgres")), os.times()
    out = pgbench(env, "-S", "-n", "-c", "8", "-j", "2", "-T", str(secs), timeout=run_timeout(secs))
    time.sleep(1)  # the backends exit and are reaped
    after = cpu_seconds(proxy), cpu_seconds(pids("-x", "postgres")), os.times()
    tps = parse_tps(out)
    per_tx = 1e6 / (tps * secs)
    client = lambda t: t.children_user + t.children_system  # noqa: E731
    return {"tps": tps, "proxy_us": (after[0] - before[0]) * per_tx, "postgres_us": (after[1] - before[1]) * per_tx,
            "pgbench_us": (client(after[2]) - client(before[2])) * per_tx}


def measure(direct: dict, through: dict, proxy: list[int], runs: int, secs: int) -> dict:
    """`runs` alternating pairs through the proxy and direct; medians and ratios."""
    rows: dict = {"proxy": [], "direct": []}
    for _ in range(runs):
        for name, env in (("proxy", through), ("direct", direct)):
            rows[name].append(one_run(env, proxy, secs))
    ratios = [p["tps"] / d["tps"] for p, d in zip(rows["proxy"], rows["direct"])]
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rows.items()}
    return {"runs": rows, "medians": med, "ratio": statistics.median(ratios), "ratios": ratios}
