"""What the benchmarks under bench/ share: their working directory, local
clusters set up and torn down through the `strata` command line, stock
PostgreSQL started beside them, pgbench and the other client programs,
the pageserver's figures, and the result files with the figures drawn
from the runs. A library, not a benchmark: it measures nothing itself.

Benchmarks run from the repository root as modules (`.venv/bin/python -m
bench.NAME`). The root is then on Python's import path, so this module is
`bench.harness` and the test suite's helpers are the package
`test_runner.fixtures`: its modules import one another relatively, so they
load the same way here as under pytest (which puts test_runner/ itself on
the path). Neither this module nor a benchmark changes the import path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import psycopg
from psycopg.conninfo import conninfo_to_dict

from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.link_proxy import LinkProxy  # noqa: F401 - the benchmarks' too
from test_runner.fixtures.pg import PgCluster, libpq_env
from test_runner.fixtures.ports import free_port
from test_runner.fixtures.strata import http_json, parse_lsn

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
# PostgreSQL 15 as scripts/setup.sh installs it (the Debian and Ubuntu layout).
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The build every benchmark measures unless told otherwise.
RELEASE_STRATA = REPO / "target" / "release" / "strata"
# What a compute's first query reads, for the benchmarks that time a start.
FIRST_QUERY = "SELECT count(*) FROM pgbench_branches"
# pg_prewarm of every pgbench table and index into shared buffers.
PGBENCH_PREWARM = ("SELECT sum(pg_prewarm(c.oid)) FROM pg_class c"
                   " WHERE c.relname LIKE 'pgbench%' AND c.relkind IN ('r', 'i')")
# Stock PostgreSQL's equivalent of a 2-of-3 quorum: two synchronous standbys.
ANY2_STANDBYS = "ANY 2 (s1, s2)"


def strata_to_measure() -> Path:
    """The `strata` binary to measure: $STRATA_BIN, so that a long run can
    keep its own copy while the tree is rebuilt, else the release build."""
    return Path(os.environ.get("STRATA_BIN", RELEASE_STRATA))


@contextlib.contextmanager
def bench_dir(prefix: str = "strata-bench-") -> Iterator[Path]:
    """A temporary directory for one benchmark's clusters and files, removed
    at the end. Others may enter it: PostgreSQL runs as another user when
    the benchmark runs as root."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        yield base


# ------------------------------------------------------------ local clusters

def new_cluster(strata: Path, workdir: Path) -> LocalCluster:
    """A local cluster in `workdir` (made if missing), before `strata init`:
    nothing runs yet, but `stop_cluster` may already be called on it."""
    workdir.mkdir(parents=True, exist_ok=True)
    return LocalCluster(strata, workdir, PG_BIN)


def start_cluster(cluster: LocalCluster, *init_args: str,
                  prepare: Callable[[LocalCluster], None] | None = None) -> None:
    """`strata init` with `init_args`, then `prepare(cluster)` for what has
    to be in place before the services first start (their configuration,
    object storage), then `strata start`."""
    cluster.init(*init_args)
    if prepare is not None:
        prepare(cluster)
    cluster.start()


def stop_cluster(cluster: LocalCluster) -> None:
    """`strata stop`, and `strata stop --immediate` if that fails, so that a
    benchmark leaves nothing running whatever happened; nothing to do if
    `strata init` never made the cluster."""
    if not (cluster.workdir / "cluster.toml").exists():
        return
    if cluster.run("stop", check=False, timeout=600).returncode != 0:
        cluster.run("stop", "--immediate", check=False, timeout=600)


@contextlib.contextmanager
def local_cluster(strata: Path, workdir: Path, *init_args: str,
                  prepare: Callable[[LocalCluster], None] | None = None) -> Iterator[LocalCluster]:
    """A started local cluster (`start_cluster`), stopped at the end of the
    block whatever happens in it or in its set-up."""
    cluster = new_cluster(strata, workdir)
    try:
        start_cluster(cluster, *init_args, prepare=prepare)
        yield cluster
    finally:
        stop_cluster(cluster)


def client_env(connstr: str) -> dict:
    """The environment of PostgreSQL's client programs (pgbench, psql) for
    an endpoint's connection string (password and TLS included)."""
    return libpq_env(conninfo_to_dict(connstr))


def last_line(output: str) -> str:
    """The last line `strata endpoint start` prints: the connection string
    (for the forms that `LocalCluster.endpoint_start` does not cover, such
    as `--replica-of`)."""
    return output.strip().splitlines()[-1]


# ---------------------------------------------------------- the pageserver

def timeline_url(cluster: LocalCluster, branch: str = "main") -> str:
    """The pageserver's HTTP URL of a branch's timeline."""
    return cluster.http_url("pageserver", cluster.timeline_path(branch))


def page_service(cluster: LocalCluster) -> str:
    """host:port of the pageserver's page service."""
    ps = next(s for s in cluster.cluster_toml["services"] if s["name"] == "pageserver")
    return f"127.0.0.1:{ps['ports']['pg']}"


def wait_pageserver_lsn(tl_url: str, lsn: int, timeout: float = 300) -> None:
    """Waits until the pageserver's timeline at `tl_url` has ingested the
    WAL up to `lsn`, polling its status every 50 ms."""
    deadline = time.monotonic() + timeout
    while parse_lsn(http_json("GET", tl_url)[1]["last_record_lsn"]) < lsn:
        if time.monotonic() > deadline:
            raise TimeoutError("the pageserver did not ingest the endpoint's WAL")
        time.sleep(0.05)


def wait_ingested(cluster: LocalCluster, tl_url: str, timeout: float = 300) -> None:
    """Waits until the pageserver has ingested what the safekeepers hold of
    the timeline `tl_url` names, so that a measurement starts from a quiet
    cluster."""
    timeline = next(t for t in cluster.status()["timelines"] if tl_url.endswith(f"/timeline/{t['timeline_id']}"))
    end = max(parse_lsn(sk["commit_lsn"]) for sk in timeline["safekeepers"])
    wait_pageserver_lsn(tl_url, end, timeout)


def pageserver_metric(text: str, name: str) -> float:
    """The value of `strata_pageserver_NAME` in a /metrics text (NaN when
    the pageserver does not report it)."""
    m = re.search(rf"^strata_pageserver_{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def load_getpage_table(cluster: LocalCluster, scale: int) -> dict:
    """Loads pgbench data through an endpoint, stops it, waits for the
    pageserver to hold all of its WAL and checkpoints it, so that reads go
    to layer files; returns where pgbench_accounts is and what `strata
    pagebench` needs to read it (`pagebench_target`)."""
    tl_url = timeline_url(cluster)
    connstr = cluster.endpoint_start("main")
    pgbench_init(client_env(connstr), scale, timeout=1800)
    with psycopg.connect(connstr, autocommit=True) as conn:
        spc, db, rel, blocks = conn.execute(
            "SELECT CASE c.reltablespace WHEN 0 THEN (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default')"
            " ELSE c.reltablespace END, (SELECT oid FROM pg_database WHERE datname = current_database()),"
            " pg_relation_filenode(c.oid), pg_relation_size(c.oid) / 8192"
            " FROM pg_class c WHERE c.relname = 'pgbench_accounts'").fetchone()
    cluster.endpoint_stop("main")
    wait_ingested(cluster, tl_url)
    code, status = http_json("POST", f"{tl_url}/checkpoint", timeout=300)
    assert code == 200, status
    return {"pageserver": page_service(cluster), "metrics_url": cluster.http_url("pageserver", "/metrics"),
            "tenant_id": cluster.tenant_id(), "timeline_id": cluster.timeline_id(),
            "rel": f"{spc}/{db}/{rel}", "blocks": blocks, "table_mb": blocks * 8192 / 1e6,
            "timeline_after_checkpoint": status}


def pagebench_target(data: dict) -> list[str]:
    """`strata pagebench`'s options naming the relation to read: `data` has
    `pageserver`, `tenant_id`, `timeline_id` and `rel` (SPC/DB/REL)."""
    return ["--pageserver", data["pageserver"], "--tenant-id", data["tenant_id"],
            "--timeline-id", data["timeline_id"], "--rel", data["rel"]]


def cluster_credentials(cluster: LocalCluster) -> list[str]:
    """The token and CA options a tool needs to call the cluster's services."""
    return ["--token-file", str(cluster.token_file()), *cluster.tls_args()]


def pagebench(strata: Path, extra: list[str], connections: int, depth: int, seconds: float) -> dict:
    """One `strata pagebench` run of `seconds`: its JSON report."""
    cmd = [str(strata), "pagebench", *extra, "--connections", str(connections), "--depth", str(depth),
           "--duration", str(seconds), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 3 + 120, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def wal_bench(strata: Path, paths: Iterable[Path], runs: int) -> dict:
    """`strata wal bench` over WAL segment files (or a directory of them):
    its JSON report (decoding MB/s and records/s, with and without
    restoring images, next to copying and reading the same bytes)."""
    out = subprocess.run([str(strata), "wal", "bench", "--runs", str(runs), *map(str, paths)],
                         capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(out.stdout)


# ------------------------------------------------------ client programs

def pgbench(env: dict, *args: str, timeout: float) -> str:
    """Runs pgbench with `args` against the server `env` names; its output.
    A failed run raises with the end of what pgbench printed."""
    res = subprocess.run([str(PG_BIN / "pgbench"), *args], env=env, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} failed ({res.returncode}):\n"
                           f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def pgbench_init(env: dict, scale: int, timeout: float = 3600) -> None:
    """`pgbench -i -q -s SCALE`: pgbench's tables, about 15 MB per unit."""
    pgbench(env, "-i", "-q", "-s", str(scale), timeout=timeout)


def run_timeout(seconds: float) -> float:
    """How long a timed run (`pgbench -T`) may take before it counts as hung:
    connections, a final checkpoint or a slow shutdown come on top."""
    return seconds * 4 + 300


def parse_tps(out: str) -> float:
    """Transactions per second from pgbench's report."""
    m = re.search(r"tps = ([0-9.]+)", out)
    if m is None:
        raise RuntimeError(f"no tps in pgbench's output:\n{out[-2000:]}")
    return float(m.group(1))


def parse_latency_ms(out: str) -> float:
    """The average latency (ms) from pgbench's report."""
    m = re.search(r"latency average = ([0-9.]+) ms", out)
    if m is None:
        raise RuntimeError(f"no latency in pgbench's output:\n{out[-2000:]}")
    return float(m.group(1))


def pgbench_tps(env: dict, *args: str, timeout: float) -> float:
    """The tps of one pgbench run."""
    return parse_tps(pgbench(env, *args, timeout=timeout))


def pgbench_process(env: dict, *args: str, output: bool = True) -> subprocess.Popen:
    """pgbench in the background, for load beside a measurement; its output
    is kept (text, for `communicate`) with `output`, dropped otherwise."""
    stream = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen([str(PG_BIN / "pgbench"), *args], env=env, stdout=stream, stderr=stream, text=True,
                            stdin=subprocess.DEVNULL)


def psql(env: dict, sql: str, timeout: float = 600) -> str:
    """Runs `sql` through psql (unaligned, tuples only, stopping at the
    first error); what it printed."""
    return subprocess.run([str(PG_BIN / "psql"), "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql], env=env,
                          check=True, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL).stdout.strip()


def first_query(connect: Callable[[], psycopg.Connection], timeout: float = 60) -> None:
    """Connects and runs FIRST_QUERY, retrying every 10 ms until it
    succeeds: when a just started server answers its first query."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with connect() as conn:
                conn.execute(FIRST_QUERY).fetchone()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# ------------------------------------------------------- stock PostgreSQL

def stock_cluster(base: Path, name: str) -> PgCluster:
    """A stock PostgreSQL cluster in `base/name`, not yet made (initdb)."""
    return PgCluster(PG_BIN, base / name, traverse_root=base)


@contextlib.contextmanager
def stock_postgres(base: Path, name: str, settings: dict | None = None) -> Iterator[PgCluster]:
    """A stock PostgreSQL made and started with `settings`, stopped and
    left behind at the end of the block."""
    c = stock_cluster(base, name)
    try:
        c.initdb()
        c.start(settings)
        yield c
    finally:
        c.cleanup()


def any2_clusters(base: Path, prefix: str = "") -> list[PgCluster]:
    """A primary and two standbys (`PREFIXprimary`, `PREFIXstandby1` and
    `2`), not yet made: start them with `start_any2`."""
    return [stock_cluster(base, f"{prefix}primary"),
            *(stock_cluster(base, f"{prefix}standby{i}") for i in (1, 2))]


def start_any2(clusters: list[PgCluster], primary: dict, standby: dict, timeout: float = 120) -> None:
    """Starts the primary with `primary`'s settings, a commit waiting for
    both standbys (ANY 2), and the standbys (pg_basebackup, streaming) with
    `standby`'s; returns once both replicate synchronously."""
    first, *standbys = clusters
    first.initdb()
    first.start({**primary, "synchronous_standby_names": ANY2_STANDBYS})
    for i, s in enumerate(standbys, start=1):
        s.basebackup_from(first, application_name=f"s{i}")
        s.start(standby)
    deadline = time.monotonic() + timeout
    while first.sql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'quorum'")[0][0] < len(standbys):
        if time.monotonic() > deadline:
            raise TimeoutError("the two standbys did not become synchronous (quorum) standbys")
        time.sleep(0.2)


def cleanup(clusters: Iterable[PgCluster]) -> None:
    """Stops every cluster of `clusters`, whatever state it is in."""
    for c in clusters:
        c.cleanup()


@contextlib.contextmanager
def any2_postgres(base: Path, primary: dict, standby: dict, prefix: str = "") -> Iterator[list[PgCluster]]:
    """The primary and its two standbys of `start_any2`, stopped at the end
    of the block; the primary comes first."""
    clusters = any2_clusters(base, prefix)
    try:
        start_any2(clusters, primary, standby)
        yield clusters
    finally:
        cleanup(clusters)


# -------------------------------------------------------------- results

def machine_state() -> dict:
    """What a result needs to be read against: the CPUs every process
    shares and the machine's load before the run."""
    return {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()[0]}


def result_stem(name: str, quick: bool) -> str:
    """A benchmark's results file stem: a smoke run (`--quick`) writes next
    to the real figures instead of over them."""
    return f"{name}_quick" if quick else name


def write_json(path: Path, data) -> None:
    """Writes `data` as indented JSON (values JSON has no type for, such as
    paths, as text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def write_results(stem: str, results: dict, text: str) -> None:
    """Writes bench/results/STEM.json (every run, the medians, the
    configuration) and STEM.txt (the summary `text`), and prints `text`."""
    write_json(RESULTS / f"{stem}.json", results)
    (RESULTS / f"{stem}.txt").write_text(text + "\n")
    print(text)


def median_at(rows: list[dict], *path: str) -> float:
    """The median of one figure over runs: `row[path[0]][path[1]]...` of each."""
    def get(row):
        for key in path:
            row = row[key]
        return row
    return statistics.median(get(r) for r in rows)


def median_where(rows: list[dict], figure: str, **match) -> float:
    """The median of `figure` over the runs whose fields equal `match`
    (one point of a table: a latency, a client count, a system)."""
    return statistics.median(r[figure] for r in rows if all(r[k] == v for k, v in match.items()))


def median_or_nan(values: Iterable) -> float:
    """The median of the values that are there (None left out); NaN if none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else float("nan")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]), interpolated linearly between
    the closest ranks; NaN of nothing."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def nearest_rank(values: list[float], q: float) -> float:
    """The value at fraction `q` (in [0, 1]) of the sorted values, no
    interpolation: a latency that some sample really had."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def dir_bytes(path: Path) -> int:
    """The apparent size of every file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
