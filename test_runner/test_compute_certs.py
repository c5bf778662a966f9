"""A compute's own certificate (docs/security.md, "Computes"): the key
PostgreSQL keeps in its data directory, which its superuser can read, is
issued for the endpoint at each start and is never a key of the host's
services; and the connection string `endpoint start` prints verifies the
server on loopback too, so a process that takes the port while the
compute is down is refused before the client sends anything."""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest

from fixtures.endpoint import start_endpoint

SSL_REQUEST = struct.pack("!ii", 8, 80877103)


def service_secrets(workdir: Path) -> dict[str, bytes]:
    """Every key and token of the cluster's services and of its CLI."""
    # Certificates and the public key are public; everything else is not.
    files = [*(workdir / "tls").glob("*.key"), *(p for p in (workdir / "auth").iterdir() if p.name != "public.pem")]
    found = {str(p.relative_to(workdir)): p.read_bytes().strip() for p in files if p.is_file()}
    assert any(name.startswith("tls/") for name in found) and "auth/private.pem" in found, found
    return found


def served_certificate(port: int, ca: Path) -> bytes:
    """The certificate (DER) PostgreSQL at `port` presents, verified
    against `ca` for 127.0.0.1."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        raw.sendall(SSL_REQUEST)
        assert raw.recv(1) == b"S"
        ctx = ssl.create_default_context(cafile=str(ca))
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)
    finally:
        raw.close()


def test_compute_key_is_the_endpoints_own(cluster):
    ep = start_endpoint(cluster, "ep")
    workdir = cluster.workdir
    own_key = (ep.dir / "tls.key").read_text()
    assert (ep.dir / "tls.key").stat().st_mode & 0o077 == 0
    # Applications, who log in as the application role, read no file at all.
    with ep.app_connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_read_file('server.key')")
    # What the superuser (the agent's, through the socket) reads from SQL
    # is the endpoint's key, no other.
    from_sql = ep.sql("SELECT pg_read_file('server.key')")[0][0]
    assert from_sql == own_key
    secrets = service_secrets(workdir)
    for name, secret in secrets.items():
        assert secret not in from_sql.encode(), f"pg_read_file('server.key') holds {name}"
    # No file of the data directory holds a service's key or token (what
    # the lazy file systems serve is the branch's data, from pages).
    mounts = [f"{m}/" for m in ep.lazy_mounts()]
    for path in ep.pgdata.rglob("*"):
        if any(str(path).startswith(m) for m in mounts):
            continue
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            for name, secret in secrets.items():
                assert secret not in data, f"{path.relative_to(ep.pgdata)} holds {name}"
    # PostgreSQL presents the endpoint's certificate, issued by the
    # cluster's CA, and not a host's.
    port = ep.conninfo()["port"]
    served = served_certificate(int(port), cluster.ca)
    assert served == ssl.PEM_cert_to_DER_cert((ep.dir / "tls.pem").read_text())
    for host_cert in (workdir / "tls").glob("*.pem"):
        if host_cert.name != "ca.pem":
            assert served != ssl.PEM_cert_to_DER_cert(host_cert.read_text()), host_cert.name
    # Each start issues a new one.
    ep.stop()
    ep.start()
    assert (ep.dir / "tls.key").read_text() != own_key
    assert ep.sql("SELECT pg_read_file('server.key')")[0][0] == (ep.dir / "tls.key").read_text()


class Impostor:
    """A listener on a stopped compute's port that records what clients
    send it: answers the SSLRequest with `N` (no TLS), or with `S` and a
    TLS handshake with a certificate the cluster's CA did not issue."""

    def __init__(self, port: int, tls: ssl.SSLContext | None):
        self.tls = tls
        self.received = b""
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(30)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.settimeout(10)
        with conn:
            try:
                self.received += conn.recv(8)
                if self.tls is None:
                    conn.sendall(b"N")
                    self.received += conn.recv(4096)
                    return
                conn.sendall(b"S")
                with self.tls.wrap_socket(conn, server_side=True) as tls:
                    self.received += tls.recv(4096)
            except (OSError, ssl.SSLError):
                pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=30)


def self_signed(tmp_path: Path) -> ssl.SSLContext:
    cert, key = tmp_path / "impostor.pem", tmp_path / "impostor.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def test_printed_connection_string_refuses_a_server_on_its_port(cluster, tmp_path):
    ep = start_endpoint(cluster, "ep")
    connstr = ep.connstr
    assert "sslmode=verify-full" in connstr and f"sslrootcert={cluster.ca}" in connstr, connstr
    port = int(ep.app_conninfo()["port"])
    password = ep.app_conninfo()["password"]
    ep.stop()
    for what, tls in (("plaintext", None), ("another CA's certificate", self_signed(tmp_path))):
        impostor = Impostor(port, tls)
        try:
            with pytest.raises(psycopg.OperationalError) as refused:
                psycopg.connect(connstr, connect_timeout=10)
        finally:
            impostor.close()
        message = str(refused.value)
        assert "SSL" in message or "certificate" in message, (what, message)
        # The client sent its SSLRequest and nothing after it: no startup
        # packet, no user name, nothing derived from the password.
        assert impostor.received == SSL_REQUEST, (what, impostor.received)
        assert password.encode() not in impostor.received
    # The endpoint, started again on its port, is accepted.
    ep.start()
    assert int(ep.app_conninfo()["port"]) == port
    with ep.app_connect() as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
