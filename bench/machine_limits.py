#!/usr/bin/env python3
"""The limits of this machine that bound the write path's figures
(`docs/performance.md`), medians of --runs:

- disk:     sequential writes of 1 MiB blocks, then one fsync, MB/s (what a
            layer flush, a WAL segment and an upload at most reach);
- fsync:    one 8 KiB write and fdatasync in place, as a WAL flush does
            (`pg_test_fsync`'s case), median and p99 latency in µs: what one
            commit waits at least, on each of PostgreSQL and 2 safekeepers;
- loopback: a 64-byte TCP ping-pong round trip on 127.0.0.1, median and
            p99 µs: what each hop of a commit (PostgreSQL → proposer →
            safekeepers → back) adds at least;
- memcpy:   one core copying 64 MiB buffers, GB/s (the ceiling of every
            copy of WAL between processes and into the page cache);
- cores:    the CPUs every process shares.

Usage: .venv/bin/python -m bench.machine_limits [--runs 5] [--dir DIR]
Writes bench/results/machine_limits.json and prints a summary.
"""

import argparse
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import RESULTS, nearest_rank, write_json

MB = 1 << 20


def disk_mb_per_s(directory: Path, total: int = 1 << 30) -> float:
    """Sequential 1 MiB writes of `total` bytes, then one fsync: MB/s."""
    block = os.urandom(MB)
    path = directory / "disk-test"
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(total // MB):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.monotonic() - t0
    path.unlink()
    return total / MB / seconds


def fsync_latencies_us(directory: Path, count: int = 500) -> list[float]:
    """Microseconds of each of `count` 8 KiB writes in place, each followed by fdatasync."""
    path = directory / "fsync-test"
    block = os.urandom(8192)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    out = []
    try:
        os.write(fd, block * 16)
        os.fsync(fd)
        for i in range(count):
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % 16) * 8192)
            os.fdatasync(fd)
            out.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.close(fd)
        path.unlink()
    return out


def loopback_rtts_us(count: int = 20000) -> list[float]:
    """Microseconds of each of `count` 64-byte TCP round trips to an echo thread on 127.0.0.1."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def echo():
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                data = conn.recv(64)
                if not data:
                    return
                conn.sendall(data)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    client = socket.create_connection(server.getsockname(), timeout=10)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * 64
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        client.sendall(payload)
        got = 0
        while got < len(payload):
            got += len(client.recv(64))
        out.append((time.perf_counter() - t0) * 1e6)
    client.close()
    thread.join(timeout=5)
    server.close()
    return out


def memcpy_gb_per_s(size: int = 64 * MB, rounds: int = 20) -> float:
    """One core copying a `size` buffer `rounds` times: GB/s."""
    src = bytearray(os.urandom(size))
    dst = bytearray(size)
    t0 = time.perf_counter()
    for _ in range(rounds):
        dst[:] = src
    return size * rounds / (time.perf_counter() - t0) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="a directory on the disk to measure (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="strata-limits-", dir=args.dir) as tmp:
        d = Path(tmp)
        disk = [disk_mb_per_s(d) for _ in range(args.runs)]
        fsyncs = [fsync_latencies_us(d) for _ in range(args.runs)]
    rtts = [loopback_rtts_us() for _ in range(args.runs)]
    copies = [memcpy_gb_per_s() for _ in range(args.runs)]
    result = {
        "cores": os.cpu_count(),
        "disk_mb_per_s": round(statistics.median(disk), 1),
        "fsync_us_p50": round(statistics.median(statistics.median(f) for f in fsyncs), 1),
        "fsync_us_p99": round(statistics.median(nearest_rank(f, 0.99) for f in fsyncs), 1),
        "loopback_rtt_us_p50": round(statistics.median(statistics.median(r) for r in rtts), 1),
        "loopback_rtt_us_p99": round(statistics.median(nearest_rank(r, 0.99) for r in rtts), 1),
        "memcpy_gb_per_s": round(statistics.median(copies), 2),
        "runs": {"disk_mb_per_s": [round(x, 1) for x in disk], "memcpy_gb_per_s": [round(x, 2) for x in copies]},
        "loadavg": os.getloadavg()[0],
    }
    write_json(RESULTS / "machine_limits.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
