"""The pageserver against a real, stock PostgreSQL 15 compute of the local
cluster (`strata init` / `start` / `endpoint start`):

- every block of every relation fork in the compute's data directory equals
  the pageserver's page at the compute's checkpoint LSN, under PostgreSQL's
  masking rules (test_runner/fixtures/page_mask.py), and the sizes agree;
  pages at an older LSN are still the older versions;
- a damaged value in a layer file fails exactly the reads that need it, with
  an error naming the file; a damaged layer header makes the timeline
  broken, not the process;
- unknown tenants and timelines, LSNs that never arrive and malformed frames
  of the page service protocol get the errors the protocol specifies, and
  the server keeps serving;
- GetPage over the page service (pipelined) returns the same bytes as the
  HTTP `/page` API.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import struct
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from fixtures import page_protocol as pp
from fixtures.cluster import LocalCluster, StrataCommandFailed, pid_alive
from fixtures.page_mask import PAGE_SIZE, diff_ranges, header_fields, locate, masked
from fixtures.strata import format_lsn, parse_lsn
from fixtures.workload import (_copy_select, _databases, _indexes, _large_objects, _maintenance, _multixact,
                               _sequences, _subtransactions, _toast, _unlogged)

GLOBAL_SPC = 1664
DEFAULT_SPC = 1663
RELSEG_BLOCKS = 131072  # blocks per 1 GiB segment file
FORK_SUFFIX = {"main": "", "fsm": "_fsm", "vm": "_vm", "init": "_init"}
FORK_NUMBER = {"main": 0, "fsm": 1, "vm": 2, "init": 3}
REL_FILE = re.compile(r"^(?P<rel>\d+)(?:_(?P<fork>fsm|vm|init))?(?:\.(?P<seg>\d+))?$")
AM_KINDS = {"btree", "hash", "gin", "gist", "spgist", "brin"}


# ---------------------------------------------------------------- helpers

class PageserverApi:
    """The pageserver of a local cluster: HTTP API on one keep-alive connection, page service address."""

    def __init__(self, cluster: LocalCluster):
        ct = cluster.cluster_toml
        svc = next(s for s in ct["services"] if s["name"] == "pageserver")
        self.http_port = svc["ports"]["http"]
        self.pg_address = f"127.0.0.1:{svc['ports']['pg']}"
        self.tenant = ct["tenant_id"]
        self.timeline = ct["branches"][0]["timeline_id"]
        self.data_dir = Path(cluster.service_config("pageserver")["data_dir"])
        self.conn: http.client.HTTPConnection | None = None

    @property
    def timeline_dir(self) -> Path:
        return self.data_dir / "tenants" / self.tenant / "timelines" / self.timeline

    def request(self, method: str, path: str, timeout: float = 60) -> tuple[int, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
            self.conn.timeout = timeout
            try:
                self.conn.request(method, path)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, ConnectionError, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def tl_path(self, tenant: str | None = None, timeline: str | None = None) -> str:
        return f"/v1/tenant/{tenant or self.tenant}/timeline/{timeline or self.timeline}"

    def status(self) -> dict:
        code, body = self.request("GET", self.tl_path())
        assert code == 200, (code, body)
        return json.loads(body)

    def checkpoint(self) -> dict:
        code, body = self.request("POST", self.tl_path() + "/checkpoint", timeout=300)
        assert code == 200, (code, body)
        return json.loads(body)

    def page(self, spc: int, db: int, rel: int, fork: str, block: int, lsn: int | None,
             timeout: float = 60) -> tuple[int, bytes]:
        q = f"?rel={spc}/{db}/{rel}&fork={FORK_NUMBER[fork]}&block={block}"
        if lsn is not None:
            q += f"&lsn={format_lsn(lsn)}"
        return self.request("GET", self.tl_path() + "/page" + q, timeout=timeout)

    def wait_lsn(self, lsn: int, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if parse_lsn(st["last_record_lsn"]) >= lsn:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"pageserver at {st['last_record_lsn']}, waited {timeout}s for {format_lsn(lsn)}: {st}")
            time.sleep(0.2)


def error_message(body: bytes) -> str:
    return json.loads(body)["error"]


class Endpoint:
    """A running endpoint: connections, client programs, its data directory."""

    def __init__(self, cluster: LocalCluster, name: str, pg_bin_dir: Path):
        self.cluster = cluster
        self.name = name
        self.connstr = cluster.endpoint_start(name)
        self.port = int(re.search(r":(\d+)/", self.connstr).group(1))
        self.pg_bin_dir = pg_bin_dir
        self.pgdata = cluster.workdir / "endpoints" / name / "pgdata"

    def connect(self, dbname: str = "postgres", autocommit: bool = True, **kw) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                               autocommit=autocommit, connect_timeout=30, **kw)

    def sql(self, query: str, params=None, dbname: str = "postgres") -> list[tuple]:
        with self.connect(dbname) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def run(self, cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(PGHOST="127.0.0.1", PGPORT=str(self.port), PGUSER="postgres", PGDATABASE="postgres",
                   PGCONNECT_TIMEOUT="30")
        res = subprocess.run([str(self.pg_bin_dir / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, f"{cmd}: {res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        return res

    def current_lsn(self, conn=None) -> int:
        q = "SELECT pg_current_wal_lsn()::text"
        row = conn.execute(q).fetchone() if conn is not None else self.sql(q)[0]
        return parse_lsn(row[0])

    def wait_quiet(self, timeout: float = 120) -> None:
        """Until no other client backend or autovacuum worker is active."""
        deadline = time.monotonic() + timeout
        while True:
            busy = self.sql("SELECT pid, backend_type, state, query FROM pg_stat_activity "
                            "WHERE backend_type IN ('client backend', 'autovacuum worker') "
                            "AND pid <> pg_backend_pid()")
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the compute is not quiet: {busy}")
            time.sleep(0.2)


def relation_file(pgdata: Path, spc: int, db: int, rel: int, fork: str) -> Path:
    base = pgdata / "global" if spc == GLOBAL_SPC else pgdata / "base" / str(db)
    return base / f"{rel}{FORK_SUFFIX[fork]}"


def read_fork(first_segment: Path) -> bytes:
    """All blocks of a relation fork: its segment files concatenated."""
    data = bytearray(first_segment.read_bytes())
    seg = 1
    while (p := first_segment.with_name(f"{first_segment.name}.{seg}")).exists():
        data += p.read_bytes()
        seg += 1
    assert len(data) % PAGE_SIZE == 0, f"{first_segment}: {len(data)} bytes is not a whole number of pages"
    return bytes(data)


@dataclass
class RelInfo:
    name: str
    relkind: str
    amname: str
    persistence: str

    @property
    def kind(self) -> str:
        """Which masking rules apply to the relation's main and init forks."""
        if self.relkind == "S":
            return "sequence"
        if self.relkind in ("r", "t", "m"):
            return "heap" if self.amname == "heap" else "unknown"
        if self.relkind == "i" and self.amname in AM_KINDS:
            return self.amname
        return "unknown"


def catalog(ep: Endpoint) -> tuple[dict[str, int], dict[tuple[int, int, int], RelInfo]]:
    """Database oids by name, and every relation with storage by (spc, db, relfilenode), from each database's catalog."""
    dbs = {name: oid for name, oid in ep.sql("SELECT datname, oid::int FROM pg_database")}
    rels: dict[tuple[int, int, int], RelInfo] = {}
    for name, oid in dbs.items():
        with ep.connect(name) as conn:
            rows = conn.execute(
                "SELECT pg_relation_filenode(c.oid)::bigint, c.reltablespace::int, c.relisshared, c.relkind, "
                "       coalesce(am.amname, ''), c.relpersistence, c.oid::regclass::text "
                "FROM pg_class c LEFT JOIN pg_am am ON am.oid = c.relam "
                "WHERE pg_relation_filenode(c.oid) IS NOT NULL").fetchall()
        for filenode, spc, shared, relkind, amname, persistence, relname in rows:
            key = (GLOBAL_SPC, 0, filenode) if shared else (spc or DEFAULT_SPC, oid, filenode)
            rels.setdefault(key, RelInfo(relname if shared else f"{name}.{relname}", relkind, amname, persistence))
    return dbs, rels


@dataclass
class ForkFile:
    spc: int
    db: int
    rel: int
    fork: str
    path: Path

    @property
    def tag(self) -> str:
        return f"{self.spc}/{self.db}/{self.rel}{FORK_SUFFIX[self.fork]}"


def relation_forks(pgdata: Path) -> list[ForkFile]:
    """Every relation fork file of the default and global tablespaces (first segments only)."""
    out = []
    dirs = [(GLOBAL_SPC, 0, pgdata / "global")]
    dirs += [(DEFAULT_SPC, int(d.name), d) for d in sorted((pgdata / "base").iterdir()) if d.name.isdigit()]
    for spc, db, d in dirs:
        for p in sorted(d.iterdir()):
            m = REL_FILE.match(p.name)
            if m and m["seg"] is None:
                out.append(ForkFile(spc, db, int(m["rel"]), m["fork"] or "main", p))
    assert not any((pgdata / "pg_tblspc").iterdir()), "tablespaces other than pg_default/pg_global are not covered"
    return out


@dataclass
class Comparison:
    lsn: int
    blocks_compared: int = 0
    blocks_equal: int = 0
    forks_compared: int = 0
    sizes_checked: int = 0
    skipped: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    mismatches: list = field(default_factory=list)
    size_mismatches: list = field(default_factory=list)
    fetched: dict = field(default_factory=dict)  # (spc, db, rel, fork, block) -> raw page from HTTP

    def summary(self) -> dict:
        return {"lsn": format_lsn(self.lsn), "forks_compared": self.forks_compared,
                "blocks_compared": self.blocks_compared, "blocks_equal": self.blocks_equal,
                "blocks_mismatched": len(self.mismatches), "sizes_checked": self.sizes_checked,
                "size_mismatches": len(self.size_mismatches), "by_kind": dict(self.by_kind),
                "skipped_blocks_by_reason": dict(self.skipped)}


def describe_mismatch(where: str, kind: str, block: int, local: bytes, served: bytes) -> dict:
    ml, ms = masked(local, kind, block), masked(served, kind, block)
    ranges = diff_ranges(ml, ms)
    return {
        "relation": where, "block": block, "kind": kind,
        "differing_byte_ranges_after_masking": [
            {"from": a, "to": b, "where": locate(local, a), "data_file": local[a:b][:32].hex(),
             "pageserver": served[a:b][:32].hex()} for a, b in ranges],
        "data_file_header": header_fields(local), "pageserver_header": header_fields(served),
    }


def compare_fork(ps: PageserverApi, ff: ForkFile, local: bytes, kind: str, lsn: int, cmp: Comparison,
                 where: str, skip_block=lambda b: None, keep: bool = False) -> None:
    """Compares every block of ``local`` with the pageserver's page at ``lsn``, and the fork's size."""
    nblocks = len(local) // PAGE_SIZE
    cmp.forks_compared += 1
    for b in range(nblocks):
        reason = skip_block(b)
        if reason:
            cmp.skipped[reason] += 1
            continue
        code, served = ps.page(ff.spc, ff.db, ff.rel, ff.fork, b, lsn)
        if code != 200:
            cmp.mismatches.append({"relation": where, "block": b, "kind": kind, "http_status": code,
                                   "error": served.decode(errors="replace")})
            continue
        assert len(served) == PAGE_SIZE, (where, b, len(served))
        if keep:
            cmp.fetched[(ff.spc, ff.db, ff.rel, ff.fork, b)] = served
        page = local[b * PAGE_SIZE:(b + 1) * PAGE_SIZE]
        cmp.blocks_compared += 1
        cmp.by_kind[kind] += 1
        if masked(page, kind, b) == masked(served, kind, b):
            cmp.blocks_equal += 1
        else:
            cmp.mismatches.append(describe_mismatch(where, kind, b, page, served))
    # The size: the block after the last one does not exist at this LSN.
    code, body = ps.page(ff.spc, ff.db, ff.rel, ff.fork, nblocks, lsn)
    cmp.sizes_checked += 1
    if code != 404:
        cmp.size_mismatches.append({"relation": where, "blocks_in_data_file": nblocks,
                                    f"page {nblocks} status": code,
                                    "body": body[:200].decode(errors="replace") if code != 200 else "a page"})
    elif nblocks == 0:
        # An empty fork must still exist on the pageserver (not "does not exist").
        msg = error_message(body)
        if "beyond its 0 blocks" not in msg:
            cmp.size_mismatches.append({"relation": where, "blocks_in_data_file": 0, "error": msg})


def compare_data_dir(ps: PageserverApi, ep: Endpoint, rels: dict, lsn: int, keep: bool = False) -> Comparison:
    cmp = Comparison(lsn)
    for ff in relation_forks(ep.pgdata):
        info = rels.get((ff.spc, ff.db, ff.rel))
        local = read_fork(ff.path)
        nblocks = len(local) // PAGE_SIZE
        if ff.fork == "fsm":
            cmp.skipped["free space map fork: not served by the pageserver"] += nblocks
            continue
        if info is None:
            # A dropped relation whose file is only unlinked after a checkpoint is empty.
            assert nblocks == 0, f"{ff.path}: {nblocks} blocks of a relation no catalog knows"
            cmp.skipped["file of a dropped relation, emptied"] += 1
            continue
        where = f"{info.name} ({ff.tag})"
        if info.persistence == "t":
            cmp.skipped["temporary relation"] += nblocks
            continue
        if info.persistence == "u" and ff.fork != "init":
            cmp.skipped["unlogged relation: main and vm forks are not WAL-logged"] += nblocks
            continue
        kind = "vm" if ff.fork == "vm" else info.kind

        def skip_block(b: int, kind=kind) -> str | None:
            if kind == "sequence":
                return "sequence page: nextval() changes it without WAL"
            if kind == "spgist" and b == 0:
                return "SP-GiST metapage: its last-used-page cache is written without WAL"
            return None

        compare_fork(ps, ff, local, kind, lsn, cmp, where, skip_block, keep)
    return cmp


def flip(path: Path, offset: int, n: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


# Layer file format (pageserver/src/layer/delta.rs, version 1).
KEY_SIZE = 18
LAYER_HEADER_SIZE = 8 + 4 + 4 + 2 * KEY_SIZE + 8 + 8 + 4
LAYER_FOOTER_SIZE = 8 + 8 + 4 + 4 + 8
LAYER_ENTRY_SIZE = KEY_SIZE + 8 + 8 + 4 + 4 + 2


@dataclass
class LayerEntry:
    kind: int
    spc: int
    db: int
    rel: int
    fork: int
    block: int
    lsn: int
    offset: int
    length: int


def layer_index(path: Path) -> tuple[int, list[LayerEntry]]:
    """The index of a delta layer file: (index offset, entries)."""
    data = path.read_bytes()
    assert data[:8] == b"STRDELTA" and data[-8:] == b"STRDLEND", path
    index_offset, count = struct.unpack_from("<QQ", data, len(data) - LAYER_FOOTER_SIZE)
    assert index_offset + count * LAYER_ENTRY_SIZE == len(data) - LAYER_FOOTER_SIZE
    entries = []
    for i in range(count):
        e = index_offset + i * LAYER_ENTRY_SIZE
        kind, f1, f2, f3, f4, f5 = struct.unpack_from(">BIIIBI", data, e)
        lsn, offset, length = struct.unpack_from("<QQI", data, e + KEY_SIZE)
        entries.append(LayerEntry(kind, f1, f2, f3, f4, f5, lsn, offset, length))
    return index_offset, entries


def layer_files(ps: PageserverApi) -> list[Path]:
    """The timeline's layer files, oldest first (by end LSN)."""
    files = list(ps.timeline_dir.glob("*.delta"))
    return sorted(files, key=lambda p: int(p.name.split("__")[1].split("-")[1].removesuffix(".delta"), 16))


# ---------------------------------------------------------------- 1. exactness

def test_pages_equal_compute_data_files(cluster, pg_bin_dir):
    """Every block of every relation fork in a running compute's data
    directory, after a broad workload and a CHECKPOINT, equals the
    pageserver's page at that LSN (masked as PostgreSQL masks WAL-check
    images); sizes agree; and an older LSN still serves the older pages."""
    ps = PageserverApi(cluster)
    ep = Endpoint(cluster, "ep", pg_bin_dir)
    with ep.connect() as conn:
        # Nothing in the background that would change pages while files are read.
        conn.execute("ALTER SYSTEM SET autovacuum = off")
        conn.execute("SELECT pg_reload_conf()")
        # So that template0's catalog can be read (page kinds of its relations).
        conn.execute("ALTER DATABASE template0 WITH ALLOW_CONNECTIONS true")

        # A first state of one table, kept at L1.
        conn.execute("CREATE TABLE hist_t (id int PRIMARY KEY, v text)")
        _copy_select(conn, "hist_t", "SELECT i, repeat('a', 150) FROM generate_series(1, 3000) i")
        conn.execute("UPDATE hist_t SET v = 'first' WHERE id % 10 = 0")
        hist = conn.execute("SELECT pg_relation_filepath('hist_t'), pg_relation_filepath('hist_t_pkey')").fetchone()
        ep.wait_quiet()
        conn.execute("CHECKPOINT")
        l1 = ep.current_lsn(conn)
        hist_at_l1 = {p: (ep.pgdata / p).read_bytes() for p in hist}
    assert len(hist_at_l1[hist[0]]) >= 60 * PAGE_SIZE

    # The broad workload, in the pieces that fit a compute (no two-phase
    # commit: a compute runs with max_prepared_transactions = 0).
    t0 = time.monotonic()
    ep.run(["pgbench", "-i", "-s", "1", "-q"])
    ep.run(["pgbench", "-n", "-t", "100", "-c", "2"])
    with ep.connect() as conn:
        _indexes(conn)
        _toast(conn)
        _sequences(conn)
        _maintenance(conn)
        _unlogged(conn)
        _databases(ep, conn)
        _large_objects(conn)
        _subtransactions(conn)
        _multixact(ep, conn)
        conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 5000 = 0")
        # Later versions of the table kept at L1: new tuples, deletions, growth.
        conn.execute("UPDATE hist_t SET v = 'second' WHERE id % 3 = 0")
        conn.execute("DELETE FROM hist_t WHERE id % 7 = 0")
        conn.execute("INSERT INTO hist_t SELECT i, 'third' FROM generate_series(3001, 4000) i")
        conn.execute("VACUUM hist_t")
    workload_s = time.monotonic() - t0

    # Quiescent compute: catalogs first (reading them may set hint bits), then
    # the checkpoint whose LSN the pages are compared at.
    ep.wait_quiet()
    dbs, rels = catalog(ep)
    assert {"postgres", "template0", "template1", "db_wal_log"} <= set(dbs), dbs
    with ep.connect() as conn:
        conn.execute("CHECKPOINT")
        l2 = ep.current_lsn(conn)
    st = ps.wait_lsn(l2)
    assert st["state"] == "active", st

    t0 = time.monotonic()
    cmp = compare_data_dir(ps, ep, rels, l2, keep=True)
    compare_s = time.monotonic() - t0
    lsn_after = ep.current_lsn()
    report = {**cmp.summary(), "wal_after_comparison": format_lsn(lsn_after),
              "workload_seconds": round(workload_s, 1), "comparison_seconds": round(compare_s, 1)}
    print("\npage exactness at L2:", json.dumps(report, indent=1))
    assert not cmp.mismatches, json.dumps({"report": report, "mismatches": cmp.mismatches[:20]}, indent=1)
    assert not cmp.size_mismatches, json.dumps(cmp.size_mismatches[:20], indent=1)
    assert cmp.blocks_compared == cmp.blocks_equal
    assert cmp.blocks_compared > 4000, report
    for kind in ("heap", "btree", "hash", "gin", "gist", "spgist", "brin", "vm"):
        assert cmp.by_kind[kind] > 0, f"no {kind} page compared: {report}"
    # Init forks of the unlogged table's indexes were compared too.
    assert any(r.persistence == "u" and r.relkind == "i" for r in rels.values())

    # The same pages over the page service, pipelined 100 deep: byte for byte.
    keys = sorted(cmp.fetched)
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
        for i in range(0, len(keys), 100):
            chunk = keys[i:i + 100]
            frames = [pp.get_page_frame(i + j + 1, l2, *page_address(k)) for j, k in enumerate(chunk)]
            for j, (k, resp) in enumerate(zip(chunk, c.pipelined(frames))):
                assert isinstance(resp, pp.Page) and resp.id == i + j + 1, (k, resp if not isinstance(resp, pp.Page) else resp.id)
                assert resp.page == cmp.fetched[k], f"page service and HTTP differ for {k}"

    # The older LSN: the table as it was at L1, while L2 has the new version.
    db_oid = dbs["postgres"]
    older = Comparison(l1)
    newer = Comparison(l2)
    changed = 0
    for path in hist:
        rel = int(Path(path).name)
        ff = ForkFile(DEFAULT_SPC, db_oid, rel, "main", ep.pgdata / path)
        kind = rels[(DEFAULT_SPC, db_oid, rel)].kind
        compare_fork(ps, ff, hist_at_l1[path], kind, l1, older, f"{path} at L1", keep=True)
        now = read_fork(ep.pgdata / path)
        compare_fork(ps, ff, now, kind, l2, newer, f"{path} at L2", keep=True)
        assert len(now) > len(hist_at_l1[path]), "the table and its index grew after L1"
        for b in range(len(hist_at_l1[path]) // PAGE_SIZE):
            key = (DEFAULT_SPC, db_oid, rel, "main", b)
            if masked(older.fetched[key], kind, b) != masked(newer.fetched[key], kind, b):
                changed += 1
    print("older LSN:", json.dumps({"L1": older.summary(), "L2": newer.summary(), "blocks_changed_since_L1": changed}))
    assert not older.mismatches and not older.size_mismatches, json.dumps(older.mismatches[:10] + older.size_mismatches, indent=1)
    assert not newer.mismatches and not newer.size_mismatches, json.dumps(newer.mismatches[:10] + newer.size_mismatches, indent=1)
    assert older.blocks_compared == older.blocks_equal > 60
    # Most pages of the table changed after L1, so L1 really served older versions.
    assert changed > 50, changed


def page_address(k: tuple) -> tuple[int, int, int, int, int]:
    spc, db, rel, fork, block = k
    return spc, db, rel, FORK_NUMBER[fork], block
