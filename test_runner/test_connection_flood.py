"""A connection flood against every port of every Strata service while a
compute commits.

Every Strata process (supervisors, three safekeepers, the pageserver, the
compute agent) runs with an open-file limit of 1,024 (soft = hard, so none
can raise it). Then, while pgbench commits through a stock PostgreSQL
compute, this test keeps 600 idle TCP connections open against each of
the twelve Strata ports (each safekeeper's protocol, HTTP and replication
ports, the pageserver's page service and HTTP ports, the compute agent's
HTTP port), re-opening every one the server closes, plus 20 slow senders
per port that trickle a partial frame, a partial startup packet or a
partial HTTP request line one byte at a time and never finish: 7,440
sockets. (PostgreSQL's own port is stock PostgreSQL's business.)

What must hold (`service/src/listener.rs`): the listeners displace the
connections that never greeted instead of running out of descriptors, so

- the compute keeps committing (no failed transaction, a sane rate compared
  with the same pgbench before the flood), and every transaction pgbench
  acknowledged is in `pgbench_history` afterwards;
- no service exits: same pids, no restart by any supervisor or the agent;
- every status API, and `strata status --json`, answers throughout;
- every flooded listener was full and displaced connections, refused none,
  and no accept failed (no EMFILE); nothing logged "Too many open files";
- once the flood stops, the open connections drop back to what they were
  before it, within the handshake timeout.

Each listener keeps its `max_connections` and displaces the oldest idle
one for each new connection, so the flood becomes churn as fast as one
Python thread can re-open what was closed; most of the flood's sockets are
at any moment displaced connections waiting to be re-opened. The figures (connections held per port, churn,
displaced and refused counts, TPS before/during, status latencies) are
printed; the only timing assertion is a loose sanity bound on the TPS ratio.
"""

from __future__ import annotations

import errno
import json
import re
import resource
import selectors
import socket
import struct
import threading
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path

from fixtures.checks import history_rows, parse_pgbench
from fixtures.cluster import LocalCluster
from fixtures.endpoint import Endpoint
from fixtures.processes import pid_alive
from fixtures.strata import urlopen
from fixtures.wait import wait_until

NOFILE = 1024                # RLIMIT_NOFILE (soft = hard) of every Strata process
IDLE_PER_PORT = 600          # idle connections kept open against each port
SLOW_PER_PORT = 20           # slow senders per port
SLOW_INTERVAL = 0.2          # seconds between two bytes of a slow sender
CLIENTS = 4                  # pgbench clients
SCALE = 1
BASELINE_SECONDS = 10
FLOOD_SECONDS = 15
RAMP_UP_TIMEOUT = 20         # every listener must be displacing within this
STATUS_DEADLINE = 5.0        # seconds a status request may take, retries included
CLI_STATUS_DEADLINE = 10.0   # the same for `strata status --json` (several requests)
MIN_TPS_RATIO = 0.2          # sanity bound only: machines are noisy
SERVICES = ("sk1", "sk2", "sk3", "pageserver")
# The compute agent's status listener admits this many connections
# (MAX_STATUS_CONNECTIONS in compute/src/agent/status.rs; not configurable).
AGENT_MAX_CONNECTIONS = 32
EMFILE_TEXT = "Too many open files"
# tcpi_state (the first byte of struct tcp_info) by name, as the kernel numbers them
TCP_STATES = {1: "established", 2: "syn_sent", 7: "close", 8: "close_wait"}

def http_get(port: int, path: str, timeout: float) -> bytes:
    with urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read()


# ----------------------------------------------------------------- the flood

def _frame_start(tag: int) -> bytes:
    # Strata's framing: u32 little-endian length | u8 tag | payload.
    return struct.pack("<I", 1000) + bytes([tag]) + bytes(999)


# What slow senders trickle, by protocol: the start of a greeting that would
# take minutes at this pace (the handshake timeout is 10 s).
PARTIAL = {
    "frame": _frame_start(0x01),  # a proposer greeting / page service hello, cut short
    # A PostgreSQL startup packet of 1000 bytes (protocol 3.0), cut short.
    "pg": struct.pack(">II", 1000, 196608) + b"user\0" + b"p" * 983,
    # An HTTP request line that never ends.
    "http": b"GET /v1/status?" + b"a" * 4000,
}


@dataclass
class Target:
    """One flooded port and what happened to its connections."""
    label: str                     # "<service> <listener>"
    port: int
    kind: str                      # "frame", "pg" or "http"
    limit: int                     # the listener's connection limit
    idle: int = 0                  # idle sockets now (connecting or connected)
    slow: int = 0                  # slow senders now
    connected: int = 0             # sockets this thread saw connect, now
    opened: int = 0                # connects started
    closed_by_server: int = 0      # ... ended by the server (EOF or reset): displaced or timed out
    answered: int = 0              # ... on which the server sent something (an error, a refusal)
    connect_errors: int = 0        # connects that failed (ECONNREFUSED: nothing listens)
    slow_bytes: int = 0            # bytes trickled by slow senders
    established: int = 0           # sockets the kernel had ESTABLISHED at the last sample
    states: dict[str, int] = field(default_factory=dict)  # TCP states of its sockets, last sample
    held: list[int] = field(default_factory=list)  # `established` samples during the measurement


@dataclass
class Sock:
    sock: socket.socket
    target: Target
    slow: bool
    connected: bool = False
    answered: bool = False
    sent: int = 0


class Flood:
    """Keeps IDLE_PER_PORT idle connections and SLOW_PER_PORT slow senders
    open against every target, from one thread with non-blocking sockets and
    a selector, re-opening whatever the server closes. Everything is
    bounded: at most IDLE_PER_PORT + SLOW_PER_PORT sockets per target."""

    def __init__(self, targets: list[Target]):
        self.targets = targets
        self.sel = selectors.DefaultSelector()
        self.socks: dict[int, Sock] = {}
        self.stop_event = threading.Event()
        self.sampling = threading.Event()
        self.error: BaseException | None = None
        self.rounds = 0
        self.longest_round = 0.0
        self.thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stops the thread, which closes every socket."""
        self.stop_event.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the flood thread did not stop"
        if self.error is not None:
            raise self.error

    def describe(self) -> str:
        return "; ".join(f"{t.label}: {t.established} established (limit {t.limit}), {t.idle}+{t.slow} open, "
                         f"{t.opened} opened, {t.closed_by_server} closed, {t.connect_errors} errors"
                         for t in self.targets)

    def _open(self, t: Target, slow: bool) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        t.opened += 1
        rc = s.connect_ex(("127.0.0.1", t.port))
        if rc not in (0, errno.EINPROGRESS):
            t.connect_errors += 1
            s.close()
            return
        entry = Sock(s, t, slow)
        self.socks[s.fileno()] = entry
        self.sel.register(s, selectors.EVENT_WRITE, entry)
        if slow:
            t.slow += 1
        else:
            t.idle += 1

    def _close(self, e: Sock, by_server: bool) -> None:
        self.sel.unregister(e.sock)
        del self.socks[e.sock.fileno()]
        e.sock.close()
        t = e.target
        if e.slow:
            t.slow -= 1
        else:
            t.idle -= 1
        if e.connected:
            t.connected -= 1
        if by_server:
            t.closed_by_server += 1

    def _event(self, e: Sock) -> None:
        t = e.target
        if not e.connected:
            if e.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                t.connect_errors += 1
                self._close(e, by_server=False)
                return
            e.connected = True
            t.connected += 1
            self.sel.modify(e.sock, selectors.EVENT_READ, e)
            return
        try:
            data = e.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._close(e, by_server=True)  # reset: closed with our bytes unread
            return
        if not data:
            self._close(e, by_server=True)
        elif not e.answered:
            e.answered = True
            t.answered += 1

    def _trickle(self) -> None:
        for e in list(self.socks.values()):
            if not (e.slow and e.connected):
                continue
            msg = PARTIAL[e.target.kind]
            i = e.sent % len(msg)
            try:
                e.sock.send(msg[i:i + 1])
            except BlockingIOError:
                continue
            except OSError:
                self._close(e, by_server=True)
                continue
            e.sent += 1
            e.target.slow_bytes += 1

    def _sample(self) -> None:
        """Counts the connections each port holds: sockets the kernel has
        ESTABLISHED (connected, not closed by the server; in the server's
        table or still in its accept queue), whether or not this thread has
        seen their connect complete yet."""
        states = {t.label: {} for t in self.targets}
        for e in self.socks.values():
            try:
                state = e.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
            except OSError:
                continue
            name = TCP_STATES.get(state, "other")
            states[e.target.label][name] = states[e.target.label].get(name, 0) + 1
        for t in self.targets:
            t.states = states[t.label]
            t.established = t.states.get("established", 0)
            if self.sampling.is_set():
                t.held.append(t.established)
                del t.held[:-1000]  # bounded

    def _run(self) -> None:
        try:
            next_trickle = next_sample = time.monotonic()
            while not self.stop_event.is_set():
                round_started = time.monotonic()
                for t in self.targets:
                    for _ in range(IDLE_PER_PORT - t.idle):
                        self._open(t, slow=False)
                    for _ in range(SLOW_PER_PORT - t.slow):
                        self._open(t, slow=True)
                for key, _mask in self.sel.select(timeout=0.02):
                    self._event(key.data)
                now = time.monotonic()
                if now >= next_trickle:
                    self._trickle()
                    next_trickle = now + SLOW_INTERVAL
                if now >= next_sample:
                    next_sample = now + 0.5
                    self._sample()
                self.rounds += 1
                self.longest_round = max(self.longest_round, time.monotonic() - round_started)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e
        finally:
            for e in list(self.socks.values()):
                self._close(e, by_server=False)
            self.sel.close()


# ------------------------------------------------------------------ metrics

_METRIC = re.compile(r'^(\w+)\{listener="(\w+)"\} (\S+)$', re.M)


def listener_metrics(port: int, prefix: str, timeout: float = 10) -> dict[tuple[str, str], float]:
    """{(metric without prefix, listener): value} from a service's /metrics."""
    text = http_get(port, "/metrics", timeout=timeout).decode()
    out = {}
    for name, listener, value in _METRIC.findall(text):
        if name.startswith(prefix + "_"):
            out[(name[len(prefix) + 1:], listener)] = float(value)
    return out


def kernel_listen_counters() -> dict[str, int]:
    """TcpExt ListenOverflows, ListenDrops and SyncookiesSent of this network
    namespace (shared with whatever else runs in it: printed, not asserted)."""
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines() if line.startswith("TcpExt:")]
    values = dict(zip(lines[0][1:], map(int, lines[1][1:])))
    return {k: values.get(k, 0) for k in ("ListenOverflows", "ListenDrops", "SyncookiesSent")}


# ---------------------------------------------------------- status answers

@dataclass
class StatusProbe:
    """What the status poller saw during the flood."""
    latencies: dict[str, list[float]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # connections_open samples of every flooded listener, by "<service> <listener>"
    server_open: dict[str, list[float]] = field(default_factory=dict)

    def record(self, name: str, seconds: float, attempts: int) -> None:
        lat = self.latencies.setdefault(name, [])
        lat.append(seconds)
        del lat[:-1000]
        self.attempts[name] = self.attempts.get(name, 0) + attempts


def retried(name: str, probe: StatusProbe, deadline: float, request):
    """Calls `request(remaining_seconds)` until it succeeds, within `deadline`
    seconds; records the latency (retries included) or a failure."""
    start = time.monotonic()
    attempts = 0
    last: object = None
    while True:
        attempts += 1
        remaining = deadline - (time.monotonic() - start)
        try:
            result = request(max(0.2, remaining))
        except (OSError, ValueError, AssertionError, urllib.error.URLError) as e:
            last = e
        else:
            probe.record(name, time.monotonic() - start, attempts)
            return result
        if time.monotonic() - start >= deadline:
            probe.failures.append(f"{name}: no answer within {deadline} s ({attempts} attempts, last: {last!r})")
            return None
        time.sleep(0.05)


def get_status(port: int, timeout: float) -> dict:
    body = json.loads(http_get(port, "/v1/status", timeout=timeout))
    assert isinstance(body, dict), body
    return body


def cli_status_ok(doc: dict) -> str | None:
    """What is missing from `strata status --json` while everything runs, if anything."""
    for s in doc["services"]:
        if s["state"] != "running":
            return f"service {s['name']}: {s['state']}"
    for e in doc["endpoints"]:
        if e["state"] != "running" or e["compute_state"] != "running":
            return f"endpoint {e['name']}: {e['state']} / {e['compute_state']}"
    for tl in doc["timelines"]:
        if tl["pageserver"] is None:
            return f"branch {tl['branch']}: no answer from the pageserver"
        for sk in tl["safekeepers"]:
            if sk["flush_lsn"] is None:
                return f"branch {tl['branch']}: no answer from {sk['name']}"
    return None


def cli_status(cluster: LocalCluster, timeout: float) -> dict:
    result = cluster.run("status", "--json", check=False, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"exit code {result.returncode}: {result.stderr.strip()}")
    doc = json.loads(result.stdout)
    missing = cli_status_ok(doc)
    if missing is not None:
        raise AssertionError(missing)
    return doc


def poll(cluster: LocalCluster, http_ports: dict[str, int], prefixes: dict[str, str],
         flooded: dict[str, tuple[str, ...]], probe: StatusProbe, stop: threading.Event) -> None:
    """Until `stop`: every service's and the agent's status, their listener
    metrics, and every third round `strata status --json`."""
    rounds = 0
    while not stop.is_set():
        for name, port in http_ports.items():
            retried(name, probe, STATUS_DEADLINE, lambda t, port=port: get_status(port, t))
            m = retried(f"{name} /metrics", probe, STATUS_DEADLINE,
                        lambda t, name=name, port=port: listener_metrics(port, prefixes[name], t))
            for listener in flooded[name] if m else ():
                samples = probe.server_open.setdefault(f"{name} {listener}", [])
                samples.append(m[("connections_open", listener)])
                del samples[:-1000]
        if rounds % 3 == 0:
            retried("strata status", probe, CLI_STATUS_DEADLINE, lambda t: cli_status(cluster, t))
        rounds += 1
        stop.wait(0.3)


# --------------------------------------------------------------------- misc

def open_file_limits(pid: int) -> tuple[str, str]:
    """(soft, hard) "Max open files" from /proc/<pid>/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


def raise_own_limit(needed: int) -> int:
    """Raises this process's soft open-file limit to its hard limit (and the
    hard one to `needed` if it is lower and we may); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
        except (ValueError, OSError):
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run_pgbench(ep: Endpoint, seconds: int):
    """TPC-B-like pgbench for `seconds`: (result, tps, output)."""
    res = ep.run(["pgbench", "-n", "-c", CLIENTS, "-j", "2", "-T", seconds], timeout=seconds + 120)
    bench = parse_pgbench(res.stdout)
    m = re.search(r"^tps = ([\d.]+)", res.stdout, re.M)
    assert m, res.stdout
    return bench, float(m.group(1)), res.stdout


def median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2]


# --------------------------------------------------------------------- test

def test_connection_flood(cluster_factory):
    started = time.monotonic()
    cluster = cluster_factory(nofile=NOFILE)
    ep = Endpoint(cluster, "ep")
    ep.start()

    # Every Strata process runs with 1024 open files, soft and hard.
    processes = {}
    for name in SERVICES + ("controller", "proxy"):
        processes[name] = cluster.pid(name)
        processes[f"{name} supervisor"] = cluster.supervisor_pid(name)
    processes["agent"] = ep.agent_pid()
    processes["agent supervisor"] = ep.supervisor_pid()
    for role, pid in processes.items():
        assert pid is not None and pid_alive(pid), f"{role} is not running ({pid})"
        assert open_file_limits(pid) == (str(NOFILE), str(NOFILE)), (role, pid, open_file_limits(pid))

    # Every port of every Strata process, with its listener's limit.
    ports = {s["name"]: s["ports"] for s in cluster.cluster_toml["services"]}
    targets = []
    for sk in ("sk1", "sk2", "sk3"):
        conf = cluster.service_config(sk)
        targets += [Target(f"{sk} protocol", ports[sk]["listen"], "frame", conf["max_connections"]),
                    Target(f"{sk} http", ports[sk]["http"], "http", conf["max_http_connections"]),
                    Target(f"{sk} pg", ports[sk]["pg"], "pg", conf["max_pg_connections"])]
    conf = cluster.service_config("pageserver")
    targets += [Target("pageserver page", ports["pageserver"]["pg"], "frame", conf["max_connections"]),
                Target("pageserver http", ports["pageserver"]["http"], "http", conf["max_http_connections"]),
                Target("agent http", ep.http_port, "http", AGENT_MAX_CONNECTIONS)]
    per_target = IDLE_PER_PORT + SLOW_PER_PORT
    needed = len(targets) * per_target + 500
    own_limit = raise_own_limit(needed + 500)
    assert own_limit >= needed, f"this test needs {needed} open files, its limit is {own_limit}"
    handshake_timeout = max(cluster.service_config(n)["handshake_timeout"] for n in SERVICES)

    http_ports = {name: ports[name]["http"] for name in SERVICES}
    http_ports["agent"] = ep.http_port
    prefixes = {name: ("strata_pageserver" if name == "pageserver" else "strata_safekeeper") for name in SERVICES}
    prefixes["agent"] = "strata_compute"
    flooded = {"sk1": ("protocol", "http", "pg"), "sk2": ("protocol", "http", "pg"), "sk3": ("protocol", "http", "pg"),
               "pageserver": ("page", "http"), "agent": ("http",)}

    def all_metrics(probe: StatusProbe | None = None) -> dict[str, dict]:
        """Every service's listener metrics; during the flood (`probe`) a
        request may be retried within STATUS_DEADLINE like a status request."""
        if probe is None:
            return {name: listener_metrics(port, prefixes[name]) for name, port in http_ports.items()}
        out = {}
        for name, port in http_ports.items():
            m = retried(f"{name} /metrics", probe, STATUS_DEADLINE,
                        lambda t, name=name, port=port: listener_metrics(port, prefixes[name], t))
            assert m is not None, probe.failures
            out[name] = m
        return out

    # The baseline: the same pgbench without the flood.
    ep.run(["pgbench", "-i", "-s", SCALE, "-q"], timeout=300)
    rows0 = history_rows(ep)
    before, tps_before, out_before = run_pgbench(ep, BASELINE_SECONDS)
    rows1 = history_rows(ep)
    assert before.failed == 0 and before.processed > 0, out_before
    assert rows1 - rows0 == before.processed, (rows0, rows1, before)
    m_before = all_metrics()
    kernel_before = kernel_listen_counters()

    # The flood, until every listener displaces, before the measurement starts.
    flood = Flood(targets)
    probe = StatusProbe()
    stop_polling = threading.Event()
    poller = threading.Thread(target=poll, args=(cluster, http_ports, prefixes, flooded, probe, stop_polling),
                              name="status", daemon=True)
    flood_started = time.monotonic()
    flood.start()
    try:
        try:
            wait_until("every listener displacing",
                       lambda: flood.error is None and all(t.closed_by_server > 0 for t in targets),
                       timeout=RAMP_UP_TIMEOUT, interval=0.2)
        except TimeoutError as e:
            raise AssertionError(f"{e}: {flood.error!r}; {flood.describe()}") from None
        ramp_up = time.monotonic() - flood_started
        m_start = all_metrics(probe)
        closed0 = {t.label: t.closed_by_server for t in targets}
        flood.sampling.set()
        poller.start()
        during_started = time.monotonic()
        during, tps_during, out_during = run_pgbench(ep, FLOOD_SECONDS)
        during_seconds = time.monotonic() - during_started
        flood.sampling.clear()
        churn = {t.label: (t.closed_by_server - closed0[t.label]) / during_seconds for t in targets}
        m_end = all_metrics(probe)
    finally:
        stop_polling.set()
        if poller.is_alive():
            poller.join(timeout=60)
        flood.stop()
    flood_stopped = time.monotonic()
    kernel_after = kernel_listen_counters()
    rows2 = history_rows(ep)

    # Once the clients are gone, the open connections drop back: at once for
    # those the server sees closed, within the handshake timeout for any it
    # cannot (a half-open connection: its client is gone without a word).
    lagging: dict[str, list[tuple[float, float]]] = {}

    def drained():
        now = all_metrics()
        done = True
        for name, listeners in flooded.items():
            for listener in listeners:
                # +1: this very metrics request (HTTP), or a proposer or
                # WAL receiver that reconnected meanwhile.
                value = now[name][("connections_open", listener)]
                if value > m_before[name][("connections_open", listener)] + 1:
                    samples = lagging.setdefault(f"{name} {listener}", [])
                    samples.append((round(time.monotonic() - flood_stopped, 1), value))
                    del samples[1:-1]
                    done = False
        return now if done else None
    after = wait_until("connections_open back to its level before the flood", drained,
                       timeout=handshake_timeout + 5, interval=0.2)
    drain_seconds = time.monotonic() - flood_stopped

    # ---------------------------------------------------------- the figures
    print(f"\nFLOOD {len(targets)} ports, {IDLE_PER_PORT} idle + {SLOW_PER_PORT} slow connections each "
          f"({len(targets) * per_target} sockets), ramp-up {ramp_up:.1f} s, measured {during_seconds:.1f} s, "
          f"drained in {drain_seconds:.1f} s")
    totals = [sum(x) for x in zip(*(t.held for t in targets))] or [0]
    print(f"flood thread: {flood.rounds} rounds, longest {flood.longest_round * 1000:.0f} ms; "
          f"connections held (ESTABLISHED) in all: min {min(totals)}, max {max(totals)} "
          f"over {len(totals)} samples")
    print("client sockets by TCP state at the last sample: "
          + "; ".join(f"{t.label} {t.states}" for t in targets))
    if lagging:
        print(f"drain: listeners above their level after the flood (seconds, connections): {lagging}")
    print(f"kernel (whole network namespace) during the flood: "
          f"{ {k: kernel_after[k] - kernel_before[k] for k in kernel_after} }")
    print(f"{'port':<18}{'limit':>6}{'held min':>9}{'held max':>9}{'srv open':>9}{'churn/s':>8}"
          f"{'displaced':>10}{'refused':>8}{'acc.err':>8}{'opened':>8}{'answered':>9}{'slow B':>7}")
    for t in targets:
        name, listener = t.label.split()
        held = t.held or [t.established]
        srv = probe.server_open.get(t.label) or [float("nan")]
        m = after[name]
        print(f"{t.label:<18}{t.limit:>6}{min(held):>9}{max(held):>9}{median(srv):>9.0f}{churn[t.label]:>8.0f}"
              f"{m[('connections_displaced_total', listener)]:>10.0f}{m[('connections_refused_total', listener)]:>8.0f}"
              f"{m[('accept_errors_total', listener)]:>8.0f}{t.opened:>8}{t.answered:>9}{t.slow_bytes:>7}")
    ratio = tps_during / tps_before
    print(f"TPS before {tps_before:.1f}, during the flood {tps_during:.1f}, ratio {ratio:.2f} "
          f"({before.processed} and {during.processed} transactions, history rows +{rows1 - rows0} "
          f"and +{rows2 - rows1})")
    for name, lat in sorted(probe.latencies.items()):
        print(f"answers {name:<20} {len(lat):>4}, max {max(lat) * 1000:5.0f} ms, "
              f"mean {sum(lat) / len(lat) * 1000:5.0f} ms, {probe.attempts[name]} attempts")
    for failure in probe.failures:
        print(f"NO ANSWER {failure}")

    # -------------------------------------------------------- the assertions
    # The compute kept committing, and everything pgbench acknowledged is there.
    assert during.failed == 0 and during.processed > 0, out_during
    assert rows2 - rows1 == during.processed, (rows1, rows2, during)
    assert ratio >= MIN_TPS_RATIO, f"TPS during the flood {tps_during:.1f} vs {tps_before:.1f} before"

    # Status answered throughout, for every service and the agent, and strata status.
    assert not probe.failures, probe.failures
    for name in [*http_ports, "strata status"]:
        assert probe.latencies.get(name), f"no status answer from {name} during the flood"

    # The flood was real: each listener's table was full and displaced
    # connections all through the measurement.
    for t in targets:
        name, listener = t.label.split()
        assert t.connect_errors == 0, f"{t.label}: {t.connect_errors} connects failed (nothing listening?)"
        assert max(probe.server_open.get(t.label, [0])) == t.limit, (t.label, probe.server_open.get(t.label))
        displaced = m_end[name][("connections_displaced_total", listener)] - \
            m_start[name][("connections_displaced_total", listener)]
        assert displaced > 0, f"{t.label}: nothing displaced during the measurement"

    # No service exited or restarted.
    for role, pid in processes.items():
        assert pid_alive(pid), f"{role} (pid {pid}) exited"
    for name in SERVICES:
        assert cluster.pid(name) == processes[name], f"{name} was restarted"
        sup = cluster.supervisor_state(name)
        assert sup["restarts"] == 0 and sup["state"] == "running", (name, sup)
    assert ep.agent_pid() == processes["agent"]
    agent_sup = json.loads((ep.dir / "compute.supervisor.json").read_text())
    assert agent_sup["restarts"] == 0 and agent_sup["state"] == "running", agent_sup
    agent = ep.agent_status()
    assert agent["state"] == "running" and agent["restarts"] == 0, agent
    doc = cluster.status()
    assert cli_status_ok(doc) is None, doc
    for s in doc["services"]:
        assert s["restarts"] == 0 and s["pid"] == processes[s["name"]], s
    entry = next(e for e in doc["endpoints"] if e["name"] == "ep")
    assert (entry["restarts"], entry["agent_restarts"], entry["postgres_restarts"]) == (0, 0, 0), entry

    # No listener refused a connection (the flood never greets, so there is
    # always one to displace) and no accept failed: no process ran out of
    # descriptors, nor logged that anything else did.
    for name, listeners in flooded.items():
        for listener in listeners:
            m = after[name]
            assert m[("connections_refused_total", listener)] == 0, (name, listener, m)
            assert m[("accept_errors_total", listener)] == 0, (name, listener, m)
    for name in SERVICES:
        assert EMFILE_TEXT not in cluster.log(name), f"{name} ran out of descriptors:\n{cluster.log(name)[-3000:]}"
    assert EMFILE_TEXT not in (ep.dir / "compute.log").read_text(errors="replace"), ep.logs()

    # Still committing after the flood.
    ep.sql("CREATE TABLE after_flood AS SELECT 1 AS one")
    assert ep.sql("SELECT one FROM after_flood") == [(1,)]
    print(f"test duration {time.monotonic() - started:.1f} s")
