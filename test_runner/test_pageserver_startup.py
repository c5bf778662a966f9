"""What a pageserver does at start with a timeline directory it cannot
make sense of: it never deletes anything it cannot prove to be garbage.

- A timeline whose `metadata.json` is gone is reported `broken` (kind
  `files`, the reason naming the file) with every file kept; the service
  runs on and answers. Restored, the timeline is `active` again after a
  restart and a compute on it has all its data.
- A directory next to a `<timeline>.creating` marker is an interrupted
  creation: it goes at start, with the marker. A directory with a valid
  timeline id, no marker and no metadata stays, reported broken.
- A layer file the metadata does not list, with an LSN range that no
  unfinished flush explains, makes the timeline broken and stays (with
  every other file of the directory).

The files are changed by hand while the pageserver is stopped (`strata
stop --only pageserver`), as an operator or a broken disk would.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from pathlib import Path

from fixtures.cluster import LocalCluster
from fixtures.endpoint import Endpoint
from fixtures.metrics import wait_for_metric
from fixtures.pageserver_api import wait_for_pageserver_lsn
from fixtures.strata import parse_lsn
from fixtures.wait import ANY_ERROR

ROWS = 2000
# The pageserver's gauge of broken timelines, updated every half second:
# waited for, and a scrape that fails (the service restarting) is tried again.
BROKEN_GAUGE = "strata_pageserver_timelines_broken"


def listing(d: Path) -> dict[str, tuple[int, str]]:
    """Every file of a directory: name -> (size, sha256)."""
    return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(d.iterdir()) if p.is_file()}


def fill(ep: Endpoint) -> int:
    """A table of ROWS rows; returns the WAL position after it."""
    ep.sql("CREATE TABLE kept (id int PRIMARY KEY, v text)")
    ep.sql(f"INSERT INTO kept SELECT g, md5(g::text) FROM generate_series(1, {ROWS}) g")
    return ep.wal_lsn()


def filled_then_pageserver_stopped(cluster: LocalCluster) -> Endpoint:
    """The table written through a stopped endpoint, ingested by the
    pageserver, which is then stopped (its files can be changed by hand)."""
    ep = Endpoint(cluster, "ep")
    ep.start()
    end = fill(ep)
    ep.stop()
    wait_for_pageserver_lsn(cluster, end)
    cluster.stop("--only", "pageserver")
    return ep


def assert_data(ep: Endpoint, extra: int = 0) -> None:
    n = ROWS + extra
    assert ep.sql("SELECT count(*), sum(id) FROM kept") == [(n, n * (n + 1) // 2)]


def restart_pageserver(cluster: LocalCluster) -> None:
    """`strata stop --only pageserver` + `strata start --only pageserver`."""
    cluster.stop("--only", "pageserver")
    cluster.start("--only", "pageserver")


def assert_broken_files(status: dict, *needles: str) -> None:
    assert status["state"] == "broken", status
    assert status["broken"]["kind"] == "files", status
    assert status["error"] == status["broken"]["reason"] and status["broken"]["since"] > 0, status
    for needle in needles:
        assert needle in status["error"], (needle, status["error"])


def test_missing_metadata_breaks_the_timeline_and_keeps_its_files(cluster, tmp_path):
    ep = filled_then_pageserver_stopped(cluster)
    d = cluster.timeline_dir()
    before = listing(d)
    assert "metadata.json" in before and any(n.endswith(".delta") for n in before), before
    meta = d / "metadata.json"
    saved = tmp_path / "metadata.json.saved"
    shutil.move(meta, saved)

    started = cluster.run("start", "--only", "pageserver", check=False)
    # The service runs; `start` reports the broken branch and fails.
    assert started.returncode == 1, started
    assert "pageserver: started" in started.stdout, started.stdout
    assert f"timeline {cluster.timeline_id()} is broken" in started.stderr, started.stderr
    assert str(meta) in started.stderr, started.stderr
    svc = cluster.service("pageserver")
    assert svc["state"] == "running" and svc["restarts"] == 0, svc
    pid = svc["pid"]

    status = cluster.timeline_status("pageserver")
    print(f"\nbroken: {status['error']}")
    assert_broken_files(status, f"reading {meta}", "No such file or directory")
    shown = cluster.branch_status()["pageserver"]  # `strata status --json` shows the same
    assert (shown["state"], shown["broken"]["kind"], shown["error"]) == ("broken", "files", status["error"]), shown
    code, whole = cluster.http("pageserver", "GET", "/v1/status")
    assert code == 200 and [t["state"] for t in whole["timelines"]] == ["broken"], whole
    # Every other file is there, unchanged.
    assert listing(d) == {n: v for n, v in before.items() if n != "metadata.json"}
    metrics = wait_for_metric(cluster, BROKEN_GAUGE, 1, service="pageserver", interval=0.1, retry=ANY_ERROR)
    # Not retried by itself (an operator decides), and the service lives on.
    time.sleep(3)
    status = cluster.timeline_status("pageserver")
    assert status["state"] == "broken" and status["broken"]["kind"] == "files", status
    metrics = cluster.metrics("pageserver")
    assert metrics["strata_pageserver_timeline_reloads_total"] == 0, metrics
    assert cluster.pid("pageserver") == pid and cluster.answers("pageserver")
    assert listing(d) == {n: v for n, v in before.items() if n != "metadata.json"}
    # No compute starts on it; the agent says why.
    refused = cluster.run("endpoint", "start", "ep", check=False)
    assert refused.returncode == 1, refused
    assert "broken" in refused.stderr, refused.stderr[-3000:]

    # The file restored, the next start brings the timeline back.
    shutil.move(saved, meta)
    restart_pageserver(cluster)
    status = cluster.timeline_status("pageserver")
    assert status["state"] == "active" and status["error"] is None and status["broken"] is None, status
    assert listing(d) == before
    wait_for_metric(cluster, BROKEN_GAUGE, 0, service="pageserver", interval=0.1, retry=ANY_ERROR)
    ep.start()
    assert_data(ep)
    ep.sql("INSERT INTO kept VALUES (%s, 'after')", (ROWS + 1,))
    assert_data(ep, 1)


def test_interrupted_creation_is_removed_and_an_unknown_directory_kept(cluster):
    ep = filled_then_pageserver_stopped(cluster)
    timelines = cluster.timelines_dir()
    main_before = listing(cluster.timeline_dir())

    # A creation interrupted after its marker and some files.
    creating = uuid.uuid4().hex
    (timelines / creating).mkdir()
    (timelines / creating / "metadata.json").write_text('{"format_version": 1, "tenant_id": ')
    (timelines / creating / "metadata.tmp").write_bytes(b"half")
    (timelines / f"{creating}.creating").write_bytes(b"")
    # A marker whose directory was already removed.
    orphan = uuid.uuid4().hex
    (timelines / f"{orphan}.creating").write_bytes(b"")
    # A directory with a valid timeline id, no marker, no metadata: whose?
    unknown = uuid.uuid4().hex
    (timelines / unknown).mkdir()
    stray = next(n for n in main_before if n.endswith(".delta"))
    shutil.copyfile(cluster.timeline_dir() / stray, timelines / unknown / stray)
    (timelines / unknown / "notes.txt").write_text("left by someone\n")
    unknown_before = listing(timelines / unknown)

    cluster.start("--only", "pageserver")  # the branch's timeline is fine
    assert not (timelines / creating).exists(), "the interrupted creation was not removed"
    assert not (timelines / f"{creating}.creating").exists()
    assert not (timelines / f"{orphan}.creating").exists()
    assert listing(timelines / unknown) == unknown_before, "the unmarked directory was changed"
    assert sorted(p.name for p in timelines.iterdir()) == sorted([cluster.timeline_id(), unknown])
    log = cluster.log("pageserver")
    assert "removing a timeline whose creation did not finish" in log and creating in log

    code, status = cluster.http("pageserver", "GET", cluster.timeline_path(timeline=unknown))
    assert code == 200, status
    print(f"\nunknown directory: {status['error']}")
    assert_broken_files(status, str(timelines / unknown / "metadata.json"), "No such file or directory")
    code, _ = cluster.http("pageserver", "GET", cluster.timeline_path(timeline=creating))
    assert code == 404
    main = cluster.timeline_status("pageserver")
    assert main["state"] == "active", main
    code, whole = cluster.http("pageserver", "GET", "/v1/status")
    assert {t["timeline_id"]: t["state"] for t in whole["timelines"]} == {
        cluster.timeline_id(): "active", unknown: "broken"}, whole
    wait_for_metric(cluster, BROKEN_GAUGE, 1, service="pageserver", interval=0.1, retry=ANY_ERROR)
    ep.start()
    assert_data(ep)

    # Once more: still there, still broken, nothing removed.
    ep.stop()
    restart_pageserver(cluster)
    assert listing(timelines / unknown) == unknown_before
    code, status = cluster.http("pageserver", "GET", cluster.timeline_path(timeline=unknown))
    assert code == 200 and status["state"] == "broken", status
    assert cluster.timeline_status("pageserver")["state"] == "active"


def test_stray_layer_file_breaks_the_timeline_and_stays(cluster):
    ep = filled_then_pageserver_stopped(cluster)
    d = cluster.timeline_dir()
    meta = json.loads((d / "metadata.json").read_text())
    listed = meta["layers"]
    assert listed, meta
    # A copy of a listed layer under a name with an old LSN range (before
    # disk_consistent_lsn): no unfinished flush explains it.
    keys, _ = listed[0].removesuffix(".delta").split("__")
    stray = f"{keys}__{0x10:016X}-{0x20:016X}.delta"
    shutil.copyfile(d / listed[0], d / stray)
    # Next to it, what an unfinished flush would have left: a layer starting
    # after disk_consistent_lsn and a temporary file. With a file nothing
    # explains in the directory, even these stay: nothing is removed.
    after = parse_lsn(meta["disk_consistent_lsn"]) + 8
    unfinished = f"{keys}__{after:016X}-{after + 0x1000:016X}.delta"
    (d / unfinished).write_bytes(b"partial")
    (d / "metadata.tmp").write_bytes(b"partial")
    before = listing(d)

    started = cluster.run("start", "--only", "pageserver", check=False)
    assert started.returncode == 1 and "is broken" in started.stderr, started
    status = cluster.timeline_status("pageserver")
    print(f"\nbroken: {status['error']}")
    assert_broken_files(status, str(d), stray, "left as they are")
    assert unfinished not in status["error"] and "metadata.tmp" not in status["error"], status["error"]
    assert listing(d) == before, "files were removed or changed"
    assert cluster.answers("pageserver")
    wait_for_metric(cluster, BROKEN_GAUGE, 1, service="pageserver", interval=0.1, retry=ANY_ERROR)

    # The stray file removed by hand, the timeline loads (the leftovers of
    # the unfinished flush go now) and a compute has all the data.
    (d / stray).unlink()
    restart_pageserver(cluster)
    status = cluster.timeline_status("pageserver")
    assert status["state"] == "active", status
    assert listing(d) == {n: v for n, v in before.items() if n not in (stray, unfinished, "metadata.tmp")}
    ep.start()
    assert_data(ep)
