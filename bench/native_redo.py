#!/usr/bin/env python3
"""What native redo of heap, heap2 and btree changes buys, in one run, side
by side on the same machine and disk:

- stock:  PostgreSQL 15 on local disk, fsync=on, synchronous_commit=on, with
          the compute's WAL settings: wal_level=replica, wal_log_hints=on,
          wal_compression=lz4, full_page_writes=on (and the same
          shared_buffers, max_wal_size and checkpoint_timeout)
- any2:   the same stock PostgreSQL with two local synchronous standbys
          (pg_basebackup, streaming; synchronous_standby_names = 'ANY 2 (s1,
          s2)'): the durability of a 2-of-3 safekeeper quorum
- strata: a local Strata cluster (`strata init`, `start`, `endpoint start`):
          the compute logs heap, heap2 and btree changes without images, the
          pageserver redoes them natively
- verify: a local Strata cluster made with `strata init --verify-redo`: its
          compute runs with wal_consistency_checking = 'all', so every change
          carries an image of its page, as before native redo (and the
          pageserver also checks its redo against those images)

Measured:

1. WAL bytes per transaction (pg_current_wal_insert_lsn() before and after,
   divided by pgbench's transaction count) for pgbench at each of --clients,
   after `pgbench -i -s --scale`; and for an insert workload: one client
   inserting --insert-batch random rows per transaction into a table with
   three btree indexes (bytes per row and per transaction). Ratios
   strata/stock and verify/stock. Twice: in equal-work runs (`pgbench -t`:
   --transactions, --insert-transactions), which come first, so that every
   configuration has done the same work before each of them; and in the
   timed runs of item 2 (`pgbench -T --seconds`). Only the former compare
   like with like: the first change of each page after a checkpoint logs a
   full-page image, so a configuration that runs more transactions in the
   same time spreads those images over more of them and logs fewer bytes
   per transaction (and leaves different pages to prune and hint later).
2. pgbench TPS of all four; ratios strata/stock, strata/any2, verify/stock,
   verify/any2.
3. Pageserver ingest during the pgbench runs (its /metrics): WAL MB/s,
   records/s, records stored for native redo and pages materialized per
   second; layer file bytes written per GB of WAL ingested, for the load,
   the pgbench runs and the insert runs.
4. GetPage@LSN latency (Python page service client, one connection, one
   request at a time) of a hot page — the pgbench_branches page after
   --hot-updates updates of one of its rows, so the pageserver holds a chain
   of WAL records to redo for it — against a page stored as an image (a page
   of a freshly loaded table whose hint bits were set after a CHECKPOINT:
   a full-page image in the WAL). The chain lengths are read from the WAL
   itself (`strata wal dump`); the hot page is read at the end of the
   updates and at the LSN where its chain was longest.

Every run begins with a CHECKPOINT, so each configuration starts it with the
same full-page-write state. Runs of the four configurations alternate (the
order rotating from run to run), so drift in the machine's load hits all of
them; medians of --runs runs.

Usage: .venv/bin/python -m bench.native_redo [--scale 10] [--seconds 20] [--runs 3] [--clients 1,8,32]
           [--transactions 10000] [--insert-batch 100] [--insert-transactions 300] [--insert-prefill 100000]
           [--hot-updates 2000] [--getpage-requests 5000] [--out FILE] [--quick]
Writes FILE (default bench/results/native_redo.json, native_redo_quick.json with --quick) and the
printed summary next to it (.txt).
"""

import argparse
import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import (REPO, strata_to_measure, RESULTS, any2_postgres, bench_dir, local_cluster, machine_state,
                           median_or_nan, page_service, percentile, pgbench, result_stem, stock_postgres,
                           write_json)
from test_runner.fixtures import page_protocol
from test_runner.fixtures.cluster import LocalCluster
from test_runner.fixtures.endpoint import Endpoint
from test_runner.fixtures.strata import SEGMENT_NAME, format_lsn, parse_lsn, segment_number

MB = 1e6
GB = 1e9

# The settings of a Strata compute (compute/src/agent/pgconf.rs) that shape
# its WAL and its buffer pool, for stock PostgreSQL; max_wal_size and
# checkpoint_timeout are PostgreSQL's defaults, which the compute keeps.
STOCK_SETTINGS = {
    "shared_buffers": "128MB",
    "wal_level": "replica",
    "wal_log_hints": "on",
    "wal_compression": "lz4",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "fsync": "on",
    "max_wal_size": "1GB",
    "checkpoint_timeout": "5min",
    "max_wal_senders": 10,
}
STANDBY_SETTINGS = {**STOCK_SETTINGS, "hot_standby": "on"}

# The order in which the configurations are set up and, rotated, run.
CONFIGS = ("stock", "any2", "strata", "verify")
# Configurations of the WAL volume and insert comparisons (any2 writes the WAL of stock).
WAL_CONFIGS = ("stock", "strata", "verify")
STRATA_CONFIGS = ("strata", "verify")

# The pageserver's counters read around each run (strata_pageserver_NAME_total).
COUNTERS = ("wal_bytes_ingested", "records_ingested", "redo_records_stored", "redo_pages_materialized",
            "layer_bytes_written", "layers_flushed", "redo_blocks_verified", "redo_mismatches")

# Records of one page, and their bytes, the pageserver keeps for redo before
# it stores the page as an image instead (MAX_REDO_CHAIN and MAX_CHAIN_BYTES in
# pageserver/src/limits.rs): used to follow the length of a page's chain
# through the WAL.
_LIMITS = (REPO / "pageserver" / "src" / "limits.rs").read_text()
MAX_REDO_CHAIN = int(re.search(r"pub const MAX_REDO_CHAIN: u32 = (\d+);", _LIMITS).group(1))
MAX_CHAIN_BYTES = int(re.search(r"pub const MAX_CHAIN_BYTES: usize = (\d+);", _LIMITS).group(1))

# The insert workload's table: three btree indexes, two of them on random
# keys; no autovacuum, so that its WAL is that of the inserts alone.
INSERT_TABLE = """
CREATE TABLE bench_insert (id bigserial PRIMARY KEY, k integer NOT NULL, s text NOT NULL, f float8 NOT NULL)
    WITH (autovacuum_enabled = off);
CREATE INDEX bench_insert_k ON bench_insert (k);
CREATE INDEX bench_insert_s ON bench_insert (s);
"""
INSERT_ROWS = ("INSERT INTO bench_insert (k, s, f) SELECT (random() * 2e9 - 1e9)::integer, md5(random()::text),"
               " random() FROM generate_series(1, {n})")


def ratio(a: float, b: float) -> float:
    """a / b, NaN where b is 0."""
    return a / b if b else float("nan")


class Target:
    """One configuration under test: the PostgreSQL that pgbench runs
    against (a PgCluster or a Strata endpoint; both offer `connect`, `sql`
    and `run`) and, for Strata, its local cluster."""

    def __init__(self, name: str, db, cluster: LocalCluster | None = None):
        self.name = name
        self.db = db
        self.cluster = cluster
        if cluster is not None:
            self.page_service = page_service(cluster)
            self.tenant = cluster.tenant_id()
            self.timeline = cluster.timeline_id()

    @property
    def strata(self) -> bool:
        return self.cluster is not None

    def scalar(self, query: str):
        return self.db.sql(query)[0][0]

    def insert_lsn(self) -> int:
        return parse_lsn(self.scalar("SELECT pg_current_wal_insert_lsn()::text"))

    def pgbench(self, *args: str, timeout: float) -> str:
        return pgbench(self.db.client_env(), *args, timeout=timeout)

    # ---- Strata only

    def timeline_status(self) -> dict:
        code, body = self.cluster.http("pageserver", "GET", self.cluster.timeline_path(), timeout=30)
        assert code == 200, body
        return body

    def counters(self) -> dict[str, float]:
        m = self.cluster.metrics("pageserver")
        return {c: m.get(f"strata_pageserver_{c}_total", float("nan")) for c in COUNTERS}

    def wait_caught_up(self, timeout: float = 900) -> float:
        """Waits until the pageserver has ingested all the WAL the compute has
        flushed (what the safekeepers can have); returns the seconds waited."""
        target = parse_lsn(self.scalar("SELECT pg_current_wal_flush_lsn()::text"))
        start = time.monotonic()
        while True:
            status = self.timeline_status()
            if status.get("state") == "broken":
                raise RuntimeError(f"{self.name}: the pageserver's timeline is broken: {status.get('error')}")
            if parse_lsn(status["last_record_lsn"]) >= target:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{self.name}: the pageserver did not reach {format_lsn(target)} in {timeout} s")
            time.sleep(0.05)

    def settled_counters(self) -> dict[str, float]:
        """The counters once everything the compute wrote is ingested and
        written to layer files (a checkpoint of the timeline)."""
        self.wait_caught_up()
        code, body = self.cluster.http("pageserver", "POST", f"{self.cluster.timeline_path()}/checkpoint",
                                       timeout=600)
        assert code == 200, body
        return self.counters()


# ---------------------------------------------------------------------------
# Configurations: each started, and stopped cleanly, by a context manager that
# leaves nothing running whatever happens inside it.
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def stock_config(base: Path):
    with stock_postgres(base, "stock", STOCK_SETTINGS) as c:
        yield Target("stock", c)


@contextlib.contextmanager
def any2_config(base: Path):
    with any2_postgres(base, STOCK_SETTINGS, STANDBY_SETTINGS, prefix="any2-") as (primary, *_):
        yield Target("any2", primary)


@contextlib.contextmanager
def strata_config(strata_bin: Path, base: Path, name: str, verify_redo: bool):
    with local_cluster(strata_bin, base / name, *(["--verify-redo"] if verify_redo else [])) as cluster:
        endpoint = Endpoint(cluster, "main")
        endpoint.start()
        yield Target(name, endpoint, cluster)


# ---------------------------------------------------------------------------
# Load and runs
# ---------------------------------------------------------------------------

def load(t: Target, args) -> dict:
    """pgbench -i, then the insert workload's table; its WAL and time."""
    before = t.settled_counters() if t.strata else None
    lsn0, t0 = t.insert_lsn(), time.monotonic()
    t.pgbench("-i", "-q", "-s", str(args.scale), timeout=3600)
    seconds, wal = time.monotonic() - t0, t.insert_lsn() - lsn0
    with t.db.connect() as conn:
        for statement in filter(str.strip, INSERT_TABLE.split(";")):
            conn.execute(statement)
        conn.execute(INSERT_ROWS.format(n=args.insert_prefill))
        conn.execute("VACUUM ANALYZE bench_insert")
    out = {"wal_bytes": wal, "seconds": seconds,
           "wal_consistency_checking": t.scalar("SHOW wal_consistency_checking")}
    if t.strata:
        out["counters_before"] = before
    return out


def parse_pgbench(out: str) -> dict:
    return {"transactions": int(re.search(r"number of transactions actually processed: (\d+)", out).group(1)),
            "tps": float(re.search(r"tps = ([0-9.]+)", out).group(1)),
            "latency_ms": float(re.search(r"latency average = ([0-9.]+) ms", out).group(1))}


def bench_run(t: Target, clients: int, seconds: int | None = None, transactions: int | None = None,
              script: Path | None = None) -> dict:
    """One pgbench run after a CHECKPOINT, for `seconds` (-T) or for
    `transactions` in all (-t, split among the clients): TPS, WAL bytes and,
    on Strata, what the pageserver ingested during the run and how long it
    took to catch up after it."""
    t.db.sql("CHECKPOINT")
    if t.strata:
        t.wait_caught_up()
        c0 = t.counters()
    args = ["-n", "-c", str(clients), "-j", str(min(clients, 2))]
    if seconds is not None:
        args += ["-T", str(seconds)]
        timeout = seconds * 4 + 300
    else:
        args += ["-t", str(max(1, transactions // clients))]
        timeout = 7200
    if script is not None:
        args += ["-f", str(script)]
    lsn0, t0 = t.insert_lsn(), time.monotonic()
    r = parse_pgbench(t.pgbench(*args, timeout=timeout))
    t1 = time.monotonic()
    wal = t.insert_lsn() - lsn0
    dt = t1 - t0
    r.update(seconds=dt, wal_bytes=wal, wal_bytes_per_tx=wal / r["transactions"])
    if t.strata:
        c1 = t.counters()
        catch_up = t.wait_caught_up()
        c2 = t.counters()
        during = {k: c1[k] - c0[k] for k in COUNTERS}
        r["ingest"] = {
            "written_mb_per_s": wal / dt / MB,
            "ingested_mb_per_s": during["wal_bytes_ingested"] / dt / MB,
            "records_per_s": during["records_ingested"] / dt,
            "redo_records_stored_per_s": during["redo_records_stored"] / dt,
            "redo_pages_materialized_per_s": during["redo_pages_materialized"] / dt,
            "catch_up_s": catch_up,
            "totals": {k: c2[k] - c0[k] for k in COUNTERS},
        }
    return r


def rounds(targets: dict[str, Target], names: tuple[str, ...], runs: int, label: str, **kw) -> dict[str, list]:
    """`runs` rounds of one bench_run per configuration, the order rotating
    from round to round; the runs of each configuration."""
    out: dict[str, list] = {n: [] for n in names}
    for run in range(runs):
        k = run % len(names)
        for n in names[k:] + names[:k]:
            r = bench_run(targets[n], **kw)
            out[n].append(r)
            print(f"{label}, run {run + 1}/{runs}, {n:<7}: {r['transactions']:7} tx, {r['tps']:8.0f} tps,"
                  f" {r['wal_bytes_per_tx']:8.0f} WAL bytes/tx", file=sys.stderr, flush=True)
    return out


def summarize_runs(runs: list[dict]) -> dict:
    out = {"transactions": median_or_nan(r["transactions"] for r in runs),
           "tps": median_or_nan(r["tps"] for r in runs),
           "latency_ms": median_or_nan(r["latency_ms"] for r in runs),
           "wal_bytes_per_tx": median_or_nan(r["wal_bytes_per_tx"] for r in runs),
           "tps_runs": [r["tps"] for r in runs]}
    if "rows_per_tx" in runs[0]:
        out["wal_bytes_per_row"] = out["wal_bytes_per_tx"] / runs[0]["rows_per_tx"]
        out["rows_per_s"] = out["tps"] * runs[0]["rows_per_tx"]
    if "ingest" in runs[0]:
        out["ingest"] = {k: median_or_nan(r["ingest"][k] for r in runs)
                         for k in runs[0]["ingest"] if k != "totals"}
    return out


def phase_totals(before: dict, after: dict) -> dict:
    d = {k: after[k] - before[k] for k in COUNTERS}
    d["layer_bytes_per_gb_wal"] = ratio(d["layer_bytes_written"], d["wal_bytes_ingested"] / GB)
    d["redo_records_stored_per_record"] = ratio(d["redo_records_stored"], d["records_ingested"])
    return d


# ---------------------------------------------------------------------------
# GetPage of a hot page and of an imaged page
# ---------------------------------------------------------------------------

def wal_files(pgdata: Path, start: int, end: int, segment_size: int) -> list[Path]:
    """The compute's own WAL segment files that hold [start, end]."""
    first, last = start // segment_size, end // segment_size
    files = {segment_number(p.name, segment_size): p for p in (pgdata / "pg_wal").iterdir()
             if SEGMENT_NAME.match(p.name)}
    missing = [n for n in range(first, last + 1) if n not in files]
    if missing:
        raise RuntimeError(f"WAL segments {missing} are not in {pgdata / 'pg_wal'}")
    return [files[n] for n in range(first, last + 1)]


def redo_chains(strata_bin: Path, files: list[Path], start: int, end: int, rels: set[str]) -> dict:
    """Follows, through the WAL in [start, end), how many WAL records a read
    of each page of `rels` (main fork) has to redo after each record that
    changes it: 0 after an image (logged by PostgreSQL, or materialized by the
    pageserver once the chain would reach MAX_REDO_CHAIN records or pass
    MAX_CHAIN_BYTES), one more with each record
    stored without an image. Returns {(rel, block): [(end_lsn, records to redo)]}.
    Pages whose first record in the range has no image are left out (their
    chain began before it)."""
    res = subprocess.run([str(strata_bin), "wal", "dump", "--json", "--start", format_lsn(start),
                          *map(str, files)], capture_output=True, text=True, timeout=600)
    # Per page: records stored since its last image, their bytes, and whether
    # the chain starts at a record that initializes the page.
    state: dict[tuple[str, int], tuple[int, int, bool]] = {}
    history: dict[tuple[str, int], list[tuple[int, int]]] = {}
    unknown: set[tuple[str, int]] = set()
    complete = False
    for line in res.stdout.splitlines():
        rec = json.loads(line)
        if "blocks" not in rec:
            # The last line: the end of the WAL, or where it stopped decoding.
            # Beyond `end` the last segment file may hold stale (recycled) WAL.
            at = rec.get("end_of_wal") or rec.get("lsn")
            complete = at is not None and parse_lsn(at) >= end
            break
        if parse_lsn(rec["lsn"]) >= end:
            complete = True
            break
        for b in rec["blocks"]:
            key = (b["rel"], b["blk"])
            if b["fork"] != "main" or b["rel"] not in rels or key in unknown:
                continue
            if b["image"]:
                count, size, wal_base = 0, 0, False
            elif b["will_init"]:
                count, size, wal_base = 0, rec["total_len"], True
            elif key not in state:
                unknown.add(key)
                continue
            else:
                count, size, wal_base = state[key][0] + 1, state[key][1] + rec["total_len"], state[key][2]
                if count + int(wal_base) >= MAX_REDO_CHAIN or size > MAX_CHAIN_BYTES:
                    count, size, wal_base = 0, 0, False  # redone at ingest and stored as an image
            state[key] = (count, size, wal_base)
            history.setdefault(key, []).append((parse_lsn(rec["end_lsn"]), count + int(wal_base)))
    if not complete:
        raise RuntimeError(f"strata wal dump did not reach {format_lsn(end)}:\n{res.stdout[-2000:]}\n"
                           f"{res.stderr[-2000:]}")
    return history


def relation(t: Target, name: str) -> str:
    return t.scalar(
        "SELECT CASE c.reltablespace WHEN 0 THEN (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default')"
        " ELSE c.reltablespace END || '/' || (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" || '/' || pg_relation_filenode(c.oid) FROM pg_class c WHERE c.relname = '{name}'")


def getpage(t: Target, strata_bin: Path, args) -> dict:
    """Builds a hot page and an imaged page, finds their chains in the WAL and
    times GetPage@LSN of each, interleaved, --runs times."""
    with t.db.connect() as conn:
        # No autovacuum may change either page once the chains are known.
        conn.execute("ALTER TABLE pgbench_branches SET (autovacuum_enabled = off)")
        conn.execute("CREATE TABLE getpage_imaged (id integer, pad text) WITH (autovacuum_enabled = off)")
        conn.execute("INSERT INTO getpage_imaged SELECT i, repeat('x', 100) FROM generate_series(1, 10000) i")
        conn.execute("CHECKPOINT")
        start = parse_lsn(conn.execute("SELECT checkpoint_lsn::text FROM pg_control_checkpoint()").fetchone()[0])
        # The first read after the checkpoint sets the hint bits: one full-page image per page.
        conn.execute("SELECT count(*) FROM getpage_imaged").fetchone()
        for _ in range(args.hot_updates):
            conn.execute("UPDATE pgbench_branches SET bbalance = bbalance + 1 WHERE bid = 1")
        hot_block = conn.execute(
            "SELECT (ctid::text::point)[0]::integer FROM pgbench_branches WHERE bid = 1").fetchone()[0]
        end = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    hot_rel, imaged_rel = relation(t, "pgbench_branches"), relation(t, "getpage_imaged")
    t.settled_counters()  # ingested and in layer files: reads go to the delta layers
    segment_size = t.timeline_status()["wal_segment_size"]
    files = wal_files(t.db.pgdata, start, end, segment_size)
    chains = redo_chains(strata_bin, files, start, end, {hot_rel, imaged_rel})

    hot = chains.get((hot_rel, hot_block))
    if not hot:
        raise RuntimeError(f"no record of block {hot_block} of {hot_rel} after {format_lsn(start)}")
    imaged_blocks = sorted(b for (rel, b), h in chains.items() if rel == imaged_rel and h[-1][1] == 0)
    if not imaged_blocks:
        raise RuntimeError(f"no page of {imaged_rel} is stored as an image at {format_lsn(end)}")
    imaged_block = imaged_blocks[0]
    longest = max(n for _, n in hot)
    longest_lsn = max(lsn for lsn, n in hot if n == longest)
    pages = {
        "imaged": {"rel": imaged_rel, "block": imaged_block, "lsn": end, "redo_records": 0},
        "hot_end": {"rel": hot_rel, "block": hot_block, "lsn": end, "redo_records": hot[-1][1]},
        "hot_longest": {"rel": hot_rel, "block": hot_block, "lsn": longest_lsn, "redo_records": longest},
    }
    frames = {}
    for i, (name, p) in enumerate(pages.items(), start=1):  # request id 0 is reserved
        spc, db, rel = map(int, p["rel"].split("/"))
        frames[name] = page_protocol.get_page_frame(i, p["lsn"], spc, db, rel, page_protocol.FORKS["main"],
                                                    p["block"])

    def read(client, name: str) -> float:
        t0 = time.perf_counter_ns()
        msg = client.request(frames[name])
        us = (time.perf_counter_ns() - t0) / 1e3
        if not isinstance(msg, page_protocol.Page):
            raise RuntimeError(f"GetPage of the {name} page: {msg!r}")
        return us

    runs = []
    with page_protocol.connect(t.page_service, t.tenant, t.timeline) as client:
        for _ in range(min(500, args.getpage_requests)):  # unmeasured: connection, page cache
            for name in frames:
                read(client, name)
        for _ in range(args.runs):
            lat: dict[str, list[float]] = {name: [] for name in frames}
            for _ in range(args.getpage_requests):
                for name in frames:
                    lat[name].append(read(client, name))
            runs.append({name: {"p50_us": percentile(v, 50), "p99_us": percentile(v, 99)}
                         for name, v in lat.items()})
    for name, p in pages.items():
        p["lsn"] = format_lsn(p["lsn"])
        p["p50_us"] = median_or_nan(r[name]["p50_us"] for r in runs)
        p["p99_us"] = median_or_nan(r[name]["p99_us"] for r in runs)
        p["p50_ratio"] = ratio(p["p50_us"], pages["imaged"]["p50_us"]) if name != "imaged" else 1.0
        p["p99_ratio"] = ratio(p["p99_us"], pages["imaged"]["p99_us"]) if name != "imaged" else 1.0
        # The client's own time cancels out of the difference: the cost of the redo.
        p["p50_extra_us"] = p["p50_us"] - pages["imaged"]["p50_us"]
    return {"pages": pages, "hot_updates": args.hot_updates, "hot_records": len(hot),
            "hot_records_with_image": sum(1 for _, n in hot if n == 0),
            "wal_range": [format_lsn(start), format_lsn(end)], "runs": runs}


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------

def report(results: dict, args) -> str:
    cfg = results["configurations"]
    pg, ins = results["pgbench"], results["insert"]
    pge, inse = results["pgbench_equal"], results["insert_equal"]

    def wal_row(label: str, clients, tx, w: dict) -> str:
        return (f"{label:<18}{clients:>8}{tx:>9}{w['stock']:>10.0f}{w['strata']:>10.0f}{w['verify']:>10.0f}"
                f"{ratio(w['strata'], w['stock']):>14.2f}{ratio(w['verify'], w['stock']):>14.2f}")

    wal_header = (f"{'workload':<18}{'clients':>8}{'tx':>9}{'stock':>10}{'strata':>10}{'verify':>10}"
                  f"{'strata/stock':>14}{'verify/stock':>14}")
    lines = [
        f"pgbench -s {args.scale}; {args.runs} runs per point, each after a CHECKPOINT; medians;"
        f" {results['cpus']} CPUs, load {results['loadavg_before']:.2f} before",
        "stock = PostgreSQL 15, local disk (fsync, wal_log_hints, lz4, full_page_writes);"
        " any2 = stock + 2 sync standbys (ANY 2)",
        "strata = Strata, native redo of heap/heap2/btree; verify = Strata --verify-redo"
        " (wal_consistency_checking = 'all': an image with every change, as before native redo)",
        "",
        "1. WAL bytes per transaction",
        "a) equal work: every configuration runs the same transactions (tx) after a checkpoint, having",
        "   done the same before",
        wal_header,
    ]
    ld = {n: cfg[n]["load"]["wal_bytes"] / MB for n in WAL_CONFIGS}
    lines.append(f"{'pgbench -i (MB)':<18}{'':>8}{'':>9}{ld['stock']:>10.1f}{ld['strata']:>10.1f}{ld['verify']:>10.1f}"
                 f"{ratio(ld['strata'], ld['stock']):>14.2f}{ratio(ld['verify'], ld['stock']):>14.2f}")
    for c in args.clients:
        lines.append(wal_row("pgbench", c, f"{pge['stock'][str(c)]['transactions']:.0f}",
                             {n: pge[n][str(c)]["wal_bytes_per_tx"] for n in WAL_CONFIGS}))
    tx = f"{inse['stock']['transactions']:.0f}"
    lines.append(wal_row("insert, per tx", 1, tx, {n: inse[n]["wal_bytes_per_tx"] for n in WAL_CONFIGS}))
    lines.append(wal_row("insert, per row", 1, tx, {n: inse[n]["wal_bytes_per_row"] for n in WAL_CONFIGS}))
    lines += [
        f"b) timed runs ({args.seconds} s each; tx = stock's): a faster configuration spreads the"
        " checkpoint's full-page images over more transactions",
        wal_header,
    ]
    for c in args.clients:
        lines.append(wal_row("pgbench", c, f"{pg['stock'][str(c)]['transactions']:.0f}",
                             {n: pg[n][str(c)]["wal_bytes_per_tx"] for n in WAL_CONFIGS}))
    tx = f"{ins['stock']['transactions']:.0f}"
    lines.append(wal_row("insert, per tx", 1, tx, {n: ins[n]["wal_bytes_per_tx"] for n in WAL_CONFIGS}))
    lines.append(wal_row("insert, per row", 1, tx, {n: ins[n]["wal_bytes_per_row"] for n in WAL_CONFIGS}))
    lines += [
        f"   insert: {args.insert_batch} random rows per transaction, one client, into a table with 3 btree"
        f" indexes ({args.insert_prefill} rows before); rows/s: "
        + ", ".join(f"{n} {ins[n]['rows_per_s']:.0f}" for n in WAL_CONFIGS),
        "",
        f"2. pgbench TPS ({args.seconds} s runs)",
        f"{'clients':>8}{'stock':>9}{'any2':>9}{'strata':>9}{'verify':>9}{'strata/stock':>14}{'strata/any2':>13}"
        f"{'verify/stock':>14}{'verify/any2':>13}",
    ]
    for c in args.clients:
        tps = {n: pg[n][str(c)]["tps"] for n in CONFIGS}
        lines.append(f"{c:>8}{tps['stock']:>9.0f}{tps['any2']:>9.0f}{tps['strata']:>9.0f}{tps['verify']:>9.0f}"
                     f"{ratio(tps['strata'], tps['stock']):>14.2f}{ratio(tps['strata'], tps['any2']):>13.2f}"
                     f"{ratio(tps['verify'], tps['stock']):>14.2f}{ratio(tps['verify'], tps['any2']):>13.2f}")
    lines += [
        "",
        "3. Pageserver ingest during the timed pgbench runs",
        f"{'mode':<8}{'clients':>8}{'written MB/s':>14}{'ingested MB/s':>15}{'records/s':>11}"
        f"{'redo recs/s':>13}{'materialized/s':>16}{'catch-up s':>12}",
    ]
    for n in STRATA_CONFIGS:
        for c in args.clients:
            g = pg[n][str(c)]["ingest"]
            lines.append(f"{n:<8}{c:>8}{g['written_mb_per_s']:>14.2f}{g['ingested_mb_per_s']:>15.2f}"
                         f"{g['records_per_s']:>11.0f}{g['redo_records_stored_per_s']:>13.0f}"
                         f"{g['redo_pages_materialized_per_s']:>16.0f}{g['catch_up_s']:>12.2f}")
    lines += [
        "   whole phases (load; all pgbench runs; all insert runs), each ended by a checkpoint of the timeline:",
        f"{'phase':<10}{'mode':<8}{'WAL ingested MB':>17}{'layer MB written':>18}{'layer GB/GB WAL':>17}"
        f"{'redo recs stored':>18}{'materialized':>14}",
    ]
    for phase in ("load", "pgbench", "insert"):
        for n in STRATA_CONFIGS:
            ph = cfg[n]["phases"][phase]
            lines.append(f"{phase:<10}{n:<8}{ph['wal_bytes_ingested'] / MB:>17.0f}"
                         f"{ph['layer_bytes_written'] / MB:>18.0f}{ph['layer_bytes_per_gb_wal'] / GB:>17.2f}{ph['redo_records_stored']:>18.0f}"
                         f"{ph['redo_pages_materialized']:>14.0f}")
    v = cfg["verify"]["redo_check"]
    lines += [
        f"   verify: {v.get('verified', 0)} blocks of native redo checked against PostgreSQL's images,"
        f" {v.get('mismatches', 0)} mismatches",
        "",
        f"4. GetPage@LSN, one connection, one request at a time (Python client); hot = the pgbench_branches"
        f" page after {args.hot_updates} updates of one row; {args.getpage_requests} requests per page and run",
        f"{'mode':<8}{'page':<22}{'at LSN':>13}{'redo recs':>10}{'p50 us':>9}{'p99 us':>9}{'p50 ratio':>11}"
        f"{'p99 ratio':>11}{'p50 - imaged':>14}",
    ]
    labels = {"imaged": "imaged", "hot_end": "hot, end of updates", "hot_longest": "hot, longest chain"}
    for n in STRATA_CONFIGS:
        gp = cfg[n]["getpage"]["pages"]
        for key, label in labels.items():
            p = gp[key]
            lines.append(f"{n:<8}{label:<22}{p['lsn']:>13}{p['redo_records']:>10}{p['p50_us']:>9.0f}"
                         f"{p['p99_us']:>9.0f}{p['p50_ratio']:>11.2f}{p['p99_ratio']:>11.2f}"
                         f"{p['p50_extra_us']:>12.0f}us")
    lines.append("   redo recs = WAL records a read of the page redoes (followed through the WAL); ratios and"
                 " difference against the imaged page of the same mode")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=20, help="seconds per pgbench run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--transactions", type=int, default=10_000,
                    help="transactions of each equal-work pgbench run (all clients together)")
    ap.add_argument("--insert-batch", type=int, default=100, help="rows per transaction of the insert workload")
    ap.add_argument("--insert-transactions", type=int, default=300,
                    help="transactions of each equal-work insert run")
    ap.add_argument("--insert-prefill", type=int, default=100_000, help="rows in the insert table before its runs")
    ap.add_argument("--hot-updates", type=int, default=2000, help="updates of one row that make the hot page")
    ap.add_argument("--getpage-requests", type=int, default=5000, help="GetPage requests per page and run")
    ap.add_argument("--out", type=Path, help="JSON results (default bench/results/native_redo.json)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: scale 2, 1 run of 5 s, clients 1,8, small insert and GetPage phases")
    args = ap.parse_args()
    if args.quick:
        args.scale, args.seconds, args.runs, args.clients = 2, 5, 1, [1, 8]
        args.transactions, args.insert_transactions = 2000, 200
        args.insert_prefill, args.hot_updates, args.getpage_requests = 10_000, 300, 1000
    out_path = args.out or RESULTS / f"{result_stem('native_redo', args.quick)}.json"
    strata_bin = strata_to_measure()
    results: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     **machine_state(), "stock_settings": STOCK_SETTINGS, "configurations": {n: {} for n in CONFIGS}}
    cfg = results["configurations"]
    # Every run: workload -> [clients ->] configuration -> runs.
    runs: dict = {"pgbench": {}, "pgbench_equal": {}}

    with bench_dir() as base:
        script = base / "insert.sql"
        script.write_text(INSERT_ROWS.format(n=args.insert_batch) + ";\n")
        script.chmod(0o644)
        with contextlib.ExitStack() as stack:
            targets = {
                "stock": stack.enter_context(stock_config(base)),
                "any2": stack.enter_context(any2_config(base)),
                "strata": stack.enter_context(strata_config(strata_bin, base, "strata", verify_redo=False)),
                "verify": stack.enter_context(strata_config(strata_bin, base, "verify", verify_redo=True)),
            }
            marks: dict[str, dict] = {}
            for n, t in targets.items():
                cfg[n]["load"] = load(t, args)
                if t.strata:
                    marks[n] = {"start": cfg[n]["load"].pop("counters_before"), "load": t.settled_counters()}

            # Equal work first, while every configuration has the same history
            # (the timed runs then do different amounts of work in each).
            for c in args.clients:
                runs["pgbench_equal"][str(c)] = rounds(targets, WAL_CONFIGS, args.runs,
                                                       f"pgbench -c {c}, {args.transactions} tx",
                                                       clients=c, transactions=args.transactions)
            for c in args.clients:
                runs["pgbench"][str(c)] = rounds(targets, CONFIGS, args.runs, f"pgbench -c {c} -T {args.seconds}",
                                                 clients=c, seconds=args.seconds)
            for n in STRATA_CONFIGS:
                marks[n]["pgbench"] = targets[n].settled_counters()

            runs["insert_equal"] = rounds(targets, WAL_CONFIGS, args.runs, f"insert, {args.insert_transactions} tx",
                                          clients=1, transactions=args.insert_transactions, script=script)
            runs["insert"] = rounds(targets, WAL_CONFIGS, args.runs, f"insert -T {args.seconds}",
                                    clients=1, seconds=args.seconds, script=script)
            for n in STRATA_CONFIGS:
                marks[n]["insert"] = targets[n].settled_counters()
                m = marks[n]
                cfg[n]["phases"] = {"load": phase_totals(m["start"], m["load"]),
                                    "pgbench": phase_totals(m["load"], m["pgbench"]),
                                    "insert": phase_totals(m["pgbench"], m["insert"])}
                cfg[n]["redo_check"] = targets[n].timeline_status().get("verify_redo") or {}

            for n in STRATA_CONFIGS:
                cfg[n]["getpage"] = getpage(targets[n], strata_bin, args)
                print(f"getpage, {n}: done", file=sys.stderr, flush=True)

    for w in ("pgbench", "pgbench_equal"):
        results[w] = {n: {c: summarize_runs(runs[w][c][n]) for c in runs[w]} for n in runs[w][str(args.clients[0])]}
    for w in ("insert", "insert_equal"):
        for n, rs in runs[w].items():
            for r in rs:
                r["rows_per_tx"] = args.insert_batch
        results[w] = {n: summarize_runs(rs) for n, rs in runs[w].items()}
    results["runs"] = runs
    text = report(results, args)
    write_json(out_path, results)
    out_path.with_suffix(".txt").write_text(text + "\n")
    print(text)
    print(f"\nresults: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
