"""The Prometheus HTTP service-discovery document of the Triton fleet and the bridge.

Called by `bridge.routing.publisher` (renders and writes the file each time the table
changes) and by the daemon's HTTP server (serves it); `SdServer` serves it on its own for
the lab. Format (Prometheus http_sd_config): a JSON list of target groups
`{"targets": ["host:port"], "labels": {name: value}}`, answered with HTTP 200 and
`Content-Type: application/json`, `[]` when there is nothing to scrape.

One group per Triton metrics endpoint, labelled `job="triton"` plus discovery metadata:
`__meta_stb_role`, `__meta_stb_node`, `__meta_stb_slurm_job_id`, `__meta_stb_lease`
(a lease id or "baseline") and `__meta_stb_models` (",echo,busy,": comma-separated with a
leading and trailing comma, as Prometheus does for Consul tags, so `.*,echo,.*` matches a
model exactly). One group for the bridge's own metrics endpoint, `job="stb-bridge"`.
`__meta_` labels are dropped after relabelling; a scrape configuration keeps them with
`relabel_configs: [{action: labelmap, regex: "__meta_stb_(.+)"}]`. `job` is a plain
target label so one scrape job can find both kinds and still tell them apart.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bridge.routing.errors import InvalidRoute
from bridge.routing.files import read_or_none, write_atomic
from bridge.routing.table import RoutingTable, validate_endpoint

LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""Prometheus label names."""
CONTENT_TYPE = "application/json"
TRITON_JOB = "triton"
BRIDGE_JOB = "stb-bridge"

TargetGroup = dict[str, list[str] | dict[str, str]]


def _group(target: str, labels: dict[str, str]) -> TargetGroup:
    for name in labels:
        if not LABEL_NAME_RE.fullmatch(name):
            raise InvalidRoute(f"invalid Prometheus label name {name!r}")
    return {"targets": [target], "labels": dict(sorted(labels.items()))}


def document(table: RoutingTable, bridge_metrics: str | None = None) -> list[TargetGroup]:
    """The target groups for `table` (sorted by endpoint), and the bridge's own metrics
    endpoint (host:port) as the last group when given."""
    groups = [
        _group(
            t.endpoint,
            {
                "job": TRITON_JOB,
                "__meta_stb_role": "triton",
                "__meta_stb_node": t.node,
                "__meta_stb_slurm_job_id": t.slurm_job_id,
                "__meta_stb_lease": t.lease,
                "__meta_stb_models": f",{','.join(t.models)}," if t.models else "",
            },
        )
        for t in table.targets
    ]
    if bridge_metrics is not None:
        groups.append(
            _group(
                validate_endpoint(bridge_metrics),
                {"job": BRIDGE_JOB, "__meta_stb_role": "bridge"},
            )
        )
    return groups


def render(table: RoutingTable, bridge_metrics: str | None = None) -> bytes:
    """The document as UTF-8 JSON bytes; the same table always gives the same bytes."""
    return (json.dumps(document(table, bridge_metrics), indent=1) + "\n").encode()


def write(path: Path, data: bytes) -> bool:
    """Atomically replace `path` with `data` unless it already holds exactly that;
    True when the file was written."""
    if read_or_none(path) == data:
        return False
    write_atomic(path, data)
    return True


def http_response(data: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers, body) answering an http_sd GET with `data`, for any server."""
    return 200, [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(data)))], data


class SdServer:
    """A minimal HTTP server of the document at `/sd`, on a thread (for the lab; the
    daemon mounts `http_response` on its own server). `get_document` is called per GET."""

    PATH = "/sd"

    def __init__(self, address: tuple[str, int], get_document: Callable[[], bytes]) -> None:
        get = get_document

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != SdServer.PATH:
                    self.send_error(404, "only /sd is served here")
                    return
                status, headers, body = http_response(get())
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="stb-sd", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.PATH}"

    def start(self) -> SdServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> SdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
