"""TLS on a running local cluster (docs/security.md, "TLS"): every listener
that has it presents a certificate of the cluster's own CA naming its
address, a client that trusts another CA refuses it, and a plaintext
request gets no answer (the compute's PostgreSQL too, through libpq);
and nothing of the cluster listens beyond loopback
without both TLS and tokens."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import struct
import subprocess

import psycopg
import pytest

from fixtures.endpoint import Endpoint
from fixtures.strata import tls_context


def handshake(port: int, context: ssl.SSLContext) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return s.getpeercert()


def plaintext_answer(port: int) -> bytes:
    """What a plaintext HTTP request gets back (until the server closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        out = b""
        try:
            while chunk := s.recv(4096):
                out += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return out


def test_every_tls_listener_presents_the_cluster_certificate(cluster_factory, pg_bin_dir):
    c = cluster_factory()
    other = cluster_factory(start=False)  # another cluster: another CA
    ep = Endpoint(c, "main")
    ep.start()
    ours, theirs = tls_context(c.ca), tls_context(other.ca)
    # Every listener but the PostgreSQL-protocol services, which negotiate
    # TLS in their protocol: the safekeepers' (below) and the proxy's
    # (test_proxy.py connects with verify-full).
    listeners = [(s["name"], role, port) for s in c.cluster_toml["services"] for role, port in s["ports"].items()
                 if not ((s["name"].startswith("sk") or s["kind"] == "proxy") and role == "pg")]
    listeners.append(("agent", "http", ep.http_port))
    # Three safekeepers (protocol, HTTP), the pageserver (page, HTTP), the
    # controller, the proxy's HTTP, the agent.
    assert len(listeners) == 11, listeners
    for name, role, port in listeners:
        cert = handshake(port, ours)
        assert ("IP Address", "127.0.0.1") in cert["subjectAltName"], (name, role, cert)
        assert dict(x[0] for x in cert["issuer"])["commonName"] == "Strata cluster CA", cert
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(port, theirs)
        answer = plaintext_answer(port)
        assert not answer.startswith(b"HTTP/"), (name, role, answer[:80])
    # The cluster still works over its TLS links.
    ep.sql("CREATE TABLE t AS SELECT generate_series(1, 1000) AS x")
    assert ep.sql("SELECT count(*) FROM t") == [(1000,)]
    # The compute's PostgreSQL: TLS with the same certificate (libpq checks
    # it: sslmode=verify-full, as the string `endpoint start` prints "over
    # TLS"), refused against another cluster's CA.
    info = dict(ep.app_conninfo(), sslmode="verify-full", sslrootcert=str(c.ca))
    with psycopg.connect(**info, connect_timeout=30) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    with pytest.raises(psycopg.OperationalError, match="SSL error|certificate verify failed"):
        psycopg.connect(**dict(info, sslrootcert=str(other.ca)), connect_timeout=30)

    # The safekeepers' PostgreSQL-protocol service negotiates TLS in its
    # protocol (SSLRequest) and takes no client without it.
    tenant, timeline = c.tenant_id(), c.timeline_id()
    for s in c.cluster_toml["services"]:
        if not s["name"].startswith("sk"):
            continue

        def identify(sslmode: str, ca=c.ca, port=s["ports"]["pg"]) -> subprocess.CompletedProcess:
            conn = (f"host=127.0.0.1 port={port} user=strata dbname=replication replication=true "
                    f"sslmode={sslmode} sslrootcert={ca} options='-c strata.timeline={tenant}/{timeline}'")
            env = {"PATH": os.environ.get("PATH", ""), "PGCONNECT_TIMEOUT": "10", "PGPASSWORD": c.token}
            return subprocess.run([str(pg_bin_dir / "psql"), "-X", "-w", "-At", "-d", conn, "-c",
                                   "IDENTIFY_SYSTEM"], env=env, capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL)
        r = identify("verify-full")
        assert r.returncode == 0 and r.stdout.strip(), (s["name"], r.stderr)
        r = identify("disable")
        assert r.returncode != 0 and "requires TLS" in r.stderr, (s["name"], r.stderr)
        r = identify("verify-full", ca=other.ca)
        assert r.returncode != 0 and "SSL error" in r.stderr, (s["name"], r.stderr)


def test_nothing_listens_beyond_loopback_without_tls_and_tokens(cluster_factory):
    """Every listening socket on a port of the cluster (its services, the
    agent, the compute's PostgreSQL) binds loopback, unless its listener
    has both TLS and tokens; and a service configured to listen beyond
    loopback without them refuses to start, naming the key."""
    c = cluster_factory()
    ep = Endpoint(c, "main")
    ep.start()
    ports = {port for s in c.cluster_toml["services"] for port in s["ports"].values()}
    ports.add(ep.http_port)
    ports.add(int(ep.conninfo()["port"]))
    lines = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout.splitlines()
    seen = set()
    for line in lines:
        local = line.split()[3]
        host, port = local.rsplit(":", 1)
        if int(port) in ports:
            seen.add(int(port))
            assert ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback, line
    assert seen == ports, (sorted(ports), sorted(seen))

    # A safekeeper told to listen on every address with its PostgreSQL-
    # protocol service does not start without `[tls]`; with its HTTP API
    # there, not without `[auth]`.
    config = c.workdir / "sk1" / "safekeeper.toml"
    text = config.read_text()
    assert text.index("[auth]") < text.index("[tls]"), text
    exposed = config.with_name("exposed.toml")
    for key, drop, words in [("listen_pg", "tls", "no TLS"), ("listen_http", "auth", "no tokens")]:
        line = next(l for l in text.splitlines() if l.startswith(f"{key} ="))
        changed = text.replace(line, f'{key} = "0.0.0.0:1"')
        exposed.write_text(without_table(changed, drop))
        r = subprocess.run([str(c.strata_bin), "safekeeper", "--config", str(exposed)], capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode != 0 and f"{key}: 0.0.0.0:1 is beyond loopback" in r.stderr and words in r.stderr, \
            (key, r.stderr)


def without_table(toml_text: str, name: str) -> str:
    """`toml_text` without its table `[name]` (its header and its lines up
    to the next table); the other tables stay as they were."""
    out, skipping = [], False
    for line in toml_text.splitlines(keepends=True):
        if line.startswith("["):
            skipping = line.strip() == f"[{name}]"
        if not skipping:
            out.append(line)
    return "".join(out)


def test_the_replication_service_takes_nothing_sent_before_its_tls_handshake(cluster_factory, pg_bin_dir):
    """Bytes pipelined after an SSLRequest (before the handshake) would be
    read as if they came over TLS: the service closes instead of answering
    `S`. Garbage instead of a startup closes the connection too, and the
    service goes on serving."""
    c = cluster_factory()
    port = next(s["ports"]["pg"] for s in c.cluster_toml["services"] if s["name"] == "sk1")
    ssl_request = struct.pack("!ii", 8, 80877103)

    def answer(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
            try:
                return s.recv(4096)
            except ConnectionResetError:
                return b""
    assert answer(ssl_request) == b"S"
    assert answer(ssl_request + b"Q\0\0\0\x0bSELECT 1\0") == b""
    for garbage in (b"\xff" * 64, struct.pack("!i", 7) + b"abc", struct.pack("!ii", 8, 196608),
                    struct.pack("!ii", 1 << 30, 196608), os.urandom(300)):
        assert not answer(garbage).startswith(b"S"), garbage
    # A plaintext startup is refused with an error, naming TLS.
    startup = struct.pack("!i", 196608) + b"user\0x\0\0"
    refused = answer(struct.pack("!i", len(startup) + 4) + startup)
    assert refused[:1] == b"E" and b"requires TLS" in refused, refused
    # And a real client is still served.
    conn = (f"host=127.0.0.1 port={port} user=strata dbname=replication replication=true sslmode=verify-full "
            f"sslrootcert={c.ca} options='-c strata.timeline={c.tenant_id()}/{c.timeline_id()}'")
    r = subprocess.run([str(pg_bin_dir / "psql"), "-X", "-w", "-At", "-d", conn, "-c", "IDENTIFY_SYSTEM"],
                       env={"PATH": os.environ.get("PATH", ""), "PGPASSWORD": c.token}, capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
