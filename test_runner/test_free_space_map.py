"""Free space maps reach the pageserver (docs/free-space-maps.md).

PostgreSQL never WAL-logs a free space map. A compute's agent sends the map
pages PostgreSQL wrote as logical messages, and the pageserver serves them:
the next compute on the branch reuses the space VACUUM freed instead of
extending every table. Any user can emit a message with the agent's prefix,
so the pageserver checks each page and skips what does not hold."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import zstandard

from fixtures import page_protocol as pp
from fixtures.endpoint import Endpoint
from fixtures.pageserver_api import PageserverApi
from fixtures.versions import MAJORS
from fixtures.wait import wait_until

ROWS = 20000
PAGE = 8192
DEFAULT_SPC = 1663


def freespace(ep, table: str) -> list[tuple[int, int]]:
    """The map's free space of every block of `table` (`pg_freespacemap`)."""
    return [tuple(r) for r in ep.sql(f"SELECT blkno, avail FROM pg_freespace('{table}') ORDER BY blkno")]


def size(ep, table: str) -> int:
    return ep.sql(f"SELECT pg_relation_size('{table}')")[0][0]


def holes(ep, table: str) -> list[tuple[int, int]]:
    """A table of `ROWS` rows, every other one deleted and vacuumed: its
    map, with half of each page free."""
    ep.sql("CREATE EXTENSION IF NOT EXISTS pg_freespacemap")
    ep.sql(f"CREATE TABLE {table} (id int, pad text) WITH (autovacuum_enabled = off)")
    ep.sql(f"INSERT INTO {table} SELECT g, repeat('x', 200) FROM generate_series(1, {ROWS}) g")
    ep.sql(f"DELETE FROM {table} WHERE id % 2 = 0")
    ep.sql(f"VACUUM {table}")
    fsm = freespace(ep, table)
    assert sum(avail for _, avail in fsm) > (1 << 20), fsm[:5]
    return fsm


@pytest.mark.parametrize("major", MAJORS)
def test_space_vacuum_freed_is_reused_after_a_restart(cluster_factory, major):
    """A stop sends the maps (a checkpoint first): the next compute sees the
    same map to the byte and fills the holes instead of growing the table."""
    cluster = cluster_factory(init_args=("--pg-version", str(major)))
    ep = Endpoint(cluster, "ep", pg_bin_dir=f"/usr/lib/postgresql/{major}/bin")
    ep.start()
    before = holes(ep, "t")
    grown_to = size(ep, "t")
    ep.stop()
    stored = cluster.metrics("pageserver")["strata_pageserver_fsm_pages_stored_total"]
    assert stored >= 3, stored

    ep.start()
    assert freespace(ep, "t") == before
    ep.sql(f"INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, {ROWS // 2 - 500}) g")
    assert size(ep, "t") == grown_to, "the rows went into the space VACUUM freed"
    assert ep.sql("SELECT count(*) FROM t")[0][0] == ROWS - 500
    assert cluster.metrics("pageserver")["strata_pageserver_fsm_pages_refused_total"] == 0


def test_a_running_compute_sends_its_maps_without_being_stopped(cluster):
    """The agent's periodic pass: after a checkpoint writes the map, its
    pages reach the pageserver while the compute runs, so a compute killed
    with SIGKILL (no stop, no last pass) leaves them behind."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    before = holes(ep, "t")
    grown_to = size(ep, "t")
    filenode, db = ep.sql("SELECT pg_relation_filenode('t'), oid FROM pg_database WHERE datname = 'postgres'")[0]
    ep.sql("CHECKPOINT")

    def map_blocks_stored() -> int:
        ps = PageserverApi(cluster)
        try:
            with pp.connect(ps.pg_address, ps.tenant, ps.timeline) as c:
                r = c.request(pp.rel_size_frame(1, 0, DEFAULT_SPC, db, filenode, 1))
                return r.blocks if isinstance(r, pp.Size) else 0
        finally:
            ps.close()

    # One pass every 15 s; a file written within 2 s is read again at the
    # next. The map's three pages (root, inner, leaf) go in one message.
    wait_until("t's map on the pageserver", lambda: map_blocks_stored() >= 3, timeout=60, interval=1)
    _, _, postmaster = ep.kill9_compute()
    ep.stop()
    # Reaped, not only exited: a zombie still looks like a running server.
    wait_until("the postmaster reaped", lambda: not Path(f"/proc/{postmaster}").exists(), timeout=60, retry=())
    ep.start()
    assert freespace(ep, "t") == before
    ep.sql(f"INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, {ROWS // 2 - 500}) g")
    assert size(ep, "t") == grown_to


def map_page(lsn: int = 0, node: int = 0) -> bytes:
    """A free space map page as PostgreSQL initializes one, every node of
    its tree set to `node` (255: the whole block free)."""
    header = struct.pack("<IIHHHHHHI", lsn >> 32, lsn & 0xFFFFFFFF, 0, 0, 24, PAGE, PAGE, PAGE | 4, 0)
    return header + struct.pack("<i", 0) + bytes([node]) * (PAGE - 28)


def payload(entries, version: int = 1, count: int | None = None, magic: bytes = b"SFSM") -> bytes:
    """A message body as docs/free-space-maps.md specifies (version 1)."""
    body = b"".join(struct.pack("<IIII", DEFAULT_SPC, db, rel, block) + page for db, rel, block, page in entries)
    n = len(entries) if count is None else count
    return magic + bytes([version]) + struct.pack("<H", n) + zstandard.ZstdCompressor().compress(body)


def test_forged_messages_are_skipped_and_ingest_goes_on(cluster):
    """A role without privileges emits messages with the agent's prefix:
    malformed payloads, a page of no relation, a page past what the
    relation's map can have and one from the future are each skipped and
    counted; a transactional message is ignored. Ingest goes on. A forged
    page that looks right is stored, and is what every map is, a hint:
    PostgreSQL checks each block it names, so rows still go where they fit
    and the table stays whole."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE EXTENSION pg_freespacemap")
    ep.sql("CREATE ROLE mallory NOLOGIN")
    ep.sql("CREATE TABLE small (id int PRIMARY KEY, pad text)")
    ep.sql("INSERT INTO small VALUES (1, 'x')")
    filenode, db = ep.sql("SELECT pg_relation_filenode('small'), oid FROM pg_database WHERE datname = 'postgres'")[0]
    future = ep.wal_lsn() + (1 << 30)
    refused_before = cluster.metrics("pageserver").get("strata_pageserver_fsm_pages_refused_total", 0)

    forged = [
        payload([(db, filenode, 0, map_page())], magic=b"XFSM"),
        payload([(db, filenode, 0, map_page())], version=2),
        payload([(db, filenode, 0, map_page())], count=2),
        payload([(db, 999999, 0, map_page())]),  # no such relation
        payload([(db, filenode, 3, map_page())]),  # a 1-block heap's map has 3 blocks
        payload([(db, filenode, 2, map_page(lsn=future))]),
    ]
    with ep.connect() as conn:
        conn.execute("SET ROLE mallory")
        for body in forged:
            conn.execute("SELECT pg_logical_emit_message(false, 'strata.fsm', %s)", (body,))
        with conn.transaction():
            # Transactional: never the agent's, whatever it carries.
            conn.execute("SELECT pg_logical_emit_message(true, 'strata.fsm', %s)",
                         (payload([(db, filenode, b, map_page(node=77)) for b in range(3)]),))
        # Pages that hold together: the whole table free, says the map.
        conn.execute("SELECT pg_logical_emit_message(false, 'strata.fsm', %s)",
                     (payload([(db, filenode, b, map_page(node=255)) for b in range(3)]),))
    ep.sql("INSERT INTO small VALUES (2, 'y')")
    ep.restart()

    refused = cluster.metrics("pageserver")["strata_pageserver_fsm_pages_refused_total"] - refused_before
    assert refused == 6, refused
    # The forged map is what the new compute reads (not the transactional one's 77s)...
    assert ep.sql("SELECT avail FROM pg_freespace('small') WHERE blkno = 0")[0][0] == 8160
    # ...and PostgreSQL checks what it names: rows go where they fit, the
    # table and its index hold together.
    ep.sql("INSERT INTO small SELECT g, repeat('z', 100) FROM generate_series(3, 3000) g")
    assert ep.sql("SELECT count(*), count(DISTINCT id) FROM small") == [(3000, 3000)]
    ep.sql("CREATE EXTENSION IF NOT EXISTS amcheck")
    ep.sql("SELECT bt_index_check('small_pkey', true)")
    assert ep.sql("SELECT count(*) FROM verify_heapam('small')")[0][0] == 0
