#!/usr/bin/env python3
"""Pageserver WAL ingest under pgbench, next to the rate at which the
compute writes that WAL and to `strata wal bench` decoding the same WAL:

- run:      pgbench -c 8 -T 30 on an endpoint of a local cluster (`strata
            init`, `start`, `endpoint start`) after `pgbench -i -s 10`. Every
            0.5 s a sampler reads the compute's pg_current_wal_lsn(), the
            pageserver's timeline status (last_record_lsn) and its /metrics
            (strata_pageserver_wal_bytes_ingested, records_ingested). Per run:
            WAL written by the compute (MB/s), WAL ingested (MB/s, records/s),
            ingested/written, and the lag in bytes and in seconds (p50, p99,
            max).
- catch-up: the pageserver is stopped (`strata stop --only pageserver`) two
            seconds into a pgbench run, which goes on without it; once pgbench
            has finished the pageserver is started again and the time until
            it has ingested the whole backlog gives its ingest rate when WAL
            is waiting (MB/s, records/s): its capacity, not the compute's pace.
- decode:   `strata wal bench` over a safekeeper's segment files of the same
            timeline afterwards: decoding alone (MB/s), the ceiling of ingest.

Lag in bytes = compute LSN - pageserver last_record_lsn at one sample. Lag
in seconds = for each sample of the compute's LSN, the time until the
pageserver's last_record_lsn reached it (interpolated between samples).
The pageserver's counters restart from zero with the process; rates are
taken from differences.

Usage: .venv/bin/python -m bench.pageserver_ingest [--scale 10] [--clients 8] [--seconds 30] [--runs 3]
           [--catchup-runs 3] [--backlog-seconds 30] [--interval 0.5] [--quick]
Writes bench/results/pageserver_ingest.json and .txt (pageserver_ingest_quick.* with --quick) and prints
medians and ratios.
"""

import argparse
import sys
import threading
import time
import urllib.error

import psycopg

from bench.harness import (bench_dir, client_env, local_cluster, machine_state, median_at,
                           pageserver_metric, parse_tps, percentile, pgbench, pgbench_process, result_stem,
                           run_timeout, strata_to_measure, timeline_url, wal_bench, write_results)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.strata import SEGMENT_NAME, http_json, http_text, parse_lsn, segment_number

MB = 1e6


def counters(text: str) -> dict[str, float]:
    """The pageserver's ingest counters from its Prometheus text."""
    return {name: pageserver_metric(text, f"{name}_total") for name in ("wal_bytes_ingested", "records_ingested")}


class Target:
    """The cluster's pageserver, timeline and endpoint, as the benchmark reads them."""

    def __init__(self, cluster: LocalCluster, connstr: str):
        self.cluster = cluster
        self.connstr = connstr
        self.tl_url = timeline_url(cluster)
        self.metrics_url = cluster.http_url("pageserver", "/metrics")
        self.tenant = cluster.tenant_id()
        self.timeline = cluster.timeline_id()
        self.pg_env = client_env(connstr)

    def timeline_status(self) -> dict:
        code, body = http_json("GET", self.tl_url, timeout=5)
        assert code == 200, body
        return body

    def pageserver_lsn(self) -> int:
        return parse_lsn(self.timeline_status()["last_record_lsn"])

    def metrics(self) -> dict[str, float]:
        return counters(http_text(self.metrics_url, timeout=5))

    def compute_lsn(self) -> int:
        with psycopg.connect(self.connstr, autocommit=True) as conn:
            return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])

    def pgbench(self, *args: str, timeout: float) -> str:
        return pgbench(self.pg_env, *args, timeout=timeout)

    def wait_caught_up(self, timeout: float = 300) -> float:
        """Waits until the pageserver has ingested everything the compute wrote; returns the seconds waited."""
        target = self.compute_lsn()
        start = time.monotonic()
        while self.pageserver_lsn() < target:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"pageserver did not reach {target:X} in {timeout} s")
            time.sleep(0.05)
        return time.monotonic() - start


class Sampler:
    """Samples the compute's LSN, the pageserver's LSN and counters every `interval` in a thread.

    One sample: t (monotonic), compute_lsn, pageserver_lsn (None while the
    pageserver does not answer), wal_bytes, records."""

    def __init__(self, target: Target, interval: float):
        self.target = target
        self.interval = interval
        self.samples: list[dict] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.error: Exception | None = None

    def __enter__(self) -> "Sampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error

    def loop(self) -> None:
        try:
            with psycopg.connect(self.target.connstr, autocommit=True) as conn:
                next_at = time.monotonic()
                while not self.stop_event.is_set():
                    t = time.monotonic()
                    clsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
                    sample = {"t": t, "compute_lsn": clsn, "pageserver_lsn": None,
                              "wal_bytes": None, "records": None}
                    try:
                        sample["pageserver_lsn"] = self.target.pageserver_lsn()
                        c = self.target.metrics()
                        sample["wal_bytes"], sample["records"] = c["wal_bytes_ingested"], c["records_ingested"]
                    except (urllib.error.URLError, ConnectionError, TimeoutError, AssertionError):
                        pass
                    self.samples.append(sample)
                    next_at += self.interval
                    self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        except Exception as e:  # reported by __exit__
            self.error = e

    def window(self, t0: float, t1: float) -> list[dict]:
        return [s for s in self.samples if t0 <= s["t"] <= t1]


def lag_seconds(samples: list[dict], t0: float, t1: float) -> list[float]:
    """For each sample in [t0, t1]: seconds until the pageserver's LSN reached
    the compute's LSN of that sample, interpolated linearly between samples;
    samples whose LSN was never reached are left out."""
    ps = [(s["t"], s["pageserver_lsn"]) for s in samples if s["pageserver_lsn"] is not None]
    out = []
    j = 0
    for s in samples:
        if not t0 <= s["t"] <= t1:
            continue
        c = s["compute_lsn"]
        while j < len(ps) and ps[j][0] < s["t"]:
            j += 1
        # The first pageserver sample at or after this one that holds c.
        k = j
        while k < len(ps) and ps[k][1] < c:
            k += 1
        if k == len(ps):
            continue
        tk, pk = ps[k]
        if k > 0 and ps[k - 1][1] < c and pk > ps[k - 1][1]:
            tp, pp = ps[k - 1]
            tk = tp + (tk - tp) * (c - pp) / (pk - pp)
        out.append(max(0.0, tk - s["t"]))
    return out


def rate(samples: list[dict], key: str) -> float:
    """Increase of a counter per second between the first and last sample that have it."""
    have = [s for s in samples if s[key] is not None]
    if len(have) < 2 or have[-1]["t"] <= have[0]["t"]:
        return float("nan")
    return (have[-1][key] - have[0][key]) / (have[-1]["t"] - have[0]["t"])


def summarize_window(sampler: Sampler, t0: float, t1: float) -> dict:
    w = sampler.window(t0, t1)
    lag_b = [s["compute_lsn"] - s["pageserver_lsn"] for s in w if s["pageserver_lsn"] is not None]
    lag_s = lag_seconds(sampler.samples, t0, t1)
    return {
        "seconds": w[-1]["t"] - w[0]["t"],
        "samples": len(w),
        "written_mb_per_s": rate(w, "compute_lsn") / MB,
        "ingested_mb_per_s": rate(w, "wal_bytes") / MB,
        "ingested_records_per_s": rate(w, "records"),
        "lag_bytes": {"p50": percentile(lag_b, 50), "p99": percentile(lag_b, 99), "max": max(lag_b)},
        "lag_seconds": {"p50": percentile(lag_s, 50), "p99": percentile(lag_s, 99), "max": max(lag_s)},
    }


def pgbench_run(target: Target, sampler: Sampler, args) -> dict:
    target.wait_caught_up()
    t0 = time.monotonic()
    out = target.pgbench("-n", "-c", str(args.clients), "-j", str(min(args.clients, 2)), "-T", str(args.seconds),
                         timeout=run_timeout(args.seconds))
    t1 = time.monotonic()
    target.wait_caught_up()
    time.sleep(args.interval * 2)  # samples after the end, for the lag of the last ones
    r = summarize_window(sampler, t0, t1)
    r["tps"] = parse_tps(out)
    r["ingested_vs_written"] = r["ingested_mb_per_s"] / r["written_mb_per_s"]
    return r


def catchup_run(target: Target, args) -> dict:
    """Stops the pageserver 2 s into a pgbench run, restarts it after the
    run and times the ingestion of the backlog."""
    cluster = target.cluster
    target.wait_caught_up()
    start_lsn = target.pageserver_lsn()
    bench = pgbench_process(target.pg_env, "-n", "-c", str(args.clients), "-j", str(min(args.clients, 2)),
                            "-T", str(args.backlog_seconds))
    try:
        time.sleep(2)
        cluster.stop("--only", "pageserver")
        stopped_lsn = parse_lsn(cluster.status()["timelines"][0]["safekeepers"][0]["commit_lsn"])
        out, err = bench.communicate(timeout=run_timeout(args.backlog_seconds))
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    if bench.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{out[-3000:]}\n{err[-3000:]}")
    end_lsn = target.compute_lsn()
    t_start = time.monotonic()
    cluster.start("--only", "pageserver")
    t_ready = time.monotonic()
    # Where the restarted pageserver resumes: what it had made durable.
    first = target.timeline_status()
    resumed_lsn = min(parse_lsn(first["last_record_lsn"]), parse_lsn(first["disk_consistent_lsn"]))
    # The rates count from here: what was ingested before `strata start`
    # returned is left out of both the bytes and the time.
    ready_lsn = parse_lsn(first["last_record_lsn"])
    c0 = target.metrics()
    t0 = time.monotonic()
    # The last poll before the LSN first moved: from there on WAL flows.
    t_flow, lsn_flow = t0, ready_lsn
    while True:
        t = time.monotonic()
        lsn = target.pageserver_lsn()
        if lsn >= end_lsn:
            break
        if lsn == ready_lsn:
            t_flow = t
        if t - t_ready > 600:
            raise TimeoutError("the pageserver did not ingest its backlog in 600 s")
        time.sleep(0.01)
    t_done = time.monotonic()
    c1 = target.metrics()
    ingest_s = t_done - t0
    return {
        "backlog_bytes": end_lsn - resumed_lsn,
        "backlog_mb": (end_lsn - resumed_lsn) / MB,
        "wal_while_down_mb": (end_lsn - stopped_lsn) / MB,
        "ingested_before_ready_mb": (ready_lsn - resumed_lsn) / MB,
        "pageserver_start_s": t_ready - t_start,
        "ingest_s": ingest_s,
        "restart_to_caught_up_s": t_done - t_start,
        "first_wal_s": t_flow - t0,
        "flowing_mb_per_s": (end_lsn - lsn_flow) / MB / (t_done - t_flow),
        "backlog_mb_per_s": (end_lsn - ready_lsn) / MB / ingest_s,
        "ingested_mb_per_s": (c1["wal_bytes_ingested"] - c0["wal_bytes_ingested"]) / MB / ingest_s,
        "ingested_records_per_s": (c1["records_ingested"] - c0["records_ingested"]) / ingest_s,
        "records": c1["records_ingested"],
        "start_lsn": f"{start_lsn >> 32:X}/{start_lsn & 0xFFFFFFFF:X}",
        "tps": parse_tps(out),
    }


def decode_bench(cluster: LocalCluster, target: Target, runs: int) -> dict | None:
    """`strata wal bench` over sk1's complete segment files of the timeline,
    from its second one on (the first starts with zeros before the timeline's
    start LSN); None when sk1 keeps none (it removes segments once every
    consumer and the archive have them: docs/safekeeper.md)."""
    d = cluster.workdir / "sk1" / "data" / target.tenant / target.timeline
    segments = sorted(p for p in d.iterdir() if SEGMENT_NAME.match(p.name))
    end = target.compute_lsn()
    seg_size = target.timeline_status()["wal_segment_size"]
    last_complete = end // seg_size  # segments below this number are complete
    files = [p for p in segments[1:] if segment_number(p.name, seg_size) < last_complete]
    if not files:
        return None
    return wal_bench(cluster.strata_bin, files, runs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--catchup-runs", type=int, default=3)
    ap.add_argument("--backlog-seconds", type=int, default=30)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--quick", action="store_true", help="smoke run: scale 2, 2 runs of 5 s, 1 catch-up of 6 s")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs, args.catchup_runs, args.backlog_seconds = 2, 5, 2, 1, 6
    results: dict = {"config": vars(args), **machine_state()}
    with bench_dir() as base, local_cluster(strata_to_measure(), base / "cluster") as cluster:
        target = Target(cluster, cluster.endpoint_start("main"))
        with Sampler(target, args.interval) as sampler:
            t0 = time.monotonic()
            target.pgbench("-i", "-q", "-s", str(args.scale), timeout=1800)
            t1 = time.monotonic()
            target.wait_caught_up()
            time.sleep(args.interval * 2)
            results["init"] = summarize_window(sampler, t0, t1)
            results["init"]["ingested_vs_written"] = (results["init"]["ingested_mb_per_s"]
                                                      / results["init"]["written_mb_per_s"])
            results["runs"] = [pgbench_run(target, sampler, args) for _ in range(args.runs)]
        results["catchup_runs"] = [catchup_run(target, args) for _ in range(args.catchup_runs)]
        results["decode"] = decode_bench(cluster, target, runs=3 if args.quick else 5)

    runs, catchups, dec = results["runs"], results["catchup_runs"], results["decode"]
    med = {
        "written_mb_per_s": median_at(runs, "written_mb_per_s"),
        "ingested_mb_per_s": median_at(runs, "ingested_mb_per_s"),
        "ingested_records_per_s": median_at(runs, "ingested_records_per_s"),
        "ingested_vs_written": median_at(runs, "ingested_vs_written"),
        "tps": median_at(runs, "tps"),
        "lag_bytes": {q: median_at(runs, "lag_bytes", q) for q in ("p50", "p99", "max")},
        "lag_seconds": {q: median_at(runs, "lag_seconds", q) for q in ("p50", "p99", "max")},
        "catchup_backlog_mb": median_at(catchups, "backlog_mb"),
        "catchup_ingest_s": median_at(catchups, "ingest_s"),
        "catchup_restart_to_caught_up_s": median_at(catchups, "restart_to_caught_up_s"),
        "catchup_mb_per_s": median_at(catchups, "ingested_mb_per_s"),
        "catchup_records_per_s": median_at(catchups, "ingested_records_per_s"),
        "catchup_pageserver_start_s": median_at(catchups, "pageserver_start_s"),
        "catchup_first_wal_s": median_at(catchups, "first_wal_s"),
        "catchup_flowing_mb_per_s": median_at(catchups, "flowing_mb_per_s"),
    }
    med["catchup_vs_written"] = med["catchup_mb_per_s"] / med["written_mb_per_s"]
    if dec:
        med.update({k: dec[k] for k in ("decode_mb_per_s", "decode_and_restore_images_mb_per_s",
                                        "decode_records_per_s")})
        med["catchup_vs_decode"] = med["catchup_mb_per_s"] / med["decode_mb_per_s"]
        med["catchup_vs_decode_and_restore"] = med["catchup_mb_per_s"] / med["decode_and_restore_images_mb_per_s"]
    results["medians"] = med

    init = results["init"]
    lines = [
        f"pgbench -s {args.scale}, -c {args.clients}, {args.runs} x {args.seconds} s; sampling every {args.interval} s;"
        f" medians of runs",
        "",
        f"{'phase':<24}{'written MB/s':>13}{'ingested MB/s':>14}{'records/s':>11}{'ingest/written':>15}"
        f"{'lag p50':>10}{'lag p99':>10}{'lag max':>10}{'lag p50 s':>10}{'lag p99 s':>10}{'lag max s':>10}",
    ]
    for name, r in [("pgbench -i (load)", init), (f"pgbench -c {args.clients} (run)", med)]:
        lines.append(
            f"{name:<24}{r['written_mb_per_s']:>13.1f}{r['ingested_mb_per_s']:>14.1f}"
            f"{r['ingested_records_per_s']:>11.0f}{r['ingested_vs_written']:>15.3f}"
            f"{r['lag_bytes']['p50'] / 1e3:>8.0f}kB{r['lag_bytes']['p99'] / 1e3:>8.0f}kB"
            f"{r['lag_bytes']['max'] / 1e3:>8.0f}kB{r['lag_seconds']['p50']:>10.3f}{r['lag_seconds']['p99']:>10.3f}"
            f"{r['lag_seconds']['max']:>10.3f}")
    lines += [
        "",
        f"catch-up (pageserver stopped during pgbench, restarted after it; {len(catchups)} runs):",
        f"  backlog {med['catchup_backlog_mb']:.1f} MB, ingested in {med['catchup_restart_to_caught_up_s']:.2f} s"
        f" from the restart ({med['catchup_pageserver_start_s']:.2f} s until the pageserver answered);"
        f" rate after it answered:"
        f" {med['catchup_mb_per_s']:.1f} MB/s, {med['catchup_records_per_s']:.0f} records/s"
        f" ({med['catchup_flowing_mb_per_s']:.1f} MB/s once WAL flowed, {med['catchup_first_wal_s']:.2f} s later)",
        f"  catch-up / written during the run: {med['catchup_vs_written']:.2f}x"
        f" (how much faster than the compute writes the pageserver can ingest)",
        "",
    ]
    if dec:
        lines += [
            f"strata wal bench on the same WAL ({dec['wal_bytes'] / MB:.0f} MB, {dec['records']} records):"
            f" decode {dec['decode_mb_per_s']:.0f} MB/s, decode + restore images"
            f" {dec['decode_and_restore_images_mb_per_s']:.0f} MB/s, {dec['decode_records_per_s']:.0f} records/s",
            f"  catch-up ingest / decode: {med['catchup_vs_decode']:.3f};"
            f" / decode + restore images: {med['catchup_vs_decode_and_restore']:.3f}",
        ]
    else:
        lines.append("strata wal bench: skipped, sk1 keeps no complete segment of the run (all offloaded)")
    summary = "\n".join(lines)
    # A smoke run keeps the real figures.
    write_results(result_stem("pageserver_ingest", args.quick), results, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
