"""The pageserver's object storage, through the CLI's cluster: layers and
the index are uploaded as they are written; a pageserver on an empty disk
attaches the timeline from object storage alone and serves the same pages;
the local disk is a bounded cache (eviction, on-demand download), and so is
the memory layers keep of their files; kill -9 during uploads never leaves
an index that lists a missing or partial object; a stale generation can
neither publish nor delete; and an S3 server (MinIO) killed under load
costs nothing once it is back.

Pages are compared with the compute's own data files at its checkpoint
(PostgreSQL's masking rules; fixtures/page_compare.py)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import crc32c

from fixtures.checks import assert_pgbench_invariants, pgbench_state
from fixtures.endpoint import start_endpoint
from fixtures.minio import minio  # noqa: F401 - a fixture
from fixtures.page_compare import (assert_same_pages, catalog, checkpoint_compute, compare_data_dir, quiet_cluster,
                                   quiet_compute, wait_quiet)
from fixtures.pageserver_api import SMALL_LAYERS, PageserverApi, error_message
from fixtures.strata import parse_lsn
from fixtures.wait import wait_until

SCALE = 4


def remote_cluster(cluster_factory, settings: dict, remote: dict | None = None):
    """`quiet_cluster` with `remote` as the pageserver's object storage (else
    the local directory `strata init` set up)."""
    prepare = None if remote is None else (lambda cluster: cluster.set_remote_storage(remote))
    return quiet_cluster(cluster_factory, settings, prepare)


def timeline_objects(root: Path, ps: PageserverApi) -> Path:
    return root / "tenants" / ps.tenant / "timelines" / ps.timeline


def check_index(cluster, index: Path) -> int:
    """Every layer `index` lists is in remote storage, whole: the size and
    CRC-32C the index gives (of the content: objects are sealed, encryption
    at rest, and opened with the cluster's key). Returns the number of layers."""
    doc = json.loads(cluster.object_content(index, "pageserver"))
    layers = doc["index"]["layers"]
    for layer in layers:
        obj = index.parent / f"{layer['name']}-{layer['generation']:08x}"
        assert obj.is_file(), f"{index.name} lists {obj.name}, which is not in remote storage"
        data = cluster.object_content(obj, "pageserver")
        assert len(data) == layer["size"], f"{obj.name}: {len(data)} bytes, {index.name} says {layer['size']}"
        assert crc32c.crc32c(data) == layer["crc32c"], f"{obj.name}: CRC differs from {index.name}"
    return len(layers)


def snapshot_pages(ps: PageserverApi, ep, lsn: int):
    """The compute's relation pages at `lsn`, compared with the pageserver's."""
    dbs, rels = catalog(ep)
    cmp = compare_data_dir(ps, ep, rels, lsn, keep=True)
    assert not cmp.mismatches and not cmp.size_mismatches, json.dumps(cmp.mismatches[:5] + cmp.size_mismatches[:5])
    assert cmp.blocks_compared > 1000 and cmp.by_kind["heap"] > 0 and cmp.by_kind["btree"] > 0, cmp.summary()
    return cmp


def settle(cluster, ps: PageserverApi, ep) -> int:
    """Quiesces the compute, checkpoints it, and checkpoints the pageserver
    through `strata timeline checkpoint`, which returns once object storage
    has everything; returns the compute's LSN."""
    wait_quiet(ep)
    lsn, _ = checkpoint_compute(ep, ps)
    uploaded = parse_lsn(cluster.run("timeline", "checkpoint").stdout.strip())
    assert uploaded >= lsn, (uploaded, lsn)
    return lsn


def caught_up(ps: PageserverApi, timeout: float = 60) -> dict:
    """The status once every layer is uploaded and listed by the remote
    index (background compaction may still be writing layers after a
    checkpoint, and an uploaded layer is listed only once the round that
    uploaded it publishes the index)."""
    def check():
        st = ps.status()
        r = st["remote"]
        done = r["upload_queue_layers"] == 0 and r["upload_lag_bytes"] == 0
        listed = r["remote_layers"] == st["l0_layers"] + st["l1_layers"] + st["image_layers"]
        return st if done and listed and r["remote_consistent_lsn"] == st["disk_consistent_lsn"] else None
    return wait_until("uploads caught up", check, timeout=timeout)


def test_attach_from_object_storage_on_an_empty_disk(cluster_factory):
    cluster, ps, ep = remote_cluster(cluster_factory, SMALL_LAYERS)
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    ep.run(["pgbench", "-n", "-c", "4", "-T", "10"], timeout=300)
    lsn = settle(cluster, ps, ep)
    st = caught_up(ps)
    remote = st["remote"]
    print("\nafter the checkpoint:", {k: st[k] for k in ("local_layers", "local_layer_bytes")}, remote)
    assert remote["remote_layers"] == st["l0_layers"] + st["l1_layers"] + st["image_layers"], (remote, st)
    assert parse_lsn(st["remote_consistent_lsn"]) == parse_lsn(st["disk_consistent_lsn"]) >= lsn, st
    # The storage controller attached the tenant under generation 1.
    assert remote["generation"] == 1 == cluster.status()["timelines"][0]["generation"]

    # `strata status --json` names where the pageserver keeps its data.
    svc = next(s for s in cluster.status()["services"] if s["kind"] == "pageserver")
    root = cluster.workdir / "remote_storage"
    assert Path(svc["data_dir"]) == ps.data_dir and Path(svc["remote_storage"]) == root, svc
    objects = timeline_objects(root, ps)
    assert check_index(cluster, objects / "index-00000001.json") == remote["remote_layers"]
    cmp = snapshot_pages(ps, ep, lsn)

    # The safekeepers hear what object storage has.
    code, sk = cluster.http("sk1", "GET", "/v1/status")
    assert code == 200, sk
    consumers = [c for t in sk["timelines"] for c in t.get("consumers", [])]
    assert any(parse_lsn(c["remote_consistent_lsn"]) >= lsn for c in consumers), consumers

    # The local disk is lost: the pageserver starts on an empty one.
    cluster.stop("--only", "pageserver")
    shutil.rmtree(ps.data_dir / "tenants")
    cluster.start("--only", "pageserver")
    ps.close()
    st = ps.status()
    assert st["state"] == "active" and parse_lsn(st["disk_consistent_lsn"]) >= lsn, st
    before = cluster.metrics("pageserver")
    assert_same_pages(ps, cmp, lsn)
    after = cluster.metrics("pageserver")
    downloaded = after["strata_pageserver_layers_downloaded_total"]
    print("attached from object storage; layers downloaded on demand:", downloaded)
    assert downloaded > 0 and after["strata_pageserver_download_errors_total"] == 0, after
    assert before["strata_pageserver_layers_downloaded_total"] <= downloaded

    # The same attachment came back (its record is outside the data
    # directory): the same generation goes on publishing the index.
    assert ps.status()["remote"]["generation"] == 1
    check_index(cluster, objects / "index-00000001.json")

    # And the compute writes on through it.
    ep.run(["pgbench", "-n", "-c", "2", "-T", "5"], timeout=300)
    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), SCALE)
    lsn2 = settle(cluster, ps, ep)
    snapshot_pages(ps, ep, lsn2)


def test_eviction_keeps_local_disk_bounded_and_downloads_on_demand(cluster_factory):
    limit = 4 << 20
    cluster, ps, ep = remote_cluster(cluster_factory, {**SMALL_LAYERS, "local_cache_bytes": limit})
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    loaded_lsn = settle(cluster, ps, ep)
    loaded = snapshot_pages(ps, ep, loaded_lsn)
    ep.run(["pgbench", "-n", "-c", "4", "-T", "10"], timeout=300)
    lsn = settle(cluster, ps, ep)

    def bounded():
        st = ps.status()
        return st if st["local_layer_bytes"] <= limit else None

    st = wait_until("local layers within local_cache_bytes", bounded, timeout=60)
    print("\nlayers:", st["layer_bytes"], "bytes in all,", st["local_layer_bytes"], "local, limit", limit)
    assert st["layer_bytes"] > 2 * limit, st
    m = cluster.metrics("pageserver")
    assert m["strata_pageserver_layers_evicted_total"] > 0, m
    assert m["strata_pageserver_local_layer_bytes"] <= limit, m
    evicted = [n for n in json.loads((ps.timeline_dir / "metadata.json").read_text())["layers"]
               if not (ps.timeline_dir / n).exists()]
    assert evicted, "evicted layers leave the local disk"

    # Every page is still exact: what a read needs comes back from object storage.
    cmp = snapshot_pages(ps, ep, lsn)
    m2 = cluster.metrics("pageserver")
    print("downloaded on demand:", m2["strata_pageserver_layers_downloaded_total"])
    assert m2["strata_pageserver_layers_downloaded_total"] > 0 and m2["strata_pageserver_download_errors_total"] == 0
    # ... and the cache goes back under its bound.
    wait_until("local layers within local_cache_bytes again", bounded, timeout=60)
    assert_same_pages(ps, cmp, lsn)
    # A restart with evicted layers loads them as remote-only layers.
    cluster.stop("--only", "pageserver")
    cluster.start("--only", "pageserver")
    ps.close()
    assert ps.status()["state"] == "active"
    assert_same_pages(ps, cmp, lsn)


def test_layer_index_memory_stays_within_its_budget_and_reads_open_the_files_again(cluster_factory):
    # The smallest budget accepted: far less than what this timeline's
    # layers keep of their files (summaries, key filters).
    limit = 64 << 10
    cluster, ps, ep = remote_cluster(cluster_factory, {**SMALL_LAYERS, "layer_index_cache_bytes": limit})
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    loaded_lsn = settle(cluster, ps, ep)
    loaded = snapshot_pages(ps, ep, loaded_lsn)
    ep.run(["pgbench", "-n", "-c", "4", "-T", "10"], timeout=300)
    lsn = settle(cluster, ps, ep)

    def bounded():
        m = cluster.metrics("pageserver")
        within = m["strata_pageserver_layer_index_bytes"] <= limit
        return m if within and m["strata_pageserver_layer_index_unloads_total"] > 0 else None

    m = wait_until("layer indexes within layer_index_cache_bytes", bounded, timeout=60)
    st = ps.status()
    print("\nlayers:", st["l0_layers"] + st["l1_layers"] + st["image_layers"], "index bytes kept:",
          m["strata_pageserver_layer_index_bytes"], "unloads:", m["strata_pageserver_layer_index_unloads_total"])
    # The files stay on local disk: dropping an index is not an eviction.
    assert m["strata_pageserver_layers_evicted_total"] == 0, m
    assert m["strata_pageserver_local_layer_bytes"] > 4 * limit, m

    # Every page is still exact, now and as loaded: a read of a layer
    # without its index (the older layers, read longest ago, first) opens
    # and checks the file again; the next round drops what it loaded.
    cmp = snapshot_pages(ps, ep, lsn)
    assert_same_pages(ps, loaded, loaded_lsn)
    m2 = wait_until("layer indexes within the budget again", bounded, timeout=60)
    print("indexes loaded again by reads:", m2["strata_pageserver_layer_index_reloads_total"])
    assert m2["strata_pageserver_layer_index_reloads_total"] > 0, m2
    assert_same_pages(ps, cmp, lsn)
    # The compute reads and writes on through it.
    ep.run(["pgbench", "-n", "-c", "2", "-T", "5"], timeout=300)
    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), SCALE)


def test_kill9_during_uploads_never_publishes_a_partial_index(cluster_factory):
    cluster, ps, ep = remote_cluster(cluster_factory, SMALL_LAYERS)
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    objects = timeline_objects(cluster.workdir / "remote_storage", ps)
    bench = ep.popen(["pgbench", "-n", "-c", "4", "-T", "20"])
    checked = []
    try:
        for i in range(4):
            time.sleep(1.5 + i)
            # The supervisor too: nothing writes while the objects are checked.
            cluster.kill9("pageserver", supervisor=True)
            indexes = sorted(objects.glob("index-*.json"))
            assert indexes, "no index"
            checked.append(sum(check_index(cluster, ix) for ix in indexes))
            out = cluster.start()
            assert "pageserver: started" in out, out
        stdout, stderr = bench.communicate(timeout=180)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=30)
    assert bench.returncode == 0, f"pgbench failed:\n{stdout}\n{stderr}"
    print("\nlayers checked in the indexes after each kill -9:", checked)
    # A restart is the same attachment: the generation stays (only the
    # storage controller issues new ones, when the tenant moves).
    assert ps.status()["remote"]["generation"] == 1
    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), SCALE)
    lsn = settle(cluster, ps, ep)
    check_index(cluster, objects / "index-00000001.json")
    snapshot_pages(ps, ep, lsn)


def test_a_stale_generation_can_neither_publish_nor_delete(cluster_factory):
    """Pageserver A stays attached under generation 1 while the tenant's
    state names generation 2 at pageserver B: what a partition between A
    and the storage controller leaves. The controllers are stopped, and the
    decision is written into their state object as they would write it."""
    cluster = cluster_factory(start=False, init_args=("--pageservers", "2"))
    for name in ("pageserver", "pageserver2"):
        cluster.configure(name, SMALL_LAYERS)
    cluster.start()
    ep = start_endpoint(cluster)
    quiet_compute(ep)
    ps_a = PageserverApi(cluster)
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    settle(cluster, ps_a, ep)
    root = cluster.workdir / "remote_storage"
    objects = timeline_objects(root, ps_a)
    tenant = ps_a.tenant
    cluster.stop("--only", "controller,controller2")

    # The decision: generation 2, at B; then B is told.
    state_file = root / "controller" / "state.json"
    state = json.loads(state_file.read_text())
    placement = state["tenants"][tenant]
    assert (placement["generation"], placement["attached"]) == (1, "pageserver"), placement
    state["tenants"][tenant] = {"generation": 2, "attached": "pageserver2", "secondaries": ["pageserver"]}
    state["version"] += 1
    state_file.write_text(json.dumps(state))
    code, body = cluster.http("pageserver2", "PUT", f"/v1/tenant/{tenant}/location",
                              {"mode": "attached", "generation": 2}, timeout=120)
    assert code == 200 and body["generation"] == 2, body
    ps_b = PageserverApi(cluster, name="pageserver2")
    wait_until("pageserver B active", lambda: ps_b.status()["state"] == "active", timeout=60)
    wait_until("B's index", lambda: (objects / "index-00000002.json").exists(), timeout=60)
    deleted_before = cluster.metrics("pageserver")["strata_pageserver_remote_deletions_total"]
    gen1 = {p.name for p in objects.iterdir() if p.name.endswith("00000001") or p.name == "index-00000001.json"}

    # A, stale, goes on ingesting: more WAL and a forced compaction (its
    # L0s are replaced). It reads the state before each upload round, so it
    # uploads and deletes nothing more, and a checkpoint that waits for an
    # upload says why none will come.
    ep.run(["pgbench", "-n", "-c", "4", "-T", "8"], timeout=300)
    code, body = ps_a.request("POST", ps_a.tl_path() + "/checkpoint?compact=true&upload_timeout=120", timeout=300)
    body = body.decode()
    assert code == 500 and "generation 1 is no longer current" in body and "names generation 2" in body, body
    st_a = ps_a.status()["remote"]
    assert "no longer current" in (st_a["upload_error"] or ""), st_a
    print("\nstale pageserver A:", st_a["upload_error"], "; upload queue", st_a["upload_queue_layers"], "layers")
    assert st_a["upload_queue_layers"] > 0, "A wrote layers it did not upload"
    m = cluster.metrics("pageserver")
    assert m["strata_pageserver_remote_deletions_total"] == deleted_before, "a stale generation deleted objects"
    now_gen1 = {p.name for p in objects.iterdir() if p.name.endswith("00000001") or p.name == "index-00000001.json"}
    assert now_gen1 <= gen1, f"the stale generation uploaded {sorted(now_gen1 - gen1)}"
    check_index(cluster, objects / "index-00000002.json")

    # The safekeepers stop feeding A once B has streamed for their grace
    # (docs/safekeeper-protocol.md, "Fencing"): A falls behind for good.
    def fenced():
        st = ps_a.status()
        return st if "is stale" in (st["wal_source_error"] or "") else None
    fenced_at = parse_lsn(wait_until("A fenced by the safekeepers", fenced, timeout=120)["last_record_lsn"])
    ep.run(["pgbench", "-n", "-c", "2", "-t", "50"], timeout=300)

    # B serves what the compute has, and A does not have it.
    wait_quiet(ep)
    lsn, _ = checkpoint_compute(ep, ps_b)
    cmp = snapshot_pages(ps_b, ep, lsn)
    assert cmp.blocks_compared > 0
    assert parse_lsn(ps_a.status()["last_record_lsn"]) == fenced_at < lsn
    # B's own index lists only objects that exist, A's activity notwithstanding.
    code, body = ps_b.request("POST", ps_b.tl_path() + "/checkpoint?compact=true&upload_timeout=120", timeout=300)
    assert code == 200, body
    check_index(cluster, objects / "index-00000002.json")
    assert json.loads(cluster.object_content(objects / "index-00000002.json", "pageserver"))["index"]["generation"] == 2


def test_object_storage_killed_under_load(minio, cluster_factory):
    """MinIO as the object store, killed while pgbench writes: ingest goes
    on locally, the status and metrics show the upload lag and the error,
    and once MinIO is back everything is uploaded; a pageserver on an empty
    disk then serves every page from it. (MinIO outlives the cluster at
    teardown: the `minio` fixture comes first.)"""
    minio.start()
    cluster, ps, ep = remote_cluster(cluster_factory, {**SMALL_LAYERS, "max_upload_lag_bytes": 2 << 20},
                                     remote=minio.remote_storage("strata"))
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    st = ps.status()
    svc = next(s for s in cluster.status()["services"] if s["kind"] == "pageserver")
    assert svc["remote_storage"] == f"s3://strata-test/strata at {minio.endpoint}", svc
    bench = ep.popen(["pgbench", "-n", "-c", "4", "-T", "25"])
    seen = {}
    try:
        time.sleep(3)
        minio.kill()
        t0 = time.monotonic()
        ingest_before = parse_lsn(ps.status()["last_record_lsn"])

        def lagging():
            s = ps.status()
            r = s["remote"]
            return s if r["upload_lag_bytes"] > 0 and r["upload_error"] and s["upload_backpressure"] else None

        down = wait_until("the upload lag shows", lagging, timeout=60)
        seen = {"lag": down["remote"]["upload_lag_bytes"], "error": down["remote"]["upload_error"][:120],
                "seconds": round(time.monotonic() - t0, 1)}
        time.sleep(max(0.0, 10 - (time.monotonic() - t0)))
        assert bench.poll() is None, "pgbench ended while object storage was down"
        st = ps.status()
        m = cluster.metrics("pageserver")
        assert m["strata_pageserver_upload_errors_total"] > 0, m
        assert parse_lsn(st["last_record_lsn"]) > ingest_before, "ingest stopped while object storage was down"
        # A checkpoint that waits for its upload gives up after its
        # timeout with the upload error, and leaves the uploads going
        # (a wait that timed out once deadlocked them for good).
        t1 = time.monotonic()
        code, raw = ps.request("POST", ps.tl_path() + "/checkpoint?upload_timeout=2", timeout=60)
        assert code == 500 and "last upload error" in error_message(raw), (code, raw)
        assert time.monotonic() - t1 < 30, "the checkpoint did not give up in time"
        minio.start()
        stdout, stderr = bench.communicate(timeout=180)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=30)
    assert bench.returncode == 0, f"pgbench failed:\n{stdout}\n{stderr}"
    print("\nwhile MinIO was down:", seen)
    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), SCALE)
    lsn = settle(cluster, ps, ep)
    st = caught_up(ps)
    assert st["remote"]["upload_error"] is None, st["remote"]
    cmp = snapshot_pages(ps, ep, lsn)
    # Nothing was lost: a pageserver with no local files serves it all from MinIO.
    cluster.stop("--only", "pageserver")
    shutil.rmtree(ps.data_dir / "tenants")
    cluster.start("--only", "pageserver")
    ps.close()
    assert_same_pages(ps, cmp, lsn)
    assert cluster.metrics("pageserver")["strata_pageserver_layers_downloaded_total"] > 0


def test_a_branch_deletion_cut_off_by_object_storage_is_finished_later_and_never_comes_back(minio, cluster_factory):
    """Object storage down while two branches are deleted: each deletion
    fails, and neither branch is served any more. Once MinIO is back, a
    retry finishes the first, the pageserver's restart the second: their
    objects, directories and markers are gone, and neither comes back
    (before, the retry said "not found" and the restart brought the
    timeline back from its directory)."""
    minio.start()
    cluster, ps, ep = remote_cluster(cluster_factory, SMALL_LAYERS, remote=minio.remote_storage("strata"))
    ep.sql("CREATE TABLE kept AS SELECT i FROM generate_series(1, 20000) AS i")
    tenant = cluster.tenant_id()
    doomed = {}
    for name in ("doomed1", "doomed2"):
        cluster.run("branch", "create", name)
        path = cluster.timeline_path(name)
        code, body = ps.request("POST", path + "/checkpoint?upload_timeout=120", timeout=300)
        assert code == 200, body
        objects = minio.data_dir / "strata-test" / "strata" / "tenants" / tenant / "timelines" / cluster.timeline_id(name)
        assert any(p.is_file() for p in objects.rglob("*")), f"{name}: nothing uploaded under {objects}"
        doomed[name] = (path, objects, cluster.timelines_dir() / cluster.timeline_id(name))

    def gone(name: str) -> None:
        path, objects, local = doomed[name]
        assert cluster.http("pageserver", "GET", path)[0] == 404, f"{name} is still served"
        assert not any(p.is_file() for p in objects.rglob("*")) if objects.exists() else True, f"{name}: objects left"
        assert not local.exists(), f"{name}: its directory is left"
        assert not local_marker(local).exists(), f"{name}: its deletion marker is left"

    minio.kill()
    for name in doomed:
        r = cluster.run("branch", "delete", name, check=False, timeout=600)
        assert r.returncode != 0, r.stdout
        assert cluster.http("pageserver", "GET", doomed[name][0])[0] == 404, f"{name} is served after its deletion began"
        assert local_marker(doomed[name][2]).exists()
    assert {"doomed1", "doomed2"} <= {b["name"] for b in cluster.tenant()["branches"]}

    minio.start()
    cluster.run("branch", "delete", "doomed1", timeout=600)
    gone("doomed1")
    killed = cluster.kill9("pageserver")
    cluster.wait_restarted("pageserver", killed)
    wait_until("the interrupted deletion finished at start", lambda: not local_marker(doomed["doomed2"][2]).exists(),
               timeout=60)
    gone("doomed2")
    cluster.run("branch", "delete", "doomed2", timeout=600)
    assert not {"doomed1", "doomed2"} & {b["name"] for b in cluster.tenant()["branches"]}
    assert ep.sql("SELECT count(*) FROM kept")[0][0] == 20000


def local_marker(local: Path) -> Path:
    """The deletion marker beside a timeline's directory."""
    return local.with_name(local.name + ".deleting")


def test_a_pageserver_started_while_object_storage_is_down_loads_its_timelines_once_it_is_back(minio, cluster_factory):
    """The pageserver starts while MinIO is down: the timeline's index in
    object storage cannot be read, so the timeline is broken (kind
    `remote`), not loaded from local files that object storage may be
    ahead of. Once MinIO answers, it is loaded again by itself, and serves
    every page as before. (A chaos run found it broken for good: the
    load was never tried again.)"""
    minio.start()
    cluster, ps, ep = remote_cluster(cluster_factory, SMALL_LAYERS, remote=minio.remote_storage("strata"))
    ep.sql("CREATE TABLE kept AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 20000) g")
    lsn = settle(cluster, ps, ep)
    cmp = snapshot_pages(ps, ep, lsn)
    cluster.stop("--only", "pageserver")
    minio.kill()
    # `strata start` also checks the timelines, which fails here.
    cluster.run("start", "--only", "pageserver", check=False, timeout=120)
    ps.close()
    broken = wait_until("the timeline reported broken", lambda: (s := ps.status())["state"] == "broken" and s, 60)
    assert broken["broken"]["kind"] == "remote" and "reading its remote index" in broken["error"], broken
    time.sleep(3)
    assert ps.status()["broken"]["reload_attempts"] >= 1, "no load was tried again while the store was down"
    minio.start()
    active = wait_until("the timeline loaded again", lambda: (s := ps.status())["state"] == "active" and s, 120)
    assert active["broken"] is None, active
    assert cluster.metrics("pageserver")["strata_pageserver_timeline_reloads_total"] >= 1
    assert_same_pages(ps, cmp, lsn)
    assert ep.sql("SELECT count(*) FROM kept")[0][0] == 20000
