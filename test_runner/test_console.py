"""The console (docs/console.md): `strata console` over HTTPS with the
cluster's CA, driven in a real browser (Debian's Chromium through
Playwright) and through its JSON API.

In the browser an operator logs in, sees the tenants and the branch tree,
creates a branch, starts an endpoint, runs a query and pages its result,
watches the endpoint suspend itself and wake for the next query, adds a
replica and promotes it; the page logs no error and breaks no rule of its
content security policy. Each view is photographed (with
STRATA_CONSOLE_SCREENSHOTS=1, into docs/console/).

Through the API: who may do what (nobody without a session, a viewer
only sees, a user bound to a tenant sees no other, only a management
token logs in as admin), sessions end at logout and when their token is
revoked, changes need the CSRF token and JSON, failed logins lock a name
out, every answer carries the security headers, the console's files are
private, and each action lands in its audit log with its user."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from fixtures.console import CHROMIUM, Console, chromium_available, wait_for_snapshot
from fixtures.wait import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
OPERATOR = ("ada", "operator password 1")
VIEWER = ("vic", "viewer password 12")
IDLE = 4  # seconds without a client before the endpoint suspends


@pytest.fixture
def console(cluster):
    c = Console(cluster)
    c.start()
    yield c
    c.stop()


def endpoint_row(overview_or_tenant: dict, name: str) -> dict | None:
    return next((e for e in overview_or_tenant.get("endpoints", []) if e["name"] == name), None)


def tenant_view(client, tenant: str = "default") -> dict:
    status, answer = client.get(f"/api/tenants/{tenant}")
    assert status == 200, answer
    return answer


def wait_endpoint_state(client, name: str, state: str, timeout: float = 120) -> dict:
    seen = {}

    def check():
        seen["row"] = endpoint_row(tenant_view(client), name)
        return seen["row"] is not None and seen["row"]["state"] == state

    wait_until(f"endpoint {name} to be {state}", check, timeout, interval=0.5, details=lambda: seen.get("row"))
    return seen["row"]


@pytest.mark.skipif(not chromium_available(), reason="Debian's chromium is not installed")
def test_an_operator_works_the_cluster_in_a_browser(cluster, console, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    console.add_user(*OPERATOR, role="operator")
    shots = tmp_path / "shots"
    shots.mkdir()
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            # The console's certificate is trusted by its public key only
            # (the cluster's CA is not the browser's).
            args=["--no-sandbox", f"--ignore-certificate-errors-spki-list={console.spki_hash()}"],
        )
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        # The browser logs each answer of 401 (the session asked before the
        # login, the wrong password) as an error of its own; anything else
        # the page logs as an error, or a rule of its policy it breaks, fails.
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                if m.type == "error" and "status of 401" not in m.text else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.set_default_timeout(60_000)

        # Log in.
        page.goto(console.url + "/")
        page.get_by_test_id("login-user").fill(OPERATOR[0])
        page.get_by_test_id("login-password").fill("wrong password here")
        page.get_by_test_id("login-submit").click()
        expect(page.get_by_test_id("login-error")).to_be_visible()
        page.screenshot(path=str(shots / "login.png"))
        page.get_by_test_id("login-password").fill(OPERATOR[1])
        page.get_by_test_id("login-submit").click()

        # The tenants, then the default tenant's tree.
        expect(page.get_by_test_id("tenants-table")).to_be_visible()
        row = page.locator('[data-testid="tenant-row"][data-name="default"]')
        expect(row).to_be_visible()
        page.screenshot(path=str(shots / "tenants.png"))
        row.get_by_role("link").first.click()
        expect(page.locator('[data-testid="branch-node"][data-name="main"]')).to_be_visible()

        # A branch, made in the form.
        page.get_by_test_id("new-branch").first.click()
        page.get_by_test_id("branch-name").fill("dev")
        page.get_by_test_id("branch-submit").click()
        expect(page.locator('[data-testid="branch-node"][data-name="dev"]')).to_be_visible(timeout=120_000)
        branches = {b["name"]: b for t in cluster.cluster_toml["tenants"] for b in t["branches"]}
        assert branches["dev"]["parent"] == "main"

        # An endpoint that sleeps after a few idle seconds.
        page.get_by_test_id("new-endpoint").first.click()
        page.get_by_test_id("endpoint-name").fill("ep1")
        page.get_by_test_id("endpoint-branch").select_option("main")
        page.get_by_test_id("endpoint-suspend-after").fill(str(IDLE))
        page.get_by_test_id("endpoint-submit").click()
        ep_row = page.locator('[data-testid="endpoint-row"][data-name="ep1"]')
        expect(ep_row.get_by_test_id("endpoint-state")).to_have_text("running", timeout=180_000)
        shoot(page, shots / "tenant.png")

        # A query, its 120 rows paged.
        run_sql(page, "default", "ep1",
                "CREATE TABLE items (id int PRIMARY KEY, name text);\n"
                "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 120) g;\n"
                "SELECT id, name FROM items ORDER BY id;")
        results = page.get_by_test_id("sql-result")
        expect(results.last).to_contain_text("item 1", timeout=120_000)
        expect(page.get_by_test_id("sql-page-info").last).to_contain_text("120")
        page.get_by_test_id("sql-next").last.click()
        expect(results.last).to_contain_text("item 51")
        shoot(page, shots / "sql.png")

        # It sleeps once idle; the next query wakes it through the proxy.
        ep_row = open_tenant(page, "default").locator('[data-testid="endpoint-row"][data-name="ep1"]')
        expect(ep_row.get_by_test_id("endpoint-state")).to_have_text("suspended", timeout=120_000)
        shoot(page, shots / "suspended.png")
        run_sql(page, "default", "ep1", "SELECT count(*) AS n FROM items;")
        expect(page.get_by_test_id("sql-result").last).to_contain_text("120", timeout=180_000)
        ep_row = open_tenant(page, "default").locator('[data-testid="endpoint-row"][data-name="ep1"]')
        expect(ep_row.get_by_test_id("endpoint-state")).to_have_text("running", timeout=60_000)

        # A replica of it, then promoted.
        page.on("dialog", lambda d: d.accept("ep1r") if d.type == "prompt" else d.accept())
        ep_row.locator('[data-testid="endpoint-action"][data-action="replica"]').click()
        if page.get_by_test_id("dialog-input").count() and page.get_by_test_id("dialog-input").is_visible():
            page.get_by_test_id("dialog-input").fill("ep1r")
            page.get_by_test_id("dialog-ok").click()
        replica = page.locator('[data-testid="endpoint-row"][data-name="ep1r"]')
        expect(replica.get_by_test_id("endpoint-state")).to_have_text("running", timeout=180_000)
        replica.locator('[data-testid="endpoint-action"][data-action="promote"]').click()
        if page.get_by_test_id("dialog-ok").count() and page.get_by_test_id("dialog-ok").is_visible():
            page.get_by_test_id("dialog-ok").click()
        expect(page.get_by_test_id("message")).to_contain_text("ep1r", timeout=180_000)
        wait_until("ep1r to be the writer", lambda: (endpoint_row(
            tenant_view(logged_in(console, *OPERATOR)), "ep1r") or {}).get("role") == "writer", 120, interval=1)

        # Services and graphs.
        page.get_by_test_id("nav-services").click()
        expect(page.get_by_test_id("services-view")).to_be_visible()
        expect(page.locator('[data-testid="service-row"][data-name="sk1"]')).to_be_visible()
        shoot(page, shots / "services.png")
        page.get_by_test_id("nav-graphs").click()
        expect(page.get_by_test_id("graphs-view")).to_be_visible()
        expect(page.locator('[data-testid="graph"][data-name="tps"]')).to_be_visible()
        shoot(page, shots / "graphs.png")
        browser.close()

    assert not problems, "\n".join(problems)
    # The promoted replica is its branch's writer: what ep1 wrote is there, and it takes writes.
    ep1r = tenant_view(logged_in(console, *OPERATOR))
    assert endpoint_row(ep1r, "ep1r")["role"] == "writer"
    client = logged_in(console, *OPERATOR)
    status, answer = client.post("/api/sql", {"endpoint": "ep1r", "sql": "INSERT INTO items VALUES (121, 'x'); "
                                              "SELECT count(*) FROM items"})
    assert status == 200, answer
    assert answer["results"][-1]["rows"] == [["121"]]
    if os.environ.get("STRATA_CONSOLE_SCREENSHOTS") == "1":
        out = REPO_ROOT / "docs" / "console"
        out.mkdir(exist_ok=True)
        for shot in shots.iterdir():
            shutil.copy(shot, out / shot.name)
    # Every action is in the audit log with its user.
    audit = [json.loads(line) for line in (console.dir / "audit.jsonl").read_text().splitlines()]
    done = [e for e in audit if e.get("outcome") == "done" and e.get("user") == OPERATOR[0]]
    actions = {e["action"].split(" ")[0] + " " + e["action"].split(" ")[1] for e in done}
    assert {"branch create", "endpoint start", "endpoint promote", "sql on"} <= actions, actions
    assert any(e.get("outcome") == "refused" and e.get("reason") == "bad_password" for e in audit)
    # The endpoints' passwords (in the connection strings a start prints) never reach it.
    text = (console.dir / "audit.jsonl").read_text()
    for ep in ("ep1", "ep1r"):
        password = (cluster.workdir / "endpoints" / ep / "password").read_text().strip()
        assert password not in text


def open_tenant(page, tenant: str):
    """Goes to `tenant`'s page from the tenants list; the page."""
    page.get_by_test_id("nav-tenants").click()
    page.locator(f'[data-testid="tenant-row"][data-name="{tenant}"]').get_by_role("link").first.click()
    return page


def run_sql(page, tenant: str, endpoint: str, sql: str) -> None:
    """Runs `sql` on `endpoint` in the SQL editor."""
    page.get_by_test_id("nav-sql").click()
    page.get_by_test_id("sql-tenant").select_option(tenant)
    page.get_by_test_id("sql-endpoint").select_option(endpoint)
    page.get_by_test_id("sql-text").fill(sql)
    page.get_by_test_id("sql-run").click()


def shoot(page, path: Path) -> None:
    """A picture of the whole page, from its top (a page scrolled down
    would show its sticky header in the middle)."""
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)


def logged_in(console: Console, user: str, password: str):
    c = console.client()
    assert c.login(user, password) == 200
    return c


def test_who_may_do_what_through_the_api(cluster, console):
    cluster.run("tenant", "create", "t2")
    console.add_user(*OPERATOR, role="operator")
    console.add_user(*VIEWER, role="viewer")
    console.add_user("bound", "bound password 123", role="operator", tenants=("t2",))
    anon = console.client()

    # Nothing but the application and the login without a session.
    status, answer, headers = anon.request("GET", "/")
    assert status == 200
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    for path in ["/api/overview", "/api/session", "/api/tenants/default", "/api/graphs", "/api/audit"]:
        assert anon.get(path)[0] == 401, path
    assert anon.post("/api/endpoints/ep1/start")[0] == 401

    # A wrong password; then too many lock the name out (even the right one).
    assert anon.login(VIEWER[0], "not the password") == 401
    assert anon.login("nobody", "not the password") == 401
    for _ in range(5):
        anon.login(VIEWER[0], "not the password")
    assert anon.login(*VIEWER) == 429

    # A user bound to a tenant sees no other.
    viewer = logged_in(console, "bound", "bound password 123")
    overview = wait_for_snapshot(viewer, "the views to show t2", lambda o: o["tenants"])
    assert [t["name"] for t in overview["tenants"]] == ["t2"], overview
    assert viewer.get("/api/tenants/default")[0] == 404
    assert viewer.get("/api/graphs?range=hour")[0] == 403
    assert viewer.get("/api/graphs?range=hour&tenant=t2")[0] == 200
    assert viewer.post("/api/tenants/default/branches", {"name": "x"})[0] == 404
    assert viewer.get("/api/audit")[0] == 403

    op = logged_in(console, *OPERATOR)
    # Changes need the CSRF token, JSON and the console's own origin.
    status, _, _ = op.request("POST", "/api/tenants/default/branches", {"name": "b1"}, csrf=False)
    assert status == 403
    status, _, _ = op.request("POST", "/api/tenants/default/branches", raw_body=b"name=b1",
                              headers={"content-type": "application/x-www-form-urlencoded", "x-csrf-token": op.csrf})
    assert status == 415
    status, _, _ = op.request("POST", "/api/tenants/default/branches", {"name": "b1"},
                              headers={"origin": "https://evil.example"})
    assert status == 403
    # The same checks as the CLI's.
    status, answer = op.post("/api/tenants/default/branches", {"name": "bad name"})
    assert status == 400 and "invalid branch name" in answer["error"], answer
    status, answer = op.post("/api/tenants/default/branches", {"name": "b1"})
    assert status == 200, answer
    assert any("branch b1" in line for line in answer["lines"])
    status, answer = op.post("/api/tenants/default/branches", {"name": "b1"})
    assert status == 409 and "exists" in answer["error"]
    assert op.get("/api/audit")[0] == 403

    plain_viewer = console.client()
    # The lockout above was the viewer's name: it lasts its window. Use a fresh viewer.
    console.add_user("vera", "vera password 123", role="viewer")
    assert plain_viewer.login("vera", "vera password 123") == 200
    status, answer = plain_viewer.post("/api/tenants/default/branches", {"name": "b2"})
    assert status == 403 and "viewer" in answer["error"]
    assert plain_viewer.post("/api/sql", {"endpoint": "x", "sql": "SELECT 1"})[0] == 403
    assert {t["name"] for t in plain_viewer.get("/api/overview")[1]["tenants"]} == {"default", "t2"}

    # Only a management token logs in as admin; a tenant's does not.
    tenant_token = cluster.run("auth", "token", "--scope", "tenant").stdout.strip()
    assert console.client().login(token=tenant_token) == 403
    token = cluster.run("auth", "token", "--scope", "management", "--ttl-secs", "600").stdout.strip()
    admin = console.client()
    assert admin.login(token=token) == 200
    status, audit = admin.get("/api/audit")
    assert status == 200
    assert any(e.get("user") == OPERATOR[0] and e.get("outcome") == "done" and "b1" in e["action"]
               for e in audit["entries"])
    assert any(e.get("reason") == "csrf" for e in audit["entries"])
    # Revoking the token ends its session within seconds.
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    cluster.run("auth", "revoke", "--id", claims["jti"])
    wait_until("the revoked token's session to end", lambda: admin.get("/api/overview")[0] == 401, 30, interval=0.5)

    # Logout ends a session; its cookie is HttpOnly, Secure and SameSite=Strict.
    again = console.client()
    status, _, headers = again.request("POST", "/api/login", {"user": OPERATOR[0], "password": OPERATOR[1]},
                                       csrf=False)
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "Secure" in cookie and "SameSite=Strict" in cookie
    again.csrf = again.get("/api/session")[1]["csrf"]
    old = again.cookie
    assert again.post("/api/logout")[0] == 200
    again.cookie = old
    assert again.get("/api/overview")[0] == 401

    # Its own metrics and status need a service token, as every service's.
    status, _, _ = anon.request("GET", "/metrics")
    assert status == 401
    service = cluster.run("auth", "token", "--scope", "service").stdout.strip()
    status, answer, _ = anon.request("GET", "/v1/status", headers={"authorization": f"Bearer {service}"})
    assert status == 200 and answer["sessions"] >= 1

    # Its files are its user's only.
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(console.dir) == 0o700
    for name in ["users.json", "audit.jsonl", "tls.key", "console.toml"]:
        assert mode(console.dir / name) == 0o600, name
    # A removed user logs in no more.
    cluster.run("console", "user", "remove", "vera")
    assert console.client().login("vera", "vera password 123") == 401


def test_branch_reset_and_endpoint_suspend_from_the_cli(cluster):
    """The two operations the console added to the CLI: `branch reset`
    makes a branch its parent's newest state again (its endpoint starts
    again on it), `endpoint suspend` puts an endpoint to sleep at once and
    `endpoint start` wakes it with its data."""
    from fixtures.endpoint import Endpoint, start_endpoint

    main = start_endpoint(cluster, "m")
    with main.app_connect() as c:
        c.execute("CREATE TABLE t (x int)")
        c.execute("INSERT INTO t VALUES (1)")
    cluster.run("branch", "create", "dev")
    dev = Endpoint(cluster, "d", branch="dev")
    dev.start()
    with dev.app_connect() as c:
        c.execute("INSERT INTO t VALUES (2)")
    with main.app_connect() as c:
        c.execute("INSERT INTO t VALUES (3)")
    old = cluster.timeline_id("dev")
    out = cluster.run("branch", "reset", "dev").stdout
    assert "reset to main" in out and "endpoints restarted: d" in out, out
    assert cluster.timeline_id("dev") != old
    with dev.app_connect() as c:
        assert sorted(r[0] for r in c.execute("SELECT x FROM t")) == [1, 3]
    # The old timeline is gone from the safekeepers.
    assert all(old not in str(p) for p in (cluster.data_dir("sk1")).rglob("*"))
    refused = cluster.run("branch", "reset", "main", check=False)
    assert refused.returncode == 1 and "no parent" in refused.stderr

    out = cluster.run("endpoint", "suspend", "d").stdout
    assert "suspended" in out
    assert dev.status()["state"] == "suspended"
    assert cluster.run("endpoint", "suspend", "d", check=False).returncode == 1
    dev.start()
    with dev.app_connect() as c:
        assert sorted(r[0] for r in c.execute("SELECT x FROM t")) == [1, 3]


def test_the_sql_editor_is_bounded_and_stays_in_its_tenant(cluster, console):
    """An endpoint started through the API; a result past 1,000 rows is cut
    and counted, a statement past its timeout is cancelled by PostgreSQL
    (SQLSTATE 57014), an error comes with its SQLSTATE and position, and a
    user bound to another tenant reaches none of its endpoints."""
    cluster.run("tenant", "create", "t2")
    console.add_user(*OPERATOR, role="operator")
    console.add_user("bound", "bound password 123", role="operator", tenants=("t2",))
    op = logged_in(console, *OPERATOR)
    status, answer = op.post("/api/tenants/default/endpoints", {"name": "e1", "branch": "main"})
    assert status == 200, answer
    assert endpoint_row(tenant_view(op), "e1")["state"] == "running"

    status, answer = op.post("/api/sql", {"endpoint": "e1", "sql": "SELECT g, repeat('x', 10) FROM generate_series(1, 5000) g"})
    assert status == 200, answer
    [result] = answer["results"]
    assert result["columns"] == ["g", "repeat"] and result["row_count"] == 5000 and result["truncated"]
    assert len(result["rows"]) == 1000 and result["rows"][0] == ["1", "x" * 10]

    started = time.monotonic()
    status, answer = op.post("/api/sql", {"endpoint": "e1", "sql": "SELECT pg_sleep(30)", "timeout_secs": 1})
    assert status == 400 and answer["sqlstate"] == "57014", answer
    assert time.monotonic() - started < 20

    status, answer = op.post("/api/sql", {"endpoint": "e1", "sql": "SELECT nonsense FROM nowhere"})
    assert status == 400 and answer["sqlstate"] == "42P01" and answer["position"] == 22, answer
    # It logs in as the database's owner, not its superuser.
    status, answer = op.post("/api/sql", {"endpoint": "e1", "sql": "SELECT current_user, "
                                          "(SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"})
    assert status == 200 and answer["results"][0]["rows"] == [["app", "f"]], answer

    bound = logged_in(console, "bound", "bound password 123")
    status, answer = bound.post("/api/sql", {"endpoint": "e1", "sql": "SELECT 1"})
    assert status == 404, answer
    assert bound.post("/api/endpoints/e1/stop")[0] == 404
    assert endpoint_row(tenant_view(op), "e1")["state"] == "running"
