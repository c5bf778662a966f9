"""A new tenant is imported from the pageserver's kept initdb output
(docs/pageserver.md, "Tenant bootstrap"): initdb runs once per
PostgreSQL install, and every tenant still has a system identifier and a
mock authentication nonce of its own."""

from __future__ import annotations

from fixtures.endpoint import start_endpoint


def identity(ep) -> tuple[int, bytes]:
    """The compute's system identifier, after a write that reads back, and
    the salt it answers SCRAM for a role that does not exist with."""
    with ep.connect() as conn:
        sysid = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
        conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
        assert conn.execute("SELECT sum(g) FROM t").fetchone()[0] == 500500
    return sysid, scram_salt_of_unknown_role(ep)


def test_tenants_of_one_template_have_identities_of_their_own(cluster_factory, tmp_path_factory):
    templates = tmp_path_factory.getbasetemp() / "initdb-template"
    a = cluster_factory()
    b = cluster_factory()
    for c in (a, b):
        assert c.service_config("pageserver")["initdb_template_dir"] == str(templates)
    # One template of 15 for both (and for every other cluster of 15 this
    # test process starts; other majors' are named pg18-...).
    built = [p.name for p in templates.iterdir() if p.name.startswith("pg15-")]
    assert len(built) == 1, built
    (sysid_a, salt_a), (sysid_b, salt_b) = (identity(start_endpoint(c, "ep")) for c in (a, b))
    assert sysid_a != sysid_b
    # What the pageserver reports (and the safekeepers were told) is the compute's.
    for c, sysid in ((a, sysid_a), (b, sysid_b)):
        assert c.timeline_status("pageserver")["system_id"] == sysid
    # The mock authentication nonce (the last 32 bytes before pg_control's
    # CRC) is each tenant's own too: the salt PostgreSQL answers a role
    # that does not exist with is derived from it.
    assert salt_a != salt_b


def scram_salt_of_unknown_role(ep) -> bytes:
    """The salt of the server's first SCRAM message for a role that does
    not exist (PostgreSQL makes it from the cluster's mock nonce)."""
    import base64
    import socket
    import ssl
    import struct

    info = ep.app_conninfo()
    raw = socket.create_connection((info.get("host", "127.0.0.1"), int(info["port"])), timeout=10)
    sock = raw
    if info.get("sslmode") not in (None, "disable"):
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S"
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        sock = ctx.wrap_socket(raw)
    params = b"user\0no_such_role\0database\0postgres\0\0"
    sock.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)

    def message() -> tuple[bytes, bytes]:
        head = recv_exact(sock, 5)
        return head[:1], recv_exact(sock, struct.unpack("!i", head[1:])[0] - 4)

    tag, body = message()
    assert tag == b"R" and struct.unpack("!i", body[:4])[0] == 10, (tag, body)  # SASL
    first = b"n,,n=,r=abcdefghijklmnopqrstuvwx"
    mech = b"SCRAM-SHA-256\0"
    sock.sendall(b"p" + struct.pack("!i", 4 + len(mech) + 4 + len(first)) + mech + struct.pack("!i", len(first)) + first)
    tag, body = message()
    assert tag == b"R" and struct.unpack("!i", body[:4])[0] == 11, (tag, body)  # SASL continue
    fields = dict(f.split(b"=", 1) for f in body[4:].split(b","))
    sock.close()
    return base64.b64decode(fields[b"s"])


def recv_exact(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out
