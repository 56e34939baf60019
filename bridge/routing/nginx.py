"""Render the nginx routing configuration for a `RoutingTable`. Pure text, no I/O.

Called by `bridge.routing.publisher`, which installs the text with
`bridge.routing.nginxctl`. The output belongs in nginx's `http` block (the main
configuration includes it): one `upstream stb_<model>` per model with ready replicas
(idle connections kept alive), an `upstream stb-any` of every routed replica for the
health endpoints, and one `server` on a loopback address that routes Triton's HTTP API:

- `/v2/models/<model>` and `/v2/models/<model>/...` (metadata, ready, infer, versions)
  go to that model's upstream, to the replica with the fewest requests in flight
  (`least_conn`), per unit of weight where its replicas differ in GPUs
  (`RoutingTable.weights`, nginx's `weight=`);
- a model's token streams, `/v2/models/<model>[/versions/<v>]/generate_stream` and
  `/generate` (Triton's generate extension: server-sent events, one per response of a
  decoupled model), go to the same upstream unbuffered (`STREAM_DIRECTIVES`): nginx's
  `proxy_buffering off` passes each event to the client as it comes, `proxy_ignore_headers
  X-Accel-Buffering` keeps a replica from turning buffering back on, and the response
  says `X-Accel-Buffering: no` to an nginx in front of this one. `proxy_read_timeout` is
  the longest silence between two reads, not a stream's length (nginx's documentation),
  so a stream of any length passes while tokens flow; the wait for its first token
  (queue and prefill) is what `read_timeout_s` bounds. `least_conn` counts a stream as in
  flight for its whole life: nginx adds a request to its replica's count when it picks the
  replica and takes it off when the upstream request ends (the round-robin peer's `conns`,
  freed when the response is done), an idle keep-alive connection counting for nothing;
- a known model with no ready replica answers 503 with a JSON error and `Retry-After`;
  a model served from zero (`RoutingTable.zero`: `min_replicas` 0) with none goes to the
  activator instead (`NginxSettings.activator`, the daemon's HTTP server, upstream
  `stb-activator`, no idle connections kept), its streams unbuffered as above, with a
  `proxy_read_timeout` longer by the cold start the activator may hold a request for
  (`cold_start_s`): the activator holds each request until a replica is ready and routed,
  then forwards it there (`bridge.http.activator`);
- a model in a rollout (`Split`): its unversioned `/v2/models/<model>/infer`, `/generate`
  and `/generate_stream` are rewritten to
  `/v2/models/<model>/versions/<old or new>/<the same>`, chosen per request by nginx's
  `split_clients` on the request's random `$request_id` (a MurmurHash2 of it against the
  share, to 0.01%), so each request goes to the new version with the share's probability,
  independently of the others: over n requests the new version's count is binomial, its
  share within 3 * sqrt(p(1-p)/n) of p nearly always (1.6 points at 10% of 3,000). A
  request that names a version, and every other path, is not split;
- the batch route (`RoutingTable.batch`, present only where `[batch]` is on): with the
  gate open, `/batch/v2/models/<model>/...` is the same request to the same upstream as
  `/v2/models/<model>/...` (the `/batch` prefix cut off; a rollout's split applies to
  its `infer`; its streams unbuffered as above), never to the activator: batch work must
  not wake a model served from zero (a model without a ready replica answers 503); with
  the gate closed, every `/batch/` request is answered 429 with `Retry-After` and a JSON
  error saying the route is closed for online load. Each batch request, passed or
  refused, is one line of the batch access log (`NginxSettings.batch_log`, format
  `BATCH_LOG_FORMAT`), which `bridge.routing.batchlog` counts: Triton cannot tell a
  batch request from an online one, so this log is how the bridge does;
- `/v2/health/ready` and `/v2/health/live` answer from any routed replica;
- anything else answers 404 with a JSON error; an upstream that cannot be reached gives
  502/504 with a JSON error.

Every name that reaches the text was validated by the table (`MODEL_NAME_RE`), so nothing
in a name can open or close an nginx string, block or directive. The same table always
renders the same text (sorted models and servers), which makes publishing idempotent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bridge.routing.errors import InvalidRoute
from bridge.routing.table import RoutingTable, Split, validate_endpoint, validate_model_name

STREAM_ENDPOINTS = ("generate", "generate_stream")
"""Triton's generate extension: the paths a streaming (decoupled) model answers on."""
STREAM_DIRECTIVES = (
    "proxy_buffering off; proxy_cache off; proxy_ignore_headers X-Accel-Buffering; "
    "add_header X-Accel-Buffering no always; add_header X-Stb-Upstream $upstream_addr always;"
)
"""What a token stream's location adds to the server's settings: each event passed on as
it comes, whatever the replica's X-Accel-Buffering says, and an nginx in front told not
to buffer either. A location with an `add_header` of its own inherits none of the
server's, so X-Stb-Upstream is said again."""

BATCH_PREFIX = "/batch"
"""The batch route's paths: `/batch/v2/models/<model>/...`."""
BATCH_LOG_FORMAT = "stb_batch"
"""nginx `log_format` of the batch access log: `$msec $status $request_uri $stb_batch_job
$upstream_response_time`, one line per batch request (`bridge.routing.batchlog` reads it;
the older three-field lines too). `$stb_batch_job` is the client's `X-Stb-Job` header (its
Slurm job id) when it is digits and underscores only, else `-` (`BATCH_JOB_MAP`): a header
can put nothing else into the log."""
BATCH_JOB_HEADER = "X-Stb-Job"
"""The request header a batch client names its Slurm job in (`deploy/batch/batch_infer.py`)."""
BATCH_JOB_MAP = (
    "map $http_x_stb_job $stb_batch_job {",
    '    default "-";',
    '    "~^[0-9][0-9_]{0,63}$" $http_x_stb_job;',
    "}",
)
"""The `$stb_batch_job` the batch log writes: the header, sanitised."""
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9/._-]+")

ANY_UPSTREAM = "stb-any"
"""Upstream of every routed replica. Model upstreams are `stb_<model>`, so no model name
can collide with it."""
ACTIVATOR_UPSTREAM = "stb-activator"
"""Upstream of the activator (the daemon's HTTP server), where the requests of a model
served from zero wait while it has no ready replica."""


@dataclass(frozen=True)
class NginxSettings:
    """How the routing server behaves; defaults suit a Triton fleet on one site."""

    listen: str = "127.0.0.1:8080"
    """address:port the routing server listens on. Loopback by default: clients on this
    host; a site that routes remote clients sets its own address."""
    keepalive: int = 32
    """Idle upstream connections each nginx worker keeps per model (nginx `keepalive`).
    Saves a TCP handshake per request; 32 covers a few hundred requests/s per model."""
    connect_timeout_s: int = 2
    """Seconds to connect to a replica before trying the next one. Replicas are on the
    local network: a connect that takes longer means the replica is gone."""
    read_timeout_s: int = 300
    """Seconds between two reads of a replica's answer (nginx `proxy_read_timeout`, the
    longest silence, not a response's length: a token stream of any length passes while
    its tokens flow). Large batches, and an LLM's queue and prefill before its first
    token, can take minutes; shorter would cut legitimate requests."""
    client_keepalive_s: int = 0
    """Seconds nginx keeps an idle client connection open (nginx `keepalive_timeout`).
    0, no client keepalive, because a graceful reload closes the old workers' idle client
    connections at once, and a request a keepalive client sends on one at that instant is
    lost (measured: about 1 request in 5,000 across 10 reloads, with an httpx client like
    `stb load`). Without it every reload is lossless; the cost is a TCP handshake per
    request on the client side (upstream connections stay kept alive)."""
    max_body_mb: int = 64
    """Largest request body in MiB (nginx `client_max_body_size`). Triton JSON inputs of
    images or long sequences reach tens of MiB; nginx's default 1 MiB would refuse them."""
    activator: str | None = None
    """host:port of the activator (the daemon's HTTP server: `[daemon] exporter_listen`),
    where the requests of a model served from zero go while it has no ready replica.
    None: they are answered 503 like any model's without a replica."""
    activator_scheme: str = "http"
    """How nginx talks to the activator: "https" where the daemon's API serves TLS."""
    cold_start_s: int = 0
    """Seconds the activator may hold a request before it forwards it (`[routing]
    cold_start_timeout_s`): added to `read_timeout_s` on the activator's locations."""
    batch_log: str | None = None
    """Absolute path of the batch route's access log (`[batch] access_log`), which nginx's
    master opens (its directory must be writable by it); None: batch requests are not
    logged, and the bridge cannot tell them from online ones."""

    def __post_init__(self) -> None:
        validate_endpoint(self.listen)
        if self.batch_log is not None and not _SAFE_PATH_RE.fullmatch(self.batch_log):
            raise InvalidRoute(
                f"batch_log must be an absolute path of letters, digits, '/', '.', '_' or "
                f"'-' (it is written into nginx's configuration): {self.batch_log!r}"
            )
        if self.activator is not None:
            validate_endpoint(self.activator)
        if self.activator_scheme not in ("http", "https"):
            raise InvalidRoute(f"activator_scheme must be http or https: {self.activator_scheme!r}")
        if not isinstance(self.cold_start_s, int) or self.cold_start_s < 0:
            raise InvalidRoute(f"cold_start_s must be >= 0: {self.cold_start_s!r}")
        if not isinstance(self.client_keepalive_s, int) or self.client_keepalive_s < 0:
            raise InvalidRoute(f"client_keepalive_s must be >= 0: {self.client_keepalive_s!r}")
        for name in ("keepalive", "connect_timeout_s", "read_timeout_s", "max_body_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRoute(f"nginx setting {name} must be a positive integer: {value!r}")


def upstream_name(model: str) -> str:
    return f"stb_{validate_model_name(model)}"


def _json_return(status: int, message: str) -> str:
    """An nginx `return` of a JSON error. `message` holds only fixed text and validated
    names; inside nginx's single quotes only `'`, `\\` and `$` (variables) would be
    interpreted, and none may appear."""
    body = json.dumps({"error": message})
    if any(c in body for c in "'\\$\n"):
        raise InvalidRoute(f"unsafe text for an nginx return: {message!r}")
    return f"return {status} '{body}';"


def _upstream(
    name: str, endpoints: tuple[str, ...], keepalive: int, weights: Mapping[str, int]
) -> list[str]:
    # least_conn: each request goes to the replica with the fewest requests in flight
    # (join the shortest queue), so a replica that joins while the others hold a backlog
    # takes the new requests until the queues are even, instead of half of them; nginx
    # wants the balancing method before `keepalive`. The zone shares the counts between
    # nginx's worker processes. Replicas of different sizes (`RoutingTable.weights`: a
    # replica's GPUs) get `weight=`: least_conn then compares requests in flight per unit
    # of weight, so a replica of one GPU beside one of eight takes a second request only
    # when the large one holds eight or more; without weights it queues as soon as the large one
    # holds two (bench/least_conn_split.py: its p99 23 ms against 101 ms at 110 req/s of
    # 20 ms). Replicas alike get none, as before.
    lines = [f"upstream {name} {{", f"    zone {name} 64k;", "    least_conn;"]
    for e in endpoints:
        w = weights.get(e, 1)
        lines.append(f"    server {validate_endpoint(e)}{f' weight={w}' if w != 1 else ''};")
    lines += [f"    keepalive {keepalive};", "}", ""]
    return lines


def _percent(p: float) -> str:
    """nginx's split_clients reads shares to two decimals."""
    return f"{p:.2f}".rstrip("0").rstrip(".") + "%"


def _split_clients(variable: str, split: Split) -> list[str]:
    lines = [f'split_clients "${{request_id}}" ${variable} {{']
    if 0 < split.percent < 100:
        lines.append(f"    {_percent(split.percent)} {split.new};")
    lines.append(f"    * {split.new if split.percent >= 100 else split.old};")
    return [*lines, "}", ""]


def render(table: RoutingTable, settings: NginxSettings | None = None) -> str:
    """The routing configuration text for `table` (an nginx `http`-context include)."""
    s = settings or NginxSettings()
    lines = [
        "# Rendered by bridge.routing.nginx: the bridge rewrites this file; do not edit.",
        f"# models: {', '.join(table.models) or '(none)'}",
        "",
    ]
    weights = {model: dict(pairs) for model, pairs in table.weights}
    for model, endpoints in table.routes:
        if endpoints:
            lines += _upstream(upstream_name(model), endpoints, s.keepalive, weights.get(model, {}))
    any_endpoints = table.all_endpoints()
    if any_endpoints:
        lines += _upstream(ANY_UPSTREAM, any_endpoints, s.keepalive, {})
    activated = frozenset(table.zero) if s.activator is not None else frozenset()
    if activated:
        # no `keepalive`: the daemon's server closes idle connections after 5 s, and a
        # POST sent on one it just closed would not be retried
        lines += [f"upstream {ACTIVATOR_UPSTREAM} {{", f"    server {s.activator};", "}", ""]
    variables = {sp.model: f"stb_split_{i}" for i, sp in enumerate(table.splits)}
    for sp in table.splits:
        lines += _split_clients(variables[sp.model], sp)
    if table.batch is not None and s.batch_log is not None:
        lines += [
            *BATCH_JOB_MAP,
            f"log_format {BATCH_LOG_FORMAT} "
            "'$msec $status $request_uri $stb_batch_job $upstream_response_time';",
            "",
        ]

    lines += [
        "server {",
        f"    listen {validate_endpoint(s.listen)};",
        "    default_type application/json;",
        f"    keepalive_timeout {s.client_keepalive_s}s;",
        f"    client_max_body_size {s.max_body_mb}m;",
        "    proxy_http_version 1.1;",
        '    proxy_set_header Connection "";',
        f"    proxy_connect_timeout {s.connect_timeout_s}s;",
        f"    proxy_send_timeout {s.read_timeout_s}s;",
        f"    proxy_read_timeout {s.read_timeout_s}s;",
        "    add_header X-Stb-Upstream $upstream_addr always;",
        "    error_page 502 @stb_502;",
        "    error_page 504 @stb_504;",
        "",
        "    location @stb_502 {",
        "        " + _json_return(502, "no replica answered"),
        "    }",
        "    location @stb_504 {",
        "        " + _json_return(504, "the replica did not answer in time"),
        "    }",
        "",
    ]
    for path in ("/v2/health/ready", "/v2/health/live"):
        if any_endpoints:
            lines.append(f"    location = {path} {{ proxy_pass http://{ANY_UPSTREAM}; }}")
        else:
            lines.append(f"    location = {path} {{ {_json_return(503, 'no ready replica')} }}")
    lines.append("")
    for model, endpoints in table.routes:
        validate_model_name(model)
        if endpoints:
            action = f"proxy_pass http://{upstream_name(model)};"
        elif model in activated:
            action = (
                f"proxy_read_timeout {s.read_timeout_s + s.cold_start_s}s; "
                f"proxy_pass {s.activator_scheme}://{ACTIVATOR_UPSTREAM};"
            )
        else:
            action = "add_header Retry-After 1 always; " + _json_return(
                503, f"model {model} has no ready replica"
            )
        lines.append(f"    location = /v2/models/{model} {{ {action} }}")
        lines.append(f"    location /v2/models/{model}/ {{ {action} }}")
        if not endpoints and model not in activated:
            continue
        # a regex location wins over the prefix above; an exact one (the split's) over both
        lines.append(
            f"    location ~ ^/v2/models/{re.escape(model)}/(versions/[0-9]+/)?"
            f"generate(_stream)?$ {{ {STREAM_DIRECTIVES} {action} }}"
        )
        if not endpoints:
            continue
        if model in variables:
            for path in ("infer", *STREAM_ENDPOINTS):
                extra = f" {STREAM_DIRECTIVES}" if path in STREAM_ENDPOINTS else ""
                lines.append(
                    f"    location = /v2/models/{model}/{path} {{ rewrite ^ "
                    f"/v2/models/{model}/versions/${variables[model]}/{path} break;"
                    f"{extra} {action} }}"
                )
    if table.batch is not None:
        lines += _batch_locations(table, s, variables)
    lines += [
        "",
        "    location / {",
        "        " + _json_return(404, "not routed: the bridge routes /v2/models/<model>/..."),
        "    }",
        "}",
        "",
    ]
    return "\n".join(lines)


def _batch_locations(table: RoutingTable, s: NginxSettings, variables: dict[str, str]) -> list[str]:
    """The batch route's locations (module docstring): per model the online route's
    upstream behind `/batch`, or, with the gate closed, one 429 for all of `/batch/`."""
    gate = table.batch
    assert gate is not None
    log = f" access_log {s.batch_log} {BATCH_LOG_FORMAT};" if s.batch_log is not None else ""
    lines = [""]
    if not gate.open:
        message = f"the batch route is closed for online load: retry after {gate.retry_after_s} s"
        lines.append(
            # ^~: no regex location may take a batch path past the closed gate
            f"    location ^~ {BATCH_PREFIX}/ {{{log} add_header Retry-After "
            f"{gate.retry_after_s} always; {_json_return(429, message)} }}"
        )
        return lines
    cut = f"rewrite ^{BATCH_PREFIX}(/v2/models/.*)$ $1 break;"
    for model, endpoints in table.routes:
        prefix = f"{BATCH_PREFIX}/v2/models/{validate_model_name(model)}"
        if not endpoints:
            action = "add_header Retry-After 1 always; " + _json_return(
                503, f"model {model} has no ready replica"
            )
            lines.append(f"    location {prefix}/ {{{log} {action} }}")
            continue
        upstream = f"proxy_pass http://{upstream_name(model)};"
        lines.append(f"    location {prefix}/ {{{log} {cut} {upstream} }}")
        lines.append(
            f"    location ~ ^{re.escape(prefix)}/(versions/[0-9]+/)?generate(_stream)?$ "
            f"{{{log} {STREAM_DIRECTIVES} {cut} {upstream} }}"
        )
        if model in variables:
            for path in ("infer", *STREAM_ENDPOINTS):
                extra = f" {STREAM_DIRECTIVES}" if path in STREAM_ENDPOINTS else ""
                lines.append(
                    f"    location = {prefix}/{path} {{{log} rewrite ^ "
                    f"/v2/models/{model}/versions/${variables[model]}/{path} break;"
                    f"{extra} {upstream} }}"
                )
    return lines
