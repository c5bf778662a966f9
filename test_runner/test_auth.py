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
    tenant = ct["tenant_id"]
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
                "controller": "strata_controller", "agent": "strata_compute"}
    # The tenant route of each listener: a timeline's status, a controller's attachment.
    tenant_paths = {"controller": f"/v1/tenant/{tenant}/attachment"}
    # (listener, path) of a service-scope route and, where there is one, a tenant route.
    for name, port in ports.items():
        base = f"http://127.0.0.1:{port}"
        before = refusals(call(f"{base}/metrics", management)[1], prefixes[name])
        bad = [(None, 401, "no token"), ("not-a-token", 401, "malformed"), ("a.b.c", 401, "malformed"),
               (foreign, 401, "not signed by this cluster"), (tenant_token, 403, "needs service scope")]
        for token, status, words in bad:
            code, body = call(f"{base}/v1/status", token)
            assert code == status and words in body, (name, token and token[:12], code, body)
            if token:
                assert token not in body
        assert call(f"{base}/v1/status", service)[0] == 200, name
        assert call(f"{base}/v1/status", management)[0] == 200, name
        if name != "agent":
            path = tenant_paths.get(name, tl)
            assert call(f"{base}{path}", tenant_token)[0] == 200, name
            code, body = call(f"{base}{path}", other_tenant)
            assert code == 403 and "another tenant" in body, (name, code, body)
        after = refusals(call(f"{base}/metrics", service)[1], prefixes[name])
        assert after - before == len(bad) + (0 if name == "agent" else 1), (name, before, after)

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
    ctl = f"http://127.0.0.1:{ports['controller']}"
    for token in [service, tenant_token]:
        assert call(f"{ctl}/v1/pageserver/pageserver/drain", token, "POST")[0] == 403
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
                         (foreign, "not signed by this cluster"), (other_tenant, "another tenant")]:
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
    for token in [tenant_token, service]:
        answer = skp.exchange(sk_proto, skp.greeting_frame(tenant, timeline, status["system_id"], token))
        assert answer.tag == skp.TAG_ACCEPTOR_GREETING, answer
        answer = skp.exchange(sk_proto, skp.start_streaming_frame(tenant, timeline, flush, token))
        assert answer.tag == skp.TAG_STREAM_START, answer
    after = refusals(call(f"http://127.0.0.1:{ports['sk1']}/metrics", service)[1], "strata_safekeeper")
    assert after - before == 2 * len(refused) + 1, (before, after)
    # The compute still commits through the safekeepers.
    ep.sql("INSERT INTO t VALUES (2)")
    assert ep.sql("SELECT count(*) FROM t") == [(2,)]

    # An expired token (past the 10 s leeway) is refused; a fresh one is not.
    time.sleep(max(0.0, minted + 1 + 10 + 1.5 - time.monotonic()))
    code, body = call(f"{ps}/v1/status", expiring)
    assert code == 401 and "expired" in body, (code, body)
    assert call(f"{ps}/v1/status", management)[0] == 200
