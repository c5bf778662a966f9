"""A cluster across hosts (`docs/deployment.md`): six hosts made of network
namespaces (three safekeeper hosts in two sites, a pageserver host, two
compute hosts), each with its own copy of the workdir and its `strata
node`; the test process is the operator's machine, on none of them.

- pgbench and acknowledged writers over TLS keep every acknowledged commit
  while one safekeeper host loses power (kill -9 of all its processes,
  then its node starts again, as systemd would start it), another is cut
  off the network, and the pageserver host loses power;
- an endpoint moves to another host with its password and its data;
- every service listens on its host's address (or loopback), with TLS;
- commands work from any host, through the other hosts' nodes;
- with two pageserver hosts and MinIO on the operator's machine, the
  attached pageserver's host cut off fails over, and returns demoted.
"""

from __future__ import annotations

import json
import re
import time
import tomllib

import psycopg
import pytest

from fixtures import netns
from fixtures.checks import assert_pgbench_invariants, pgbench_state
from fixtures.hosted import Remote, hosted_cluster
from fixtures.pg import temp_root
from fixtures.load import AckedWriters, PgbenchLoop
from fixtures.minio import Minio
from fixtures.metrics import parse_metrics
from fixtures.strata import http_text
from fixtures.tokens import header_of
from fixtures.wait import wait_until

# name, what it runs ("+" between roles), site
HOSTS = [
    ("sk-a", "safekeeper+proxy", "dc1"),
    ("sk-b", "safekeeper", "dc1"),
    ("sk-c", "safekeeper", "dc2"),
    ("ps", "pageserver", "dc1"),
    ("cp1", "compute", "dc1"),
    ("cp2", "compute", "dc2"),
]
SCALE = 2
# Hosts without the signing keys: their nodes work with the services' token.
NO_CLI = ("ps", "sk-b")


@pytest.fixture
def hosted(strata_bin, pg_bin_dir, tmp_path, tmp_path_factory):
    with hosted_cluster(strata_bin, pg_bin_dir, tmp_path, temp_root(tmp_path_factory), HOSTS, no_cli=NO_CLI) as h:
        yield h


def listeners(hosts: netns.Hosts, name: str) -> list[str]:
    """The local addresses of every listening TCP socket of host `name`."""
    out = netns.sh("ip", "netns", "exec", hosts.hosts[name].netns, "ss", "-Hltn").stdout
    return [line.split()[3] for line in out.splitlines()]


def test_every_service_listens_on_its_hosts_address(hosted):
    hosts = hosted.hosts
    st = hosted.status()
    by_host = {s["name"]: s["host"] for s in st["services"]}
    assert by_host == {"sk1": "sk-a", "sk2": "sk-b", "sk3": "sk-c", "pageserver": "ps", "controller": "ps",
                       "proxy": "sk-a"}, by_host
    by_site = {s["name"]: s["site"] for s in st["services"]}
    assert by_site == {"sk1": "dc1", "sk2": "dc1", "sk3": "dc2", "pageserver": "dc1", "controller": "dc1",
                       "proxy": "dc1"}, by_site
    for name, _, _ in HOSTS:
        address = hosts.hosts[name].address
        bound = listeners(hosts, name)
        assert bound, f"nothing listens on {name}"
        for local in bound:
            ip = local.rsplit(":", 1)[0]
            assert ip in (address, "127.0.0.1"), f"{name}: a socket on {local} (host address {address})"
    # Every listener beyond loopback speaks TLS and wants a token.
    ps = next(s for s in hosted.cluster.cluster_toml["services"] if s["name"] == "pageserver")
    import ssl
    import urllib.request
    ctx = ssl.create_default_context(cafile=str(hosted.cluster.workdir / "tls" / "ca.pem"))
    url = f"https://{hosts.hosts['ps'].address}:{ps['ports']['http']}/v1/status"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, context=ctx, timeout=10)
    assert refused.value.code == 401
    node = next(x for x in hosted.cluster.cluster_toml["hosts"] if x["name"] == "ps")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"https://{hosts.hosts['ps'].address}:{node['node_port']}/v1/status", context=ctx,
                               timeout=10)
    assert refused.value.code == 401


def test_pgbench_keeps_every_acknowledged_commit_when_hosts_fail(hosted):
    hosts = hosted.hosts
    ep = hosted.endpoint("ep", "cp1")
    assert ep.info["host"] == hosts.hosts["cp1"].address and ep.info["sslmode"] == "verify-full"
    ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
    writers = AckedWriters(ep, threads=2).start()
    bench = PgbenchLoop(ep, clients=2).start()
    try:
        def acked_more(than: int, timeout: float = 60) -> int:
            return wait_until(f"more than {than} acknowledged commits", lambda: writers.count() > than + 20 and
                              writers.count(), timeout, interval=0.2,
                              details=lambda: (writers.errors[-3:], hosted.logs()))

        n = acked_more(0)
        # A safekeeper host loses power: two of three safekeepers still make commits durable.
        killed = hosts.kill9("sk-b")
        assert killed >= 3, f"the node, a supervisor and a safekeeper ran on sk-b: {killed}"
        n = acked_more(n)
        # It comes back (systemd starts its node again, the node its safekeeper).
        hosted.start_node("sk-b")
        wait_until("sk2 to run again", lambda: next(s for s in hosted.status()["services"]
                                                   if s["name"] == "sk2")["state"] == "running", 60, interval=0.5)
        n = acked_more(n)

        # Another safekeeper host is cut off the network, then joins again.
        hosts.link("sk-c", up=False)
        try:
            n = acked_more(n)
            st = hosted.status()
            assert next(s for s in st["services"] if s["name"] == "sk3")["state"].startswith("unknown"), st
        finally:
            hosts.link("sk-c", up=True)
        n = acked_more(n)

        # The pageserver host loses power and comes back: commits go on
        # meanwhile (the safekeepers hold them), reads wait for it.
        hosts.kill9("ps")
        n = acked_more(n)
        hosted.start_node("ps")
        wait_until("the pageserver to run again", lambda: next(
            s for s in hosted.status()["services"] if s["name"] == "pageserver")["state"] == "running", 90,
            interval=0.5)
        acked_more(n)
    finally:
        bench.stop()
        writers.stop()

    acked = writers.acked_ids()
    stored = {row[0] for row in ep.sql("SELECT id FROM acked")}
    lost = acked - stored
    assert not lost, f"{len(lost)} acknowledged commits lost, e.g. {sorted(lost)[:10]}"
    assert len(acked) > 100, len(acked)
    print(f"\n{len(acked)} acknowledged commits kept, {len(writers.in_doubt)} in doubt, "
          f"pgbench restarted {bench.restarts()} times")
    with ep.connect() as conn:
        assert_pgbench_invariants(pgbench_state(conn), SCALE)
    # Every safekeeper holds the WAL again, up to the same commit.
    def caught_up():
        [t] = hosted.status()["timelines"]
        commits = {s["name"]: s["commit_lsn"] for s in t["safekeepers"]}
        return len(commits) == 3 and len(set(commits.values())) == 1 and None not in commits.values() and commits
    wait_until("every safekeeper to hold the same commit LSN", caught_up, 60, interval=0.5)


def test_an_endpoint_moves_to_another_host_and_commands_work_from_any_host(hosted):
    hosts = hosted.hosts
    ep = hosted.endpoint("ep", "cp1")
    ep.sql("CREATE TABLE moved (id int PRIMARY KEY, note text)")
    ep.sql("INSERT INTO moved SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
    password = ep.info["password"]
    # The endpoint lives on cp1's disk only.
    assert (hosts.hosts["cp1"].disk / "endpoints" / "ep" / "endpoint.toml").exists()
    assert not (hosted.cluster.workdir / "endpoints" / "ep").exists()

    # From the compute host itself, and from a safekeeper host: the same cluster.
    listed = hosted.on("sk-a", "endpoint", "list")
    assert re.search(r"^ep\s+cp1\s+main\s+\d+\s+running\s", listed, re.M), listed
    st = json.loads(hosted.on("cp2", "status", "--json"))
    assert {s["name"]: s["state"] for s in st["services"]} == dict.fromkeys(
        ["sk1", "sk2", "sk3", "pageserver", "controller", "proxy"], "running"), st
    assert [(e["name"], e["host"], e["site"], e["state"]) for e in st["endpoints"]] == [("ep", "cp1", "dc1", "running")]

    # Stopped on cp1 (from cp1), started on cp2 (from the operator's machine).
    assert "stopped" in hosted.on("cp1", "endpoint", "stop", "ep")
    refused = hosted.cluster.run("endpoint", "start", "ep", "--host", "sk-a", check=False)
    assert refused.returncode == 2 and "does not run computes" in refused.stderr, refused.stderr
    out = hosted.cluster.run("endpoint", "start", "ep", "--host", "cp2", timeout=300).stdout
    assert "moves from host cp1 to host cp2" in out, out
    tls = next(line for line in out.splitlines() if line.startswith("over TLS: "))
    moved = Remote(tls.removeprefix("over TLS: "), hosted)
    assert moved.info["host"] == hosts.hosts["cp2"].address
    assert moved.info["password"] == password, "the password moves with the endpoint"
    assert moved.sql("SELECT count(*), max(note) FROM moved") == [(1000, "row 999")]
    moved.sql("INSERT INTO moved VALUES (1001, 'on cp2')")
    assert not (hosts.hosts["cp1"].disk / "endpoints" / "ep").exists(), "cp1 keeps nothing of it"
    listed = hosted.cluster.run("endpoint", "list").stdout
    assert re.search(r"^ep\s+cp2\s+main\s+\d+\s+running\s", listed, re.M), listed
    # The old address no longer answers.
    with pytest.raises(Exception):
        ep.sql("SELECT 1")

    # A branch made on the operator's machine reaches every host's copy of
    # the cluster's state; an endpoint on it starts from a compute host's
    # own CLI, on that host.
    hosted.cluster.run("branch", "create", "dev")
    assert re.search(r"^(└ )?dev\s", hosted.on("sk-c", "branch", "list"), re.M)
    out = hosted.on("cp2", "endpoint", "start", "dev-ep", "--branch", "dev")
    assert "on branch dev" in out and "on host cp2" in out, out
    dev = Remote(next(line for line in out.splitlines() if line.startswith("over TLS: ")).removeprefix("over TLS: "),
                 hosted)
    assert dev.sql("SELECT count(*) FROM moved") == [(1001,)]
    revisions = {name: tomllib.loads((h.disk / "cluster.toml").read_text())["revision"]
                 for name, h in hosts.hosts.items()}
    assert len(set(revisions.values())) == 1, f"every host has the same revision: {revisions}"


def test_a_proxy_on_one_host_wakes_and_reaches_computes_on_two_others(hosted):
    """The proxy runs on sk-a (a host with the cluster's keys): endpoints
    on cp1 and cp2 sleep, and clients on the operator's machine reach
    each through the proxy's one address by `options`, which finds them
    through the compute hosts' nodes, wakes them there and logs in over
    TLS (docs/proxy.md)."""
    hosts = hosted.hosts.hosts
    svc = next(s for s in hosted.cluster.cluster_toml["services"] if s["kind"] == "proxy")
    assert svc["host"] == "sk-a"
    rows = {}
    hosted.cluster.run("branch", "create", "dev")  # one writer per branch
    for name, host, branch in (("e1", "cp1", "main"), ("e2", "cp2", "dev")):
        ep = hosted.endpoint(name, host, "--branch", branch, "--suspend-after", "2")
        ep.sql(f"CREATE TABLE kept AS SELECT '{name}' AS who, g FROM generate_series(1, 100) g")
        rows[name] = (ep, ep.info["password"])

    def asleep() -> bool:
        st = {e["name"]: e["state"] for e in hosted.status()["endpoints"]}
        return st.get("e1") == "suspended" and st.get("e2") == "suspended"

    wait_until("both endpoints to suspend", asleep, 90, interval=0.5, details=hosted.logs)
    for name, (ep, password) in rows.items():
        info = {"host": hosts["sk-a"].address, "port": svc["ports"]["pg"], "user": "app", "password": password,
                "dbname": "postgres", "sslmode": "verify-full", "sslrootcert": str(hosted.cluster.ca),
                "options": f"endpoint={name}", "connect_timeout": 120}
        with psycopg.connect(**info, autocommit=True) as conn:
            assert conn.execute("SELECT who, count(*) FROM kept GROUP BY who").fetchall() == [(name, 100)]
            # The session reached the compute over TCP and TLS.
            assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
            assert conn.execute("SELECT inet_server_addr()::text").fetchone()[0].split("/")[0] == \
                hosts[ep.host].address
            # Running on its own host while the session holds it (once the
            # session ends it may suspend again after its 2 s, before the
            # other endpoint has woken).
            st = {e["name"]: (e["host"], e["state"]) for e in hosted.status()["endpoints"]}
            assert st[name] == (ep.host, "running"), st


def test_a_safekeeper_is_replaced_on_its_host_and_every_host_learns_it(hosted):
    hosts = hosted.hosts
    ep = hosted.endpoint("ep", "cp1")
    ep.sql("CREATE TABLE kept (id int PRIMARY KEY)")
    ep.sql("INSERT INTO kept SELECT generate_series(1, 100)")
    out = hosted.cluster.run("safekeeper", "replace", "sk3", "sk4", timeout=300).stdout
    assert "sk3 replaced by sk4" in out, out
    ep.sql("INSERT INTO kept SELECT generate_series(101, 200)")
    st = hosted.status()
    assert {s["name"]: (s["host"], s["state"]) for s in st["services"]} == {
        "sk1": ("sk-a", "running"), "sk2": ("sk-b", "running"), "sk4": ("sk-c", "running"),
        "pageserver": ("ps", "running"), "controller": ("ps", "running"), "proxy": ("sk-a", "running")}, st["services"]
    # sk4 runs on sk-c's disk; the pageserver host's copy names it (from its next start).
    assert (hosts.hosts["sk-c"].disk / "sk4" / "safekeeper.toml").exists()
    ps_conf = tomllib.loads((hosts.hosts["ps"].disk / "pageserver" / "pageserver.toml").read_text())
    sk4 = next(s for s in hosted.cluster.cluster_toml["services"] if s["name"] == "sk4")
    assert f"{hosts.hosts['sk-c'].address}:{sk4['ports']['listen']}" in ps_conf["safekeepers"], ps_conf
    revisions = {name: tomllib.loads((h.disk / "cluster.toml").read_text())["revision"]
                 for name, h in hosts.hosts.items()}
    assert len(set(revisions.values())) == 1, f"every host has the same revision: {revisions}"
    # The compute commits through the new set after a restart too.
    hosted.cluster.run("endpoint", "stop", "ep", timeout=300)
    again = hosted.endpoint("ep", "cp1")
    assert again.sql("SELECT count(*) FROM kept") == [(200,)]


def _kids(text: str) -> int:
    return text.count("-----BEGIN PUBLIC KEY-----")


def test_keys_rotate_across_hosts_and_the_controllers_secrets_stay_theirs(hosted):
    """`strata auth rotate` reaches every host through its node: each trusts
    the new keys and takes the services' new token; only the controllers'
    host gets their new token and issuer key; the compute on another host
    renews its token at the controller; `--retire` then leaves every host
    trusting the new keys alone, and writes go on (docs/security.md, "Keys
    and their rotation")."""
    hosts = hosted.hosts.hosts
    ep = hosted.endpoint("ep", "cp1")
    ep.sql("CREATE TABLE kept (id int PRIMARY KEY)")
    ep.sql("INSERT INTO kept SELECT generate_series(1, 100)")
    old_controller_token = (hosts["sk-a"].disk / "auth" / "controller.token").read_text()
    hosted.cluster.run("auth", "rotate", timeout=300)
    here = hosted.cluster.workdir / "auth"
    for name, h in hosts.items():
        auth = h.disk / "auth"
        assert _kids((auth / "public.pem").read_text()) == 2, name
        assert (auth / "service.token").read_text() == (here / "service.token").read_text(), name
    # The controllers' token and issuer key: the new ones on the controllers'
    # host only; the others keep what the operator copied (and may delete).
    assert (hosts["ps"].disk / "auth" / "controller.token").read_text() == (here / "controller.token").read_text()
    assert (hosts["ps"].disk / "auth" / "issuer.pem").read_text() == (here / "issuer.pem").read_text()
    for name in ("sk-a", "cp1"):
        assert (hosts[name].disk / "auth" / "controller.token").read_text() == old_controller_token, name
    new_issuer = next(line.split()[1] for line in hosted.cluster.run("auth", "keys").stdout.splitlines()
                      if line.startswith("issuer") and line.endswith("signs"))
    agent_token = hosts["cp1"].disk / "endpoints" / "ep" / "agent.token"
    wait_until("the compute on cp1 renews its token at the controller",
               lambda: header_of(agent_token.read_text())["kid"] == new_issuer, 90, interval=1)
    ep.sql("INSERT INTO kept SELECT generate_series(101, 200)")
    hosted.cluster.run("auth", "rotate", "--retire", timeout=300)
    for name, h in hosts.items():
        assert _kids((h.disk / "auth" / "public.pem").read_text()) == 1, name
    ep.sql("INSERT INTO kept SELECT generate_series(201, 300)")
    hosted.cluster.run("endpoint", "stop", "ep", timeout=300)
    again = hosted.endpoint("ep", "cp1")
    assert again.sql("SELECT count(*) FROM kept") == [(300,)]


def test_a_replica_on_another_host_follows_and_is_promoted(hosted):
    """A replica on cp2 of a writer on cp1: the CLI asks the writer's agent
    on cp1 for a checkpoint, the replica streams from the safekeepers' hosts
    over TLS and reads from the pageserver's host; promoted, it is the
    writer, and the writer on cp1 is fenced and stopped."""
    ep = hosted.endpoint("ep", "cp1")
    ep.sql("CREATE TABLE far (g int)")
    ep.sql("INSERT INTO far SELECT generate_series(1, 5000)")
    replica = hosted.endpoint("r1", "cp2", "--replica-of", "ep")
    assert replica.info["host"] == hosted.hosts.hosts["cp2"].address
    ep.sql("INSERT INTO far SELECT generate_series(5001, 6000)")
    end = ep.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    wait_until("the replica on cp2 to replay the writer's WAL", lambda: replica.sql(
        f"SELECT pg_last_wal_replay_lsn() >= '{end}'::pg_lsn")[0][0] or None, 60, details=hosted.logs)
    assert replica.sql("SELECT count(*), sum(g) FROM far") == ep.sql("SELECT count(*), sum(g) FROM far")
    st = {e["name"]: e for e in hosted.status()["endpoints"]}
    assert st["r1"]["role"] == "replica" and st["r1"]["host"] == "cp2" and st["r1"]["replica"] is not None, st

    out = hosted.cluster.run("endpoint", "promote", "r1", timeout=300).stdout
    assert "promoted to the writer of branch main" in out, out
    replica.sql("INSERT INTO far VALUES (-1)")
    assert replica.sql("SELECT count(*) FROM far")[0][0] == 6001
    st = {e["name"]: e for e in hosted.status()["endpoints"]}
    assert st["ep"]["state"] == "stopped" and st["r1"]["role"] == "writer", st


# Two pageserver hosts (a storage controller beside each), object storage
# on the operator's machine.
FAILOVER_HOSTS = [
    ("sk-a", "safekeeper", "dc1"),
    ("sk-b", "safekeeper", "dc1"),
    ("sk-c", "safekeeper", "dc1"),
    ("ps1", "pageserver", "dc1"),
    ("ps2", "pageserver", "dc1"),
    ("cp1", "compute", "dc1"),
]


def test_the_attached_pageservers_host_cut_off_fails_over_and_returns_demoted(strata_bin, pg_bin_dir, tmp_path,
                                                                                tmp_path_factory):
    """The host of the attached pageserver (and of a controller) is cut off
    the network under load: the other host's controller attaches the
    secondary under a new generation and the compute follows. When the host
    joins again, its pageserver, which never heard of the failover, is made a
    secondary; the safekeepers refuse its old generation; nothing it did
    meanwhile damaged what the new generation serves."""
    minio = Minio(tmp_path / "minio")
    try:
        with hosted_cluster(strata_bin, pg_bin_dir, tmp_path, temp_root(tmp_path_factory), FAILOVER_HOSTS,
                            remote=lambda gateway: (minio.start(host=gateway), minio.remote_storage("strata"))[1]) \
                as hosted:
            hosts = hosted.hosts
            placement = lambda: (lambda t: (t["attached"], t["generation"], t["secondaries"]))(  # noqa: E731
                hosted.status()["timelines"][0])
            assert placement() == ("pageserver", 1, ["pageserver2"])
            tenant = hosted.cluster.tenant_id()

            def mode(ps: str):
                code, body = hosted.http(ps, "GET", "/v1/status")
                assert code == 200, body
                return next((loc["mode"] for loc in body["locations"] if loc["tenant_id"] == tenant), None)

            ep = hosted.endpoint("ep", "cp1")
            ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
            ep.as_superuser([str(pg_bin_dir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-c", "CREATE EXTENSION amcheck"])
            hosted.cluster.run("timeline", "checkpoint", timeout=300)
            writers = AckedWriters(ep, threads=2, backoff=(0.05, 0.5)).start()
            try:
                def acked_more(than: int, timeout: float = 90) -> int:
                    return wait_until(f"more than {than} acknowledged commits", lambda: writers.count() > than + 20
                                      and writers.count(), timeout, interval=0.2,
                                      details=lambda: (writers.errors[-3:], hosted.logs()))

                n = acked_more(0)
                hosts.link("ps1", up=False)
                try:
                    wait_until("the tenant on pageserver2", lambda: placement()[0] == "pageserver2" or None,
                               timeout=120, interval=0.5)
                    n = acked_more(n)
                    # Reads through the new attachment: a whole scan, not
                    # only the pages the compute holds.
                    assert ep.sql("SELECT count(*) FROM pgbench_accounts") == [(SCALE * 100000,)]
                    # The cut-off host still believes it holds the tenant.
                    time.sleep(5)
                finally:
                    hosts.link("ps1", up=True)
                wait_until("pageserver on ps1 a secondary", lambda: mode("pageserver") == "secondary" or None,
                           timeout=120, interval=0.5)
                acked_more(n)
            finally:
                writers.stop()
            assert placement() == ("pageserver2", 2, ["pageserver"])
            assert mode("pageserver2") == "attached"

            acked = writers.acked_ids()
            stored = {row[0] for row in ep.sql("SELECT id FROM acked")}
            assert not acked - stored, f"{len(acked - stored)} acknowledged commits lost"
            with ep.connect() as conn:
                assert_pgbench_invariants(pgbench_state(conn), SCALE)
            # Every safekeeper fences generation 1.
            timeline = hosted.status()["timelines"][0]["timeline_id"]
            for sk in ("sk1", "sk2", "sk3"):
                code, st = hosted.http(sk, "GET", f"/v1/tenant/{tenant}/timeline/{timeline}")
                assert code == 200 and st["pageserver_generation"] == 2, st
            # Nothing the old generation did damaged the new one: a compute
            # started afresh reads every page from pageserver2.
            hosted.cluster.run("endpoint", "stop", "ep", timeout=120)
            ep = hosted.endpoint("ep", "cp1")
            # pg_amcheck is a server package's program, and the superuser's.
            ep.as_superuser([str(pg_bin_dir / "pg_amcheck"), "--heapallindexed", "-d", "postgres"])
            with ep.connect() as conn:
                assert_pgbench_invariants(pgbench_state(conn), SCALE)
            print(f"\n{len(acked)} acknowledged commits kept across the cut-off pageserver host")
    finally:
        minio.kill()


def test_a_tenant_split_across_hosts_streams_each_shard_its_decoded_wal(strata_bin, pg_bin_dir, tmp_path,
                                                                         tmp_path_factory):
    """Across hosts, with MinIO on the operator's machine: the tenant is
    split into two shards under acknowledged writes (`strata tenant split`
    run on the operator's machine). The children start on ps1's pageserver
    and part onto both pageserver hosts; each ingests the WAL the
    safekeeper hosts decode for its shard, in fewer bytes than the WAL;
    the compute on cp1 follows the new layout; every acknowledged commit
    is there and pg_amcheck finds nothing."""
    minio = Minio(tmp_path / "minio")
    try:
        with hosted_cluster(strata_bin, pg_bin_dir, tmp_path, temp_root(tmp_path_factory), FAILOVER_HOSTS,
                            remote=lambda gateway: (minio.start(host=gateway), minio.remote_storage("strata"))[1]) \
                as hosted:
            tenant = hosted.cluster.tenant_id()
            ep = hosted.endpoint("ep", "cp1")
            ep.run(["pgbench", "-i", "-s", str(SCALE), "-q"], timeout=300)
            before = ep.sql("SELECT sum(abalance), count(*) FROM pgbench_accounts")
            writers = AckedWriters(ep, threads=2, backoff=(0.05, 0.5)).start()
            try:
                wait_until("acknowledged commits", lambda: writers.count() > 20, 90, interval=0.2)
                out = hosted.cluster.run("tenant", "split", "default", "--shards", "2", "--stripe-blocks", "8",
                                         timeout=600).stdout
                assert "2 shards" in out, out
                n = writers.count()
                wait_until("commits after the split", lambda: writers.count() > n + 20, 90, interval=0.2,
                           details=lambda: (writers.errors[-3:], hosted.logs()))

                def placed() -> list[str]:
                    """The leading controller's attached pageserver of each shard."""
                    for svc in hosted.cluster.cluster_toml["services"]:
                        if svc["kind"] == "controller":
                            code, body = hosted.http(svc["name"], "GET", "/v1/status")
                            if code == 200 and body.get("leader"):
                                return sorted(p["attached"] for t, p in body["state"]["tenants"].items()
                                              if t.startswith(f"{tenant}-"))
                    return []
                wait_until("a shard attached on each pageserver host",
                           lambda: placed() == ["pageserver", "pageserver2"], 120, interval=0.5, details=placed)
                n = writers.count()
                wait_until("commits with the shards apart", lambda: writers.count() > n + 20, 90, interval=0.2)
            finally:
                writers.stop()
            # Read through both shards: a whole scan after the writes.
            assert ep.sql("SELECT sum(abalance), count(*) FROM pgbench_accounts") == before
            acked = writers.acked_ids()
            stored = {row[0] for row in ep.sql(f"SELECT id FROM {writers.table}")}
            assert not acked - stored, f"{len(acked - stored)} acknowledged commits lost"
            ep.as_superuser([str(pg_bin_dir / "psql"), "-X", "-c", "CREATE EXTENSION IF NOT EXISTS amcheck"])
            ep.as_superuser([str(pg_bin_dir / "pg_amcheck"), "--heapallindexed", "-d", "postgres"])
            # pageserver2 only ever held a child: its WAL came decoded, and
            # only what its shard needs.
            svc = next(s for s in hosted.cluster.cluster_toml["services"] if s["name"] == "pageserver2")
            address = hosted.hosts.hosts[svc["host"]].address
            hosted.cluster.register_port(svc["ports"]["http"])
            m = parse_metrics(http_text(f"http://{address}:{svc['ports']['http']}/metrics"))
            decoded, sent, wal = (m.get(f"strata_pageserver_{k}", 0) for k in
                                  ("decoded_batches_total", "wal_stream_bytes_total", "wal_bytes_ingested_total"))
            assert decoded > 0 and 0 < sent < wal, (decoded, sent, wal)
            print(f"\n{len(acked)} acknowledged commits across the split; pageserver2 received {sent} bytes "
                  f"for {wal} bytes of WAL ({sent / wal:.2f}x), tenant {tenant}")
    finally:
        minio.kill()
