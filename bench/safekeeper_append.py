#!/usr/bin/env python3
"""Safekeeper append throughput (fsync per append) next to the disk's own
sequential write bandwidth, measured in the same run on the same file
system with dd: `oflag=dsync` (a sync per write, same block size: the
fair comparison) and `conv=fdatasync` (one sync at the end: the ceiling).
Segment sizes 16 and 128 MiB. Medians of --runs.

Usage: .venv/bin/python -m bench.safekeeper_append [--total-mb 256] [--runs 3] [--dir DIR]
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import REPO, RESULTS, write_json

SIZES = [(8 << 10, "8 KiB"), (128 << 10, "128 KiB"), (1 << 20, "1 MiB")]


def dd(path: Path, block: int, total: int, flag: list[str]) -> float:
    count = max(1, total // block)
    out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}", *flag],
                         capture_output=True, text=True, check=True).stderr
    path.unlink()
    m = re.search(r"copied, ([0-9.]+) s", out)
    return block * count / 1e6 / float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--total-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="file system to measure (default: a temporary directory)")
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "strata-safekeeper", "--example", "append_bench"],
                   cwd=REPO, check=True)
    binary = REPO / "target" / "release" / "examples" / "append_bench"
    base = Path(args.dir or tempfile.mkdtemp(prefix="strata-append-"))
    total = args.total_mb << 20
    results = []
    for size, label in SIZES:
        # Small appends are slow with an fsync each: cap their volume.
        volume = min(total, size * 4000)
        row = {"append": label}
        row["dd_dsync_mb_s"] = statistics.median(
            dd(base / "dd.bin", size, volume, ["oflag=dsync"]) for _ in range(args.runs))
        row["dd_fdatasync_mb_s"] = statistics.median(
            dd(base / "dd.bin", size, total, ["conv=fdatasync"]) for _ in range(args.runs))
        for seg in (16, 128):
            runs = []
            for _ in range(args.runs):
                out = subprocess.run([str(binary), "--dir", str(base / "sk"), "--append-size", str(size),
                                      "--total-mb", str(max(1, volume >> 20)), "--segment-mb", str(seg)],
                                     capture_output=True, text=True, check=True).stdout
                runs.append(json.loads(out)["mb_per_s"])
            row[f"strata_seg{seg}_mb_s"] = statistics.median(runs)
        results.append(row)
    write_json(RESULTS / "safekeeper_append.json", results)
    print(f"{'append':>8} {'dd dsync':>9} {'dd fdatasync':>13} {'strata 16M':>11} {'strata 128M':>12}"
          f" {'vs dsync':>9} {'vs fdatasync':>13} {'128M/16M':>9}")
    for r in results:
        s16, s128 = r["strata_seg16_mb_s"], r["strata_seg128_mb_s"]
        print(f"{r['append']:>8} {r['dd_dsync_mb_s']:>9.0f} {r['dd_fdatasync_mb_s']:>13.0f} {s16:>11.0f} {s128:>12.0f}"
              f" {s16 / r['dd_dsync_mb_s']:>9.2f} {s16 / r['dd_fdatasync_mb_s']:>13.2f} {s128 / s16:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
