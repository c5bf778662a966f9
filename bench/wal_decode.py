#!/usr/bin/env python3
"""WAL decoding throughput on WAL written by pgbench, next to the machine's
memory-copy and file-read bandwidth for the same bytes.

Starts a throw-away PostgreSQL 15 cluster, runs pgbench (initialisation and a
read-write run), stops it, and runs `strata wal bench` over its pg_wal for
two WAL flavours: plain (no images beyond full_page_writes) and with
wal_consistency_checking='all' + lz4 (every block change carries an image,
as Strata's computes write it for rmgrs without native redo).

Usage: .venv/bin/python bench/wal_decode.py [--scale 10] [--transactions 20000] [--runs 5]
Writes bench/results/wal_decode.json and prints a summary.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "test_runner"))

from fixtures.pg import PgCluster  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def generate_wal(base: Path, settings: dict, scale: int, transactions: int) -> PgCluster:
    cluster = PgCluster(PG_BIN, base, traverse_root=base.parent)
    cluster.initdb()
    cluster.start({"max_wal_size": "4GB", "wal_keep_size": "4GB", "checkpoint_timeout": "1h",
                   "fsync": "off", **settings})
    cluster.run(["pgbench", "-i", "-q", "-s", str(scale)], timeout=1200)
    cluster.run(["pgbench", "-n", "-c", "4", "-j", "2", "-t", str(transactions // 4)], timeout=1200)
    cluster.stop("fast")
    return cluster


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--transactions", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    strata = REPO / "target" / "release" / "strata"
    results = {}
    flavours = {
        "plain": {},
        "consistency_all_lz4": {"wal_consistency_checking": "all", "wal_compression": "lz4"},
    }
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        for name, settings in flavours.items():
            cluster = generate_wal(Path(tmp) / name, settings, args.scale, args.transactions)
            try:
                out = subprocess.run([str(strata), "wal", "bench", "--runs", str(args.runs), str(cluster.waldir)],
                                     capture_output=True, text=True, check=True, timeout=3600)
            finally:
                cluster.cleanup()
            results[name] = json.loads(out.stdout)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "wal_decode.json").write_text(json.dumps(results, indent=2))
    print(f"{'WAL':<22}{'MB':>8}{'records':>10}{'decode MB/s':>13}{'rec/s':>12}"
          f"{'+images MB/s':>14}{'copy MB/s':>11}{'read MB/s':>11}{'decode/copy':>13}{'decode/read':>13}")
    for name, r in results.items():
        print(f"{name:<22}{r['wal_bytes'] / 1e6:>8.1f}{r['records']:>10}{r['decode_mb_per_s']:>13.0f}"
              f"{r['decode_records_per_s']:>12.0f}{r['decode_and_restore_images_mb_per_s']:>14.0f}"
              f"{r['copy_mb_per_s']:>11.0f}{r['read_mb_per_s']:>11.0f}{r['decode_vs_copy']:>13.3f}"
              f"{r['decode_vs_read']:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
