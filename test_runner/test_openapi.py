"""The OpenAPI descriptions of the HTTP APIs (`docs/openapi/`: the
pageserver, the safekeeper, the storage controller, the compute agent
(with the standalone WAL proposer's part of it), the node of a host
(`strata node`) and the link proxy) are kept honest three ways:

- each is a structurally valid OpenAPI 3.0 document (version string, info,
  paths, responses on every operation, path parameters declared, every
  `$ref` resolving);
- the routes the services' routers declare (`.route(...)` in
  `pageserver/src/http.rs`, `safekeeper/src/http.rs`,
  `controller/src/http.rs`, `compute/src/agent/status.rs` (tag `agent`),
  `cli/src/compute.rs` (tag `proposer`), `control_plane/src/node.rs` and
  `link_proxy/src/http.rs`) are exactly the documented paths and methods
  (of the operations with the router's tag, where the document's tags say
  which process serves what); the reading of routers is tried on a known
  snippet as well, so that one written another way fails the test;
- a live local cluster answers every documented operation with a status
  code the description lists for it, with a body that has the documented
  media type and, for JSON, the documented required fields and types.
  Every GET is called with real ids; every other operation only with
  requests it must refuse (or that change nothing, such as creating a
  safekeeper timeline again with its own identity, or healing a route
  that is not cut). The compute agent is the cluster's endpoint's (its
  checkpoint is the one the test needs anyway) and a read-only
  endpoint's; the node is a `strata node` started for the cluster's one
  host, on loopback; the link proxy is a `strata link-proxy` with one
  route, started with the cluster's keys and certificate as `strata init
  --sites` would configure it. The standalone proposer's server is
  checked against its router only: its `/v1/status` answer is the
  agent's `proposer` member, which is checked live.

Needs PyYAML (`requirements.txt`).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import uuid
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from fixtures.endpoint import Endpoint
from fixtures.pageserver_api import wait_for_pageserver_lsn
from fixtures.ports import free_port
from fixtures.strata import Process, format_lsn, parse_lsn, urlopen
from fixtures.routers import routes_in
from fixtures.wait import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
SPECS = {name: REPO_ROOT / "docs" / "openapi" / f"{name}.yaml"
         for name in ("pageserver", "safekeeper", "controller", "compute", "node", "link-proxy", "proxy")}
# Each API's routers: (source, the tag of the operations it serves; None: all).
ROUTERS = {
    "pageserver": [(REPO_ROOT / "pageserver" / "src" / "http.rs", None)],
    "safekeeper": [(REPO_ROOT / "safekeeper" / "src" / "http.rs", None)],
    "controller": [(REPO_ROOT / "controller" / "src" / "http.rs", None)],
    # The agent's status server, and the standalone proposer's (`strata
    # compute proposer --http`), which serves part of the same API.
    "compute": [(REPO_ROOT / "compute" / "src" / "agent" / "status.rs", "agent"),
                (REPO_ROOT / "cli" / "src" / "compute.rs", "proposer")],
    "node": [(REPO_ROOT / "control_plane" / "src" / "node.rs", None)],
    "link-proxy": [(REPO_ROOT / "link_proxy" / "src" / "http.rs", None)],
    "proxy": [(REPO_ROOT / "proxy" / "src" / "http.rs", None)],
}
SAFEKEEPERS = ["sk1", "sk2", "sk3"]
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def load_spec(name: str) -> dict:
    with open(SPECS[name], encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def specs() -> dict[str, dict]:
    return {name: load_spec(name) for name in SPECS}


# ---------------------------------------------------------------- documents

def resolve_pointer(doc: dict, ref: str):
    """The object an internal `$ref` (`#/a/b`) names; KeyError if none."""
    assert ref.startswith("#/"), f"only internal references are used: {ref!r}"
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise KeyError(ref)
        node = node[part]
    return node


def deref(doc: dict, node):
    """`node`, following `$ref`s until an object without one."""
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref not in seen, f"reference cycle at {ref}"
        seen.add(ref)
        node = resolve_pointer(doc, ref)
    return node


def all_refs(node, where: str = "#"):
    """Every (location, `$ref` value) in a document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield where, v
            else:
                yield from all_refs(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from all_refs(v, f"{where}/{i}")


def operations(spec: dict):
    """Every (path, method, operation, path-level parameters) of a document."""
    for path, item in spec["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                yield path, method, item[method], item.get("parameters", [])


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_is_structurally_valid_openapi_3(name):
    spec = load_spec(name)
    problems = []
    assert isinstance(spec, dict), f"{SPECS[name]} is not a mapping"
    assert isinstance(spec.get("openapi"), str) and re.fullmatch(r"3\.0\.\d+", spec["openapi"]), \
        f"openapi must be a 3.0.x version string, not {spec.get('openapi')!r}"
    info = spec.get("info")
    assert isinstance(info, dict), "info is missing"
    for key in ("title", "version", "description"):
        assert isinstance(info.get(key), str) and info[key].strip(), f"info.{key} must be a non-empty string"
    # The description points to the documents of the semantics; they exist.
    docs = re.findall(r"`(docs/[\w./-]+\.md)`", info["description"])
    assert docs, "info.description names no document of the semantics"
    for d in docs:
        if not (REPO_ROOT / d).is_file():
            problems.append(f"info.description names {d}, which does not exist")
    assert isinstance(spec.get("paths"), dict) and spec["paths"], "paths is missing or empty"

    for where, ref in all_refs(spec):
        try:
            resolve_pointer(spec, ref)
        except (KeyError, AssertionError):
            problems.append(f"{where}: $ref {ref!r} does not resolve")

    op_ids = []
    for path in spec["paths"]:
        if not path.startswith("/"):
            problems.append(f"path {path!r} does not start with /")
    for path, method, op, path_params in operations(spec):
        at = f"{method.upper()} {path}"
        if not isinstance(op, dict):
            problems.append(f"{at}: not an operation object")
            continue
        if "operationId" in op:
            op_ids.append(op["operationId"])
        responses = op.get("responses")
        if not isinstance(responses, dict) or not responses:
            problems.append(f"{at}: no responses")
            continue
        for code, response in responses.items():
            if not (isinstance(code, str) and (code == "default" or re.fullmatch(r"[1-5](\d\d|XX)", code))):
                problems.append(f"{at}: response key {code!r} is not a quoted status code")
            try:
                response = deref(spec, response)
            except KeyError:
                continue  # reported with the references
            if not isinstance(response.get("description"), str):
                problems.append(f"{at} {code}: a response needs a description")
            for media, content in (response.get("content") or {}).items():
                if "schema" not in content:
                    problems.append(f"{at} {code} {media}: no schema")
            # Every error answer is the `{"error": ...}` object.
            if isinstance(code, str) and code[0] in "45":
                schema = (response.get("content") or {}).get("application/json", {}).get("schema")
                try:
                    err = deref(spec, schema) if schema else None
                except KeyError:
                    err = None
                if not (err and "error" in err.get("required", [])):
                    problems.append(f"{at} {code}: an error answer must be application/json with a required `error`")
        # Path parameters: each template name declared once as a required path parameter, nothing else.
        declared = {}
        for p in list(path_params) + list(op.get("parameters", [])):
            try:
                p = deref(spec, p)
            except KeyError:
                continue
            for key in ("name", "in"):
                if key not in p:
                    problems.append(f"{at}: parameter without {key}: {p}")
            if "schema" not in p and "content" not in p:
                problems.append(f"{at}: parameter {p.get('name')} has no schema")
            if p.get("in") == "path":
                declared[p.get("name")] = p
                if p.get("required") is not True:
                    problems.append(f"{at}: path parameter {p.get('name')} must be required")
        templated = set(re.findall(r"\{(\w+)\}", path))
        if templated != set(declared):
            problems.append(f"{at}: path parameters {sorted(declared)} do not match the template {sorted(templated)}")
        body = op.get("requestBody")
        if body is not None:
            try:
                body = deref(spec, body)
            except KeyError:
                body = {}
            if not body.get("content"):
                problems.append(f"{at}: requestBody without content")
    dup = {i for i in op_ids if op_ids.count(i) > 1}
    if dup:
        problems.append(f"duplicate operationIds {sorted(dup)}")
    assert not problems, f"{SPECS[name].name}:\n" + "\n".join(problems)


# ------------------------------------------------------------ code vs. docs

def code_routes(source: Path) -> set[tuple[str, str]]:
    """(path, method) of every `.route(...)` of a router's source file."""
    return routes_in(source.read_text(), str(source.relative_to(REPO_ROOT)))


ROUTER_SNIPPET = r"""
// .route("/commented/out", get(nothing))
fn router(state: State) -> Router {
    let counter = state.counter.clone();
    Router::new()
        .route("/v1/item/{id}", get(read_item).put(write_item))
        .route(
            "/v1/count",
            post(move || {
                let text = format!("{} (a parenthesis, a \") and // in a string", counter.get());
                async move { text }
            }),
        )
        .route("/metrics", get(metrics)).with_state(state)
}
async fn read_item() {}
async fn write_item() {}
async fn metrics() {}
"""


def test_routes_are_read_in_every_form_the_routers_use():
    assert routes_in(ROUTER_SNIPPET, "snippet") == {
        ("/v1/item/{id}", "get"), ("/v1/item/{id}", "put"), ("/v1/count", "post"), ("/metrics", "get")}
    for broken, error in [(ROUTER_SNIPPET.replace("fn metrics", "fn other"), "no handler fn metrics"),
                          (ROUTER_SNIPPET.replace("get(metrics)", "any(metrics)"), "unexpected method router any"),
                          (ROUTER_SNIPPET.replace('"/metrics", ', "METRICS, "), "without a literal path"),
                          (ROUTER_SNIPPET + "fn v2() -> Router { Router::new().nest(\"/v2\", router()) }",
                           "nested routers")]:
        with pytest.raises(AssertionError, match=re.escape(error)):
            routes_in(broken, "snippet")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_documented_routes_are_the_routes_of_the_code(name):
    spec = load_spec(name)
    fmt = lambda s: "\n".join(f"  {m.upper()} {p}" for p, m in sorted(s))  # noqa: E731
    served = set()
    for source, tag in ROUTERS[name]:
        documented = {(path, method) for path, method, op, _ in operations(spec)
                      if tag is None or tag in op.get("tags", [])}
        in_code = code_routes(source)
        doc = SPECS[name].name + (f" (tag {tag})" if tag else "")
        assert not in_code - documented, f"routed in {source.name} but not in {doc}:\n{fmt(in_code - documented)}"
        assert not documented - in_code, f"in {doc} but not routed in {source.name}:\n{fmt(documented - in_code)}"
        served |= in_code
    unserved = {(path, method) for path, method, _, _ in operations(spec)} - served
    assert not unserved, f"in {SPECS[name].name} but served by none of its routers:\n{fmt(unserved)}"


# ------------------------------------------------------- answers vs. schemas

JSON_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def validate(spec: dict, schema, value, where: str) -> list[str]:
    """What in `value` disagrees with `schema` (the subset of OpenAPI 3.0
    schemas the descriptions use: type, nullable, required, properties,
    additionalProperties, items, enum, pattern, minimum/maximum, allOf,
    oneOf)."""
    schema = deref(spec, schema)
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null where the schema does not allow it"]
    errors = []
    for sub in schema.get("allOf", []):
        errors += validate(spec, sub, value, where)
    if "oneOf" in schema:
        misfits = [validate(spec, sub, value, where) for sub in schema["oneOf"]]
        fits = misfits.count([])
        if fits == 0:
            errors.append(f"{where}: fits none of the schemas of oneOf: " + "; ".join(m[0] for m in misfits))
        elif fits > 1:
            errors.append(f"{where}: fits {fits} of the schemas of oneOf, not one")
    kind = schema.get("type")
    if kind is not None:
        if not JSON_TYPES[kind](value):
            return errors + [f"{where}: {type(value).__name__} {value!r:.60} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if JSON_TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {value} > maximum {schema['maximum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{where}: required field {key!r} is missing")
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key in value:
                errors += validate(spec, sub, value[key], f"{where}.{key}")
        if schema.get("additionalProperties") is False:
            extra = set(value) - set(props)
            if extra:
                errors.append(f"{where}: fields {sorted(extra)} are not documented")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(spec, schema["items"], item, f"{where}[{i}]")
    return errors


def raw_request(url: str, method: str, body: bytes | None = None,
                timeout: float = 30, headers: dict | None = None) -> tuple[int, str, bytes]:
    """One request: (status, content type, body bytes). A body is sent as
    JSON unless `headers` are given."""
    if headers is None:
        headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        with urlopen(url, method, body, headers, timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


class Checker:
    """Calls documented operations of a live cluster and collects every
    disagreement with the descriptions."""

    def __init__(self, cluster, specs: dict[str, dict]):
        self.cluster = cluster
        self.specs = specs
        self.problems: list[str] = []
        # (spec name, path template, method) -> status codes answered.
        self.answered: dict[tuple[str, str, str], set[int]] = {}
        # Servers that are not services of cluster.toml: name -> (spec name, base URL).
        self.servers: dict[str, tuple[str, str]] = {}

    def add_server(self, name: str, spec: str, port: int) -> None:
        """`name` serves the API of `spec` on `port` of 127.0.0.1 (with the
        cluster's token and, when it has one, its CA)."""
        self.cluster.register_port(port)
        self.servers[name] = (spec, f"http://127.0.0.1:{port}")

    def url(self, service: str, path: str) -> str:
        if service in self.servers:
            return self.servers[service][1] + path
        return self.cluster.http_url(service, path)

    def call(self, service: str, method: str, template: str, *, query: dict | None = None,
             json_body=None, raw_body: bytes | None = None, expect: set[int], **params):
        """Calls `method template` (filled with `params`) on `service`; checks
        that the status is documented for the operation and expected by the
        test, and the body against the documented content. Returns (status,
        parsed JSON or raw bytes)."""
        if service in self.servers:
            name = self.servers[service][0]
        else:
            name = service if service in ("pageserver", "controller") else "safekeeper"
        spec = self.specs[name]
        path = template.format(**params)
        if query:
            path += "?" + urllib.parse.urlencode(query)
        body = raw_body if raw_body is not None else (json.dumps(json_body).encode() if json_body is not None else None)
        status, ctype, data = raw_request(self.url(service, path), method.upper(), body)
        at = f"{service}: {method.upper()} {path}"
        self.answered.setdefault((name, template, method), set()).add(status)

        op = spec["paths"].get(template, {}).get(method)
        if op is None:
            self.problems.append(f"{at}: {method.upper()} {template} is not documented")
            return status, data
        if status not in expect:
            self.problems.append(f"{at}: answered {status}, the test expected {sorted(expect)}: {data[:300]!r}")
        responses = op["responses"]
        if str(status) not in responses and "default" not in responses:
            self.problems.append(f"{at}: answered {status}, not documented (documented: {sorted(responses)}): "
                                 f"{data[:300]!r}")
            return status, data
        response = deref(spec, responses.get(str(status), responses.get("default")))
        content = response.get("content") or {}
        if not content:
            return status, data
        media = ctype.split(";")[0].strip().lower()
        if media not in content:
            self.problems.append(f"{at}: {status} with content type {ctype!r}, documented {sorted(content)}")
            return status, data
        if media != "application/json":
            return status, data
        try:
            parsed = json.loads(data)
        except ValueError as e:
            self.problems.append(f"{at}: {status} body is not JSON ({e}): {data[:200]!r}")
            return status, data
        self.problems += [f"{at}: {e}" for e in validate(spec, content[media]["schema"], parsed, "body")]
        return status, parsed

    def unexercised(self) -> list[str]:
        """Documented operations never called, or GETs never answered with success."""
        out = []
        for name, spec in self.specs.items():
            for path, method, _, _ in operations(spec):
                codes = self.answered.get((name, path, method))
                if not codes:
                    out.append(f"{name}: {method.upper()} {path} was never called")
                elif method == "get" and not any(200 <= c < 300 for c in codes):
                    out.append(f"{name}: GET {path} never succeeded (answers {sorted(codes)})")
        return out


def wait_answering(port: int, proc: Process, what: str) -> None:
    """Until `GET /v1/status` on `port` answers 200; fails at once if `proc` exits."""
    wait_until(f"{what} answers", lambda: raw_request(f"http://127.0.0.1:{port}/v1/status", "GET", timeout=5)[0] == 200,
               timeout=30, stop_if=lambda: None if proc.running() else f"{what} exited:\n{proc.log_text()[-2000:]}")


@pytest.fixture
def node(cluster, tmp_path) -> int:
    """`strata node` of the cluster's one host (`local`, on loopback), with
    the cluster's TLS and keys as every node has them; its port. It finds
    the host's services running and leaves them be. Killed at teardown: on
    SIGTERM a node stops its host's endpoints and services, which is the
    cluster fixture's to do."""
    [host] = cluster.cluster_toml["hosts"]
    port = host["node_port"]
    cluster.register_port(port)
    proc = Process([str(cluster.strata_bin), "node", "--workdir", str(cluster.workdir), "--host", host["name"]],
                   tmp_path / "node.log")
    proc.start()
    try:
        wait_answering(port, proc, "strata node")
        yield port
    finally:
        proc.kill9()


@pytest.fixture
def link_proxy(cluster, tmp_path) -> int:
    """`strata link-proxy` with one route, `to-pageserver` (to the
    pageserver's page service), secured as `strata init --sites` secures
    one: the cluster's public key, this host's certificate (the
    pageserver's `[auth]` and `[tls]`); its HTTP port."""
    ps = cluster.service_config("pageserver")
    port = free_port()
    lines = [f'listen_http = "127.0.0.1:{port}"', "[[routes]]", 'name = "to-pageserver"', 'listen = "127.0.0.1:0"',
             f"target = {json.dumps(ps['listen_pg'])}"]
    if "auth" in ps:
        lines += ["[auth]", f"public_key = {json.dumps(ps['auth']['public_key'])}"]
    if "tls" in ps:
        lines += ["[tls]"] + [f"{key} = {json.dumps(ps['tls'][key])}" for key in ("ca", "cert", "key")]
    config = tmp_path / "link-proxy.toml"
    config.write_text("\n".join(lines) + "\n")
    cluster.register_port(port)
    proc = Process([str(cluster.strata_bin), "link-proxy", "--config", str(config)], tmp_path / "link-proxy.log")
    proc.start()
    try:
        wait_answering(port, proc, "strata link-proxy")
        yield port
    finally:
        proc.stop()


def check_agent(c: Checker, tenant: str, timeline: str) -> None:
    """The writer's compute agent ("ep"): its status and metrics."""
    _, agent = c.call("ep", "get", "/v1/status", expect={200})
    if isinstance(agent, dict):
        c.problems += [f"ep: GET /v1/status: the agent's answer is no ComputeStatus: {e}" for e in
                       validate(c.specs["compute"], {"$ref": "#/components/schemas/ComputeStatus"}, agent, "body")]
        if [agent.get("state"), agent.get("tenant_id"), agent.get("timeline_id")] != ["running", tenant, timeline]:
            c.problems.append(f"ep: not running on the branch: {agent}")
        if not (agent.get("proposer") or {}).get("streaming"):
            c.problems.append(f"ep: its proposer does not stream: {agent.get('proposer')}")
    st, text = c.call("ep", "get", "/metrics", expect={200})
    if st == 200 and not (b'strata_compute_state{state="running"} 1' in text and b"strata_proposer_term" in text):
        c.problems.append("ep /metrics: no running state or no proposer term")


def check_node(c: Checker, connstr: str, ep_port: int, timeline: str) -> None:
    """The host's node: reads, and only requests it must refuse or that
    change nothing; its services and endpoints run on as before."""
    nd = "node"
    _, host = c.call(nd, "get", "/v1/status", expect={200})
    if isinstance(host, dict):
        services = {s.get("name"): s.get("state") for s in host.get("services", [])}
        computes = {e.get("name"): e.get("compute_state") for e in host.get("endpoints", [])}
        if services != {s["name"]: "running" for s in c.cluster.cluster_toml["services"]} or \
                computes != {"ep": "running"}:
            c.problems.append(f"the node does not report every service and ep running: {services}, {computes}")
    _, records = c.call(nd, "get", "/v1/endpoints", expect={200})
    if isinstance(records, list) and [r.get("file", {}).get("http_port") for r in records
                                      if r.get("file", {}).get("name") == "ep"] != [ep_port]:
        c.problems.append(f"the node's endpoints do not have ep at its port {ep_port}: {records}")
    _, state = c.call(nd, "get", "/v1/spec", expect={200})
    revision = c.cluster.cluster_toml["revision"]
    if isinstance(state, dict) and (state.get("revision") != revision or "cluster.toml" not in state.get("files", {})):
        c.problems.append(f"the node's state is not revision {revision} with cluster.toml: {str(state)[:300]}")
    # The host's own revision again changes nothing; a newer one must carry cluster.toml.
    if isinstance(state, dict):
        _, taken = c.call(nd, "post", "/v1/spec", json_body=state, expect={200})
        if isinstance(taken, dict) and taken != {"revision": revision, "taken": False}:
            c.problems.append(f"the node took its own revision again: {taken}")
    c.call(nd, "post", "/v1/spec", json_body={"revision": revision + 1, "files": {}}, expect={500})
    # A service that runs, started again, stays as it is; unknown ones are refused.
    c.call(nd, "post", "/v1/services/start", json_body={"names": ["sk1"]}, expect={200})
    c.call(nd, "post", "/v1/services/start", json_body={"names": ["nope"]}, expect={400})
    c.call(nd, "post", "/v1/services/stop", json_body={"names": ["nope"]}, expect={400})
    launch = {"name": "ep", "host": c.cluster.cluster_toml["hosts"][0]["name"], "tenant": "default",
              "tenant_id": c.cluster.tenant_id(), "branch": "main", "timeline_id": timeline,
              "agent": {"lazy": False, "eager": False}}
    c.call(nd, "post", "/v1/endpoints/start", json_body={**launch, "host": "elsewhere"}, expect={400})
    c.call(nd, "post", "/v1/endpoints/start", json_body={**launch, "name": "not a name"}, expect={400})
    c.call(nd, "post", "/v1/endpoints/start", json_body=launch, expect={500})  # it runs already
    c.call(nd, "post", "/v1/endpoints/stop", json_body={"name": "nope"}, expect={500})
    c.call(nd, "post", "/v1/endpoints/forget", json_body={"name": "ep"}, expect={500})  # it runs
    c.call(nd, "post", "/v1/endpoints/forget", json_body={"name": "nope"}, expect={500})
    _, password = c.call(nd, "post", "/v1/endpoints/password", json_body={"name": "ep"}, expect={200})
    if isinstance(password, dict) and password.get("password") != conninfo_to_dict(connstr).get("password"):
        c.problems.append("the node's password of ep is not the one of its connection string")
    c.call(nd, "post", "/v1/endpoints/password", json_body={"name": "nope"}, expect={500})
    _, verifier = c.call(nd, "post", "/v1/endpoints/verifier", json_body={"name": "ep"}, expect={200})
    if isinstance(verifier, dict) and (verifier.get("password") is not None or verifier.get("verifier") is None
                                       or not password or verifier.get("verifier") != password.get("verifier")):
        c.problems.append(f"the node's verifier of ep is not its verifier alone: {verifier}")
    c.call(nd, "post", "/v1/endpoints/verifier", json_body={"name": "nope"}, expect={500})
    # Bodies the node cannot read are refused before any operation, in plain text.
    for body, headers, code in [(b"{", {"Content-Type": "application/json"}, 400),
                                (b'{"names": "sk1"}', {"Content-Type": "application/json"}, 422),
                                (b'{"names": []}', {"Content-Type": "text/plain"}, 415)]:
        st, ctype, data = raw_request(c.url(nd, "/v1/services/start"), "POST", body, headers=headers)
        if st != code or not ctype.startswith("text/plain"):
            c.problems.append(f"node: {body!r} as {headers}: {st} {ctype!r}, not {code} in plain text: {data[:200]!r}")
    _, host_after = c.call(nd, "get", "/v1/status", expect={200})
    if isinstance(host, dict) and isinstance(host_after, dict):
        before, now = ({(x.get("name"), x.get("pid")) for x in h.get("services", []) + h.get("endpoints", [])}
                       for h in (host, host_after))
        if now != before:
            c.problems.append(f"the node's services or endpoints changed: {before} -> {now}")


def check_link_proxy(c: Checker) -> None:
    """The link proxy: reads, and only requests it must refuse or that
    change nothing; its routes are as before."""
    lp = "link-proxy"
    route = "/v1/route/{name}"
    _, routes = c.call(lp, "get", "/v1/status", expect={200})
    if isinstance(routes, dict) and [(r.get("name"), r.get("target")) for r in routes.get("routes", [])] != \
            [("to-pageserver", c.cluster.service_config("pageserver")["listen_pg"])]:
        c.problems.append(f"the link proxy does not have its one route: {routes}")
    st, text = c.call(lp, "get", "/metrics", expect={200})
    if st == 200 and b"# TYPE" not in text:
        c.problems.append("link proxy /metrics: no `# TYPE` line")
    # Its own delay again, healing a route that is not cut and resetting one
    # without connections change nothing; the rest is refused.
    c.call(lp, "put", route, json_body={"delay_ms": 0, "jitter_ms": 0}, expect={200}, name="to-pageserver")
    c.call(lp, "put", route, json_body={"delay_ms": -1}, expect={400}, name="to-pageserver")
    c.call(lp, "put", route, json_body={"delay_ms": 0, "bogus": 1}, expect={400}, name="to-pageserver")
    c.call(lp, "put", route, raw_body=b"{", expect={400}, name="to-pageserver")
    c.call(lp, "put", route, json_body={"delay_ms": 0}, expect={404}, name="nope")
    c.call(lp, "post", route + "/cut", expect={404}, name="nope")
    c.call(lp, "post", route + "/cut", query={"direction": "sideways"}, expect={400}, name="to-pageserver")
    c.call(lp, "put", route, json_body={"loss_pct": 101}, expect={400}, name="to-pageserver")
    c.call(lp, "post", route + "/heal", expect={200}, name="to-pageserver")
    c.call(lp, "post", route + "/heal", expect={200}, name="*")
    c.call(lp, "post", route + "/heal", expect={404}, name="nope")
    c.call(lp, "post", route + "/reset", expect={200}, name="to-pageserver")
    c.call(lp, "post", route + "/reset", expect={404}, name="nope")
    _, routes_after = c.call(lp, "get", "/v1/status", expect={200})
    if routes_after != routes:
        c.problems.append(f"the link proxy's routes changed: {routes} -> {routes_after}")


def check_proxy(c: Checker) -> None:
    """The proxy: its status and metrics."""
    _, status = c.call("proxy", "get", "/v1/status", expect={200})
    if isinstance(status, dict) and status.get("require_tls") is not True:
        c.problems.append(f"the proxy of a cluster with TLS does not require it: {status}")
    st, text = c.call("proxy", "get", "/metrics", expect={200})
    if st == 200 and b"strata_proxy_sessions" not in text:
        c.problems.append("proxy /metrics: no strata_proxy_sessions")


def test_live_cluster_answers_as_documented(cluster, node, link_proxy, specs):
    """Every documented operation of the pageserver, of each safekeeper, of
    the storage controller, of a writer's and a read-only compute's agent,
    of the host's node and of a link proxy, against a running local
    cluster."""
    c = Checker(cluster, specs)
    c.add_server("node", "node", node)
    c.add_server("link-proxy", "link-proxy", link_proxy)
    tenant = cluster.tenant_id()
    timeline = cluster.timeline_id()
    missing = uuid.uuid4().hex  # a timeline (or tenant) no service holds
    ids = {"tenant": tenant, "timeline": timeline}
    tl = "/v1/tenant/{tenant}/timeline/{timeline}"

    # A commit, so that the timelines have WAL of a compute: a term history,
    # consumers, and a commit time to find by `lsn_by_time`.
    connstr = cluster.endpoint_start("ep")
    ep_port = Endpoint(cluster, "ep").http_port
    c.add_server("ep", "compute", ep_port)
    with psycopg.connect(connstr, autocommit=True, connect_timeout=30) as conn:
        conn.execute("CREATE TABLE t (id int)")
        # A checkpoint record for `checkpoint_record`, made by the writer's agent.
        _, made = c.call("ep", "post", "/v1/checkpoint", expect={200})
        before_commit = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        conn.execute("INSERT INTO t VALUES (1)")
        commit_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    wait_for_pageserver_lsn(cluster, commit_lsn, timeout=30)

    # ---- pageserver: reads, with real ids
    ps = "pageserver"
    _, node = c.call(ps, "get", "/v1/status", expect={200})
    if isinstance(node, dict) and not any(t.get("timeline_id") == timeline for t in node.get("timelines", [])):
        c.problems.append(f"pageserver /v1/status does not list timeline {timeline}")
    has_remote = isinstance(node, dict) and node.get("remote_storage") is not None
    _, status = c.call(ps, "get", tl, expect={200}, **ids)
    assert isinstance(status, dict), f"no timeline status: {status!r}"
    _, sized = c.call(ps, "get", tl, query={"logical_size": "true"}, expect={200}, **ids)
    if isinstance(sized, dict) and not isinstance(sized.get("logical_size"), int):
        c.problems.append(f"logical_size=true answered no logical_size: {sized.get('logical_size')!r}")
    c.call(ps, "get", tl, query={"bogus": "1"}, expect={400}, **ids)
    c.call(ps, "get", tl, expect={404}, tenant=tenant, timeline=missing)
    c.call(ps, "get", tl, expect={400}, tenant=tenant, timeline="not-an-id")

    st, tar = c.call(ps, "get", tl + "/basebackup", expect={200}, **ids)
    if st == 200 and (len(tar) < 1024 or tar[257:262] != b"ustar"):
        c.problems.append(f"basebackup: not a tar stream ({len(tar)} bytes)")
    c.call(ps, "get", tl + "/basebackup", query={"lsn": "0/8"}, expect={404}, **ids)  # before the start
    c.call(ps, "get", tl + "/basebackup", query={"full": "maybe"}, expect={400}, **ids)
    c.call(ps, "get", tl + "/basebackup", expect={404}, tenant=tenant, timeline=missing)
    st, tar = c.call(ps, "get", tl + "/basebackup", query={"standby": "true"}, expect={200}, **ids)
    if st == 200 and b"backup_label" not in tar:
        c.problems.append("basebackup standby=true: no backup_label")

    _, record = c.call(ps, "get", tl + "/checkpoint_record", expect={200}, **ids)
    if isinstance(record, dict) and "lsn" in record and parse_lsn(record["lsn"]) >= before_commit:
        c.problems.append(f"checkpoint_record: {record['lsn']}, not before the last commit")
    if isinstance(record, dict) and isinstance(made, dict) and \
            [record.get("lsn"), record.get("redo")] != [made.get("checkpoint_lsn"), made.get("redo_lsn")]:
        c.problems.append(f"checkpoint_record: {record}, not the checkpoint the agent made: {made}")
    c.call(ps, "get", tl + "/checkpoint_record", query={"lsn": "not-an-lsn"}, expect={400}, **ids)
    c.call(ps, "get", tl + "/checkpoint_record", expect={404}, tenant=tenant, timeline=missing)

    # After every commit stamped at or before now: past the INSERT's commit.
    just_now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    _, found = c.call(ps, "get", tl + "/lsn_by_time", query={"time": just_now}, expect={200}, **ids)
    if isinstance(found, dict) and "lsn" in found and parse_lsn(found["lsn"]) <= before_commit:
        c.problems.append(f"lsn_by_time {just_now}: {found['lsn']}, not after the last commit")
    c.call(ps, "get", tl + "/lsn_by_time", query={"time": "2100-01-01T00:00:00Z"}, expect={422}, **ids)
    c.call(ps, "get", tl + "/lsn_by_time", query={"time": "yesterday"}, expect={400}, **ids)
    c.call(ps, "get", tl + "/lsn_by_time", expect={400}, **ids)
    c.call(ps, "get", tl + "/lsn_by_time", query={"time": just_now}, expect={404}, tenant=tenant, timeline=missing)

    # pg_class (relfilenode 1259) of template1 (database 1): in every bootstrap.
    st, page = c.call(ps, "get", tl + "/page", query={"rel": "1663/1/1259", "block": 0}, expect={200}, **ids)
    if st == 200 and len(page) != 8192:
        c.problems.append(f"page: {len(page)} bytes, not 8192")
    c.call(ps, "get", tl + "/page", query={"rel": "1663/1/1259", "block": 4000000000}, expect={404}, **ids)
    c.call(ps, "get", tl + "/page", query={"rel": "1663/1/1259", "block": 0, "fork": 9}, expect={400}, **ids)
    c.call(ps, "get", tl + "/page", query={"block": 0}, expect={400}, **ids)

    st, text = c.call(ps, "get", "/metrics", expect={200})
    if st == 200 and b"# TYPE" not in text:
        c.problems.append("pageserver /metrics: no `# TYPE` line")

    # ---- pageserver: changes, only requests that must be refused
    c.call(ps, "post", "/v1/tenant", raw_body=b"{", expect={400})
    c.call(ps, "post", "/v1/tenant", json_body={"tenant_id": tenant, "bogus": 1}, expect={400})
    c.call(ps, "post", "/v1/tenant", json_body={"tenant_id": tenant, "timeline_id": timeline}, expect={409})
    if has_remote:
        # With object storage a tenant the attachment file does not name is refused before any work.
        c.call(ps, "post", "/v1/tenant", json_body={"tenant_id": missing}, expect={412})
    # An import: of a timeline that exists (refused before a byte is read),
    # with a bad id, and of bytes that are no tar stream.
    imp = tl + "/import"
    c.call(ps, "put", imp, raw_body=b"x" * 1024, expect={409}, **ids)
    c.call(ps, "put", imp, raw_body=b"x" * 1024, expect={400}, tenant="not-an-id", timeline=timeline)
    c.call(ps, "put", imp, raw_body=b"not a tar stream" * 64, expect={422}, tenant=missing, timeline=timeline)
    # A tenant's objects: refused while it is located here; a tenant never
    # placed has none (nothing of the cluster's changes).
    c.call(ps, "delete", "/v1/tenant/{tenant}", expect={409} if has_remote else {200}, tenant=tenant)
    c.call(ps, "delete", "/v1/tenant/{tenant}", expect={200}, tenant=missing)
    c.call(ps, "delete", "/v1/tenant/{tenant}", expect={400}, tenant="not-an-id")

    branches = "/v1/tenant/{tenant}/timeline"
    c.call(ps, "post", branches, raw_body=b"not json", expect={400}, tenant=tenant)
    c.call(ps, "post", branches, json_body={"ancestor_timeline_id": timeline}, expect={400}, tenant="not-an-id")
    c.call(ps, "post", branches, json_body={"timeline_id": missing}, expect={400}, tenant=tenant)
    c.call(ps, "post", branches, json_body={"ancestor_timeline_id": missing}, expect={404}, tenant=tenant)
    c.call(ps, "post", branches, json_body={"timeline_id": missing, "ancestor_timeline_id": timeline,
                                            "ancestor_lsn": "0/8", "ancestor_time": just_now},
           expect={400}, tenant=tenant)
    c.call(ps, "post", branches, json_body={"timeline_id": missing, "ancestor_timeline_id": timeline,
                                            "ancestor_lsn": "0/1"}, expect={422}, tenant=tenant)  # not aligned
    c.call(ps, "post", branches, json_body={"timeline_id": missing, "ancestor_timeline_id": timeline,
                                            "ancestor_lsn": "0/8"}, expect={422}, tenant=tenant)  # before start
    c.call(ps, "post", branches, json_body={"timeline_id": missing, "ancestor_timeline_id": timeline,
                                            "ancestor_time": "2100-01-01T00:00:00Z"}, expect={422}, tenant=tenant)

    c.call(ps, "delete", tl, expect={404}, tenant=tenant, timeline=missing)
    c.call(ps, "delete", tl, expect={400}, tenant=tenant, timeline="not-an-id")

    c.call(ps, "post", tl + "/lease", raw_body=b"{", expect={400}, **ids)
    c.call(ps, "post", tl + "/lease", json_body={"lsn": "0/16B3748", "ttl": 1}, expect={400}, **ids)
    c.call(ps, "post", tl + "/lease", json_body={"lsn": "FFFFFFFF/0"}, expect={422}, **ids)  # beyond the WAL
    c.call(ps, "post", tl + "/lease", json_body={"lsn": "0/16B3748"}, expect={404}, tenant=tenant, timeline=missing)

    c.call(ps, "post", tl + "/checkpoint", query={"compact": "maybe"}, expect={400}, **ids)
    c.call(ps, "post", tl + "/checkpoint", expect={404}, tenant=tenant, timeline=missing)
    c.call(ps, "post", tl + "/evict", expect={404}, tenant=tenant, timeline=missing)
    c.call(ps, "post", tl + "/evict", expect={400}, tenant="not-an-id", timeline=timeline)
    loc = "/v1/tenant/{tenant}/location"
    c.call(ps, "put", loc, json_body={"mode": "attached"}, expect={400}, tenant=tenant)  # no generation
    c.call(ps, "put", loc, json_body={"mode": "elsewhere"}, expect={400}, tenant=tenant)
    c.call(ps, "put", loc, json_body={"mode": "secondary"}, expect={400}, tenant="not-an-id")
    # A split's call: children that are not the parent's, a parent not here.
    split = "/v1/tenant/{tenant}/split"
    c.call(ps, "post", split, json_body={"stripe_blocks": 8, "children": [
        {"shard": f"{tenant}-0of3", "generation": 1}]}, expect={400}, tenant=tenant)
    c.call(ps, "post", split, json_body={"stripe_blocks": 8, "children": [
        {"shard": f"{missing}-0of2", "generation": 1}, {"shard": f"{missing}-1of2", "generation": 1}]},
        expect={404}, tenant=missing)
    c.call(ps, "post", split, raw_body=b"{", expect={400}, tenant=tenant)

    # ---- safekeepers
    for sk in SAFEKEEPERS:
        _, node = c.call(sk, "get", "/v1/status", expect={200})
        if isinstance(node, dict) and not any(t.get("timeline_id") == timeline for t in node.get("timelines", [])):
            c.problems.append(f"{sk} /v1/status does not list timeline {timeline}")
        _, positions = c.call(sk, "get", "/v1/positions", expect={200})
        if isinstance(positions, list) and not any(p.get("timeline_id") == timeline for p in positions):
            c.problems.append(f"{sk} /v1/positions does not list timeline {timeline}")
        _, sk_status = c.call(sk, "get", tl, expect={200}, **ids)
        c.call(sk, "get", tl, expect={404}, tenant=tenant, timeline=missing)
        c.call(sk, "get", tl, expect={400}, tenant="not-an-id", timeline=timeline)
        _, membership = c.call(sk, "get", tl + "/membership", expect={200}, **ids)
        c.call(sk, "get", tl + "/membership", expect={404}, tenant=tenant, timeline=missing)
        st, text = c.call(sk, "get", "/metrics", expect={200})
        if st == 200 and b"# TYPE" not in text:
            c.problems.append(f"{sk} /metrics: no `# TYPE` line")

        # Creation: again with its own identity changes nothing (200); anything else is refused.
        if isinstance(sk_status, dict):
            identity = {"system_id": sk_status.get("system_id"), "pg_version": sk_status.get("pg_version"),
                        "wal_segment_size": sk_status.get("wal_segment_size"),
                        "start_lsn": sk_status.get("timeline_start_lsn")}
            c.call(sk, "post", tl, json_body=identity, expect={200}, **ids)
            c.call(sk, "post", tl, json_body={**identity, "system_id": identity["system_id"] ^ 1},
                   expect={409}, **ids)
            c.call(sk, "post", tl, json_body={**identity, "pg_version": 14}, expect={400},
                   tenant=tenant, timeline=missing)
            c.call(sk, "post", tl, json_body={**identity, "wal_segment_size": 1000}, expect={400},
                   tenant=tenant, timeline=missing)
            c.call(sk, "post", tl, json_body={**identity, "bogus": 1}, expect={400},
                   tenant=tenant, timeline=missing)
        c.call(sk, "post", tl, raw_body=b"{", expect={400}, tenant=tenant, timeline=missing)
        c.call(sk, "delete", tl, expect={404}, tenant=tenant, timeline=missing)
        c.call(sk, "delete", tl, expect={400}, tenant=tenant, timeline="not-an-id")

        # Membership: the configuration held, again, changes nothing (200); the rest is refused.
        if isinstance(membership, dict):
            c.call(sk, "put", tl + "/membership", json_body=membership, expect={200}, **ids)
        c.call(sk, "put", tl + "/membership", raw_body=b"{", expect={400}, **ids)
        c.call(sk, "put", tl + "/membership", json_body={"generation": 0, "members": [{"id": 1, "address": "a:1"}]},
               expect={400}, **ids)
        c.call(sk, "put", tl + "/membership", json_body={"generation": 1, "members": [{"id": 1, "address": "a:1"}]},
               expect={404}, tenant=tenant, timeline=missing)
        # Sealing is for good: only refusals here.
        c.call(sk, "post", tl + "/seal", expect={404}, tenant=tenant, timeline=missing)
        c.call(sk, "post", tl + "/seal", expect={400}, tenant=tenant, timeline="not-an-id")

    # ---- the storage controller
    ctl = "controller"
    _, cst = c.call(ctl, "get", "/v1/status", expect={200})
    if isinstance(cst, dict) and not (cst.get("leader") and (cst.get("state") or {}).get("tenants", {}).get(tenant)):
        c.problems.append(f"the controller does not lead or does not place tenant {tenant}: {cst}")
    att = "/v1/tenant/{tenant}/attachment"
    _, where = c.call(ctl, "get", att, expect={200}, tenant=tenant)
    if isinstance(where, dict) and where.get("pageserver") != "pageserver":
        c.problems.append(f"the attachment names {where.get('pageserver')!r}, not the only pageserver")
    version = where.get("version", 0) if isinstance(where, dict) else 0
    # Nothing newer comes: the poll answers with the same state after its wait.
    _, again = c.call(ctl, "get", att, query={"after": version, "wait_seconds": 0.2}, expect={200}, tenant=tenant)
    if isinstance(again, dict) and again.get("version") != version:
        c.problems.append(f"the state changed during the test: {version} -> {again.get('version')}")
    c.call(ctl, "get", att, query={"wait_seconds": 99}, expect={400}, tenant=tenant)
    c.call(ctl, "get", att, query={"bogus": 1}, expect={400}, tenant=tenant)
    c.call(ctl, "get", att, expect={400}, tenant="not-an-id")
    c.call(ctl, "get", att, expect={404}, tenant=missing)
    # Registering the placed tenant again changes nothing (200, not 201);
    # malformed ids are refused. (Deleting would change the state.)
    _, registered = c.call(ctl, "put", "/v1/tenant/{tenant}", expect={200}, tenant=tenant)
    if isinstance(registered, dict) and registered.get("tenant_id") != tenant:
        c.problems.append(f"registering {tenant} again answered another tenant: {registered}")
    c.call(ctl, "put", "/v1/tenant/{tenant}", expect={400}, tenant="not-an-id")
    c.call(ctl, "delete", "/v1/tenant/{tenant}", expect={400}, tenant="not-an-id")
    # Splits: never split (404), a count that is no multiple, a shard's id.
    csplit = "/v1/tenant/{tenant}/split"
    c.call(ctl, "get", csplit, expect={404}, tenant=tenant)
    c.call(ctl, "get", csplit, expect={400}, tenant="not-an-id")
    c.call(ctl, "post", csplit, json_body={"shards": 1, "stripe_blocks": 8}, expect={409}, tenant=tenant)
    c.call(ctl, "post", csplit, json_body={"shards": 2, "stripe_blocks": 7}, expect={409}, tenant=tenant)
    c.call(ctl, "post", csplit, json_body={"shards": 2}, expect={400}, tenant=tenant)
    c.call(ctl, "post", csplit, json_body={"shards": 4, "stripe_blocks": 8}, expect={400}, tenant=f"{tenant}-0of2")
    # Renewal renews a tenant's own token only: management's is refused.
    c.call(ctl, "post", "/v1/tenant/{tenant}/token", expect={403}, tenant=tenant)
    c.call(ctl, "post", "/v1/tenant/{tenant}/token", expect={400}, tenant="not-an-id")
    # Fill of an active pageserver changes nothing; an unknown one is refused.
    c.call(ctl, "post", "/v1/pageserver/{name}/fill", expect={200}, name="pageserver")
    c.call(ctl, "post", "/v1/pageserver/{name}/fill", expect={404}, name="nope")
    c.call(ctl, "post", "/v1/pageserver/{name}/drain", expect={404}, name="nope")
    c.call(ctl, "post", "/v1/pageserver/{name}/lost", expect={404}, name="nope")
    st, text = c.call(ctl, "get", "/metrics", expect={200})
    if st == 200 and b"# TYPE" not in text:
        c.problems.append("controller /metrics: no `# TYPE` line")

    check_agent(c, tenant, timeline)
    check_node(c, connstr, ep_port, timeline)
    check_link_proxy(c)
    proxy = next(s for s in cluster.cluster_toml["services"] if s["kind"] == "proxy")
    c.add_server("proxy", "proxy", proxy["ports"]["http"])
    check_proxy(c)

    # Nothing was changed by the refused requests.
    _, after = c.call(ps, "get", tl, expect={200}, **ids)
    if isinstance(after, dict) and after.get("retain_lsns") != status.get("retain_lsns"):
        c.problems.append(f"retain_lsns changed: {status.get('retain_lsns')} -> {after.get('retain_lsns')}")
    if isinstance(after, dict) and after.get("leases"):
        c.problems.append(f"a lease was granted: {after['leases']}")
    for sk in SAFEKEEPERS:
        _, positions = c.call(sk, "get", "/v1/positions", expect={200})
        if isinstance(positions, list) and any(p.get("timeline_id") == missing for p in positions):
            c.problems.append(f"{sk} now holds timeline {missing}")

    # A read-only compute (it leases its LSN, so only after the check above)
    # makes no checkpoints.
    cluster.endpoint_start("ro", "main", "--at", format_lsn(commit_lsn))
    c.add_server("ro", "compute", Endpoint(cluster, "ro").http_port)
    _, ro = c.call("ro", "get", "/v1/status", expect={200})
    if isinstance(ro, dict) and ro.get("start_lsn") != format_lsn(commit_lsn):
        c.problems.append(f"ro: not started at {format_lsn(commit_lsn)}: {ro.get('start_lsn')}")
    c.call("ro", "post", "/v1/checkpoint", expect={409})

    # A split, last (it changes the tenant): recorded, then answered.
    _, recorded = c.call(ctl, "post", csplit, json_body={"shards": 2, "stripe_blocks": 8}, expect={202},
                         tenant=tenant)
    _, newest = c.call(ctl, "get", csplit, expect={200}, tenant=tenant)
    if isinstance(recorded, dict) and isinstance(newest, dict) and \
            (recorded.get("to"), recorded.get("version")) != (newest.get("to"), newest.get("version")):
        c.problems.append(f"the split answered is not the one recorded: {recorded} vs {newest}")

    problems = c.problems + c.unexercised()
    assert not problems, "\n".join(problems)
