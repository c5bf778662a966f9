"""Idle timelines (docs/pageserver.md, "Idle timelines"): a timeline that
receives no WAL for `idle_after` makes what it ingested durable and gives
up its WAL stream and its two threads (`wal-<timeline>`, `flush-<timeline>`,
read from /proc/<pid>/task); a read that waits for an LSN wakes it at once,
and WAL committed while it idles wakes it through the safekeepers'
positions. No committed row is lost along the way, through a compute
started on an idle timeline, writes while it idles and wakes, and a
`kill -9` of the pageserver while it idles."""

from __future__ import annotations

import re
import time
from pathlib import Path

from fixtures.endpoint import Endpoint
from fixtures.strata import format_lsn, http_text, parse_lsn
from fixtures.wait import wait_until

IDLE_AFTER = 2  # seconds without WAL before a timeline goes idle


def thread_names(pid: int) -> list[str]:
    """The names of a process's threads (each truncated to 15 bytes by Linux)."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return names


def timeline_threads(cluster, timeline_id: str) -> list[str]:
    """The pageserver's threads of one timeline: its WAL receiver and flusher."""
    own = {f"wal-{timeline_id}"[:15], f"flush-{timeline_id}"[:15]}
    return [n for n in thread_names(cluster.pid("pageserver")) if n in own]


def labelled(cluster, name: str, label: str) -> float:
    """One labelled sample of the pageserver's metrics (0 if absent)."""
    text = http_text(cluster.http_url("pageserver", "/metrics"))
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(label)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def status(cluster) -> dict:
    return cluster.timeline_status("pageserver")


def wait_idle(cluster, timeline_id: str, timeout: float = 60) -> None:
    """Until the timeline says it idles and its threads are gone."""
    wait_until("the timeline to go idle and end its threads",
               lambda: status(cluster)["idle"] and not timeline_threads(cluster, timeline_id),
               timeout, 0.2, details=lambda: (status(cluster), timeline_threads(cluster, timeline_id)))


def read_at(cluster, lsn: int) -> None:
    """A read that waits for `lsn` (so wakes an idle timeline)."""
    path = cluster.timeline_path() + f"/checkpoint_record?lsn={format_lsn(lsn)}"
    code, body = cluster.http("pageserver", "GET", path, timeout=60)
    assert code == 200, body


def insert(ep: Endpoint, first: int, last: int) -> None:
    ep.sql(f"INSERT INTO kept SELECT g, 'row ' || g FROM generate_series({first}, {last}) g")


def test_an_idle_timeline_gives_up_its_threads_and_wakes_with_every_committed_row(cluster_factory):
    cluster = cluster_factory(start=False)
    # WAL wakes it slowly at first, so that the read below is what wakes it.
    cluster.configure("pageserver", {"idle_after": IDLE_AFTER, "idle_poll_period": 120})
    cluster.start()
    tl = cluster.timeline_id()
    ep = Endpoint(cluster, "ep")
    ep.start()
    ep.sql("CREATE TABLE kept (id int PRIMARY KEY, v text)")
    insert(ep, 1, 1000)
    # On a slow machine the timeline may already have idled between its
    # creation and the compute's first write (its WAL wakes it only every
    # 120 s here); a read at the newest commit wakes it, and it then keeps
    # both threads for at least IDLE_AFTER.
    read_at(cluster, cluster.commit_lsn())
    wait_until("the active timeline to have both threads",
               lambda: len(timeline_threads(cluster, tl)) == 2 and status(cluster)["idle"] is False,
               30, 0.05, details=lambda: (status(cluster), thread_names(cluster.pid("pageserver"))))

    # No compute: the timeline idles, its threads end, and nothing is only in memory.
    ep.stop()
    wait_idle(cluster, tl)
    st = status(cluster)
    assert st["disk_consistent_lsn"] == st["last_record_lsn"], st
    assert st["wal_source"] is None, st
    assert labelled(cluster, "strata_pageserver_timelines", 'state="idle"') >= 1
    assert labelled(cluster, "strata_pageserver_timelines", 'state="active"') == 0
    # No timeline keeps a thread (pools such as remote storage's come and go
    # with uploads, so the total count is not what is checked).
    left = [n for n in thread_names(cluster.pid("pageserver")) if n.startswith(("wal-", "flush-"))]
    assert left == [], left
    # Its WAL stream ended: no safekeeper streams it to the pageserver.
    for sk in cluster.safekeeper_names():
        consumers = cluster.timeline_status(sk)["consumers"]
        assert not [c for c in consumers if c["name"].startswith("pageserver/")], (sk, consumers)

    # A compute starts on the idle timeline and writes; a read at the
    # newest commit wakes it at once (the positions are read every 120 s).
    ep.start()
    assert ep.sql("SELECT count(*) FROM kept") == [(1000,)]
    wait_idle(cluster, tl)
    insert(ep, 1001, 2000)
    t = time.monotonic()
    read_at(cluster, cluster.commit_lsn())
    assert time.monotonic() - t < 30, "the read waited for the poll of positions"
    assert labelled(cluster, "strata_pageserver_timeline_wakes_total", 'reason="read"') >= 1

    # The pageserver is killed while the timeline idles: what it ingested
    # was durable. It comes back polling every half second.
    wait_idle(cluster, tl)
    cluster.configure("pageserver", {"idle_after": IDLE_AFTER, "idle_poll_period": 0.5})
    old = cluster.kill9("pageserver")
    cluster.wait_restarted("pageserver", old)
    wait_until("the pageserver to answer", lambda: cluster.answers("pageserver"), 60)

    # Writes while the timeline idles, each batch waking it through the
    # safekeepers' positions (no read asks for them).
    for batch in range(3):
        wait_idle(cluster, tl)
        first = 2001 + batch * 1000
        insert(ep, first, first + 999)
        commit = cluster.commit_lsn()
        wait_until("the WAL written while idle to be ingested", lambda: parse_lsn(status(cluster)["last_record_lsn"]) >= commit, 60, 0.2)
    assert labelled(cluster, "strata_pageserver_timeline_wakes_total", 'reason="wal"') >= 1

    # A new compute reads every page from the pageserver: every row is there.
    ep.stop()
    ep.start()
    assert ep.sql("SELECT count(*), sum(id) FROM kept") == [(5000, sum(range(1, 5001)))]
    assert ep.sql("SELECT v FROM kept WHERE id = 4321") == [("row 4321",)]

