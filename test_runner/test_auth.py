"""Tokens on every interface of a running local cluster (docs/security.md):
the HTTP APIs, the page service, the safekeepers' protocol and their
PostgreSQL-protocol WAL service:
each listener refuses a call without a token, with a malformed one, with
one of another cluster's key, with an expired one, and with a scope or a
tenant that does not allow it; a refused call changes nothing and is
counted; the right token gets through."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error

from fixtures import page_protocol as pp
from fixtures import sk_protocol as skp
from fixtures.endpoint import Endpoint
from fixtures.strata import http_json, urlopen
from fixtures.tokens import claims_of, header_of
from fixtures.wait import wait_until

SAFEKEEPERS = ["sk1", "sk2", "sk3"]


def call(url: str, token: str | None, method: str = "GET") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urlopen(url, method, headers=headers, token=False) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def refusals(text: str, prefix: str) -> float:
    """All of a service's `auth_refusals_total{…}` samples, summed."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"{prefix}_auth_refusals_total{{"))


def test_every_http_api_refuses_bad_tokens_and_changes_nothing(cluster_factory, pg_bin_dir):
    c = cluster_factory()
    other = cluster_factory(start=False)  # another cluster: another key
    ep = Endpoint(c, "main")
    ep.start()
    ct = c.cluster_toml
    tenant = c.tenant_id()
    timeline = c.timeline_id("main")
    tl = f"/v1/tenant/{tenant}/timeline/{timeline}"
    mint = lambda cl, scope, *extra: cl.run("auth", "token", "--scope", scope, *extra).stdout.strip()  # noqa: E731
    management, service = mint(c, "management"), mint(c, "service")
    tenant_token = mint(c, "tenant")
    other_tenant = mint(c, "tenant", "--tenant", "ab" * 16)
    foreign = mint(other, "management")
    expiring = mint(c, "management", "--ttl-secs", "1")
    minted = time.monotonic()

    ports = {s["name"]: s["ports"]["http"] for s in ct["services"]}
    ports["agent"] = ep.http_port
    prefixes = {**{n: "strata_safekeeper" for n in SAFEKEEPERS}, "pageserver": "strata_pageserver",
                "controller": "strata_controller", "agent": "strata_compute", "proxy": "strata_proxy"}
    # The tenant route of each listener: a timeline's status, a controller's attachment.
    tenant_paths = {"controller": f"/v1/tenant/{tenant}/attachment"}
    # (listener, path) of a service-scope route and, where there is one, a tenant route.
    for name, port in ports.items():
        base = f"http://127.0.0.1:{port}"
        before = refusals(call(f"{base}/metrics", management)[1], prefixes[name])
        bad = [(None, 401, "no token"), ("not-a-token", 401, "malformed"), ("a.b.c", 401, "malformed"),
               (foreign, 401, "no longer trusts (or never did)"), (tenant_token, 403, "needs service scope")]
        for token, status, words in bad:
            code, body = call(f"{base}/v1/status", token)
            assert code == status and words in body, (name, token and token[:12], code, body)
            if token:
                assert token not in body
        assert call(f"{base}/v1/status", service)[0] == 200, name
        assert call(f"{base}/v1/status", management)[0] == 200, name
        # The agent and the proxy have no tenant route.
        if name not in ("agent", "proxy"):
            path = tenant_paths.get(name, tl)
            assert call(f"{base}{path}", tenant_token)[0] == 200, name
            code, body = call(f"{base}{path}", other_tenant)
            assert code == 403 and "another tenant" in body, (name, code, body)
        after = refusals(call(f"{base}/metrics", service)[1], prefixes[name])
        assert after - before == len(bad) + (0 if name in ("agent", "proxy") else 1), (name, before, after)

    # Management calls with lesser scopes are refused and change nothing.
    ps = f"http://127.0.0.1:{ports['pageserver']}"
    timelines_before = len(http_json("GET", f"{ps}/v1/status")[1]["timelines"])
    for token in [service, tenant_token]:
        assert call(f"{ps}{tl}", token, "DELETE")[0] == 403
        assert call(f"{ps}/v1/tenant/{tenant}/timeline", token, "POST")[0] == 403
        assert call(f"{ps}/v1/tenant", token, "POST")[0] == 403
    # Placing a tenant (attach, detach) needs a controller's token: the
    # services' token, which every host holds, may not.
    location = f"{ps}/v1/tenant/{tenant}/location"
    for token in [service, tenant_token]:
        code, body = call(location, token, "PUT")
        assert code == 403 and "needs controller scope" in body, (code, body)
    controller_token = mint(c, "controller")
    assert (c.workdir / "auth" / "controller.token").read_text().strip() != service
    for token in [controller_token, (c.workdir / "auth" / "controller.token").read_text().strip()]:
        # Past the token check, refused by the handler for its empty body.
        code, body = call(location, token, "PUT")
        assert code not in (401, 403) and 400 <= code < 500, (code, body)
    assert c.service_config("controller")["auth"]["token_file"].endswith("auth/controller.token")
    # A split's children's indexes are the controllers' to ask for: the
    # tenant's own token may not split it, on either listener.
    split = f"{ps}/v1/tenant/{tenant}/split"
    for token in [service, tenant_token]:
        code, body = call(split, token, "POST")
        assert code == 403 and "needs controller scope" in body, (code, body)
    code, body = call(split, controller_token, "POST")
    assert code not in (401, 403) and 400 <= code < 500, (code, body)
    ctl = f"http://127.0.0.1:{ports['controller']}"
    for token in [service, tenant_token, other_tenant]:
        assert call(f"{ctl}/v1/pageserver/pageserver/drain", token, "POST")[0] == 403
        code, body = call(f"{ctl}/v1/tenant/{tenant}/split", token, "POST")
        assert code == 403 and "needs management scope" in body, (code, body)
        assert call(f"{ctl}/v1/tenant/{tenant}/split", token)[0] == 403
    code, body = call(f"{ctl}/v1/tenant/{tenant}/split", management)
    assert code == 404 and "never split" in body, (code, body)
    assert http_json("GET", f"{ctl}/v1/status")[1]["state"]["pageservers"] == {}
    for name in SAFEKEEPERS:
        sk = f"http://127.0.0.1:{ports[name]}"
        assert call(f"{sk}{tl}", tenant_token, "DELETE")[0] == 403
        assert call(f"{sk}{tl}", service, "DELETE")[0] == 403
        assert call(f"{sk}{tl}/membership", service, "PUT")[0] == 403
    assert len(http_json("GET", f"{ps}/v1/status")[1]["timelines"]) == timelines_before
    for name in [*SAFEKEEPERS, "pageserver"]:
        code, body = http_json("GET", c.http_url(name, tl))
        assert code == 200, (name, body)
    # The compute kept working throughout.
    ep.sql("CREATE TABLE t AS SELECT 1 AS x")
    assert ep.sql("SELECT count(*) FROM t") == [(1,)]

    # The page service: the token travels in the hello, and the refusal
    # comes before the timeline is looked up (an unknown one is refused the same).
    page = f"127.0.0.1:{next(s['ports']['pg'] for s in ct['services'] if s['name'] == 'pageserver')}"
    before = refusals(call(f"{ps}/metrics", service)[1], "strata_pageserver")
    for tl_id, token, version, code in [
        (timeline, "", 2, pp.ERR_UNAUTHORIZED),
        (timeline, "", 1, pp.ERR_UNAUTHORIZED),
        (timeline, foreign, 2, pp.ERR_UNAUTHORIZED),
        (timeline, other_tenant, 2, pp.ERR_FORBIDDEN),
        ("ef" * 16, other_tenant, 2, pp.ERR_FORBIDDEN),
        (timeline, service, 2, None),
        (timeline, tenant_token, 2, None),
    ]:
        with pp.PageClient(page) as cl:
            answer = cl.hello(tenant, tl_id, version=version, token=token)
            if code is None:
                assert isinstance(answer, pp.HelloOk), answer
                r = cl.request(pp.rel_size_frame(1, 0, 1664, 0, 1262, 0))
                assert isinstance(r, pp.Size), r
            else:
                assert isinstance(answer, pp.Error) and answer.id == 0 and answer.code == code, (token[:12], answer)
                assert token == "" or token not in answer.message
    after = refusals(call(f"{ps}/metrics", service)[1], "strata_pageserver")
    assert after - before == 5, (before, after)

    # The safekeepers' PostgreSQL-protocol WAL service takes the token as a
    # cleartext password (PGPASSWORD), checked before the timeline is looked up.
    sk_pg = ct["services"][0]["ports"]["pg"]
    before = refusals(call(f"http://127.0.0.1:{ports['sk1']}/metrics", service)[1], "strata_safekeeper")

    def identify(token: str | None, tl_id: str = timeline) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", ""), "PGCONNECT_TIMEOUT": "10"}
        if token is not None:
            env["PGPASSWORD"] = token
        conn = (f"host=127.0.0.1 port={sk_pg} user=strata dbname=replication replication=true "
                f"sslmode=verify-full sslrootcert={c.ca} options='-c strata.timeline={tenant}/{tl_id}'")
        return subprocess.run([str(pg_bin_dir / "psql"), "-X", "-w", "-At", "-d", conn, "-c", "IDENTIFY_SYSTEM"],
                              env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    for token, words in [(None, "no password supplied"), ("garbage", "malformed"),
                         (foreign, "no longer trusts (or never did)"), (other_tenant, "another tenant")]:
        r = identify(token)
        assert r.returncode != 0 and words in r.stderr, (token and token[:12], r.returncode, r.stdout, r.stderr)
        assert token is None or token not in r.stderr
    for token in [tenant_token, service]:
        r = identify(token)
        assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)
    after = refusals(call(f"http://127.0.0.1:{ports['sk1']}/metrics", service)[1], "strata_safekeeper")
    # psql without a password gives up before it sends one: no refusal to count.
    assert after - before == 3, (before, after)

    # The safekeeper protocol: greetings (proposers) and stream requests
    # (pageservers, peers) carry the token, checked before the timeline is
    # looked up; the tenant's computes and the services get through.
    sk_proto = f"127.0.0.1:{ct['services'][0]['ports']['listen']}"
    code, status = http_json("GET", c.http_url("sk1", tl))
    assert code == 200, status
    hi, lo = status["flush_lsn"].split("/")
    flush = (int(hi, 16) << 32) | int(lo, 16)
    before = refusals(call(f"http://127.0.0.1:{ports['sk1']}/metrics", service)[1], "strata_safekeeper")
    refused = [("", skp.ERR_UNAUTHORIZED), ("not-a-token", skp.ERR_UNAUTHORIZED),
               (foreign, skp.ERR_UNAUTHORIZED), (other_tenant, skp.ERR_FORBIDDEN)]
    for token, want in refused:
        for first in [skp.greeting_frame(tenant, timeline, status["system_id"], token),
                      skp.start_streaming_frame(tenant, timeline, flush, token)]:
            answer = skp.exchange(sk_proto, first)
            assert answer.code == want, (token[:12], answer)
            assert token == "" or token not in answer.message
    unknown = skp.exchange(sk_proto, skp.greeting_frame("cd" * 16, timeline, status["system_id"], ""))
    assert unknown.code == skp.ERR_UNAUTHORIZED, unknown
    for token in [tenant_token, management]:
        answer = skp.exchange(sk_proto, skp.greeting_frame(tenant, timeline, status["system_id"], token))
        assert answer.tag == skp.TAG_ACCEPTOR_GREETING, answer
    for token in [tenant_token, service]:
        answer = skp.exchange(sk_proto, skp.start_streaming_frame(tenant, timeline, flush, token))
        assert answer.tag == skp.TAG_STREAM_START, answer
    # The services read WAL but never propose it.
    answer = skp.exchange(sk_proto, skp.greeting_frame(tenant, timeline, status["system_id"], service))
    assert answer.code == skp.ERR_FORBIDDEN and "needs tenant scope" in answer.message, answer
    after = refusals(call(f"http://127.0.0.1:{ports['sk1']}/metrics", service)[1], "strata_safekeeper")
    assert after - before == 2 * len(refused) + 2, (before, after)
    # The compute still commits through the safekeepers.
    ep.sql("INSERT INTO t VALUES (2)")
    assert ep.sql("SELECT count(*) FROM t") == [(2,)]

    # An expired token (past the 10 s leeway) is refused; a fresh one is not.
    time.sleep(max(0.0, minted + 1 + 10 + 1.5 - time.monotonic()))
    code, body = call(f"{ps}/v1/status", expiring)
    assert code == 401 and "expired" in body, (code, body)
    assert call(f"{ps}/v1/status", management)[0] == 200


def test_tokens_bound_to_a_timeline_and_read_only(cluster):
    """A writer's token names its timeline and may propose on it; a
    replica's may only read; neither reaches another timeline of the
    tenant (docs/security.md, "Scopes")."""
    c = cluster
    ep = Endpoint(c, "main")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT 1 AS x")
    c.run("branch", "create", "dev")
    tenant, main, dev = c.tenant_id(), c.timeline_id("main"), c.timeline_id("dev")
    mint = lambda *extra: c.run("auth", "token", "--scope", "tenant", *extra).stdout.strip()  # noqa: E731
    writer, reader = mint("--timeline", main), mint("--timeline", main, "--read-only")
    assert claims_of(writer)["timeline_id"] == main and "read_only" not in claims_of(writer)
    assert claims_of(reader)["read_only"] is True
    # What the CLI gives the endpoint's agent: its branch, and it writes.
    agent = claims_of((ep.dir / "agent.token").read_text().strip())
    assert (agent["scope"], agent["tenant_id"], agent["timeline_id"]) == ("tenant", tenant, main), agent
    assert not agent.get("read_only"), agent
    services = {s["name"]: s for s in c.cluster_toml["services"]}

    # The page service and the HTTP API: their timeline, not another.
    page = f"127.0.0.1:{services['pageserver']['ports']['pg']}"
    for tl_id, token, code in [(main, writer, None), (main, reader, None), (dev, writer, pp.ERR_FORBIDDEN),
                               (dev, reader, pp.ERR_FORBIDDEN)]:
        with pp.PageClient(page) as cl:
            answer = cl.hello(tenant, tl_id, version=2, token=token)
            if code is None:
                assert isinstance(answer, pp.HelloOk), answer
            else:
                assert isinstance(answer, pp.Error) and answer.code == code, answer
                assert "another timeline" in answer.message, answer
    ps = f"http://127.0.0.1:{services['pageserver']['ports']['http']}"
    assert call(f"{ps}/v1/tenant/{tenant}/timeline/{main}", reader)[0] == 200
    code, body = call(f"{ps}/v1/tenant/{tenant}/timeline/{dev}", writer)
    assert code == 403 and "another timeline" in body, (code, body)
    ctl = f"http://127.0.0.1:{services['controller']['ports']['http']}"
    assert call(f"{ctl}/v1/tenant/{tenant}/attachment", reader)[0] == 200, "where the tenant is"

    # The safekeepers: a reader streams but never proposes; a writer
    # proposes on its timeline only.
    sk_proto = f"127.0.0.1:{services['sk1']['ports']['listen']}"
    sk_status = http_json("GET", c.http_url("sk1", f"/v1/tenant/{tenant}/timeline/{main}"))[1]
    sysid = sk_status["system_id"]
    hi, lo = sk_status["flush_lsn"].split("/")
    flush = (int(hi, 16) << 32) | int(lo, 16)
    answer = skp.exchange(sk_proto, skp.greeting_frame(tenant, main, sysid, reader))
    assert answer.code == skp.ERR_FORBIDDEN and "read-only" in answer.message, answer
    answer = skp.exchange(sk_proto, skp.greeting_frame(tenant, dev, sysid, writer))
    assert answer.code == skp.ERR_FORBIDDEN and "another timeline" in answer.message, answer
    assert skp.exchange(sk_proto, skp.greeting_frame(tenant, main, sysid, writer)).tag == skp.TAG_ACCEPTOR_GREETING
    assert skp.exchange(sk_proto, skp.start_streaming_frame(tenant, main, flush, reader)).tag == skp.TAG_STREAM_START
    answer = skp.exchange(sk_proto, skp.start_streaming_frame(tenant, dev, flush, reader))
    assert answer.code == skp.ERR_FORBIDDEN, answer

    # A replica's agent gets a read-only token of its writer's branch, and
    # still streams and serves.
    replica = Endpoint(c, "r1")
    replica.start("--replica-of", "main")
    got = claims_of((replica.dir / "agent.token").read_text().strip())
    assert (got["timeline_id"], got.get("read_only")) == (main, True), got
    ep.sql("INSERT INTO t VALUES (2)")
    wait_until("the replica replays the insert", lambda: replica.sql("SELECT count(*) FROM t") == [(2,)], timeout=60)
    # The writer still commits.
    ep.sql("INSERT INTO t VALUES (3)")
    assert ep.sql("SELECT count(*) FROM t") == [(3,)]


def agent_token(ep: Endpoint) -> dict:
    """What an endpoint's agent says of its token (`token` of its status)."""
    status = ep.agent_status()
    return status.get("agent", status).get("token") or {}


def test_keys_rotate_and_tokens_are_revoked_without_a_restart(cluster):
    """`strata auth rotate` trusts new keys everywhere, then signs with them
    (the services' own tokens too, taken up without a restart; the agents
    renew theirs at a controller), and `--retire` refuses the old keys'
    tokens; `strata auth revoke` puts one token on the deny list every
    service reads (docs/security.md, "Keys and their rotation")."""
    c = cluster
    ep = Endpoint(c, "main")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT 1 AS x")
    replica = Endpoint(c, "r1")
    replica.start("--replica-of", "main")
    services = {s["name"]: s for s in c.cluster_toml["services"]}
    ps = f"http://127.0.0.1:{services['pageserver']['ports']['http']}"
    sk = f"http://127.0.0.1:{services['sk1']['ports']['http']}"
    mint = lambda *extra: c.run("auth", "token", *extra).stdout.strip()  # noqa: E731
    keys = lambda: [line.split() for line in c.run("auth", "keys").stdout.splitlines()]  # noqa: E731
    pids = {name: c.pid(name) for name in ("pageserver", "sk1", "controller")}

    listed = keys()
    assert [(k, role) for k, _, role in listed] == [("cluster", "signs"), ("issuer", "signs")], listed
    old_kid, old_issuer = listed[0][1], listed[1][1]
    # The agents' tokens expire (an hour) and name the key that signed them.
    agent = claims_of((ep.dir / "agent.token").read_text().strip())
    assert agent["exp"] - agent["iat"] == 3600, agent
    assert agent_token(ep)["kid"] == old_kid
    old_management = mint("--scope", "management")
    old_service_token = (c.workdir / "auth" / "service.token").read_text().strip()
    assert call(f"{ps}/v1/status", old_management)[0] == 200

    out = c.run("auth", "rotate").stdout
    listed = keys()
    new_kid, new_issuer = listed[0][1], listed[2][1]
    assert [(k, role) for k, _, role in listed] == [("cluster", "signs"), ("cluster", "trusted"),
                                                   ("issuer", "signs"), ("issuer", "trusted")], listed
    assert (listed[1][1], listed[3][1]) == (old_kid, old_issuer)
    assert new_kid in out and new_kid != old_kid
    new_management = mint("--scope", "management")
    assert claims_of(new_management)["jti"] != claims_of(old_management).get("jti")
    assert header_of(new_management)["kid"] == new_kid
    # Both keys' tokens are accepted during the overlap.
    for token in (old_management, new_management):
        assert call(f"{ps}/v1/status", token)[0] == 200
        assert call(f"{sk}/v1/status", token)[0] == 200
    # The services' own tokens are signed again with the new key.
    new_service_token = (c.workdir / "auth" / "service.token").read_text().strip()
    assert new_service_token != old_service_token
    assert header_of(new_service_token)["kid"] == new_kid
    # The agents renew theirs at a controller: signed by the new issuer key,
    # the same claims and id, a new expiry; a replica's password file too.
    for e in (ep, replica):
        wait_until(f"{e.name}'s agent renews its token",
                   lambda e=e: agent_token(e).get("kid") == new_issuer, timeout=60)
        assert agent_token(e)["renewals"] >= 1 and agent_token(e)["last_error"] is None
    renewed = (ep.dir / "agent.token").read_text().strip()
    assert header_of(renewed)["kid"] == new_issuer
    got = claims_of(renewed)
    assert {k: got.get(k) for k in ("scope", "tenant_id", "timeline_id", "jti")} == \
        {k: agent.get(k) for k in ("scope", "tenant_id", "timeline_id", "jti")}, (got, agent)
    replica_token = (replica.dir / "agent.token").read_text().strip()
    assert claims_of(replica_token)["read_only"] is True
    assert (replica.pgdata / "strata_replication.pgpass").read_text().strip().endswith(replica_token)

    c.run("auth", "rotate", "--retire")
    assert [(k, kid) for k, kid, _ in keys()] == [("cluster", new_kid), ("issuer", new_issuer)]
    # Each verifier reads its key file again within a second or so.
    for url in (ps, sk):
        wait_until("the old key's tokens are refused", lambda url=url: call(f"{url}/v1/status", old_management)[0] == 401)
    code, body = call(f"{sk}/v1/status", old_management)
    assert code == 401 and "no longer trusts" in body, (code, body)
    code, body = call(f"{ps}/v1/status", old_service_token)
    assert code == 401, (code, body)
    assert call(f"{ps}/v1/status", new_management)[0] == 200
    # The services, now with the new key's tokens, still talk to each other,
    # and the computes with their renewed ones: WAL reaches the pageserver
    # and the replica, and a restarted compute reads its pages.
    ep.sql("INSERT INTO t VALUES (2)")
    wait_until("the replica replays the insert", lambda: replica.sql("SELECT count(*) FROM t") == [(2,)], timeout=60)
    ep.stop()
    ep.start()
    assert ep.sql("SELECT count(*) FROM t") == [(2,)]
    assert {name: c.pid(name) for name in pids} == pids, "no service was restarted"

    # Revocation: by the token itself, and by id; only that token.
    revoked, kept = mint("--scope", "management"), mint("--scope", "management")
    path = c.workdir / "revoke-me.token"
    path.write_text(revoked)
    path.chmod(0o600)
    out = c.run("auth", "revoke", "--token-file", str(path)).stdout
    assert claims_of(revoked)["jti"] in out
    for url in (ps, sk):
        wait_until("the revoked token is refused", lambda url=url: call(f"{url}/v1/status", revoked)[0] == 401)
    code, body = call(f"{sk}/v1/status", revoked)
    assert code == 401 and "revoked" in body, (code, body)
    assert call(f"{ps}/v1/status", kept)[0] == 200
    by_id = mint("--scope", "tenant")
    c.run("auth", "revoke", "--id", claims_of(by_id)["jti"])
    tl = f"{ps}/v1/tenant/{c.tenant_id()}/timeline/{c.timeline_id('main')}"
    wait_until("the token revoked by id is refused", lambda: call(tl, by_id)[0] == 401)
    metrics = call(f"{ps}/metrics", kept)[1]
    for reason in ("unknown_key", "revoked"):
        assert f'reason="{reason}"' in metrics, reason
    # Bad input: an id no token has, a token file others may read.
    assert c.run("auth", "revoke", "--id", "not an id", check=False).returncode == 2
    path.chmod(0o644)
    result = c.run("auth", "revoke", "--token-file", str(path), check=False)
    assert result.returncode != 0 and "600" in result.stderr, result.stderr
    # The endpoint still works after everything.
    ep.sql("INSERT INTO t VALUES (3)")
    assert ep.sql("SELECT count(*) FROM t") == [(3,)]


def test_a_renewal_keeps_the_claims_and_an_issuer_mints_nothing_else(cluster):
    """The controller renews a tenant token it is shown (same claims and id,
    a new expiry, its issuer's key) and nothing else; what an issuer's key
    could sign beyond that is refused by every service."""
    c = cluster
    services = {s["name"]: s for s in c.cluster_toml["services"]}
    ctl = f"http://127.0.0.1:{services['controller']['ports']['http']}"
    ps = f"http://127.0.0.1:{services['pageserver']['ports']['http']}"
    tenant, main = c.tenant_id(), c.timeline_id("main")
    mint = lambda *extra: c.run("auth", "token", *extra).stdout.strip()  # noqa: E731
    reader = mint("--scope", "tenant", "--timeline", main, "--read-only", "--ttl-secs", "600")
    code, body = call(f"{ctl}/v1/tenant/{tenant}/token", reader, "POST")
    assert code == 200, (code, body)
    import json
    renewed = json.loads(body)["token"]
    before, after = claims_of(reader), claims_of(renewed)
    for k in ("scope", "tenant_id", "timeline_id", "read_only", "jti"):
        assert after[k] == before[k], k
    assert after["exp"] - after["iat"] == 600 and after["iat"] >= before["iat"]
    issuer_kid = [line.split()[1] for line in c.run("auth", "keys").stdout.splitlines() if line.startswith("issuer")][0]
    assert header_of(renewed)["kid"] == issuer_kid
    assert call(f"{ps}/v1/tenant/{tenant}/timeline/{main}", renewed)[0] == 200
    # Another tenant's path, and tokens of other scopes: refused.
    assert call(f"{ctl}/v1/tenant/{'ab' * 16}/token", reader, "POST")[0] == 403
    for scope in ("management", "service", "controller"):
        code, body = call(f"{ctl}/v1/tenant/{tenant}/token", mint("--scope", scope), "POST")
        assert code == 403 and "only a token of tenant" in body, (scope, code, body)
    assert call(f"{ctl}/v1/tenant/{tenant}/token", None, "POST")[0] == 401
    # A renewed token revoked is refused with every renewal of it.
    c.run("auth", "revoke", "--id", before["jti"])
    wait_until("the renewal is revoked", lambda: call(f"{ps}/v1/status", renewed)[0] == 401)
    # Each verifier reads the deny list again within a second or so.
    wait_until("the controller renews it no more",
               lambda: call(f"{ctl}/v1/tenant/{tenant}/token", reader, "POST")[0] == 401)
    code, body = call(f"{ctl}/v1/tenant/{tenant}/token", reader, "POST")
    assert "revoked" in body, (code, body)
    # The issuer's private key is the controllers' alone.
    mode = (c.workdir / "auth" / "issuer.pem").stat().st_mode & 0o777
    assert mode == 0o600, oct(mode)


def test_the_audit_log_names_who_and_never_the_token(cluster):
    """Every refusal and every call that changes something is a JSON line in
    the service's audit log, with the verified token's scope, tenant and id,
    never the token (docs/security.md, "Audit log")."""
    import json
    c = cluster
    ep = Endpoint(c, "main")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT 1 AS x")
    services = {s["name"]: s for s in c.cluster_toml["services"]}
    ps = f"http://127.0.0.1:{services['pageserver']['ports']['http']}"
    tenant, main = c.tenant_id(), c.timeline_id("main")
    mint = lambda *extra: c.run("auth", "token", *extra).stdout.strip()  # noqa: E731
    management, tenant_token = mint("--scope", "management"), mint("--scope", "tenant")
    assert call(f"{ps}/v1/tenant/{tenant}/location", tenant_token, "PUT")[0] == 403
    assert call(f"{ps}/v1/status", None)[0] == 401
    assert call(f"{ps}/v1/tenant/{tenant}/timeline/{main}/checkpoint", management, "POST")[0] == 200

    def lines(name: str) -> list[dict]:
        return [json.loads(line) for line in (c.workdir / name / "audit.jsonl").read_text().splitlines()]

    got = lines("pageserver")
    assert all({"ts", "service", "interface", "action", "outcome", "scope"} <= set(e) for e in got), got[:3]
    assert all(e["service"] == "pageserver" for e in got)
    tenant_jti, management_jti = claims_of(tenant_token)["jti"], claims_of(management)["jti"]
    assert any(e["outcome"] == "refused" and e["reason"] == "scope" and e["scope"] == "tenant"
               and e["tenant_id"] == tenant and e["jti"] == tenant_jti
               and e["action"] == f"PUT /v1/tenant/{tenant}/location" for e in got), got
    assert any(e["outcome"] == "refused" and e["reason"] == "no_token" and e["scope"] is None
               and e["action"] == "GET /v1/status" for e in got), got
    assert any(e["outcome"] == "allowed" and e["scope"] == "management" and e["jti"] == management_jti
               and e["action"] == f"POST /v1/tenant/{tenant}/timeline/{main}/checkpoint" for e in got), got
    # The controller placed the tenant with its own token; reads are not audited.
    assert any(e["outcome"] == "allowed" and e["scope"] == "controller"
               and e["action"] == f"PUT /v1/tenant/{tenant}/location" for e in got), got
    assert not any(e["action"].startswith("GET ") and e["outcome"] == "allowed" for e in got), got
    # The safekeepers: the compute's proposer, by its timeline-bound token.
    sk = lines("sk1")
    assert any(e["outcome"] == "allowed" and e["interface"] == "proposer" and e["scope"] == "tenant"
               and e["action"] == f"proposer propose {tenant}/{main}" for e in sk), sk
    # Never a token, and private to the services' user.
    secrets = [management, tenant_token, (c.workdir / "auth" / "service.token").read_text().strip(),
               (ep.dir / "agent.token").read_text().strip()]
    for name in ("pageserver", "sk1", "controller"):
        path = c.workdir / name / "audit.jsonl"
        text = path.read_text()
        assert not any(s in text for s in secrets), name
        assert path.stat().st_mode & 0o777 == 0o600, name
