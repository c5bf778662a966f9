"""No secret on a command line or in an environment (docs/security.md):
every local user reads those of every process (`ps e`, /proc/PID/cmdline
and, for their own processes, /proc/PID/environ). Each process the
cluster starts (services, supervisors, agents, PostgreSQL and its
children) is checked for the endpoint's password, every token and every
private key."""

from __future__ import annotations

import os
from pathlib import Path

from fixtures.endpoint import start_endpoint


def secrets(workdir: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for path in [*(workdir / "auth").iterdir(), *(workdir / "tls").glob("*.key"), *workdir.glob("endpoints/*/*")]:
        if path.is_file() and (path.suffix in (".token", ".key") or path.name in ("password", "private.pem")):
            text = path.read_bytes().strip()
            # A PEM key is checked by its base64 body, which is what would leak.
            lines = [line for line in text.splitlines() if not line.startswith(b"-----")]
            found[str(path.relative_to(workdir))] = b"".join(lines) if lines else text
    return found


def cluster_processes(workdir: Path) -> dict[int, tuple[bytes, bytes]]:
    """The command line and environment of each process whose command line
    or working directory names the workdir, and of their descendants."""
    procs: dict[int, tuple[int, bytes, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cwd = os.readlink(entry / "cwd")
        except (OSError, ValueError):
            continue
        procs[int(entry.name)] = (ppid, cmdline + b"\0cwd=" + cwd.encode(), environ)
    ours = {pid for pid, (_, cmdline, _) in procs.items() if str(workdir).encode() in cmdline}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _, _) in procs.items() if ppid in ours} - ours
        grew = bool(children)
        ours |= children
    return {pid: procs[pid][1:] for pid in ours}


def test_no_secret_in_any_command_line_or_environment(cluster):
    ep = start_endpoint(cluster, "ep")
    ep.sql("CREATE TABLE t AS SELECT generate_series(1, 100) AS x")
    found = secrets(cluster.workdir)
    assert {"endpoints/ep/password", "endpoints/ep/agent.token", "auth/service.token",
            "auth/private.pem"} <= set(found), found
    procs = cluster_processes(cluster.workdir)
    names = {cmdline.split(b"\0")[0].rsplit(b"/", 1)[-1] for cmdline, _ in procs.values()}
    # The check covers what it should: services, agent, PostgreSQL.
    assert b"strata" in names and any(n.startswith(b"postgres") for n in names), names
    assert len(procs) >= 8, names
    leaks = [(pid, name, where) for pid, (cmdline, environ) in procs.items()
             for name, secret in found.items()
             for where, text in (("command line", cmdline), ("environment", environ)) if secret in text]
    assert not leaks, leaks
