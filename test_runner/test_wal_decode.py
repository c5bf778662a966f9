"""`strata wal dump` must decode real PostgreSQL WAL exactly like that
major's own pg_waldump.

For every combination of wal_consistency_checking (off / all) and
wal_compression (off / pglz / lz4 / zstd) on 15, and two of them on every
other major the suite runs (fixtures/versions.py), a fresh cluster runs a
broad workload and is shut down cleanly; then the record streams of
``pg_waldump -b`` and ``strata wal dump --json`` are compared record by
record, including every block reference and full-page image.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from dataclasses import asdict

import pytest

from fixtures.strata import parse_lsn
from fixtures.versions import DEFAULT_MAJOR, MAJORS
from fixtures.waldump import WalRecord, format_lsn, run_waldump
from fixtures.workload import broad_settings, run_broad_workload

BLCKSZ = 8192
INDEX_RMGRS = ("Btree", "Hash", "Gin", "Gist", "SPGist", "BRIN")
# Resource managers with a page-masking function: wal_consistency_checking=all
# covers exactly these, so all their block references then carry an image.
CHECKED_RMGRS = ("Heap2", "Heap", "Btree", "Hash", "Gin", "Gist", "Sequence", "SPGist", "BRIN", "Generic")

CONFIGS = [
    pytest.param(DEFAULT_MAJOR, consistency, compression,
                 id=f"pg{DEFAULT_MAJOR}-checking_{consistency or 'off'}-compression_{compression}")
    for consistency in ("", "all")
    for compression in ("off", "pglz", "lz4", "zstd")
] + [
    pytest.param(major, consistency, compression, id=f"pg{major}-checking_{consistency or 'off'}-compression_{compression}")
    for major in MAJORS if major != DEFAULT_MAJOR
    for consistency, compression in (("", "off"), ("all", "zstd"))
]


def _pg_view(r: WalRecord) -> dict:
    return {
        "lsn": format_lsn(r.lsn),
        "prev": format_lsn(r.prev),
        "xid": r.xid,
        "rmgr": r.rmgr,
        "info": r.info,
        "rec_len": r.rec_len,
        "tot_len": r.tot_len,
        "blocks": [
            {k: v for k, v in asdict(b).items() if k != "compression_saved"} for b in r.blocks
        ],
    }


def _strata_view(j: dict) -> dict:
    return {
        "lsn": format_lsn(parse_lsn(j["lsn"])),
        "prev": format_lsn(parse_lsn(j["prev"])),
        "xid": j["xid"],
        "rmgr": j["rmgr"],
        "info": j["info"],
        "rec_len": j["rec_len"],
        "tot_len": j["total_len"],
        "blocks": [
            {
                "id": b["id"],
                "rel": b["rel"],
                "fork": b["fork"],
                "blk": b["blk"],
                "image": b["image"],
                "apply": b["apply"],
                "hole_offset": b.get("hole_offset"),
                "hole_length": b.get("hole_length"),
                "compression": b.get("compression"),
            }
            for b in j["blocks"]
        ],
    }


def _describe_difference(i: int, pg: WalRecord, pg_view: dict, st_raw: dict, st_view: dict) -> str:
    fields = [k for k in pg_view if k != "blocks" and pg_view[k] != st_view[k]]
    lines = [f"record #{i} differs (pg_waldump lsn {format_lsn(pg.lsn)}, strata lsn {st_raw.get('lsn')}):"]
    for k in fields:
        lines.append(f"  {k}: pg_waldump={pg_view[k]!r} strata={st_view[k]!r}")
    if pg_view["blocks"] != st_view["blocks"]:
        pb, sb = pg_view["blocks"], st_view["blocks"]
        if len(pb) != len(sb):
            lines.append(f"  number of block references: pg_waldump={len(pb)} strata={len(sb)}")
        for n in range(max(len(pb), len(sb))):
            a = pb[n] if n < len(pb) else None
            b = sb[n] if n < len(sb) else None
            if a != b:
                lines.append(f"  block {n}: pg_waldump={a}\n  {' ' * len(f'block {n}:')}strata=    {b}")
    lines.append(f"  pg_waldump: rmgr {pg.rmgr} desc: {pg.desc}")
    lines.append(f"  strata:     {json.dumps(st_raw)}")
    return "\n".join(lines)


def run_strata_dump(strata_bin, waldir, timeout=300):
    res = subprocess.run([str(strata_bin), "wal", "dump", "--json", str(waldir)], capture_output=True,
                         text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    lines = res.stdout.splitlines()
    assert lines, f"strata printed nothing (exit {res.returncode}); stderr:\n{res.stderr}"
    try:
        objs = [json.loads(line) for line in lines]
    except json.JSONDecodeError as e:
        raise AssertionError(f"strata printed invalid JSON ({e}); stderr:\n{res.stderr}") from None
    return res, objs[:-1], objs[-1]


def test_waldump_parser():
    """The pg_waldump -b parser on output in PostgreSQL 15's exact formats."""
    from fixtures.waldump import END_AT_PAGE_RE, END_RE, parse_waldump, segment_start_lsn

    text = (
        "rmgr: Heap2       len (rec/tot):     64/  8256, tx:        735, lsn: 0/0153D2A8, prev 0/0153D270, "
        "desc: VISIBLE cutoff xid 734 flags 0x03\n"
        "\tblkref #0: rel 1663/5/16390 fork vm blk 0 (FPW); hole: offset: 40, length: 8008, "
        "compression saved: 12, method: zstd\n"
        "\tblkref #1: rel 1663/5/16390 fork main blk 12 (FPW for WAL verification); hole: offset: 264, length: 32\n"
        "\tblkref #2: rel 1663/5/16391 fork init blk 4294967294\n"
        "rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 1/00000028, prev 0/FFFFFFC8, "
        "desc: CHECKPOINT_SHUTDOWN redo 1/28; tli 1; prev tli 1; fpw true\n"
        "rmgr: ReplicationOrigin len (rec/tot):     30/    30, tx: 4294967295, lsn: 1/00000A00, prev 1/00000028, "
        "desc: UNKNOWN (f0) \n"
    )
    recs = parse_waldump(text)
    assert [(r.rmgr, r.info) for r in recs] == [
        ("Heap2", "VISIBLE"), ("XLOG", "CHECKPOINT_SHUTDOWN"), ("ReplicationOrigin", "UNKNOWN (f0)")]
    r = recs[0]
    assert (r.lsn, r.prev, r.xid, r.rec_len, r.tot_len) == (0x153D2A8, 0x153D270, 735, 64, 8256)
    assert [asdict(b) for b in r.blocks] == [
        dict(id=0, rel="1663/5/16390", fork="vm", blk=0, image=True, apply=True, hole_offset=40,
             hole_length=8008, compression="zstd", compression_saved=12),
        dict(id=1, rel="1663/5/16390", fork="main", blk=12, image=True, apply=False, hole_offset=264,
             hole_length=32, compression="none", compression_saved=None),
        dict(id=2, rel="1663/5/16391", fork="init", blk=4294967294, image=False, apply=False,
             hole_offset=None, hole_length=None, compression=None, compression_saved=None),
    ]
    assert (recs[1].lsn, recs[1].prev, recs[1].blocks) == ((1 << 32) | 0x28, 0xFFFFFFC8, [])
    assert recs[2].xid == 4294967295
    with pytest.raises(ValueError, match="line 2"):
        parse_waldump("rmgr: XLOG        len (rec/tot):     30/    30, tx:          0, lsn: 0/01000028, "
                      "prev 0/00000000, desc: NEXTOID 1\nsomething else\n")

    end = END_RE.search("pg_waldump: error: error in WAL record at 0/1F3A2B8: invalid record length at "
                        "0/1F3A330: wanted 24, got 0")
    assert end and parse_lsn(end["end"]) == 0x1F3A330
    assert END_RE.search("pg_waldump: error: error in WAL record at 0/1F3A2B8: invalid record length at "
                         "0/1F3A330: wanted 24, got 17") is None
    end = END_RE.search("pg_waldump: error: error in WAL record at 0/2EFD860: invalid record length at "
                        "0/2EFD8D8: expected at least 24, got 0")
    assert end and parse_lsn(end["end"]) == 0x2EFD8D8
    page = END_AT_PAGE_RE.search("pg_waldump: error: error in WAL record at 0/3FFFF80: invalid magic number "
                                 "0000 in log segment 000000010000000000000003, offset 16769024")
    assert page and page["segment"] == "000000010000000000000003" and page["offset"] == "16769024"
    assert segment_start_lsn(page["segment"], 16 << 20) + int(page["offset"]) == 0x3FFE000
    assert segment_start_lsn("0000000100000002000000FF", 16 << 20) == (2 << 32) | 0xFF000000


def _relfilenode(cluster, dbname, query) -> str:
    (rel,) = cluster.sql(query, dbname=dbname)[0]
    return rel


@pytest.mark.parametrize("major,consistency,compression", CONFIGS)
def test_strata_wal_dump_matches_pg_waldump(pg_cluster_factory, strata_bin, major, consistency, compression):
    cluster = pg_cluster_factory(major=major)
    pg_bin_dir = cluster.bin_dir
    cluster.initdb(["--data-checksums"])
    cluster.start(broad_settings(consistency, compression))
    # WAL written by initdb predates these settings.
    workload_start = cluster.wal_lsn("pg_current_wal_insert_lsn")
    run_broad_workload(cluster)
    # Relations whose WAL we look for afterwards: "spc/db/relfilenode".
    rel_query = ("SELECT concat_ws('/', CASE WHEN reltablespace = 0 THEN "
                 "(SELECT dattablespace FROM pg_database WHERE datname = current_database()) "
                 "ELSE reltablespace END, (SELECT oid FROM pg_database WHERE datname = current_database()), "
                 "pg_relation_filenode(oid)) FROM pg_class WHERE oid = {}")
    toast_rel = _relfilenode(cluster, "postgres", rel_query.format(
        "(SELECT reltoastrelid FROM pg_class WHERE relname = 'toast_t')"))
    lo_rel = _relfilenode(cluster, "postgres", rel_query.format("'pg_largeobject'::regclass"))
    unlogged_rel = _relfilenode(cluster, "postgres", rel_query.format("'unlogged_t'::regclass"))
    unlogged_idx = _relfilenode(cluster, "postgres", rel_query.format("'unlogged_t_pkey'::regclass"))
    cluster.stop()
    assert "database system is shut down" in cluster.log_text()

    dump = run_waldump(pg_bin_dir / "pg_waldump", cluster.waldir)
    assert dump.end_lsn is not None, (
        f"pg_waldump did not stop at an invalid record length (exit {dump.returncode}):\n{dump.stderr}")
    pg_records = dump.records
    assert len(pg_records) > 1000, f"only {len(pg_records)} records from pg_waldump:\n{dump.stderr}"

    res, st_records, summary = run_strata_dump(strata_bin, cluster.waldir)

    # Record by record: same records, same order, same headers and block references.
    for i, (pg, st) in enumerate(zip(pg_records, st_records)):
        pv, sv = _pg_view(pg), _strata_view(st)
        if pv != sv:
            pytest.fail(_describe_difference(i, pg, pv, st, sv), pytrace=False)
    if res.returncode != 0 or "error" in summary:
        at = len(st_records)
        pg_next = _pg_view(pg_records[at]) if at < len(pg_records) else "(end of pg_waldump's records)"
        pytest.fail(f"strata wal dump exited {res.returncode} after {at} matching records; last line: "
                    f"{summary}\npg_waldump's record #{at}: {pg_next}\nstderr:\n{res.stderr}", pytrace=False)
    if len(pg_records) != len(st_records):
        n = min(len(pg_records), len(st_records))
        extra = pg_records[n] if len(pg_records) > n else st_records[n]
        pytest.fail(f"pg_waldump printed {len(pg_records)} records, strata {len(st_records)}; "
                    f"first unmatched: {extra}", pytrace=False)

    assert summary.get("records") == len(st_records) == len(pg_records), summary
    assert parse_lsn(summary["end_of_wal"]) == dump.end_lsn, (
        f"strata end_of_wal {summary['end_of_wal']}, pg_waldump stopped at {format_lsn(dump.end_lsn)}: "
        f"{dump.stderr.strip()}")
    # The WAL ends with the shutdown checkpoint, and the end of WAL follows it.
    assert pg_records[-1].rmgr == "XLOG" and pg_records[-1].info == "CHECKPOINT_SHUTDOWN", pg_records[-1]
    assert pg_records[-1].lsn < parse_lsn(st_records[-1]["end_lsn"]) <= dump.end_lsn

    # Every full-page image restores to a whole page.
    bad_images = [(st["lsn"], b) for st in st_records for b in st["blocks"]
                  if b["image"] and b.get("image_len") != BLCKSZ]
    assert not bad_images, f"{len(bad_images)} images not restored to {BLCKSZ} bytes, first: {bad_images[0]}"
    no_image = [(st["lsn"], b) for st in st_records for b in st["blocks"]
                if not b["image"] and any(k in b for k in ("image_len", "compression", "hole_offset"))]
    assert not no_image, f"image fields on blocks without an image, first: {no_image[0]}"

    assert pg_records[0].lsn < workload_start < pg_records[-1].lsn
    assert any(r.rmgr == "CLOG" for r in pg_records)  # from initdb
    workload_records = [r for r in pg_records if r.lsn >= workload_start]
    _check_coverage(major, workload_records, consistency, compression, toast_rel, lo_rel, unlogged_rel, unlogged_idx)


def _heap2_prune_kinds(major: int) -> list[tuple[str, str]]:
    """17 merged heap2's prune, vacuum and freeze records into three kinds of
    one record, and added XLOG's CHECKPOINT_REDO."""
    if major >= 17:
        return [("Heap2", "PRUNE_ON_ACCESS"), ("Heap2", "PRUNE_VACUUM_SCAN"), ("Heap2", "PRUNE_VACUUM_CLEANUP"),
                ("XLOG", "CHECKPOINT_REDO")]
    return [("Heap2", "FREEZE_PAGE"), ("Heap2", "PRUNE"), ("Heap2", "VACUUM")]


def _check_coverage(major, records, consistency, compression, toast_rel, lo_rel, unlogged_rel, unlogged_idx):
    """The workload really produced the WAL this test is meant to exercise
    (``records``: those written since the server started with the test's
    settings)."""
    kinds = Counter((r.rmgr, r.info) for r in records)
    rmgrs = {r.rmgr for r in records}
    missing_rmgrs = {"XLOG", "Transaction", "Storage", "Database", "Standby", "Heap2", "Heap",
                     "Btree", "Hash", "Gin", "Gist", "Sequence", "SPGist", "BRIN", "MultiXact",
                     "RelMap"} - rmgrs
    assert not missing_rmgrs, f"no records of {sorted(missing_rmgrs)}"
    expected_kinds = [
        ("Database", "CREATE_FILE_COPY"), ("Database", "CREATE_WAL_LOG"), ("Database", "DROP"),
        ("Transaction", "PREPARE"), ("Transaction", "COMMIT_PREPARED"), ("Transaction", "ABORT_PREPARED"),
        ("Transaction", "ASSIGNMENT"), ("Transaction", "ABORT"),
        ("MultiXact", "CREATE_ID"), ("MultiXact", "ZERO_MEM_PAGE"),
        ("Storage", "CREATE"), ("Storage", "TRUNCATE"),
        ("Heap2", "VISIBLE"), *_heap2_prune_kinds(major), ("Heap2", "MULTI_INSERT+INIT"),
        ("Heap", "INSERT"), ("Heap", "INSERT+INIT"), ("Heap", "UPDATE"), ("Heap", "HOT_UPDATE"),
        ("Heap", "DELETE"), ("Heap", "LOCK"), ("Heap", "INPLACE"),
        ("Sequence", "LOG"),
        ("XLOG", "FPI"), ("XLOG", "FPI_FOR_HINT"), ("XLOG", "CHECKPOINT_ONLINE"), ("XLOG", "NEXTOID"),
        ("Btree", "INSERT_LEAF"), ("Btree", "SPLIT_R"), ("Btree", "VACUUM"),
        ("Hash", "INSERT"), ("Hash", "SPLIT_ALLOCATE_PAGE"), ("Hash", "INIT_META_PAGE"),
        ("Gin", "INSERT"), ("Gin", "UPDATE_META_PAGE"), ("Gin", "INSERT_LISTPAGE"),
        ("Gin", "DELETE_LISTPAGE"), ("Gin", "VACUUM_DATA_LEAF_PAGE"),
        ("Gist", "PAGE_UPDATE"), ("Gist", "PAGE_SPLIT"),
        ("SPGist", "ADD_LEAF"), ("SPGist", "VACUUM_LEAF"),
        ("BRIN", "INSERT"), ("BRIN", "SAMEPAGE_UPDATE"), ("BRIN", "REVMAP_EXTEND"),
    ]
    missing = [k for k in expected_kinds if kinds[k] == 0]
    assert not missing, f"workload produced no {missing}"

    blocks = [(r, b) for r in records for b in r.blocks]
    forks = {b.fork for _, b in blocks}
    assert {"main", "vm", "init"} <= forks, forks
    # Unlogged relations: only their init forks are WAL-logged (the heap's is
    # empty: just created; the index's holds its metapage).
    unlogged_path = "base/" + unlogged_rel.split("/", 1)[1]  # default tablespace
    assert any(r.rmgr == "Storage" and r.info == "CREATE" and f"{unlogged_path}_init" in r.desc
               for r in records), f"no creation of {unlogged_path}_init"
    assert any(b.rel == unlogged_idx and b.fork == "init" for _, b in blocks), "no init fork of the unlogged index"
    assert not any(b.rel in (unlogged_rel, unlogged_idx) and b.fork == "main" for _, b in blocks), (
        "the main fork of an unlogged relation was WAL-logged")
    assert any(r.rmgr == "Heap" and b.rel == toast_rel for r, b in blocks), "no heap records on the TOAST table"
    assert any(r.rmgr == "Heap" and b.rel == lo_rel for r, b in blocks), "no heap records on pg_largeobject"
    dbs = {b.rel.split("/")[1] for _, b in blocks}
    assert len(dbs - {"0"}) >= 3, f"blocks of only databases {dbs}"

    images = [(r, b) for r, b in blocks if b.image]
    assert any(b.hole_length for _, b in images) and any(b.hole_length == 0 for _, b in images)

    # wal_consistency_checking: images "for WAL verification" on checked rmgrs.
    verification = [(r, b) for r, b in images if not b.apply]
    if consistency == "all":
        unimaged = [(r, b) for r, b in blocks if r.rmgr in CHECKED_RMGRS and not b.image]
        assert not unimaged, f"block without image under wal_consistency_checking=all: {unimaged[0]}"
        for rmgr in INDEX_RMGRS + ("Heap", "Heap2", "Sequence"):
            assert any(r.rmgr == rmgr for r, _ in verification), f"no verification images on {rmgr} records"
        assert all(r.rmgr in CHECKED_RMGRS for r, _ in verification)
    else:
        assert not verification, f"verification image without wal_consistency_checking: {verification[0]}"
        for rmgr in INDEX_RMGRS:
            assert any(r.rmgr == rmgr and not b.image for r, b in blocks), f"every {rmgr} block has an image"

    # wal_compression: compressed images use exactly the configured method.
    methods = Counter(b.compression for _, b in images)
    if compression == "off":
        assert set(methods) == {"none"}, methods
    else:
        assert methods[compression] > 0, f"no {compression}-compressed images: {methods}"
        assert set(methods) <= {compression, "none"}, methods
        saved = [b for _, b in images if b.compression == compression]
        assert all(b.compression_saved > 0 for b in saved)
