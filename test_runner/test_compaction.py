"""Compaction and image creation under a real workload, through the CLI's
cluster: the pageserver runs with 1 MiB in-memory layers and low
thresholds, so pgbench makes many L0 deltas that the background compactor
merges into L1 runs and covers with images while the compute writes. Every
page of the compute's data directory then equals the pageserver's at the
compute's checkpoint (PostgreSQL's masking rules), before and after a
forced compaction; an older LSN still serves the older pages; pgbench's
invariants hold; and a read at the newest LSN visits few layers."""

from __future__ import annotations

import json
import threading
import time

from fixtures.checks import assert_pgbench_invariants, pgbench_state
from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.page_compare import (assert_same_pages, catalog, checkpoint_compute, compare_data_dir, quiet_cluster,
                                   wait_quiet)
from fixtures.page_mask import masked
from fixtures.pageserver_api import SMALL_LAYERS, PageserverApi, error_message
from fixtures.strata import format_lsn, parse_lsn

SCALE = 4
# pgbench runs in rounds of PGBENCH_ROUND seconds until compaction has
# shown itself, for at most PGBENCH_SECONDS.
PGBENCH_ROUND = 3
PGBENCH_SECONDS = 27


def assert_heap_served_as_it_was(ps, db_oid: int, rel: int, file: bytes, lsn: int, step: int) -> None:
    """Every `step`-th block of a heap's main fork, as its file held it at
    `lsn`, is what the pageserver serves at `lsn`: equal after PostgreSQL's
    masking (hint bits set later)."""
    for block in range(0, len(file) // 8192, step):
        code, served = ps.page(1663, db_oid, rel, "main", block, lsn)
        assert code == 200, (block, served)
        assert masked(served, "heap", block) == masked(file[block * 8192:(block + 1) * 8192], "heap", block), \
            f"relation {rel} block {block} at {format_lsn(lsn)}"


def test_compaction_under_pgbench_keeps_pages_exact(cluster_factory):
    cluster, ps, ep = quiet_cluster(cluster_factory, SMALL_LAYERS)
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    with ep.connect() as conn:
        conn.execute("CHECKPOINT")
        early = current_lsn(conn)
        accounts = conn.execute("SELECT pg_relation_filepath('pgbench_accounts')").fetchone()[0]
    early_accounts = (ep.pgdata / accounts).read_bytes()

    # While pgbench runs, watch the layers the compactor keeps in check.
    seen = {"l0": 0, "images": 0, "samples": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            st = ps.status()
            seen["l0"] = max(seen["l0"], st["l0_layers"])
            seen["images"] = max(seen["images"], st["image_layers"])
            seen["samples"] += 1
            time.sleep(0.2)

    def shown(m: dict, compactions_before: float) -> bool:
        """Whether the load has shown what is asserted below, with two
        compactions while pgbench ran."""
        return (m["strata_pageserver_compactions_total"] >= compactions_before + 2
                and m["strata_pageserver_image_layers_created_total"] >= 1
                and seen["samples"] > 10 and seen["images"] >= 1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # pgbench in rounds, until the compactor has shown what is asserted.
        compactions_before = cluster.metrics("pageserver")["strata_pageserver_compactions_total"]
        ran = 0
        while ran < PGBENCH_SECONDS:
            ep.run(["pgbench", "-n", "-c", "4", "-T", str(PGBENCH_ROUND)], timeout=300)
            ran += PGBENCH_ROUND
            if shown(cluster.metrics("pageserver"), compactions_before):
                break
    finally:
        stop.set()
        watcher.join()
    metrics = cluster.metrics("pageserver")
    print(f"\npgbench ran {ran} s")
    print("layers while pgbench ran:", seen, {k: v for k, v in metrics.items() if "compaction" in k or "image" in k})
    assert metrics["strata_pageserver_compactions_total"] >= 2, metrics
    assert metrics["strata_pageserver_image_layers_created_total"] >= 1, metrics
    assert metrics["strata_pageserver_compaction_errors_total"] == 0
    assert seen["samples"] > 10 and seen["images"] >= 1, seen

    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), SCALE)
    wait_quiet(ep)
    dbs, rels = catalog(ep)
    lsn, st = checkpoint_compute(ep, ps)
    assert st["state"] == "active", st
    cmp = compare_data_dir(ps, ep, rels, lsn, keep=True)
    print("pages after background compaction:", json.dumps(cmp.summary()))
    assert not cmp.mismatches and not cmp.size_mismatches, json.dumps(cmp.mismatches[:5] + cmp.size_mismatches[:5])
    assert cmp.blocks_compared > 1000 and cmp.by_kind["heap"] > 0 and cmp.by_kind["btree"] > 0, cmp.summary()

    # Everything compacted and imaged now: the same bytes from the new layers.
    st = ps.checkpoint("compact=true", timeout=600)
    print("after a forced compaction:", {k: st[k] for k in ("l0_layers", "l1_layers", "image_layers", "layer_bytes")},
          st["compaction"])
    assert st["l0_layers"] == 0 and st["image_layers"] >= 1, st
    assert_same_pages(ps, cmp, lsn, "changed with compaction")

    # The early LSN still serves the pages of that time (from L1 deltas below the images).
    db_oid = dbs["postgres"]
    rel = int(accounts.rsplit("/", 1)[1])
    assert_heap_served_as_it_was(ps, db_oid, rel, early_accounts, early, 37)

    # A read at the newest LSN stops at the first image: few layers, however long the history.
    before = cluster.metrics("pageserver")
    code, _ = ps.page(1663, db_oid, rel, "main", 1, lsn)
    after = cluster.metrics("pageserver")
    visited = after["strata_pageserver_read_layers_visited_sum"] - before["strata_pageserver_read_layers_visited_sum"]
    reads = after["strata_pageserver_read_layers_visited_count"] - before["strata_pageserver_read_layers_visited_count"]
    assert code == 200 and reads >= 1
    assert visited / reads <= 3, (visited, reads)


def test_bulk_load_pages_skip_compaction_and_stay_exact(cluster_factory):
    """A bulk load (an insert into a new table, then its index) initializes
    its pages in the flush that writes them: those go to fresh-page deltas,
    which compaction keeps instead of reading and writing them again. An
    update of some of them afterwards, and one inside the load's window,
    make compaction merge the deltas that share their keys. Every page of
    the compute then equals the pageserver's, after a forced compaction
    too, and the load's LSN still serves the pages of that time."""
    settings = dict(SMALL_LAYERS, checkpoint_distance=4 << 20, compaction_threshold=4,
                    fresh_page_min_bytes=256 << 10)
    cluster, ps, ep = quiet_cluster(cluster_factory, settings)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE bulk (id int, pad text)")
        for part in range(4):
            conn.execute("INSERT INTO bulk SELECT g, repeat(md5(g::text), 6) FROM generate_series(%s, %s) g",
                         (part * 50_000 + 1, (part + 1) * 50_000))
            if part == 1:
                # Inside the load: pages loaded a flush or two ago change again.
                conn.execute("UPDATE bulk SET pad = 'changed' WHERE id % 5000 = 0")
        conn.execute("CREATE INDEX bulk_id ON bulk (id)")
        conn.execute("CHECKPOINT")
        early = current_lsn(conn)
        path = conn.execute("SELECT pg_relation_filepath('bulk')").fetchone()[0]
    early_bulk = (ep.pgdata / path).read_bytes()
    wait_quiet(ep)
    lsn, st = checkpoint_compute(ep, ps)
    st = ps.checkpoint("compact=true", timeout=600)
    m = cluster.metrics("pageserver")
    flushed = m["strata_pageserver_layer_bytes_written_total"]
    fresh = m["strata_pageserver_fresh_bytes_written_total"]
    read = m["strata_pageserver_compaction_bytes_read_total"]
    print(f"\nflushed {flushed / 1e6:.1f} MB, of it fresh-page deltas {fresh / 1e6:.1f} MB; "
          f"compaction read {read / 1e6:.1f} MB; layers {st['l0_layers']}/{st['l1_layers']}/{st['image_layers']}")
    assert m["strata_pageserver_compaction_errors_total"] == 0
    # Most of what the load flushed was its own new pages, and compaction
    # did not read them again (it used to read every flushed byte).
    assert fresh >= 0.5 * flushed, (fresh, flushed)
    assert read <= flushed - 0.5 * fresh, (read, flushed, fresh)

    # Today's pages (the compute ran no query since the checkpoint).
    _, rels = catalog(ep)
    cmp = compare_data_dir(ps, ep, rels, lsn, keep=True)
    print("pages:", json.dumps(cmp.summary()))
    assert not cmp.mismatches and not cmp.size_mismatches, json.dumps(cmp.mismatches[:5] + cmp.size_mismatches[:5])
    assert cmp.by_kind["heap"] > 1000 and cmp.by_kind["btree"] > 100, cmp.summary()

    # An update of pages kept as fresh-page deltas, then everything
    # compacted and imaged: the same pages, and the load's LSN still serves
    # the table as it was then.
    ep.sql("UPDATE bulk SET pad = 'later' WHERE id % 3000 = 1")
    wait_quiet(ep)
    lsn, st = checkpoint_compute(ep, ps)
    st = ps.checkpoint("compact=true", timeout=600)
    assert st["l0_layers"] == 0, st
    _, rels = catalog(ep)
    cmp = compare_data_dir(ps, ep, rels, lsn)
    assert not cmp.mismatches and not cmp.size_mismatches, json.dumps(cmp.mismatches[:5] + cmp.size_mismatches[:5])
    db_oid = ep.sql("SELECT oid::int FROM pg_database WHERE datname = 'postgres'")[0][0]
    assert_heap_served_as_it_was(ps, db_oid, int(path.rsplit("/", 1)[1]), early_bulk, early, 23)
    assert ep.sql("SELECT count(*), count(*) FILTER (WHERE pad = 'changed'), "
                  "count(*) FILTER (WHERE pad = 'later') FROM bulk") == [(200_000, 20, 67)]


def test_gc_keeps_the_pitr_window_exact_and_refuses_below(cluster_factory):
    """With a PITR window of 2 s and no byte horizon, GC after pgbench
    moves the cutoff to the newest commit older than 2 s, removes the
    layers the image below it covers, refuses reads below it with an
    error naming it, and keeps every page at the compute's checkpoint
    exact; the cutoff survives a pageserver restart."""
    cluster, ps, ep = quiet_cluster(cluster_factory,
                                    {**SMALL_LAYERS, "pitr_interval": 2.0, "gc_horizon": 0, "gc_period": 3600.0})
    ep.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    with ep.connect() as conn:
        early = current_lsn(conn)
        accounts = conn.execute("SELECT pg_relation_filepath('pgbench_accounts')").fetchone()[0]
        db_oid = conn.execute("SELECT oid::int FROM pg_database WHERE datname = 'postgres'").fetchone()[0]
    rel = int(accounts.rsplit("/", 1)[1])
    ps.wait_lsn(early)
    code, _ = ps.page(1663, db_oid, rel, "main", 0, early)
    assert code == 200
    ep.run(["pgbench", "-n", "-c", "2", "-T", "8"], timeout=300)
    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), 2)
    wait_quiet(ep)
    dbs, rels = catalog(ep)
    lsn, _ = checkpoint_compute(ep, ps)
    before = ps.status()
    time.sleep(2.5)  # the checkpoint's own commit leaves the window too
    st = ps.checkpoint("compact=true&gc=true", timeout=600)
    gc = st["gc"]
    print("\ngc:", gc, "layer bytes", before["layer_bytes"], "->", st["layer_bytes"])
    cutoff = parse_lsn(gc["cutoff"])
    # Commits after the checkpoint (its own, the txid taken with it) may be outside the window too.
    assert early < cutoff <= parse_lsn(st["disk_consistent_lsn"]), gc
    now = max(lsn, cutoff)
    assert gc["layers_removed"] > 0 and st["layer_bytes"] < before["layer_bytes"], (gc, st["layer_bytes"])
    assert st["gc_cutoff_lsn"] == gc["cutoff"]

    code, body = ps.page(1663, db_oid, rel, "main", 0, early)
    assert code == 410, (code, body)
    message = error_message(body)
    assert "below the GC cutoff" in message and gc["cutoff"] in message, message
    # The compute is quiet: its files are the pages at any LSN from its checkpoint on.
    cmp = compare_data_dir(ps, ep, rels, now, keep=True)
    assert not cmp.mismatches and not cmp.size_mismatches, json.dumps(cmp.mismatches[:5] + cmp.size_mismatches[:5])
    assert cmp.blocks_compared > 500, cmp.summary()

    ep.stop()
    cluster.stop("--only", "pageserver")
    cluster.start("--only", "pageserver")
    ps = PageserverApi(cluster)
    # Kept, and never lowered (the compactor's own GC may have raised it since).
    assert parse_lsn(ps.status()["gc_cutoff_lsn"]) >= cutoff
    code, body = ps.page(1663, db_oid, rel, "main", 0, early)
    assert code == 410, (code, body)
    code, served = ps.page(1663, db_oid, rel, "main", 0, None)
    assert code == 200 and served == cmp.fetched[(1663, db_oid, rel, "main", 0)]


def test_timeline_checkpoint_cli(cluster):
    """`strata timeline checkpoint` flushes, compacts and writes images,
    and prints the LSN now durable; an unknown branch is an error."""
    ep = start_endpoint(cluster)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS id, repeat('x', 200) AS v FROM generate_series(1, 20000) g")
        lsn = current_lsn(conn)
    ps = PageserverApi(cluster)
    ps.wait_lsn(lsn)
    out = cluster.run("timeline", "checkpoint").stdout.strip()
    durable = parse_lsn(out)
    st = ps.status()
    assert durable >= lsn and st["disk_consistent_lsn"] == out, (out, st)
    assert st["l0_layers"] == 0 and st["image_layers"] >= 1, st
    with ep.connect() as conn:
        assert conn.execute("SELECT count(*), sum(length(v)) FROM t").fetchone() == (20000, 4_000_000)
    # `strata status` shows the layers and the GC cutoff of each timeline.
    shown = cluster.run("status").stdout
    assert f"layers(L0/L1/image)=0/{st['l1_layers']}/{st['image_layers']}" in shown, shown
    assert "gc_cutoff=0/0" in shown, shown
    bad = cluster.run("timeline", "checkpoint", "--branch", "nope", check=False)
    assert bad.returncode == 1 and 'no branch named "nope"' in bad.stderr, bad
