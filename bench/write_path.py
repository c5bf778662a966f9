#!/usr/bin/env python3
"""The write path, side by side with stock PostgreSQL 15 on local disk in one
run, with every process's CPU seconds (from /proc) for each workload:

- stock:     PostgreSQL 15, fsync=on, synchronous_commit=on, and the
             compute's WAL settings (wal_log_hints=on, wal_compression=lz4,
             shared_buffers=128MB), on this machine's disk.
- strata:    the whole cluster as `strata init`, `start` and `endpoint start`
             give it (3 safekeepers, a pageserver, a lazy endpoint).
- sync_any2: stock PostgreSQL with two synchronous standbys, ANY 2 (the
             durability of a 2-of-3 quorum), all fsync=on: pgbench only.

Workloads, each on a fresh cluster of each kind, --runs times (medians):
- load:    `pgbench -i -s 50`;
- insert:  INSERT … SELECT of 10 M rows (about 1.1 GB) into a new table,
           then CREATE INDEX on it;
- restore: `pg_restore -j 2` of a directory-format dump of about 1 GB
           (pgbench at scale 65, dumped once at the start);
- pgbench: RW (TPC-B-like) at scale 10, 1, 8 and 32 clients, --seconds each;
- catchup: (strata) the pageserver stopped, `pgbench -i -s 20` written on an
           eager endpoint, the pageserver started again: MB/s of WAL it
           ingests on the WAL already on the safekeepers, its CPU seconds per
           MB against PostgreSQL's for producing that WAL and the
           safekeepers', and `strata wal bench` (decoding alone) on the
           same segments.

After each bulk load on Strata (load, insert, restore), once settled: the
layer bytes the pageserver wrote for it (flushes, compaction, image
layers) against its WAL, and the bytes it stores for the timeline before
and after compaction and GC (no PITR window), against PostgreSQL's data
files of every database.

For each workload: wall seconds, ratio strata/stock speed (stock seconds /
strata seconds, or tps ratio), WAL bytes, and CPU seconds of PostgreSQL
(the postmaster with every child, exited ones included), of each
safekeeper, of the pageserver and of the compute agent (proposer and lazy
file system), also per MB of WAL. The pageserver's and the agent's threads
are also counted by what they do (`pageserver.ingest`, `.flush`,
`.compaction`, `.upload`; `compute_agent.proposer`, `.lazy_fs`), and every
figure again once the services have worked off what the workload left
(`cpu_settled`: the last flush, compaction, uploads).

Usage: .venv/bin/python -m bench.write_path [--runs 3] [--seconds 20] [--only load,insert,restore,pgbench,catchup]
           [--quick]
Writes bench/results/write_path.json and .txt (write_path_quick.* with --quick).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import (PG_BIN, RESULTS, any2_clusters, bench_dir, cleanup, machine_state, new_cluster,
                           pgbench_init, pgbench_tps, result_stem, run_timeout, start_any2, start_cluster,
                           stock_cluster, stop_cluster, strata_to_measure, wal_bench, write_json)
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.endpoint import Endpoint
from test_runner.fixtures.strata import SEGMENT_NAME, parse_lsn, segment_number

MB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")
# What the compute sets that weighs on the WAL, for stock too.
STOCK = {"fsync": "on", "synchronous_commit": "on", "wal_log_hints": "on", "wal_compression": "lz4",
         "shared_buffers": "128MB"}
INSERT_ROWS = 10_000_000
INSERT = ("CREATE TABLE big (id bigint, k int, a text, b text);"
          "INSERT INTO big SELECT g, g % 1000, md5(g::text), md5((g + 1)::text) FROM generate_series(1, {rows}) g;"
          "CREATE INDEX big_id ON big (id);")


# ------------------------------------------------------------------ CPU

def read_stat(path: Path) -> tuple[str, list[str]] | None:
    """A process's or thread's `stat`: its name and the fields after it
    (None if it is gone)."""
    try:
        stat = path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of `pid` (and of its waited-for children with
    `children`), 0 if it is gone."""
    stat = read_stat(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return 0.0
    # After the name: state is field 3; utime 14, stime 15, cutime 16, cstime 17.
    u, s, cu, cs = (int(stat[1][i]) for i in (11, 12, 13, 14))
    return (u + s + ((cu + cs) if children else 0)) / TICK


def child_pids(pid: int) -> list[int]:
    """The live children of `pid`."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def postgres_cpu(postmaster: int) -> float:
    """The postmaster, its exited (reaped) children and its live ones."""
    return proc_cpu(postmaster, children=True) + sum(proc_cpu(c) for c in child_pids(postmaster))


# A service's threads by what they do (their names), for the CPU budget.
THREAD_ROLES = {
    "pageserver": [("wal-", "ingest"), ("flush-", "flush"), ("compactor", "compaction"),
                   ("remote-storage", "upload")],
    "compute_agent": [("wal-proposer", "proposer"), ("proposer", "proposer"), ("fuser", "lazy_fs")],
}


def thread_cpu(pid: int, roles: list[tuple[str, str]]) -> dict[str, float]:
    """CPU seconds of a process's live threads, grouped by name prefix
    (threads that have exited are in no group: the process total has them)."""
    out = {role: 0.0 for _, role in roles}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        stat = read_stat(task / "stat")
        if stat is None:
            continue
        name, fields = stat
        role = next((r for prefix, r in roles if name.startswith(prefix)), None)
        if role:
            out[role] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def proc_switches(pid: int, roles: list[tuple[str, str]]) -> dict[str, int]:
    """Context switches (voluntary and not) of a process's live threads, in
    all and grouped by name prefix as `thread_cpu` does: each is a wake-up
    or a preemption, what a commit's hops cost beyond their work."""
    out = {"": 0, **{role: 0 for _, role in roles}}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            status = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        n = sum(int(line.split()[1]) for line in status.splitlines()
                if line.split(":")[0] in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        out[""] += n
        role = next((r for prefix, r in roles if name.startswith(prefix)), None)
        if role:
            out[role] += n
    return out


class Processes:
    """The processes whose CPU is counted, by role (and the threads of the
    pageserver and the agent by what they do, as `role.part`)."""

    def __init__(self, postmaster: int, services: dict[str, int] | None = None):
        self.postmaster = postmaster
        self.services = services or {}

    def sample(self) -> dict[str, float]:
        out = {"postgres": postgres_cpu(self.postmaster)}
        for name, pid in self.services.items():
            out[name] = proc_cpu(pid)
            for part, cpu in thread_cpu(pid, THREAD_ROLES.get(name, [])).items():
                out[f"{name}.{part}"] = cpu
        return out

    def switches(self) -> dict[str, int]:
        """Context switches of the services' live threads, by role (and
        `role.part`); PostgreSQL's are not counted (its backends come and go)."""
        out = {}
        for name, pid in self.services.items():
            for part, n in proc_switches(pid, THREAD_ROLES.get(name, [])).items():
                out[f"{name}.{part}" if part else name] = n
        return out

    def settle(self, quiet: float = 0.1, limit: float = 180) -> None:
        """Waits until the services stop working off what the workload left
        (the pageserver's flushes, compaction and uploads): less than `quiet`
        CPU seconds in all over 2 s, or `limit` seconds."""
        if not self.services:
            return
        deadline = time.monotonic() + limit
        last = sum(proc_cpu(p) for p in self.services.values())
        while time.monotonic() < deadline:
            time.sleep(2)
            now = sum(proc_cpu(p) for p in self.services.values())
            if now - last < quiet:
                return
            last = now


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds of each role between two samples."""
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}


# ------------------------------------------------------------- targets

class Stock:
    """Stock PostgreSQL on local disk."""

    def __init__(self, base: Path, name: str, extra: dict | None = None):
        self.dir = base / name
        self.pg = stock_cluster(base, name)
        self.pg.initdb()
        self.pg.start({**STOCK, **(extra or {})})

    def env(self) -> dict:
        return self.pg.client_env()

    def processes(self) -> Processes:
        return Processes(int((self.pg.pgdata / "postmaster.pid").read_text().split()[0]))

    def diagnose(self) -> str:
        return self.pg.log_text()[-4000:]

    def close(self) -> None:
        # Each run's files go at once: a bulk load's are gigabytes.
        self.pg.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


class Strata:
    """A local cluster through the CLI, and one endpoint on `main`."""

    def __init__(self, strata_bin: Path, base: Path, name: str, *endpoint_args: str,
                 pageserver: dict | None = None):
        self.cluster = new_cluster(strata_bin, base / name)
        start_cluster(self.cluster, prepare=(lambda c: c.configure("pageserver", pageserver)) if pageserver else None)
        self.ep = Endpoint(self.cluster, "main")
        self.ep.start(*endpoint_args)

    def env(self) -> dict:
        return self.ep.client_env()

    def processes(self) -> Processes:
        services = {n: self.cluster.pid(n) for n in [*self.cluster.safekeeper_names(), "pageserver"]}
        services["compute_agent"] = self.ep.agent_pid()
        return Processes(self.ep.postmaster_pid(), {k: v for k, v in services.items() if v})

    def diagnose(self) -> str:
        return self.ep.logs()[-6000:]

    def close(self) -> None:
        stop_cluster(self.cluster)
        shutil.rmtree(self.cluster.workdir, ignore_errors=True)


# Bulk loads run with no PITR window and GC only when asked, so that after
# the timed part one collection shows what the loaded data costs to keep.
# (The default keeps 7 days of history and collects every 60 s; with 7 days
# nothing of a fresh load is collected, so the timed part is the same.)
GC_NOW = {"pitr_interval": 0, "gc_horizon": 0, "gc_period": 3600}
LAYER_WRITES = ("strata_pageserver_layer_bytes_written_total", "strata_pageserver_compaction_bytes_written_total",
                "strata_pageserver_image_bytes_written_total")
# Of the flushes' bytes, the fresh-page deltas (which compaction keeps as
# they are); and what compaction read.
FRESH_WRITTEN = "strata_pageserver_fresh_bytes_written_total"
COMPACTION_READ = "strata_pageserver_compaction_bytes_read_total"


def storage(target: "Strata", before: dict[str, float], lsn_start: int) -> dict:
    """After a settled bulk load and a VACUUM of it: the layer bytes the
    pageserver wrote for them (flushes, including what was still in memory,
    compaction, images) against their WAL, and the bytes it stores
    for the timeline before and after compaction and GC against
    PostgreSQL's data files of every database."""
    c = target.cluster
    # The VACUUM that autovacuum would run a minute later (hint bits and the
    # visibility map of the new pages, WAL-logged with page images), now, so
    # that every run measures the same thing.
    run(target.env(), "vacuumdb", "--all", "--quiet")
    target.processes().settle()
    # What ingest still holds in memory is flushed first: it is written for
    # the load as surely as what was flushed already.
    code, body = c.http("pageserver", "POST", c.timeline_path() + "/checkpoint", timeout=600)
    if code != 200:
        raise RuntimeError(f"checkpoint: {code} {body}")
    target.processes().settle()
    after = c.metrics("pageserver")
    # Against all the WAL written since the load began, the VACUUM's
    # included: the layers hold that too.
    wal_mb = (wal_lsn(target.env()) - lsn_start) / MB
    parts = {k.split("_")[2]: after.get(k, 0) - before.get(k, 0) for k in LAYER_WRITES}
    written = sum(parts.values())
    fresh = after.get(FRESH_WRITTEN, 0) - before.get(FRESH_WRITTEN, 0)
    compaction_read = after.get(COMPACTION_READ, 0) - before.get(COMPACTION_READ, 0)
    stored = c.timeline_status("pageserver")["layer_bytes"]
    code, body = c.http("pageserver", "POST", c.timeline_path() + "/checkpoint?compact=true&gc=true&upload_timeout=120",
                        timeout=600)
    if code != 200:
        raise RuntimeError(f"checkpoint with compaction and GC: {code} {body}")
    collected = c.timeline_status("pageserver")["layer_bytes"]
    data = int(run(target.env(), "psql", "-XAtc", "SELECT sum(pg_database_size(oid)) FROM pg_database").stdout)
    return {"wal_mb": round(wal_mb, 1), "layer_mb_written": round(written / MB, 1),
            "layer_written_by": {k: round(v / MB, 1) for k, v in parts.items()},
            "flushed_fresh_mb": round(fresh / MB, 1), "compaction_read_mb": round(compaction_read / MB, 1),
            "layer_written_vs_wal": round(written / MB / max(wal_mb, 1e-9), 3),
            "stored_mb": round(stored / MB, 1), "stored_after_gc_mb": round(collected / MB, 1),
            "data_files_mb": round(data / MB, 1), "stored_after_gc_vs_data": round(collected / max(data, 1), 3)}


def run(env: dict, *cmd: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    """Runs PostgreSQL's client program cmd[0] with the rest as its arguments;
    fails with the end of its output."""
    r = subprocess.run([str(PG_BIN / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def wal_lsn(env: dict) -> int:
    """The server's current WAL position."""
    return parse_lsn(run(env, "psql", "-XAtc", "SELECT pg_current_wal_lsn()").stdout.strip())


def timed(target, fn) -> dict:
    """Runs `fn`; its wall seconds, WAL bytes and CPU by role."""
    procs = target.processes()
    env = target.env()
    lsn0, cpu0, sw0 = wal_lsn(env), procs.sample(), procs.switches()
    t0 = time.monotonic()
    fn(env)
    seconds = time.monotonic() - t0
    cpu1, sw1 = procs.sample(), procs.switches()
    wal = wal_lsn(env) - lsn0
    cpu = cpu_delta(cpu0, cpu1)
    # What the services still do for this workload after it returned (the
    # last flush, compaction, uploads) is part of its cost.
    procs.settle()
    settled = cpu_delta(cpu0, procs.sample())
    return {"seconds": round(seconds, 2), "wal_mb": round(wal / MB, 1), "lsn_start": lsn0, "cpu": cpu,
            # Live threads only: a thread that exited in between takes its
            # switches along, hence the floor at 0.
            "cpu_settled": settled, "switches": {k: max(v - sw0.get(k, 0), 0) for k, v in sw1.items()},
            "cpu_per_wal_mb": {k: round(v / max(wal / MB, 1e-9), 4) for k, v in settled.items()}}


# ------------------------------------------------------------ workloads

def load(env: dict, scale: int) -> None:
    """The bulk load: pgbench's tables at `scale`."""
    pgbench_init(env, scale)


def insert(env: dict, rows: int) -> None:
    """The bulk insert: INSERT ... SELECT of `rows` rows, then an index."""
    run(env, "psql", "-X", "-v", "ON_ERROR_STOP=1", "-qc", INSERT.format(rows=rows))


def restore(env: dict, dump: Path) -> None:
    """pg_restore -j 2 of `dump` into a new database."""
    run(env, "createdb", "restored")
    run(env, "pg_restore", "-j", "2", "-d", "restored", str(dump))


def make_dump(base: Path, scale: int) -> tuple[Path, int]:
    """A directory-format dump of pgbench at `scale`, and the database's size."""
    src = Stock(base, "dump-source")
    try:
        env = src.env()
        load(env, scale)
        size = int(run(env, "psql", "-XAtc", "SELECT pg_database_size(current_database())").stdout)
        dump = base / "dump"
        run(env, "pg_dump", "-Fd", "-j", "2", "-f", str(dump))
        subprocess.run(["chmod", "-R", "a+rX", str(dump)], check=True)
        return dump, size
    finally:
        src.close()


def rw_tps(env: dict, clients: int, seconds: int) -> float:
    """tps of one pgbench RW run."""
    return pgbench_tps(env, "-n", "-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2)),
                       timeout=run_timeout(seconds))


def pgbench_all(target, clients: list[int], seconds: int) -> dict:
    """pgbench's tables at scale 10, then one timed RW run per client count."""
    env = target.env()
    load(env, 10)
    run(env, "psql", "-Xqc", "CHECKPOINT")
    out = {}
    for c in clients:
        out[c] = timed(target, lambda e, c=c: out.__setitem__(f"tps_{c}", rw_tps(e, c, seconds)))
        out[c]["tps"] = out.pop(f"tps_{c}")
    return out


class Any2:
    """Stock with two synchronous standbys (ANY 2), all fsync=on."""

    def __init__(self, base: Path):
        self.primary, *self.standbys = any2_clusters(base)
        start_any2([self.primary, *self.standbys], {**STOCK, "wal_level": "replica", "max_wal_senders": 10},
                   {**STOCK, "hot_standby": "on"})

    def env(self) -> dict:
        return self.primary.client_env()

    def processes(self) -> Processes:
        pids = {f"standby{i}": int((s.pgdata / "postmaster.pid").read_text().split()[0])
                for i, s in enumerate(self.standbys, 1)}
        primary = int((self.primary.pgdata / "postmaster.pid").read_text().split()[0])

        class Both(Processes):
            def sample(inner) -> dict[str, float]:
                out = {"postgres": postgres_cpu(primary)}
                out.update({k: postgres_cpu(v) for k, v in pids.items()})
                return out
        return Both(primary)

    def close(self) -> None:
        cleanup((*self.standbys, self.primary))
        for c in (*self.standbys, self.primary):
            shutil.rmtree(c.base_dir, ignore_errors=True)


def catchup(strata_bin: Path, base: Path, name: str, scale: int) -> dict:
    """The pageserver behind by a bulk load, then catching up."""
    z = Strata(strata_bin, base, name, "--eager")
    try:
        cluster = z.cluster
        tl = cluster.timeline_path()
        # It stops after a last flush: it resumes from what it had ingested.
        resume = parse_lsn(cluster.http("pageserver", "GET", tl)[1]["last_record_lsn"])
        cluster.stop("--only", "pageserver")
        procs = z.processes()
        env = z.env()
        lsn0, cpu0 = wal_lsn(env), procs.sample()
        load(env, scale)
        run(env, "psql", "-Xqc", "CHECKPOINT")
        end = wal_lsn(env)
        cpu1 = procs.sample()
        # The WAL is on the safekeepers (commits waited for them). Timed
        # from the start of the process: with a backlog of hundreds of MB the
        # start-up is a small part.
        t0 = time.monotonic()
        cluster.start("--only", "pageserver")
        ps_pid = cluster.pid("pageserver")
        start = resume
        while parse_lsn(cluster.http("pageserver", "GET", tl)[1]["last_record_lsn"]) < end:
            if time.monotonic() - t0 > 1800:
                raise TimeoutError("the pageserver did not catch up in 30 min")
            time.sleep(0.05)
        seconds = time.monotonic() - t0
        ps_cpu = proc_cpu(ps_pid)
        wal_mb = (end - lsn0) / MB
        backlog_mb = (end - start) / MB
        load_cpu = cpu_delta(cpu0, cpu1)
        sk_cpu = sum(v for k, v in load_cpu.items() if k.startswith("sk"))
        decode = decode_bench(cluster, lsn0, end)
        return {
            "wal_mb": round(wal_mb, 1), "backlog_mb": round(backlog_mb, 1), "seconds": round(seconds, 2),
            "ingest_mb_per_s": round(backlog_mb / seconds, 1),
            "pageserver_cpu_s": round(ps_cpu, 2), "pageserver_mb_per_cpu_s": round(backlog_mb / max(ps_cpu, 1e-9), 1),
            "load_cpu": load_cpu,
            "pageserver_cpu_vs_postgres": round((ps_cpu / backlog_mb) / (load_cpu["postgres"] / wal_mb), 3),
            "safekeepers_cpu_vs_postgres": round(sk_cpu / load_cpu["postgres"], 3),
            "decode_mb_per_s": decode,
        }
    finally:
        z.close()


def decode_bench(cluster: LocalCluster, start: int, end: int) -> dict | None:
    """`strata wal bench` over sk1's complete segments between two LSNs."""
    ct = cluster.cluster_toml
    d = cluster.workdir / "sk1" / "data" / cluster.tenant_id() / cluster.timeline_id()
    seg = 16 * MB
    files = [p for p in sorted(d.iterdir()) if SEGMENT_NAME.match(p.name)
             and start // seg < segment_number(p.name, seg) < end // seg]
    if not files:
        return None
    report = wal_bench(cluster.strata_bin, files, 3)
    return {k: round(report[k], 1) for k in ("decode_mb_per_s", "decode_and_restore_images_mb_per_s")}


# ----------------------------------------------------------------- main

def median(values: list[float]) -> float:
    """The median, rounded as the report shows it."""
    return round(statistics.median(values), 3)


def summarize(runs: list[dict]) -> dict:
    """Medians of seconds and WAL, and of each role's CPU."""
    roles = sorted({k for r in runs for k in r["cpu"]})
    settled = sorted({k for r in runs for k in r.get("cpu_settled", {})})
    return {"seconds": median([r["seconds"] for r in runs]), "wal_mb": median([r["wal_mb"] for r in runs]),
            "cpu": {k: median([r["cpu"].get(k, 0.0) for r in runs]) for k in roles},
            "cpu_settled": {k: median([r["cpu_settled"].get(k, 0.0) for r in runs]) for k in settled},
            "runs_seconds": [r["seconds"] for r in runs]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20, help="each pgbench run")
    ap.add_argument("--only", default="load,insert,restore,pgbench,catchup")
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, one run")
    args = ap.parse_args()
    scale, rows, dump_scale, catchup_scale, clients = 50, INSERT_ROWS, 65, 20, [1, 8, 32]
    if args.quick:
        args.runs, args.seconds = 1, 5
        scale, rows, dump_scale, catchup_scale, clients = 2, 100_000, 2, 2, [1, 8]
    only = set(args.only.split(","))
    strata = strata_to_measure()
    results: dict = {"config": {**vars(args), "scale": scale, "rows": rows, "dump_scale": dump_scale},
                     **machine_state()}
    lines = []
    with bench_dir() as base:
        dump = None
        if "restore" in only:
            dump, dump_bytes = make_dump(base, dump_scale)
            results["dump_database_mb"] = round(dump_bytes / MB)
        workloads = {"load": lambda e: load(e, scale), "insert": lambda e: insert(e, rows),
                     "restore": lambda e: restore(e, dump)}
        for name, fn in workloads.items():
            if name not in only:
                continue
            per: dict = {"stock": [], "strata": []}
            for r in range(args.runs):
                # Alternating which goes first: the shared machine drifts.
                for kind in ("stock", "strata") if r % 2 == 0 else ("strata", "stock"):
                    t = Stock(base, f"{name}-{kind}-{r}") if kind == "stock" else Strata(
                        strata, base, f"{name}-{kind}-{r}", pageserver=GC_NOW)
                    try:
                        before = t.cluster.metrics("pageserver") if kind == "strata" else {}
                        per[kind].append(timed(t, fn))
                        if kind == "strata":
                            per[kind][-1]["storage"] = storage(t, before, per[kind][-1]["lsn_start"])
                    except Exception as e:  # a failure is a finding: recorded, the other runs go on
                        failure = f"{name} run {r} on {kind}: {e}\n{t.diagnose()}"
                        print(failure, file=sys.stderr)
                        results.setdefault("failures", []).append(failure)
                    finally:
                        t.close()
            if not per["stock"] or not per["strata"]:
                continue
            s, z = summarize(per["stock"]), summarize(per["strata"])
            paired = median([a["seconds"] / b["seconds"] for a, b in zip(per["stock"], per["strata"])])
            results[name] = {"stock": s, "strata": z, "speed_vs_stock": round(s["seconds"] / z["seconds"], 3),
                             "paired": paired, "runs": per}
            lines.append(f"{name:8} stock {s['seconds']:7.1f} s  strata {z['seconds']:7.1f} s  "
                         f"speed {s['seconds'] / z['seconds']:.2f}x (paired {paired:.2f})  "
                         f"WAL stock {s['wal_mb']:.0f} MB strata {z['wal_mb']:.0f} MB")
            lines.append(f"         CPU s stock {s['cpu']}  strata {z['cpu']}")
            lines.append(f"         CPU s once settled: strata {z['cpu_settled']}")
            st = {k: median([r["storage"][k] for r in per["strata"]]) for k in (
                "wal_mb", "layer_mb_written", "layer_written_vs_wal", "stored_mb", "stored_after_gc_mb", "data_files_mb",
                "stored_after_gc_vs_data")}
            results[name]["storage"] = st
            lines.append(f"         layers written {st['layer_mb_written']:.0f} MB = {st['layer_written_vs_wal']:.2f}x "
                         f"the {st['wal_mb']:.0f} MB of WAL until measured (target <= 1.5; by kind {[r['storage']['layer_written_by'] for r in per['strata']]}; "
                         f"of the flushes, fresh-page deltas {[r['storage']['flushed_fresh_mb'] for r in per['strata']]} MB; "
                         f"compaction read {[r['storage']['compaction_read_mb'] for r in per['strata']]} MB); "
                         f"stored {st['stored_mb']:.0f} MB, after compaction and GC {st['stored_after_gc_mb']:.0f} MB "
                         f"= {st['stored_after_gc_vs_data']:.2f} of {st['data_files_mb']:.0f} MB of data files "
                         f"(target <= 0.33)")
            save(results, lines, args.quick)
        if "pgbench" in only:
            per = {"stock": [], "strata": [], "sync_any2": []}
            for r in range(args.runs):
                for kind in per:
                    t = (Stock(base, f"pgb-stock-{r}") if kind == "stock" else
                         Strata(strata, base, f"pgb-strata-{r}") if kind == "strata" else Any2(base / f"any2-{r}"))
                    try:
                        per[kind].append(pgbench_all(t, clients, args.seconds))
                    finally:
                        t.close()
            results["pgbench"] = {"runs": per}
            for c in clients:
                tps = {k: median([run_[c]["tps"] for run_ in v]) for k, v in per.items()}
                results["pgbench"][c] = {"tps": tps, "vs_stock": round(tps["strata"] / tps["stock"], 3),
                                         "vs_sync_any2": round(tps["strata"] / tps["sync_any2"], 3)}
                lines.append(f"pgbench RW -c {c:2}: stock {tps['stock']:8.1f}  strata {tps['strata']:8.1f}  "
                             f"any2 {tps['sync_any2']:8.1f}  strata/stock {tps['strata'] / tps['stock']:.2f}  "
                             f"strata/any2 {tps['strata'] / tps['sync_any2']:.2f}")
                # Wake-ups per transaction of each service (median of the runs).
                per_tx = {}
                for k in per["strata"][0][c]["switches"]:
                    per_tx[k] = round(median([r[c]["switches"][k] / max(r[c]["tps"] * args.seconds, 1)
                                              for r in per["strata"]]), 2)
                results["pgbench"][c]["strata_switches_per_tx"] = per_tx
                lines.append(f"         strata context switches per transaction: {per_tx}")
            save(results, lines, args.quick)
        if "catchup" in only:
            runs = [catchup(strata, base, f"catchup-{r}", catchup_scale) for r in range(args.runs)]
            results["catchup"] = {"runs": runs, **{k: median([r[k] for r in runs]) for k in (
                "ingest_mb_per_s", "pageserver_mb_per_cpu_s", "pageserver_cpu_vs_postgres",
                "safekeepers_cpu_vs_postgres")}}
            c = results["catchup"]
            lines.append(f"catch-up: {c['ingest_mb_per_s']:.0f} MB/s of WAL, {c['pageserver_mb_per_cpu_s']:.0f} MB "
                         f"per pageserver CPU second; pageserver CPU/MB vs PostgreSQL's "
                         f"{c['pageserver_cpu_vs_postgres']:.2f} (target <= 0.25), safekeepers "
                         f"{c['safekeepers_cpu_vs_postgres']:.2f}; decode alone "
                         f"{[r['decode_mb_per_s'] for r in runs]} MB/s")
    if results.get("failures"):
        lines.append(f"{len(results['failures'])} run(s) failed: see failures in the JSON")
    save(results, lines, args.quick)
    print("\n".join(lines))
    return 0


def save(results: dict, lines: list[str], quick: bool) -> None:
    """Writes what is measured so far (a long run keeps its figures if it stops)."""
    stem = result_stem("write_path", quick)
    write_json(RESULTS / f"{stem}.json", results)
    (RESULTS / f"{stem}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
