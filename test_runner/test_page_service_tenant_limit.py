"""One tenant cannot hold every connection of the pageserver's page service
(docs/pageserver.md, "Connections and limits"; docs/pageserver-protocol.md,
"Errors"): with `max_connections_per_tenant = 3`,

- a tenant's first three hellos are answered `HelloOk` and their
  connections serve requests;
- its fourth is refused with `Error(Overloaded)` of id 0, whose message
  names the tenant and the limit, and the server closes the connection; a
  service token for the same tenant is refused the same way (the limit is
  the tenant's, whatever the token's scope);
- another tenant on the same pageserver still connects, up to its own three;
- once one of the first tenant's connections closes, it connects again;
- the refusals are counted in
  `page_connections_refused_total{reason="tenant_limit"}`, the tenants at
  their limit in `page_tenants_at_limit`, and once every connection is
  closed no tenant is tracked any more (`page_tenants_connected` is 0).

The second tenant is a real one: before the cluster starts, the storage
controller is told to place it too, and once it has attached it to the
pageserver, the pageserver bootstraps it through its API
(`POST /v1/tenant`), as `strata start` does for the first.
"""

from __future__ import annotations

import re
import uuid

from fixtures import page_protocol as pp
from fixtures.cluster import LocalCluster
from fixtures.strata import http_text
from fixtures.wait import wait_until

LIMIT = 3
REFUSED = "strata_pageserver_page_connections_refused_total"
AT_LIMIT = "strata_pageserver_page_tenants_at_limit"
CONNECTED = "strata_pageserver_page_tenants_connected"
# RelSize of pg_database's main fork (global tablespace): in every bootstrap.
PG_DATABASE_SIZE = pp.rel_size_frame(1, 0, 1664, 0, 1262, 0)


def tenant_limit_refusals(c: LocalCluster) -> float:
    """The pageserver's count of connections refused for their tenant's limit."""
    text = http_text(c.http_url("pageserver", "/metrics"))
    m = re.search(rf'^{REFUSED}{{reason="tenant_limit"}} (\S+)$', text, re.M)
    assert m, f"no {REFUSED}{{reason=\"tenant_limit\"}} in the pageserver's metrics"
    return float(m.group(1))


def gauges(c: LocalCluster) -> tuple[float, float]:
    """(tenants with a page service connection, tenants at their limit)."""
    m = c.metrics("pageserver")
    return m[CONNECTED], m[AT_LIMIT]


def connect(address: str, tenant: str, timeline: str, token: str) -> pp.PageClient:
    """A connection past its hello that answers a request; fails otherwise."""
    cl = pp.PageClient(address, timeout=30)
    answer = cl.hello(tenant, timeline, token=token)
    if not isinstance(answer, pp.HelloOk):
        cl.close()
        raise AssertionError(f"hello of tenant {tenant} refused: {answer}")
    r = cl.request(PG_DATABASE_SIZE)
    assert isinstance(r, pp.Size) and r.blocks > 0, r
    return cl


def refused_for_limit(address: str, tenant: str, timeline: str, token: str) -> pp.Error:
    """A hello that must be refused for the tenant's limit; the server
    must close the connection after it."""
    with pp.PageClient(address, timeout=30) as cl:
        answer = cl.hello(tenant, timeline, token=token)
        assert isinstance(answer, pp.Error), f"hello of tenant {tenant} beyond its limit: {answer}"
        assert (answer.id, answer.code_name) == (0, "Overloaded"), answer
        assert cl.closed_by_server(), "the connection stays open after the refusal"
    return answer


def test_one_tenant_cannot_hold_every_page_service_connection(cluster_factory):
    c = cluster_factory(start=False)
    t1, l1 = c.tenant_id(), c.timeline_id("main")
    t2, l2 = uuid.uuid4().hex, uuid.uuid4().hex
    c.configure("pageserver", {"max_connections_per_tenant": LIMIT})
    placed = c.service_config("controller")["tenants"]
    assert placed == [t1], placed
    c.configure("controller", {"tenants": [t1, t2]})
    c.start()

    def bootstrapped():
        code, body = c.http("pageserver", "POST", "/v1/tenant", {"tenant_id": t2, "timeline_id": l2}, timeout=120)
        if code == 412:
            return None  # the controller has not attached it yet
        assert code in (201, 409), (code, body)  # 409: an earlier try created it
        return True
    wait_until(f"tenant {t2} bootstrapped on the pageserver", bootstrapped, timeout=60, interval=0.5,
               retry=(OSError,))

    mint = lambda *extra: c.run("auth", "token", *extra).stdout.strip()  # noqa: E731
    token1, token2 = mint("--scope", "tenant"), mint("--scope", "tenant", "--tenant", t2)
    service = mint("--scope", "service")
    address = f"127.0.0.1:{next(s['ports']['pg'] for s in c.cluster_toml['services'] if s['name'] == 'pageserver')}"

    refusals_before = tenant_limit_refusals(c)
    assert gauges(c) == (0, 0), "page service connections before the test opened any"
    first = [connect(address, t1, l1, token1) for _ in range(LIMIT)]
    try:
        assert gauges(c) == (1, 1)
        refusal = refused_for_limit(address, t1, l1, token1)
        assert "too many connections for tenant" in refusal.message and t1 in refusal.message, refusal
        assert str(LIMIT) in refusal.message, refusal
        assert token1 not in refusal.message
        # The limit is the tenant's, whatever the token.
        refused_for_limit(address, t1, l1, service)
        assert tenant_limit_refusals(c) - refusals_before == 2

        # The held connections still serve.
        for cl in first:
            assert isinstance(cl.request(PG_DATABASE_SIZE), pp.Size)

        # Another tenant connects, up to its own limit.
        second = [connect(address, t2, l2, token2) for _ in range(LIMIT)]
        try:
            assert gauges(c) == (2, 2)
            refused_for_limit(address, t2, l2, token2)
            assert tenant_limit_refusals(c) - refusals_before == 3
        finally:
            for cl in second:
                cl.close()
        wait_until("the second tenant's connections closed", lambda: gauges(c) == (1, 1), timeout=10)

        # One of the first tenant's closes: it connects again (the server
        # sees the close asynchronously; the gauge says when).
        first.pop().close()
        wait_until("a place of the first tenant given back", lambda: gauges(c) == (1, 0), timeout=10)
        first.append(connect(address, t1, l1, token1))
        assert gauges(c) == (1, 1)
        refused_for_limit(address, t1, l1, token1)
        assert tenant_limit_refusals(c) - refusals_before == 4
    finally:
        for cl in first:
            cl.close()
    # No tenant is tracked once its connections are gone.
    wait_until("every tenant's connections closed", lambda: gauges(c) == (0, 0), timeout=10)
    assert tenant_limit_refusals(c) - refusals_before == 4
