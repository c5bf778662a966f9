"""Tenants (docs/tenants.md): `strata tenant create|list|delete`, branches
and endpoints of several tenants on one cluster, isolated from each other
(data, tokens), per-tenant sizes in `strata status`, a deletion that
removes every trace of one tenant and nothing of another and resumes
after `kill -9`, and a workdir from before tenants that keeps working."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
from pathlib import Path

import pytest
import tomllib

from fixtures.endpoint import Endpoint
from fixtures.strata import urlopen


def tenants(cluster) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(cluster.run("tenant", "list", "--json").stdout)}


def create(cluster, name: str) -> str:
    """`strata tenant create`; the new tenant's id."""
    out = cluster.run("tenant", "create", name, timeout=180).stdout.strip().splitlines()[-1]
    # tenant NAME: id ID, branch main = timeline T
    words = out.split()
    assert words[:3] == ["tenant", f"{name}:", "id"], out
    return words[3].rstrip(",")


def objects(cluster, tenant_id: str) -> set[str]:
    """Every object of `tenant_id` in the cluster's (local) object storage."""
    root = cluster.workdir / "remote_storage"
    found = set()
    for prefix in ("tenants", "wal", "keys"):
        base = root / prefix / tenant_id
        if base.exists():
            found |= {str(p.relative_to(root)) for p in base.rglob("*") if p.is_file()}
    return found


def service_dirs_of(cluster, tenant_id: str) -> list[Path]:
    """The directories any service keeps of `tenant_id` on local disk."""
    found = []
    for s in cluster.cluster_toml["services"]:
        if s["kind"] in ("safekeeper", "pageserver"):
            data = cluster.data_dir(s["name"])
            found += [p for p in (data / tenant_id, data / "tenants" / tenant_id) if p.exists()]
    return found


def status_code(url: str, token: str) -> int:
    try:
        with urlopen(url, headers={"Authorization": f"Bearer {token}"}) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_tenants_are_isolated_sized_and_deleted_without_a_trace(cluster):
    default = Endpoint(cluster, "default-ep")
    default.start()
    default.sql("CREATE TABLE mine (v text)")
    default.sql("INSERT INTO mine VALUES ('default')")

    acme_id = create(cluster, "acme")
    listed = tenants(cluster)
    assert set(listed) == {"default", "acme"}, listed
    assert listed["acme"]["tenant_id"] == acme_id and listed["acme"]["state"] == "active", listed
    assert listed["acme"]["branches"] == ["main"], listed
    assert cluster.tenant("acme").get("state") is None, "a created tenant carries no state line"
    # The same name twice is refused, as is a name that is no DNS label.
    again = cluster.run("tenant", "create", "acme", check=False)
    assert again.returncode == 1 and "exists" in again.stderr, again.stderr
    bad = cluster.run("tenant", "create", "Acme_1", check=False)
    assert bad.returncode == 2 and "invalid tenant name" in bad.stderr, bad.stderr

    acme = Endpoint(cluster, "acme-ep")
    acme.start("--tenant", "acme")
    # Another PostgreSQL cluster: its own system identifier, none of the default tenant's tables.
    sysid = "SELECT system_identifier FROM pg_control_system()"
    assert acme.sql(sysid) != default.sql(sysid)
    assert acme.sql("SELECT to_regclass('mine')") == [(None,)]
    acme.sql("CREATE TABLE mine (v text)")
    acme.run(["pgbench", "-i", "-s", "2", "-q"], timeout=300)
    acme.sql("INSERT INTO mine VALUES ('acme')")
    assert default.sql("SELECT v FROM mine") == [("default",)]
    assert acme.sql("SELECT v FROM mine") == [("acme",)]

    # Branches are per tenant: `main` of acme is not the default's.
    out = cluster.run("branch", "create", "dev", "--tenant", "acme", timeout=120).stdout
    assert "branch dev:" in out, out
    assert [b["name"] for b in json.loads(cluster.run("branch", "list", "--json").stdout)] == ["main"]
    dev = Endpoint(cluster, "acme-dev", branch="dev")
    dev.start("--tenant", "acme")
    assert dev.sql("SELECT v FROM mine") == [("acme",)]
    # An endpoint keeps its tenant.
    moved = cluster.run("endpoint", "start", "acme-ep", "--tenant", "default", check=False)
    assert moved.returncode == 1 and "runs in tenant acme" in moved.stderr, moved.stderr

    # Tokens: the default tenant's may not read acme's timelines, acme's may.
    ps = cluster.http_url("pageserver", f"/v1/tenant/{acme_id}/timeline/{cluster.timeline_id('main', 'acme')}")
    default_token = cluster.run("auth", "token", "--scope", "tenant").stdout.strip()
    acme_token = cluster.run("auth", "token", "--scope", "tenant", "--tenant", "acme").stdout.strip()
    assert status_code(ps, default_token) == 403
    assert status_code(ps, acme_token) == 200

    # Sizes: acme holds a pgbench database; its layers reach object storage.
    cluster.run("timeline", "checkpoint", "--tenant", "acme", timeout=300)
    st = {t["name"]: t for t in cluster.status()["tenants"]}
    assert st["acme"]["logical_bytes"] > 20 << 20, st
    assert st["acme"]["wal_held_bytes"] > 0 and st["acme"]["remote_layer_bytes"] > 0, st
    assert st["acme"]["local_layer_bytes"] is not None, st
    human = cluster.run("status").stdout
    assert "acme/dev" in human and f"acme     {acme_id}  active" in human, human

    acme_objects = objects(cluster, acme_id)
    default_objects = objects(cluster, cluster.tenant_id())
    assert any(o.startswith("tenants/") for o in acme_objects), acme_objects
    assert any(o.startswith("keys/") for o in acme_objects), "encryption at rest: acme has data keys"
    assert service_dirs_of(cluster, acme_id), "acme has local data before its deletion"

    out = cluster.run("tenant", "delete", "acme", timeout=300).stdout
    assert f"tenant acme: deleted (id {acme_id}" in out, out
    assert "acme" not in tenants(cluster)
    assert objects(cluster, acme_id) == set(), "every object of the tenant is gone"
    assert service_dirs_of(cluster, acme_id) == []
    assert not (cluster.workdir / "endpoints" / "acme-ep").exists()
    # Nothing of the default tenant went: its objects then are there now, its data reads.
    assert default_objects <= objects(cluster, cluster.tenant_id())
    assert default.sql("SELECT v FROM mine") == [("default",)]
    default.stop()
    default.start()
    assert default.sql("SELECT v FROM mine") == [("default",)]
    # A name is free again once its tenant is gone; the new tenant is a new cluster.
    again_id = create(cluster, "acme")
    assert again_id != acme_id
    fresh = Endpoint(cluster, "acme-again")
    fresh.start("--tenant", "acme")
    assert fresh.sql("SELECT to_regclass('mine')") == [(None,)]


def run_killed(cluster, args: list[str], after: float) -> None:
    """Runs `strata ARGS` and kills it with SIGKILL `after` seconds in (if it still runs)."""
    proc = subprocess.Popen([str(cluster.strata_bin), *args, "--workdir", str(cluster.workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=after)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("after", [0.3, 1.0, 2.5])
def test_tenant_create_and_delete_resume_after_kill9(cluster, after):
    """A `tenant create` or `tenant delete` killed at some point of its
    run leaves a state the same command finishes from."""
    run_killed(cluster, ["tenant", "create", "kill"], after)
    state = cluster.tenant("kill").get("state") if "kill" in tenants(cluster) else "absent"
    if state == "creating" or state == "absent":
        # Not finished: a new run finishes it (or, never recorded, makes it).
        create(cluster, "kill")
    assert tenants(cluster)["kill"]["state"] == "active"
    tenant_id = cluster.tenant_id("kill")
    ep = Endpoint(cluster, "kill-ep")
    ep.start("--tenant", "kill")
    ep.sql("CREATE TABLE t AS SELECT generate_series(1, 1000) AS i")
    ep.stop()
    cluster.run("timeline", "checkpoint", "--tenant", "kill", timeout=300)
    assert objects(cluster, tenant_id)

    run_killed(cluster, ["tenant", "delete", "kill"], after)
    if "kill" in tenants(cluster):
        state = tenants(cluster)["kill"]["state"]
        # Killed before it recorded anything (a loaded machine can take
        # longer than `after` to start the command), the tenant is as it
        # was; otherwise the delete was recorded before anything was removed.
        assert state in ("active", "deleting"), state
        if state == "deleting":
            # The tenant takes no endpoint while it is being deleted.
            refused = cluster.run("endpoint", "start", "other", "--tenant", "kill", check=False)
            assert refused.returncode == 1 and "deleting" in refused.stderr, refused.stderr
        cluster.run("tenant", "delete", "kill", timeout=300)
    assert "kill" not in tenants(cluster)
    assert objects(cluster, tenant_id) == set()
    assert service_dirs_of(cluster, tenant_id) == []


def test_a_workdir_from_before_tenants_keeps_working(cluster):
    """cluster.toml of format version 2 (one tenant at the top level) and an
    endpoint recorded without a tenant: both are of the default tenant."""
    ep = Endpoint(cluster, "old-ep")
    ep.start()
    ep.sql("CREATE TABLE t AS SELECT 'before' AS v")
    ep.stop()
    cluster.stop()

    path = cluster.workdir / "cluster.toml"
    [t] = tomllib.loads(path.read_text())["tenants"]
    path.write_text(as_format_2(path.read_text(), t["tenant_id"]))
    assert tomllib.loads(path.read_text())["branches"][0]["name"] == "main"
    ep_file = cluster.workdir / "endpoints" / "old-ep" / "endpoint.toml"
    ep_file.write_text("".join(l for l in ep_file.read_text().splitlines(True) if not l.startswith("tenant =")))

    cluster.start()
    assert tenants(cluster)["default"]["tenant_id"] == t["tenant_id"]
    ep.start()
    assert ep.sql("SELECT v FROM t") == [("before",)]
    out = cluster.run("branch", "create", "dev", timeout=120).stdout
    assert "branch dev:" in out, out
    # Written back as format version 3, the same tenant with the new branch.
    now = tomllib.loads(path.read_text())
    assert now["format_version"] == 3 and now["cluster_id"] == t["tenant_id"], now
    assert [b["name"] for b in now["tenants"][0]["branches"]] == ["main", "dev"]


def as_format_2(text: str, tenant_id: str) -> str:
    """cluster.toml as format version 2 wrote it: the tenant's id at the
    top level and its branches as `[[branches]]`, no cluster id."""
    out, skip = [], False
    for line in text.splitlines():
        if line.startswith("format_version = "):
            out += ["format_version = 2", f'tenant_id = "{tenant_id}"']
        elif line.startswith("cluster_id = "):
            continue
        elif line == "[[tenants]]":
            skip = True  # its name and id: gone with it
        elif line == "[[tenants.branches]]":
            skip = False
            out.append("[[branches]]")
        elif line.startswith("[[tenants.branches."):
            out.append(line.replace("[[tenants.branches.", "[[branches.", 1))
        elif line.startswith("[tenants.branches."):
            out.append(line.replace("[tenants.branches.", "[branches.", 1))
        elif not skip:
            out.append(line)
    return "\n".join(out) + "\n"
