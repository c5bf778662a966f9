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
  HTTP `/page` API;
- the last checkpoint record at an LSN is the one PostgreSQL's pg_control
  names.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
import zstandard

from fixtures import page_protocol as pp
from fixtures.cluster import LocalCluster, StrataCommandFailed
from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.page_compare import (Comparison, ForkFile, catalog, checkpoint_compute, compare_data_dir, compare_fork,
                                   mismatch_report, quiet_compute, read_fork, relation_forks, wait_quiet)
from fixtures.page_mask import PAGE_SIZE, masked
from fixtures.pageserver_api import DEFAULT_SPC, FORK_NUMBER, PageserverApi, error_message, wait_for_pageserver_lsn
from fixtures.processes import pid_alive
from fixtures.strata import format_lsn, parse_lsn
from fixtures.wait import wait_until
from fixtures.workload import _copy_select, run_broad_workload

HISTORY_TABLES = ("hist_t", "shrink_t", "drop_t")


# ---------------------------------------------------------------- helpers

def wait_caught_up(cluster: LocalCluster, ps: PageserverApi, timeout: float = 120) -> dict:
    """With no compute running: until the pageserver has ingested every WAL
    record the safekeepers have committed."""
    return ps.wait_lsn(cluster.commit_lsn(), timeout)


@dataclass
class WalImage:
    end_lsn: int
    hole_offset: int
    hole_length: int


def last_wal_images(strata_bin: Path, waldir: Path, start: int, end: int) -> dict[tuple[str, str, int], WalImage]:
    """The last full-page image of each block in the WAL from ``start`` (a
    record's LSN) to ``end``, as `strata wal dump --json` decodes it."""
    out: dict[tuple[str, str, int], WalImage] = {}
    proc = subprocess.Popen([str(strata_bin), "wal", "dump", "--json", "--start", format_lsn(start), str(waldir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reached = 0
    for line in proc.stdout:
        r = json.loads(line)
        if "end_lsn" not in r:  # the last line: {"end_of_wal": …} or {"error": …, "lsn": …}
            reached = max(reached, parse_lsn(r.get("end_of_wal") or r["lsn"]))
            continue
        end_lsn = parse_lsn(r["end_lsn"])
        if end_lsn > end:
            continue
        reached = max(reached, end_lsn)
        for b in r["blocks"]:
            if b["image"]:
                out[(b["rel"], b["fork"], b["blk"])] = WalImage(end_lsn, b["hole_offset"], b["hole_length"])
    proc.wait(timeout=60)
    assert reached >= end, (f"the compute's WAL from {format_lsn(start)} ends at {format_lsn(reached)}: "
                            f"{proc.stderr.read()}")
    return out


def wal_hole_explanation(images: dict[tuple[str, str, int], WalImage]):
    """A difference PostgreSQL's WAL itself accounts for: every differing byte
    lies in the hole of the block's last WAL image (bytes the image does not
    carry, restored as zeros by redo), and the pageserver has zeros there.

    This happens to visibility-map pages copied by CREATE DATABASE ... STRATEGY
    = WAL_LOG: PostgreSQL 15 logs each copied page with log_newpage_buffer(...,
    page_std = true), and a map page (pd_lower 24, pd_upper 8192) then has its
    whole bitmap in the "hole". Redo, on a standby as on the pageserver, gives
    a map with every bit clear, while the primary's file keeps the source's
    bits. Clear bits are the safe direction (no page is wrongly all-visible)."""
    def explain(ff: ForkFile, kind: str, block: int, local: bytes, served: bytes) -> str | None:
        img = images.get((f"{ff.spc}/{ff.db}/{ff.rel}", ff.fork, block))
        if img is None or img.hole_length == 0:
            return None
        hole = range(img.hole_offset, img.hole_offset + img.hole_length)
        ml, ms = masked(local, kind, block), masked(served, kind, block)
        diff = [i for i in range(PAGE_SIZE) if ml[i] != ms[i]]
        if not all(i in hole and served[i] == 0 for i in diff):
            return None
        return (f"bytes {diff[0]}..{diff[-1]} differ, all inside the hole [{img.hole_offset}, "
                f"{img.hole_offset + img.hole_length}) of the last WAL image (ending {format_lsn(img.end_lsn)}): "
                f"PostgreSQL's redo restores zeros there, and the pageserver has zeros")
    return explain


def flip(path: Path, offset: int, n: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


# Layer file format (pageserver/src/layer/layer_file/format.rs, version 2; docs/pageserver-storage.md).
KEY_SIZE = 18
LAYER_HEADER_SIZE = 8 + 4 + 4 + 2 * KEY_SIZE + 8 + 8 + 4
LAYER_FOOTER_SIZE = 8 + 8 + 4 + 4 + 8
LAYER_ENTRY_SIZE = KEY_SIZE + 8 + 8 + 4 + 4 + 2
LAYER_BLOCK_REF_SIZE = 8 + 4 + 4
LAYER_ENTRIES_PER_BLOCK = 128
REL_SIZE_BLOCK = 0xFFFFFFFF  # the block field of a relation-size key


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
    """The index of a delta layer file: (end of the values, entries)."""
    data = path.read_bytes()
    assert data[:8] == b"STRDELTA" and data[-8:] == b"STRDLEND", path
    assert struct.unpack_from("<I", data, 8)[0] == 2, path
    table, count = struct.unpack_from("<QQ", data, len(data) - LAYER_FOOTER_SIZE)
    nblocks = -(-count // LAYER_ENTRIES_PER_BLOCK)
    assert table + nblocks * LAYER_BLOCK_REF_SIZE == len(data) - LAYER_FOOTER_SIZE
    raw = b""
    values_end = None
    for b in range(nblocks):
        offset, length, crc = struct.unpack_from("<QII", data, table + b * LAYER_BLOCK_REF_SIZE)
        values_end = offset if values_end is None else values_end
        stored = data[offset:offset + length]
        assert crc32c.crc32c(stored) == crc
        raw += zstandard.ZstdDecompressor().decompress(stored)
    assert len(raw) == count * LAYER_ENTRY_SIZE
    entries = []
    for i in range(count):
        e = i * LAYER_ENTRY_SIZE
        kind, f1, f2, f3, f4, f5 = struct.unpack_from(">BIIIBI", raw, e)
        lsn, offset, length = struct.unpack_from("<QQI", raw, e + KEY_SIZE)
        entries.append(LayerEntry(kind, f1, f2, f3, f4, f5, lsn, offset, length))
    return values_end if values_end is not None else table, entries


def layer_files(ps: PageserverApi) -> list[Path]:
    """The timeline's layer files, oldest first (by end LSN)."""
    files = list(ps.timeline_dir.glob("*.delta"))
    return sorted(files, key=lambda p: int(p.name.split("__")[1].split("-")[1].removesuffix(".delta"), 16))


# ---------------------------------------------------------------- 1. exactness

def test_pages_equal_compute_data_files(cluster, strata_bin):
    """Every block of every relation fork in a running compute's data
    directory, after a broad workload and a CHECKPOINT, equals the
    pageserver's page at that LSN (masked as PostgreSQL masks WAL-check
    images); sizes agree; and an older LSN still serves the older pages."""
    ps = PageserverApi(cluster)
    # The compute starts at the end of the timeline's WAL: its pg_wal begins
    # with a checkpoint record there, followed by all the WAL it writes.
    start = parse_lsn(ps.status()["last_record_lsn"])
    ep = start_endpoint(cluster)
    # Nothing in the background that would change pages while files are
    # read; template0's catalog readable (page kinds of its relations).
    quiet_compute(ep)
    with ep.connect() as conn:
        # A first state of three tables, kept at L1: one will grow, one
        # shrink (VACUUM truncates it), one be dropped.
        for t in HISTORY_TABLES:
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
            _copy_select(conn, t, "SELECT i, repeat('a', 150) FROM generate_series(1, 3000) i")
        conn.execute("UPDATE hist_t SET v = 'first' WHERE id % 10 = 0")
        hist = {t: conn.execute("SELECT pg_relation_filepath(%s)", (t,)).fetchone()[0]
                for name in HISTORY_TABLES for t in (name, f"{name}_pkey")}
        wait_quiet(ep)
        conn.execute("CHECKPOINT")
        l1 = current_lsn(conn)
        hist_at_l1 = {t: (ep.pgdata / p).read_bytes() for t, p in hist.items()}
    assert len(hist_at_l1["hist_t"]) >= 60 * PAGE_SIZE

    # The broad workload (every index access method, TOAST, sequences,
    # VACUUM / VACUUM FULL / CLUSTER / TRUNCATE, unlogged tables, both CREATE
    # DATABASE strategies, two-phase commit, large objects, subtransactions,
    # multixacts, visibility-map changes), then more changes.
    t0 = time.monotonic()
    run_broad_workload(ep)
    with ep.connect() as conn:
        # Later versions of the tables kept at L1: new tuples, deletions,
        # growth; the tail deleted and truncated away; a drop.
        conn.execute("UPDATE hist_t SET v = 'second' WHERE id % 3 = 0")
        conn.execute("DELETE FROM hist_t WHERE id % 7 = 0")
        conn.execute("INSERT INTO hist_t SELECT i, 'third' FROM generate_series(3001, 4000) i")
        conn.execute("VACUUM hist_t")
        conn.execute("DELETE FROM shrink_t WHERE id > 1200")
        conn.execute("VACUUM shrink_t")
        conn.execute("DROP TABLE drop_t")
    workload_s = time.monotonic() - t0

    # Quiescent compute: catalogs first (reading them may set hint bits), then
    # the checkpoint whose LSN the pages are compared at.
    wait_quiet(ep)
    dbs, rels = catalog(ep)
    assert {"postgres", "template0", "template1", "db_wal_log"} <= set(dbs), dbs
    l2, st = checkpoint_compute(ep, ps)
    assert st["state"] == "active", st

    t0 = time.monotonic()
    images = last_wal_images(strata_bin, ep.pgdata / "pg_wal", start, l2)
    # Over the HTTP `/page` API, one request per page (compared with the
    # page service below).
    cmp = compare_data_dir(ps, ep, rels, l2, keep=True, explain=wal_hole_explanation(images), via="http")
    compare_s = time.monotonic() - t0
    lsn_after = ep.wal_lsn()
    report = {**cmp.summary(), "equal_blocks_with_a_different_pd_lsn": cmp.lsn_differs,
              "wal_after_comparison": format_lsn(lsn_after),
              "workload_seconds": round(workload_s, 1), "comparison_seconds": round(compare_s, 1)}
    print("\npage exactness at L2:", json.dumps(report, indent=1))
    for e in cmp.explained[:3]:
        print(f"  differs as PostgreSQL's WAL says: {e['relation']} block {e['block']}: {e['why']}")
    if len(cmp.explained) > 3:
        print(f"  ... and {len(cmp.explained) - 3} more: " + ", ".join(e["relation"] for e in cmp.explained[3:]))
    assert not cmp.mismatches, mismatch_report(report, cmp.mismatches)
    assert not cmp.size_mismatches, json.dumps(cmp.size_mismatches[:20], indent=1)
    assert cmp.blocks_compared == cmp.blocks_equal + len(cmp.explained)
    # Even pd_lsn (masked above) agrees: the pageserver stamps each image with
    # its record's end LSN, as PostgreSQL does. The exceptions are init forks
    # that PostgreSQL writes to disk before logging them (btbuildempty:
    # smgrwrite, then log_newpage), whose file keeps LSN 0/0.
    assert all(where.endswith("_init)") and file_lsn == "0/0" for where, _, file_lsn, _ in cmp.lsn_differs), \
        cmp.lsn_differs
    # Only visibility-map pages of the database copied with STRATEGY = WAL_LOG
    # differ that way (see wal_hole_explanation).
    assert {(e["kind"], e["relation"].split(".")[0]) for e in cmp.explained} <= {("vm", "db_wal_log")}, cmp.explained
    assert cmp.blocks_compared > 4000, report
    for kind in ("heap", "btree", "hash", "gin", "gist", "spgist", "brin", "vm"):
        assert cmp.by_kind[kind] > 0, f"no {kind} page compared: {report}"
    # Init forks of the unlogged table's indexes were compared too.
    assert any(r.persistence == "u" and r.relkind == "i" for r in rels.values())

    # No relation fork the data directory lacks: each database's size on the
    # pageserver is what its files add up to (free space maps as the
    # pageserver has them, unlogged main and vm forks not at all).
    expected: Counter = Counter()
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
        for ff in relation_forks(ep.pgdata):
            info = rels.get((ff.spc, ff.db, ff.rel))
            if info is None or (info.persistence == "u" and ff.fork != "init"):
                continue
            blocks = len(read_fork(ff.path)) // PAGE_SIZE
            if ff.fork == "fsm":
                r = c.request(pp.rel_size_frame(1, l2, ff.spc, ff.db, ff.rel, FORK_NUMBER["fsm"]))
                blocks = r.blocks if isinstance(r, pp.Size) else 0
                assert isinstance(r, pp.Size) or r.code == pp.ERR_NOT_FOUND, r
            expected[(ff.spc, ff.db)] += blocks * PAGE_SIZE
        for (spc, db), size in sorted(expected.items()):
            r = c.request(pp.db_size_frame(2, l2, spc, db))
            assert isinstance(r, pp.DbSize) and r.bytes == size, (spc, db, r, size)

    # The same pages over the page service, pipelined 100 deep: byte for byte.
    keys = sorted(cmp.fetched)
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
        for i in range(0, len(keys), 100):
            chunk = keys[i:i + 100]
            frames = [pp.get_page_frame(i + j + 1, l2, *page_address(k)) for j, k in enumerate(chunk)]
            for j, (k, resp) in enumerate(zip(chunk, c.pipelined(frames))):
                assert isinstance(resp, pp.Page) and resp.id == i + j + 1, (k, getattr(resp, "message", resp.id))
                assert resp.page == cmp.fetched[k], f"page service and HTTP differ for {k}"

    # The older LSN: the tables as they were at L1, while L2 has their new
    # versions, their shorter size, or no relation at all.
    db_oid = dbs["postgres"]
    older = Comparison(l1)
    newer = Comparison(l2)
    changed = Counter()
    for t, path in hist.items():
        rel = int(Path(path).name)
        ff = ForkFile(DEFAULT_SPC, db_oid, rel, "main", ep.pgdata / path)
        kind = "btree" if t.endswith("_pkey") else "heap"
        then = hist_at_l1[t]
        compare_fork(ps, ff, then, kind, l1, older, f"{t} at L1", keep=True)
        if t.startswith("drop_t"):
            code, body = ps.page(DEFAULT_SPC, db_oid, rel, "main", 0, l2)
            assert code == 404 and "does not exist" in error_message(body), (t, code, body)
            continue
        assert rels[(DEFAULT_SPC, db_oid, rel)].kind == kind
        now = read_fork(ep.pgdata / path)
        compare_fork(ps, ff, now, kind, l2, newer, f"{t} at L2", keep=True)
        for b in range(min(len(then), len(now)) // PAGE_SIZE):
            key = (DEFAULT_SPC, db_oid, rel, "main", b)
            changed[t] += masked(older.fetched[key], kind, b) != masked(newer.fetched[key], kind, b)
        if t == "hist_t":
            assert len(now) > len(then), "hist_t grew after L1"
        if t == "shrink_t":
            assert len(now) < len(then) // 2, "VACUUM truncated shrink_t"
    print("older LSN:", json.dumps({"L1": older.summary(), "L2": newer.summary(),
                                    "blocks_changed_since_L1": dict(changed)}))
    for c in (older, newer):
        assert not c.mismatches and not c.size_mismatches, json.dumps(c.mismatches[:10] + c.size_mismatches, indent=1)
    assert older.blocks_compared == older.blocks_equal > 3 * 60
    # Most pages of hist_t changed after L1, so L1 really served older versions.
    assert changed["hist_t"] > 50, changed


def page_address(k: tuple) -> tuple[int, int, int, int, int]:
    spc, db, rel, fork, block = k
    return spc, db, rel, FORK_NUMBER[fork], block


# ------------------------------------------------------- the masks themselves

def test_masking_is_sensitive():
    """The masks hide exactly what PostgreSQL may change without WAL, nothing
    more: checked on real pages (formats/tests/data/page)."""
    data = Path(__file__).resolve().parent.parent / "formats" / "tests" / "data" / "page"
    heap = (data / "heap_blk1.page").read_bytes()
    btree = (data / "btree_blk1.page").read_bytes()

    def changed(page: bytes, offset: int, value: bytes) -> bytes:
        return page[:offset] + value + page[offset + len(value):]

    lower = struct.unpack_from("<H", heap, 12)[0]
    first_lp = struct.unpack_from("<I", heap, 24)[0]
    tup = first_lp & 0x7FFF
    tup_len = (first_lp >> 17) & 0x7FFF
    assert (first_lp >> 15) & 3 == 1 and tup_len > 24
    infomask = struct.unpack_from("<H", heap, tup + 20)[0]
    assert infomask & 0x0300 != 0x0300, "xmin not frozen: every visibility bit is a hint"
    # Masked away: pd_lsn, checksum, pd_prune_xid, PD_ALL_VISIBLE, unused space,
    # commit hint bits, the command id.
    for offset, value in [(0, b"\x12\x34\x56\x78"), (8, b"\xAA\xBB"), (20, b"\x07\x00\x00\x00"),
                          (10, struct.pack("<H", 0x4)), (lower + 8, b"\xFF" * 8),
                          (tup + 20, struct.pack("<H", (infomask | 0x0100 | 0x0800) & ~0x0300 | 0x0100)),
                          (tup + 8, b"\x05\x00\x00\x00")]:
        assert masked(changed(heap, offset, value), "heap", 1) == masked(heap, "heap", 1), offset
    # Not masked: tuple data, xmin, the line pointer, pd_lower, the tuple's length.
    for offset, value in [(tup + tup_len - 1, bytes([heap[tup + tup_len - 1] ^ 1])), (tup, b"\x01\x02"),
                          (24, struct.pack("<I", first_lp ^ (1 << 17))), (12, struct.pack("<H", lower + 4))]:
        assert masked(changed(heap, offset, value), "heap", 1) != masked(heap, "heap", 1), offset
    # B-tree leaf: LP_DEAD and the garbage flag are hints, a key byte is not.
    lp = struct.unpack_from("<I", btree, 24)[0]
    dead = changed(btree, 24, struct.pack("<I", lp | (3 << 15)))
    special = struct.unpack_from("<H", btree, 16)[0]
    flags = struct.unpack_from("<H", btree, special + 12)[0]
    assert flags & 1, "a leaf page"
    garbage = changed(dead, special + 12, struct.pack("<H", flags | 0x40))
    assert masked(garbage, "btree") == masked(btree, "btree")
    key_at = lp & 0x7FFF
    assert masked(changed(btree, key_at + 8, bytes([btree[key_at + 8] ^ 0xFF])), "btree") != masked(btree, "btree")
    # A visibility-map page keeps its bitmap.
    vm = bytes(12) + struct.pack("<HHHH", 24, 8192, 8192, 0x2004) + bytes(4) + b"\x03" + bytes(8192 - 25)
    assert masked(vm, "vm") != masked(vm[:24] + bytes(8168), "vm")


# ------------------------------------------------------- 2. corrupted layers

def test_corrupted_layer_files(cluster):
    """A damaged value fails only the reads that need it, with an error naming
    the layer file; a damaged header makes the timeline broken. The process
    survives both, and never panics."""
    ps = PageserverApi(cluster)
    ep = start_endpoint(cluster)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE corrupt_t (id int, v text)")
        _copy_select(conn, "corrupt_t", "SELECT i, repeat(md5(i::text), 6) FROM generate_series(1, 3000) i")
        db = conn.execute("SELECT oid::int FROM pg_database WHERE datname = current_database()").fetchone()[0]
        rel = conn.execute("SELECT pg_relation_filenode('corrupt_t')::bigint").fetchone()[0]
        nblocks = conn.execute("SELECT pg_relation_size('corrupt_t') / 8192").fetchone()[0]
    assert nblocks >= 50
    # The compute's last WAL reaches the safekeepers; the pageserver takes all of it.
    cluster.endpoint_stop("ep")
    wait_caught_up(cluster, ps)
    before = {}
    for b in range(nblocks):
        code, page = ps.page(DEFAULT_SPC, db, rel, "main", b, None)
        assert code == 200, (b, page)
        before[b] = page
    st = ps.checkpoint()
    assert st["disk_consistent_lsn"] == st["last_record_lsn"] and st["delta_layers"] >= 2, st

    cluster.stop("--only", "pageserver")
    newest = layer_files(ps)[-1]
    index_offset, entries = layer_index(newest)
    # Values start right after the 72-byte header (delta.rs HEADER_SIZE; the
    # field table of docs/pageserver-storage.md adds up to 72 as well).
    assert min(e.offset for e in entries) == LAYER_HEADER_SIZE == 72
    # The newest version of one block of the table, in the middle of the value region.
    versions = [e for e in entries if (e.kind, e.spc, e.db, e.rel, e.fork) == (0, DEFAULT_SPC, db, rel, 0)
                and e.block != REL_SIZE_BLOCK]
    newest_of = {}
    for e in versions:  # entries are in (key, LSN) order
        newest_of[e.block] = e
    assert len(newest_of) == nblocks, f"{newest.name} holds {len(newest_of)} of {nblocks} blocks"
    victim = sorted(newest_of.values(), key=lambda e: abs(e.offset - index_offset // 2))[0]
    assert LAYER_HEADER_SIZE <= victim.offset and victim.offset + victim.length <= index_offset and victim.length >= 8
    flip(newest, victim.offset + victim.length // 2, 4)
    cluster.start("--only", "pageserver")
    pid = cluster.pid("pageserver")

    failed = {}
    for b in range(nblocks):
        code, body = ps.page(DEFAULT_SPC, db, rel, "main", b, None)
        if code == 200:
            assert body == before[b], f"block {b} changed"
        else:
            failed[b] = (code, error_message(body))
    assert list(failed) == [victim.block], failed
    code, msg = failed[victim.block]
    assert code == 500 and str(newest) in msg and "CRC mismatch" in msg, msg
    # Over the page service: a Corrupt error for that request only.
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
        resps = c.pipelined([pp.get_page_frame(1, 0, DEFAULT_SPC, db, rel, 0, victim.block),
                             pp.get_page_frame(2, 0, DEFAULT_SPC, db, rel, 0, (victim.block + 1) % nblocks)])
        assert isinstance(resps[0], pp.Error) and resps[0].id == 1 and resps[0].code == pp.ERR_CORRUPT, resps[0]
        assert str(newest) in resps[0].message
        assert isinstance(resps[1], pp.Page) and resps[1].page == before[(victim.block + 1) % nblocks]
    # Still failing the same way, still alive, no panic.
    code, body = ps.page(DEFAULT_SPC, db, rel, "main", victim.block, None)
    assert code == 500 and str(newest) in error_message(body)
    assert pid_alive(pid) and cluster.pid("pageserver") == pid
    assert ps.status()["state"] == "active"
    assert "panicked" not in cluster.log("pageserver")

    # A damaged header: the timeline cannot be loaded, and says why.
    cluster.stop("--only", "pageserver")
    damaged = layer_files(ps)[0]
    flip(damaged, 20, 2)  # inside the key range, covered by the header CRC
    # The pageserver starts; `strata start` reports the broken timeline and fails.
    res = cluster.run("start", "--only", "pageserver", check=False)
    assert res.returncode == 1 and "pageserver: started" in res.stdout, res
    assert "is broken" in res.stderr and str(damaged) in res.stderr, res.stderr
    pid = cluster.pid("pageserver")
    st = ps.status()
    assert st["state"] == "broken" and str(damaged) in st["error"] and "header CRC mismatch" in st["error"], st
    code, body = ps.page(DEFAULT_SPC, db, rel, "main", 0, None)
    msg = error_message(body)
    assert code == 500 and "broken" in msg and str(damaged) in msg, (code, msg)
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
        # (The error code is checked in test_broken_timeline_error_code_over_page_service.)
        r = c.request(pp.get_page_frame(7, 0, DEFAULT_SPC, db, rel, 0, 0))
        assert isinstance(r, pp.Error) and r.id == 7 and "broken" in r.message and str(damaged) in r.message, r
        # The connection stays usable (every request gets the same answer).
        r = c.request(pp.rel_size_frame(8, 0, DEFAULT_SPC, db, rel, 0))
        assert isinstance(r, pp.Error) and r.id == 8 and str(damaged) in r.message, r
    # A compute refuses to start on it, with the reason.
    with pytest.raises(StrataCommandFailed) as e:
        cluster.endpoint_start("ep")
    assert "broken" in e.value.stderr and damaged.name in e.value.stderr, e.value.stderr[-3000:]
    assert pid_alive(pid) and cluster.pid("pageserver") == pid
    assert cluster.service("pageserver")["state"] == "running"
    assert "panicked" not in cluster.log("pageserver")


def test_broken_timeline_error_code_over_page_service(cluster):
    """docs/pageserver-protocol.md: `Corrupt` is "stored data failed a check";
    `LsnTimeout` is only for an LSN not ingested in time (a client may retry
    that). A timeline broken by a damaged layer file must answer Corrupt, as
    the HTTP API answers 500 and not 504."""
    ps = PageserverApi(cluster)
    cluster.stop("--only", "pageserver")
    [layer] = layer_files(ps)  # the import of the tenant's initdb
    flip(layer, 20, 2)
    assert cluster.run("start", "--only", "pageserver", check=False).returncode == 1
    assert ps.status()["state"] == "broken"
    code, body = ps.page(DEFAULT_SPC, 5, 1259, "main", 0, None)
    assert code == 500 and str(layer) in error_message(body)
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
        r = c.pipelined([pp.get_page_frame(1, 0, DEFAULT_SPC, 5, 1259, 0, 0),
                         pp.rel_size_frame(2, 0, DEFAULT_SPC, 5, 1259, 0)])
    assert all(isinstance(x, pp.Error) and str(layer) in x.message for x in r), r
    assert [x.code_name for x in r] == ["Corrupt", "Corrupt"], r


# ------------------------------------------------------- 3. bad requests

def test_bad_requests(cluster_factory):
    """Unknown tenants and timelines, LSNs that never arrive, malformed
    frames: each gets the error the protocol specifies, and the pageserver
    keeps serving everyone else."""
    c = cluster_factory(start=False)
    text = c.service_config_path("pageserver").read_text()
    assert re.search(r"^wait_lsn_timeout = ", text, re.M), text
    c.configure("pageserver", {"wait_lsn_timeout": 2.0})
    c.start()
    ps = PageserverApi(c)
    ep = start_endpoint(c)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
        db = conn.execute("SELECT oid::int FROM pg_database WHERE datname = current_database()").fetchone()[0]
        rel = conn.execute("SELECT pg_relation_filenode('t')::bigint").fetchone()[0]
        lsn = current_lsn(conn)
    ps.wait_lsn(lsn)
    good = pp.get_page_frame(1, lsn, DEFAULT_SPC, db, rel, 0, 0)
    code, page0 = ps.page(DEFAULT_SPC, db, rel, "main", 0, lsn)
    assert code == 200

    # HTTP: unknown tenant, unknown timeline, malformed ids and addresses.
    other = uuid.uuid4().hex
    for tenant, timeline in [(other, ps.timeline), (ps.tenant, other)]:
        for path in ["", "/page?rel=1663/5/1259&block=0"]:
            code, body = ps.request("GET", ps.tl_path(tenant, timeline) + path)
            assert code == 404 and f"{tenant}/{timeline}" in error_message(body), (code, body)
    code, body = ps.request("GET", ps.tl_path("nothex", ps.timeline))
    assert code == 400, (code, body)
    for q in ["rel=1663/5&block=0", "rel=1663/5/1259&fork=9&block=0", "rel=1663/5/1259", "rel=a/b/c&block=0"]:
        code, body = ps.request("GET", ps.tl_path() + "/page?" + q)
        assert code == 400 and error_message(body), (q, code, body)
    code, body = ps.page(DEFAULT_SPC, db, rel + 100000, "main", 0, lsn)
    assert code == 404 and str(rel + 100000) in error_message(body), (code, body)

    # HTTP: an LSN far beyond the end of the WAL times out, naming the LSN.
    future = lsn + (1 << 36)
    t0 = time.monotonic()
    code, body = ps.page(DEFAULT_SPC, db, rel, "main", 0, future)
    waited = time.monotonic() - t0
    assert code == 504 and format_lsn(future) in error_message(body), (code, body)
    assert 1.5 <= waited < 25, waited  # the configured 2 s, not the default 30 s

    # Page service: an unknown timeline, a tenant not attached here (the
    # client asks the storage controller where it is), an unsupported version.
    with pp.PageClient(ps.pg_address) as cl:
        r = cl.hello(ps.tenant, other)
        assert isinstance(r, pp.Error) and r.id == 0 and r.code == pp.ERR_NOT_FOUND, r
        assert other in r.message and ps.tenant in r.message, r
        assert cl.closed_by_server()
    with pp.PageClient(ps.pg_address) as cl:
        r = cl.hello(other, ps.timeline)
        assert isinstance(r, pp.Error) and r.id == 0 and r.code == pp.ERR_NOT_ATTACHED, r
        assert other in r.message and "not attached" in r.message, r
        assert cl.closed_by_server()
    with pp.PageClient(ps.pg_address) as cl:
        r = cl.hello(ps.tenant, ps.timeline, version=4)
        assert isinstance(r, pp.Error) and r.id == 0 and r.code == pp.ERR_VERSION and "4" in r.message, r
        assert cl.closed_by_server()

    # Page service: a future LSN is an error for that request only.
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as cl:
        t0 = time.monotonic()
        r = cl.request(pp.get_page_frame(5, future, DEFAULT_SPC, db, rel, 0, 0))
        assert isinstance(r, pp.Error) and r.id == 5 and r.code == pp.ERR_LSN_TIMEOUT, r
        assert format_lsn(future) in r.message and 1.5 <= time.monotonic() - t0 < 25, r
        r = cl.request(good)
        assert isinstance(r, pp.Page) and r.id == 1 and r.page == page0, r
        # Beyond the end of the relation, and a relation that does not exist: NotFound, connection open.
        r = cl.request(pp.get_page_frame(6, lsn, DEFAULT_SPC, db, rel, 0, 100000))
        assert isinstance(r, pp.Error) and r.code == pp.ERR_NOT_FOUND and "100000" in r.message, r
        r = cl.request(pp.rel_size_frame(7, lsn, DEFAULT_SPC, db, rel + 100000, 0))
        assert isinstance(r, pp.Error) and r.code == pp.ERR_NOT_FOUND and str(rel + 100000) in r.message, r
        # An LSN before the timeline's start, and a database that does not exist: NotFound naming them.
        r = cl.request(pp.get_page_frame(10, 1, DEFAULT_SPC, db, rel, 0, 0))
        assert isinstance(r, pp.Error) and r.code == pp.ERR_NOT_FOUND and "before the start" in r.message, r
        r = cl.request(pp.db_size_frame(11, lsn, DEFAULT_SPC, 999999))
        assert isinstance(r, pp.Error) and r.code == pp.ERR_NOT_FOUND and "999999" in r.message, r
        r = cl.request(good)
        assert isinstance(r, pp.Page) and r.page == page0

    # Malformed or out-of-order frames: Error(id 0, Protocol), then the server closes.
    payload = good[5:]
    malformed = {
        "zero length": struct.pack("<I", 0),
        "length beyond 1 MiB (no body sent)": struct.pack("<I", pp.MAX_FRAME_SIZE + 1),
        "unknown tag": pp.frame(0x55, payload),
        "server tag": pp.frame(pp.TAG_PAGE, payload),
        "request id 0": pp.get_page_frame(0, lsn, DEFAULT_SPC, db, rel, 0, 0),
        "fork 7": pp.get_page_frame(8, lsn, DEFAULT_SPC, db, rel, 7, 0),
        "SLRU kind 9": pp.slru_segment_frame(9, 0, 9, 0),
        "trailing byte": pp.frame(pp.TAG_GET_PAGE, payload + b"\x00"),
        "short payload": pp.frame(pp.TAG_GET_PAGE, payload[:20]),
        "second Hello": pp.hello_frame(ps.tenant, ps.timeline),
    }
    for what, data in malformed.items():
        with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as cl:
            cl.send(data)
            r = cl.read_message()
            assert isinstance(r, pp.Error) and r.id == 0 and r.code == pp.ERR_PROTOCOL and r.message, (what, r)
            assert cl.closed_by_server(), what
    with pp.PageClient(ps.pg_address) as cl:  # a request before the Hello
        cl.send(good)
        r = cl.read_message()
        assert isinstance(r, pp.Error) and r.id == 0 and r.code == pp.ERR_PROTOCOL and "Hello" in r.message, r
        assert cl.closed_by_server()
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as cl:
        # Requests before the bad frame are answered first, in order.
        cl.send(good + pp.get_page_frame(2, lsn, DEFAULT_SPC, db, rel, 0, 0) + struct.pack("<I", 0))
        r1, r2, r3 = cl.read_message(), cl.read_message(), cl.read_message()
        assert isinstance(r1, pp.Page) and r1.id == 1 and isinstance(r2, pp.Page) and r2.id == 2, (r1, r2)
        assert isinstance(r3, pp.Error) and r3.id == 0 and r3.code == pp.ERR_PROTOCOL, r3
        assert cl.closed_by_server()

    # Everyone else is still served; the process is the same one and did not panic.
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as cl:
        assert [m.page for m in cl.pipelined([good] * 3)] == [page0] * 3
    assert ps.page(DEFAULT_SPC, db, rel, "main", 0, lsn) == (200, page0)
    assert ep.sql("SELECT count(*) FROM t") == [(1000,)]
    assert c.service("pageserver")["state"] == "running"
    assert "panicked" not in c.log("pageserver")


# ------------------------------------------------ 4. page service vs HTTP

def test_getpage_pipelined_matches_http(cluster):
    """GetPage over the page service returns the bytes HTTP /page returns;
    50 requests sent before reading any answer come back in order with their
    ids, errors in their place; RelSize, RelExists and DbSize agree too."""
    ps = PageserverApi(cluster)
    ep = start_endpoint(cluster)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE pipe_t (id int PRIMARY KEY, v text)")
        _copy_select(conn, "pipe_t", "SELECT i, repeat(md5(i::text), 4) FROM generate_series(1, 8000) i")
        # A visibility map with bits set (WAL-logged). VACUUM sets none while
        # another snapshot (e.g. autovacuum's) still sees the load as in
        # progress, so repeat it until it has.
        def vacuumed_all_visible() -> bool:
            conn.execute("VACUUM pipe_t")
            return conn.execute("SELECT relallvisible FROM pg_class WHERE relname = 'pipe_t'").fetchone()[0] > 0

        wait_until("VACUUM to mark a page of pipe_t all-visible", vacuumed_all_visible, timeout=60, interval=0.5,
                   retry=())
        db = conn.execute("SELECT oid::int FROM pg_database WHERE datname = current_database()").fetchone()[0]
        rels = dict(conn.execute("SELECT relname::text, pg_relation_filenode(oid)::bigint FROM pg_class "
                                 "WHERE relname IN ('pipe_t', 'pipe_t_pkey', 'pg_class')").fetchall())
        sizes = {name: conn.execute("SELECT pg_relation_size(%s) / 8192", (name,)).fetchone()[0] for name in rels}
        vm_blocks = conn.execute("SELECT pg_relation_size('pipe_t', 'vm') / 8192").fetchone()[0]
        lsn = current_lsn(conn)
    ps.wait_lsn(lsn)
    assert sizes["pipe_t"] > 100 and vm_blocks == 1

    # 50 requests over three relations, a vm page, and two that must fail, in one write.
    requests = []
    for i in range(47):
        name = ["pipe_t", "pipe_t_pkey", "pg_class"][i % 3]
        requests.append((name, "main", (i * 7) % sizes[name]))
    requests.insert(10, ("pipe_t", "vm", 0))
    requests.insert(20, ("pipe_t", "main", sizes["pipe_t"] + 5))  # beyond the end
    requests.insert(30, ("pipe_t_pkey", "init", 0))  # a fork it does not have
    assert len(requests) == 50
    def http_pages(at: int | None) -> list[tuple[int, bytes]]:
        return [ps.page(DEFAULT_SPC, db, rels[name], fork, block, at) for name, fork, block in requests]

    def check_pipelined(cl: pp.PageClient, at: int, expected: list[tuple[int, bytes]]) -> None:
        frames = [pp.get_page_frame(1000 + i, at, DEFAULT_SPC, db, rels[name], FORK_NUMBER[fork], block)
                  for i, (name, fork, block) in enumerate(requests)]
        responses = cl.pipelined(frames)
        for i, (resp, (code, body), req) in enumerate(zip(responses, expected, requests)):
            assert resp.id == 1000 + i, (i, resp)
            if code == 200:
                assert isinstance(resp, pp.Page) and resp.page == body, (req, resp.id)
            else:
                assert code == 404 and isinstance(resp, pp.Error) and resp.code == pp.ERR_NOT_FOUND, (req, resp)
                assert error_message(body) == resp.message, (req, body, resp)

    expected = http_pages(lsn)
    assert [code for code, _ in expected].count(200) == 48, [
        (req, code, body[:300]) for req, (code, body) in zip(requests, expected) if code != 200]
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as cl:
        check_pipelined(cl, lsn, expected)

        # Sizes and existence.
        frames = [pp.rel_size_frame(1, lsn, DEFAULT_SPC, db, rels["pipe_t"], 0),
                  pp.rel_size_frame(2, lsn, DEFAULT_SPC, db, rels["pipe_t"], 2),
                  pp.rel_exists_frame(3, lsn, DEFAULT_SPC, db, rels["pipe_t"], 2),
                  pp.rel_exists_frame(4, lsn, DEFAULT_SPC, db, rels["pipe_t"], 3),
                  pp.rel_size_frame(5, lsn, DEFAULT_SPC, db, rels["pipe_t_pkey"], 0),
                  pp.db_size_frame(6, lsn, DEFAULT_SPC, db)]
        r = cl.pipelined(frames)
        assert [x.id for x in r] == [1, 2, 3, 4, 5, 6], r
        assert r[0] == pp.Size(1, sizes["pipe_t"]) and r[1] == pp.Size(2, 1), r
        assert r[2] == pp.Exists(3, True) and r[3] == pp.Exists(4, False), r
        assert r[4] == pp.Size(5, sizes["pipe_t_pkey"]), r
        assert isinstance(r[5], pp.DbSize) and r[5].bytes >= (sizes["pipe_t"] + sizes["pipe_t_pkey"]) * PAGE_SIZE, r

        # Every page of the table and its index, 128 in flight (the protocol's limit).
        addrs = [(rels[name], b) for name in ("pipe_t", "pipe_t_pkey") for b in range(sizes[name])]
        got = {}
        for start in range(0, len(addrs), 128):
            chunk = addrs[start:start + 128]
            resp = cl.pipelined([pp.get_page_frame(start + j + 1, lsn, DEFAULT_SPC, db, r_, 0, b)
                                 for j, (r_, b) in enumerate(chunk)])
            for j, (a, m) in enumerate(zip(chunk, resp)):
                assert isinstance(m, pp.Page) and m.id == start + j + 1, (a, m)
                got[a] = m.page
    for (r_, b), page in list(got.items())[::25]:
        assert ps.page(DEFAULT_SPC, db, r_, "main", b, lsn) == (200, page)
    assert len(got) == sizes["pipe_t"] + sizes["pipe_t_pkey"]

    # LSN 0, "the latest ingested": with the compute stopped, the latest is
    # stable, and the pages equal HTTP's at the latest LSN.
    cluster.endpoint_stop("ep")
    wait_caught_up(cluster, ps)
    latest = http_pages(None)
    with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as cl:
        check_pipelined(cl, 0, latest)


def test_checkpoint_records_are_found_where_postgres_wrote_them(cluster):
    """The pageserver names the last checkpoint record at or before an LSN
    (where a hot standby starts, docs/replicas.md): exactly the record and
    redo point PostgreSQL's own pg_control names after a CHECKPOINT; an LSN
    before the record's end gives an earlier one (or none); a branch made
    after it inherits it; a malformed LSN is a 400."""
    ep = start_endpoint(cluster)
    path = cluster.timeline_path()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE cpr_t (i int)")
        conn.execute("INSERT INTO cpr_t SELECT generate_series(1, 5000)")
        conn.execute("CHECKPOINT")
        cp, redo = (parse_lsn(v) for v in conn.execute(
            "SELECT checkpoint_lsn::text, redo_lsn::text FROM pg_control_checkpoint()").fetchone())
        conn.execute("INSERT INTO cpr_t VALUES (0)")
        end = current_lsn(conn)
    assert redo < cp < end
    wait_for_pageserver_lsn(cluster, end)

    code, body = cluster.http("pageserver", "GET", f"{path}/checkpoint_record")
    assert code == 200, body
    assert (parse_lsn(body["lsn"]), parse_lsn(body["redo"])) == (cp, redo), (body, format_lsn(cp), format_lsn(redo))
    assert body["shutdown"] is False and body["pg_timeline"] == 1, body
    record_end = parse_lsn(body["end_lsn"])
    assert cp < record_end <= end, body

    # Visible from the record's end on, not before.
    code, at_end = cluster.http("pageserver", "GET", f"{path}/checkpoint_record?lsn={format_lsn(record_end)}")
    assert code == 200 and at_end == body, at_end
    code, before = cluster.http("pageserver", "GET", f"{path}/checkpoint_record?lsn={format_lsn(cp)}")
    assert code in (200, 404), before
    if code == 200:
        assert parse_lsn(before["end_lsn"]) <= cp and parse_lsn(before["lsn"]) < cp, before
    else:
        assert "no checkpoint record" in before["error"], before

    # A branch made after the record inherits it from its parent.
    cluster.run("branch", "create", "cpr_branch", "--from", "main")
    code, branched = cluster.http("pageserver", "GET", f"{cluster.timeline_path('cpr_branch')}/checkpoint_record")
    assert code == 200 and parse_lsn(branched["lsn"]) == cp, branched

    code, bad = cluster.http("pageserver", "GET", f"{path}/checkpoint_record?lsn=nonsense")
    assert code == 400, bad
