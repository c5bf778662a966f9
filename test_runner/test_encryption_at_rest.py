"""Encryption at rest in object storage (docs/security.md, "Encryption at
rest"), through a cluster made by the CLI, where it is on by default: the
layers, indexes and offloaded WAL in the object store hold no plaintext of
the tenant's data (a marker that the services' own disks do hold), every
tenant object is sealed, and a layer object with a flipped byte is refused
on download, with an error naming it, instead of being served."""

from __future__ import annotations

from pathlib import Path

from fixtures.cluster import SEALED_MAGIC
from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.pageserver_api import SMALL_LAYERS, PageserverApi
from fixtures.strata import parse_lsn
from fixtures.wait import wait_until

# A value no other data contains: found in plaintext, it leaked.
MARKER = "strata-plaintext-marker-5e1f09c2"
SEGMENT = 16 << 20


def files_under(root: Path) -> list[Path]:
    """The objects under `root` (a local store's conditional-write sidecars,
    `NAME#…`, are bookkeeping, not objects)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and "#" not in p.name)


def containing(paths: list[Path], needle: bytes) -> list[Path]:
    return [p for p in paths if needle in p.read_bytes()]


def test_objects_are_sealed_and_a_flipped_byte_is_refused(cluster_factory):
    cluster = cluster_factory(start=False)
    cluster.configure("pageserver", SMALL_LAYERS)
    cluster.start()
    store = Path(cluster.service_config("pageserver")["remote_storage"]["path"])
    assert cluster.service_config("pageserver")["storage_key"] == str(cluster.workdir.resolve() / "auth/storage.key")
    ps = PageserverApi(cluster)
    ep = start_endpoint(cluster)
    ep.sql("CREATE TABLE marked (id int, v text)")
    ep.sql(f"INSERT INTO marked SELECT g, '{MARKER}' || g FROM generate_series(1, 40000) g")
    rel = ep.sql("SELECT pg_relation_filenode('marked'), (SELECT oid FROM pg_database "
                 "WHERE datname = current_database())")[0]
    with ep.connect() as conn:
        conn.execute("SELECT pg_switch_wal()")
        end = current_lsn(conn)
    wait_until("the WAL offloaded", lambda: parse_lsn(
        cluster.timeline_status("sk1")["offload"]["offloaded_lsn"]) >= end // SEGMENT * SEGMENT, timeout=120)
    cluster.run("timeline", "checkpoint", timeout=300)
    ep.stop()

    # The services' disks hold the marker in plaintext: the scan below would see it.
    local = files_under(ps.timeline_dir) + files_under(cluster.data_dir("sk1"))
    assert containing(local, MARKER.encode()), "the marker is on no service's disk: the check proves nothing"
    tenant = cluster.tenant_id()
    objects = files_under(store / "tenants" / tenant) + files_under(store / "wal" / tenant)
    layers = [p for p in objects if "/timelines/" in p.as_posix() and not p.name.startswith("index-")]
    indexes = [p for p in objects if p.name.startswith("index-")]
    segments = [p for p in objects if p.parent.parent.name == tenant and len(p.name) == 24]
    assert layers and indexes and segments, [p.relative_to(store).as_posix() for p in objects]
    # No plaintext: every tenant object is sealed and none holds the marker.
    assert not containing(objects, MARKER.encode()), "plaintext in object storage"
    unsealed = [p for p in objects if not p.read_bytes().startswith(SEALED_MAGIC)]
    assert not unsealed, unsealed
    # The tenant's data key is in the store, wrapped; its content opens with the cluster's key.
    assert (store / "keys" / tenant / "data-keys.json").is_file()
    assert any(MARKER.encode() in cluster.object_content(p, "pageserver") for p in layers)

    # Every layer object gets one flipped byte; the pageserver evicts its
    # copies, so a read must download them: refused, never served.
    originals = {p: p.read_bytes() for p in layers}
    for p, data in originals.items():
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(flipped))
    code, body = ps.request("POST", ps.tl_path() + "/evict", timeout=120)
    assert code == 200, (code, body)
    before = cluster.metrics("pageserver")["strata_pageserver_download_errors_total"]
    code, body = ps.page(1663, rel[1], rel[0], "main", 0, None)
    assert code != 200, "a page was served from a tampered layer"
    answer = body.decode(errors="replace")
    assert "refused" in answer and "fails authentication" in answer, (code, answer)
    refused_names = [p.name for p in layers if p.name in answer]
    assert refused_names, ("the refusal names no layer object", answer)
    assert cluster.metrics("pageserver")["strata_pageserver_download_errors_total"] > before
    print("\nrefused:", code, answer)

    # The same objects, untouched, are served: the refusal was the flipped byte's.
    for p, data in originals.items():
        p.write_bytes(data)

    def served():
        code, page = ps.page(1663, rel[1], rel[0], "main", 0, None)
        return page if code == 200 else None

    page = wait_until("the page served from the intact layers", served, timeout=120)
    assert MARKER.encode() in page
