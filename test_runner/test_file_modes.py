"""Files and their modes (docs/security.md, "Files and their modes"): what
the services write (WAL segments, layers, control and metadata files, the
objects of the local object store) and the cluster's keys and tokens are
private to their owner, files 0600 and directories 0700, so that another
local user reads none of it; and a service refuses to start on a token or
key file that group or others can access."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from fixtures.endpoint import current_lsn, start_endpoint
from fixtures.pageserver_api import PageserverApi, wait_for_pageserver_lsn
from fixtures.wait import wait_until

# Who may read what: anyone a public key or a certificate, nobody else anything.
PUBLIC = {"auth": re.compile(r"(issuer-)?public\.pem|revoked\.json"), "tls": re.compile(r".*\.pem")}
WAL_SEGMENT = re.compile(r"[0-9A-F]{24}(\.partial)?")
OTHER_USER = "nobody"


def exposed(root: Path, public: re.Pattern | None = None) -> list[str]:
    """Every directory under `root` (itself included) and every file that
    group or others have any access to, with its mode; files whose name
    `public` matches may be read by all."""
    found = []
    for dirpath, _, files in os.walk(root):
        mode = stat.S_IMODE(os.stat(dirpath).st_mode)
        if mode & 0o077:
            found.append(f"{dirpath}/ {mode:04o}")
        for name in files:
            path = Path(dirpath) / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            allowed = 0o044 if public is not None and public.fullmatch(name) else 0
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077 & ~allowed:
                found.append(f"{path} {mode:04o}")
    return found


def read_as(user: str, path: Path) -> subprocess.CompletedProcess:
    """`cat PATH` as `user`."""
    return subprocess.run(["runuser", "-u", user, "--", "cat", str(path)], capture_output=True, timeout=30,
                          stdin=subprocess.DEVNULL)


def first(paths, what: str) -> Path:
    """The first of `paths` by name; fails if there is none."""
    found = sorted(paths)
    assert found, f"no {what}"
    return found[0]


def objects(store: Path) -> list[Path]:
    """The files of the local object store's tenants (layers, indexes)."""
    return sorted(p for p in (store / "tenants").rglob("*") if p.is_file())


def test_what_the_services_write_is_private_to_their_owner(cluster):
    """Rows written through an endpoint, in the WAL and, once checkpointed,
    in layers on the pageserver's disk and in the object store: (a) no file
    or directory of the services' data, of the store or of the key stores
    is open to group or others (every offender is reported); (b) another
    local user cannot read a layer, a WAL segment, an object or a token."""
    ep = start_endpoint(cluster)
    with ep.connect() as conn:
        conn.execute("CREATE TABLE secrets (id int, secret text)")
        conn.execute("INSERT INTO secrets SELECT g, 'the secret of row ' || g FROM generate_series(1, 20000) g")
        conn.execute("CHECKPOINT")
        lsn = current_lsn(conn)
    wait_for_pageserver_lsn(cluster, lsn)
    ps = PageserverApi(cluster)
    try:
        ps.checkpoint()  # the rows in layer files on the pageserver's disk
        timeline_dir = ps.timeline_dir
    finally:
        ps.close()
    workdir = cluster.workdir.resolve()
    tenant = cluster.tenant_id()
    remote = cluster.service_config("pageserver")["remote_storage"]
    store = Path(remote["path"]) if remote["type"] == "local" else None
    if store is not None:
        # The layers are uploaded in the background.
        wait_until("a layer in the object store", lambda: objects(store), timeout=120)

    # (a) Every service's directory (its config, log and pidfiles) and
    # everything in its data directory, the object store, the key stores.
    offenders = []
    for name in (s["name"] for s in cluster.cluster_toml["services"]):
        mode = stat.S_IMODE((workdir / name).stat().st_mode)
        if mode & 0o077:
            offenders.append(f"{workdir / name}/ {mode:04o}")
        # The controller and the link proxy keep nothing there (yet).
        data = cluster.service_config(name).get("data_dir", workdir / name / "data")
        offenders += exposed(Path(data))
    if store is not None:
        offenders += exposed(store)
    for keys in ("auth", "tls"):
        offenders += exposed(workdir / keys, PUBLIC[keys])
    assert not offenders, "group or others can access:\n" + "\n".join(offenders)

    # (b) Another local user reads neither a layer nor a WAL segment, on
    # the services' disks or in the object store.
    if os.geteuid() != 0:
        pytest.skip("reading as another user needs root (runuser)")
    sk_timeline = cluster.data_dir("sk1") / tenant / cluster.timeline_id()
    private = {
        "a layer file": first((p for p in timeline_dir.iterdir() if p.name.endswith((".delta", ".image"))),
                              f"layer file in {timeline_dir}"),
        "a WAL segment": first((p for p in sk_timeline.iterdir() if WAL_SEGMENT.fullmatch(p.name)),
                               f"WAL segment in {sk_timeline}"),
        "the service token": workdir / "auth" / "service.token",
    }
    if store is not None:
        private["an object of the store"] = objects(store)[0]
    # The user reads what is meant for all: the refusals below are these files'.
    assert read_as(OTHER_USER, Path("/etc/passwd")).returncode == 0
    for what, path in private.items():
        assert path.stat().st_size > 0, path
        r = read_as(OTHER_USER, path)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (what, path, r)
        assert not r.stdout, (what, path)


def test_a_service_refuses_a_token_or_key_file_others_can_read(cluster_factory):
    """The safekeeper started by hand with its `[auth] token_file`, then its
    `[tls] key`, readable by all: it exits at once naming the file, its mode
    and the fix. With the modes restored, the cluster starts."""
    c = cluster_factory(start=False)
    config = c.service_config_path("sk1")
    settings = c.service_config("sk1")
    for secret in (Path(settings["auth"]["token_file"]), Path(settings["tls"]["key"])):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
        secret.chmod(0o644)
        try:
            r = subprocess.run([str(c.strata_bin), "safekeeper", "--config", str(config)], capture_output=True,
                               text=True, timeout=60, stdin=subprocess.DEVNULL)
        finally:
            secret.chmod(0o600)
        assert r.returncode == 1, (secret, r.returncode, r.stderr)
        assert f"{secret}: mode 0644 " in r.stderr and f"chmod 600 {secret}" in r.stderr, r.stderr
    c.start()
    states = {s["name"]: s["state"] for s in c.status()["services"]}
    assert set(states.values()) == {"running"}, states
