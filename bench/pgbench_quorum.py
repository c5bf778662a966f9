#!/usr/bin/env python3
"""pgbench read-write TPS and latency, side by side in one run:

- stock:    PostgreSQL 15 on local disk, fsync=on, synchronous_commit=on
- strata:   PostgreSQL 15 (fsync=off: the compute is disposable) whose commits
            wait for a quorum of 3 safekeepers (fsync on) via the proposer
- sync_any2: stock PostgreSQL with two synchronous standbys, ANY 2 (the same
            durability as a 2-of-3 quorum), all fsync=on

Usage: .venv/bin/python bench/pgbench_quorum.py [--scale 10] [--seconds 10] [--runs 3] [--clients 1,8,32]
Writes bench/results/pgbench_quorum.json and prints medians and ratios.
"""

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "test_runner"))

from fixtures.pg import PgCluster  # noqa: E402
from fixtures.strata import WalService  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")
COMMON = {"shared_buffers": "128MB", "max_wal_size": "2GB", "checkpoint_timeout": "30min"}


def pgbench(cluster: PgCluster, clients: int, seconds: int) -> tuple[float, float]:
    out = cluster.run(["pgbench", "-n", "-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2))],
                      timeout=seconds * 4 + 120).stdout
    tps = float(re.search(r"tps = ([0-9.]+)", out).group(1))
    latency = float(re.search(r"latency average = ([0-9.]+) ms", out).group(1))
    return tps, latency


def measure(cluster: PgCluster, args) -> dict:
    cluster.run(["pgbench", "-i", "-q", "-s", str(args.scale)], timeout=1800)
    cluster.sql("CHECKPOINT")
    results = {}
    for clients in args.clients:
        runs = [pgbench(cluster, clients, args.seconds) for _ in range(args.runs)]
        results[clients] = {"tps": statistics.median(r[0] for r in runs),
                            "latency_ms": statistics.median(r[1] for r in runs),
                            "tps_runs": [r[0] for r in runs]}
    return results


def stock(base: Path, args) -> dict:
    c = PgCluster(PG_BIN, base / "stock", traverse_root=base)
    try:
        c.initdb()
        c.start({**COMMON, "fsync": "on", "synchronous_commit": "on"})
        return measure(c, args)
    finally:
        c.cleanup()


def strata(strata_bin: Path, base: Path, args) -> dict:
    c = PgCluster(PG_BIN, base / "strata-pg", traverse_root=base)
    svc = WalService(strata_bin, base / "strata", c)
    (base / "strata").mkdir(exist_ok=True)
    try:
        svc.start(extra_settings=COMMON)
        return measure(c, args)
    finally:
        svc.stop()
        c.cleanup()


def sync_any2(base: Path, args) -> dict:
    primary = PgCluster(PG_BIN, base / "primary", traverse_root=base)
    standbys = [PgCluster(PG_BIN, base / f"standby{i}", traverse_root=base) for i in (1, 2)]
    try:
        primary.initdb()
        primary.start({**COMMON, "fsync": "on", "wal_level": "replica", "max_wal_senders": 10,
                       "synchronous_commit": "on", "synchronous_standby_names": "ANY 2 (s1, s2)"})
        for i, s in enumerate(standbys, start=1):
            s.basebackup_from(primary, application_name=f"s{i}")
            s.start({**COMMON, "fsync": "on", "hot_standby": "on"})
        return measure(primary, args)
    finally:
        for c in [primary, *standbys]:
            c.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    args = ap.parse_args()
    strata_bin = REPO / "target" / "release" / "strata"
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        results = {"stock": stock(base, args), "strata": strata(strata_bin, base, args),
                   "sync_any2": sync_any2(base, args)}
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "pgbench_quorum.json").write_text(json.dumps(results, indent=2))
    print(f"{'clients':>8} {'stock tps':>10} {'strata tps':>11} {'any2 tps':>9} {'strata/stock':>13} {'strata/any2':>12}"
          f" {'lat stock':>10} {'lat strata':>11} {'lat any2':>9}")
    for c in args.clients:
        s, t, a = results["stock"][c], results["strata"][c], results["sync_any2"][c]
        print(f"{c:>8} {s['tps']:>10.0f} {t['tps']:>11.0f} {a['tps']:>9.0f} {t['tps'] / s['tps']:>13.2f}"
              f" {t['tps'] / a['tps']:>12.2f} {s['latency_ms']:>10.2f} {t['latency_ms']:>11.2f} {a['latency_ms']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
