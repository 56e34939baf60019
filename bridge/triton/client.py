"""`TritonInstance` on tritonclient's HTTP client, and httpx for the metrics page.

Created by the daemon (one per Triton instance it watches or lends a node to) and by the
lab tests. Maps every failure onto the two typed errors of `bridge.triton.errors`: no
answer is `TritonUnreachable`, an answer that says no is `TritonRejected` (Triton's message
quoted). The model-repository calls carry the restricted-API key in `api_key_header`
(the lab's Triton requires `X-Stb-Key`, see deploy/slurm/triton-server.sbatch).

The metrics page is read streamed, uncompressed and bounded: a page over
`MAX_METRICS_BYTES` is refused (`TritonRejected`, naming the limit) once that many bytes
have come, never read whole; to the observer that replica gave no data.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import gevent
import httpx
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from bridge.triton.errors import TritonRejected, TritonUnreachable
from bridge.triton.ports import METRICS_PORT, metrics_port
from bridge.triton.protocol import Array, ModelStatistics, RepositoryModel, ServerMetadata

DEFAULT_API_KEY_HEADER = "X-Stb-Key"
"""The header the bridge's Triton servers expect the model-repository key in."""


MAX_METRICS_BYTES = 16 * 1024 * 1024
"""The largest metrics page read (bytes as sent, uncompressed). Triton's page is about 150
bytes a series: 16 MiB holds some 100,000 series, far more than thousands of models emit."""

_QUOTED_BYTES = 200
"""How much of a refused answer's body an error quotes."""

_UNCOMPRESSED = {"Accept-Encoding": "identity"}
"""The metrics page is asked for uncompressed: a compressed one could inflate far past the
limit from a few bytes read."""

# Gateway and "unavailable" answers mean "not now", not "no".
_TRANSIENT_STATUS = {502, 503, 504}

T = TypeVar("T")


class TritonHttpClient:
    """One Triton instance over HTTP. See `TritonInstance` for the contract.

    `address` is "host:port" of the HTTP endpoint (no scheme). `api_key` is needed only for
    load, unload and the repository index. Timeouts are seconds: `connect_timeout_s` bounds
    the TCP connect (short: a lost node must not stall a tick), `timeout_s` each answer
    (model loads take seconds, so it is longer). Not thread-safe (tritonclient's HTTP
    client runs on gevent); use one object per thread.
    """

    def __init__(
        self,
        address: str,
        *,
        api_key: str | None = None,
        api_key_header: str = DEFAULT_API_KEY_HEADER,
        metrics_url: str | None = None,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 60.0,
    ) -> None:
        self._address = address
        self._key_headers = {api_key_header: api_key} if api_key is not None else {}
        host, _, port = address.rpartition(":")
        # a server on another slot's ports (`bridge.triton.ports`) has its metrics beside
        metrics = metrics_port(int(port)) if host and port.isdigit() else METRICS_PORT
        self.metrics_url = metrics_url or f"http://{host or address}:{metrics}/metrics"
        self._timeouts = {"connection_timeout": connect_timeout_s, "network_timeout": timeout_s}
        self._client = httpclient.InferenceServerClient(address, **self._timeouts)
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s))

    @property
    def address(self) -> str:
        return self._address

    def __enter__(self) -> TritonHttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()
        self._http.close()

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run one tritonclient call, classifying whatever goes wrong."""
        try:
            return fn()
        except InferenceServerException as e:
            status = _int_or_none(e.status())
            message = str(e.message() or "")
            if status is None or status in _TRANSIENT_STATUS:
                raise TritonUnreachable(self._address, operation, message or "no answer") from e
            raise TritonRejected(self._address, operation, message, status) from e
        except (OSError, http.client.HTTPException, gevent.Timeout) as e:
            raise TritonUnreachable(self._address, operation, repr(e)) from e

    def is_live(self) -> bool:
        return bool(self._call("live", self._client.is_server_live))

    def is_ready(self) -> bool:
        return bool(self._call("ready", self._client.is_server_ready))

    def server_metadata(self) -> ServerMetadata:
        meta: dict[str, Any] = self._call("metadata", self._client.get_server_metadata)
        return ServerMetadata(
            name=str(meta.get("name", "")),
            version=str(meta.get("version", "")),
            extensions=tuple(str(x) for x in meta.get("extensions", ())),
        )

    def repository_index(self) -> tuple[RepositoryModel, ...]:
        entries: list[dict[str, Any]] = self._call(
            "repository index",
            lambda: self._client.get_model_repository_index(headers=self._key_headers),
        )
        return tuple(
            RepositoryModel(
                name=str(m["name"]),
                version=str(m.get("version", "")),
                state=str(m.get("state", "")),
                reason=str(m.get("reason", "")),
            )
            for m in entries
        )

    def load_model(self, name: str) -> None:
        """On a connection of its own, closed once answered: a load is asked from a thread
        of its own (the daemon's placer), and a connection that thread kept alive would
        hold the server's exit when its lease is returned (`bridge.daemon.clients`)."""
        once = httpclient.InferenceServerClient(self._address, **self._timeouts)
        try:
            self._call(f"load {name!r}", lambda: once.load_model(name, headers=self._key_headers))
        finally:
            once.close()

    def unload_model(self, name: str) -> None:
        self._call(
            f"unload {name!r}", lambda: self._client.unload_model(name, headers=self._key_headers)
        )

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return bool(
            self._call(f"ready {name!r}", lambda: self._client.is_model_ready(name, version))
        )

    def infer(self, name: str, inputs: Mapping[str, Array], version: str = "") -> dict[str, Array]:
        def call() -> dict[str, Array]:
            reqs = []
            for key, value in inputs.items():
                inp = httpclient.InferInput(key, list(value.shape), np_to_triton_dtype(value.dtype))
                inp.set_data_from_numpy(value, binary_data=True)
                reqs.append(inp)
            res = self._client.infer(name, reqs, model_version=version)
            outputs = res.get_response().get("outputs", [])
            return {str(o["name"]): res.as_numpy(o["name"]) for o in outputs}

        return self._call(f"infer {name!r}", call)

    def model_statistics(self, name: str = "") -> tuple[ModelStatistics, ...]:
        """All loaded models' statistics, or one model's (`TritonRejected` if not loaded)."""
        stats: dict[str, Any] = self._call(
            f"statistics {name!r}", lambda: self._client.get_inference_statistics(name)
        )
        return tuple(_statistics(m) for m in stats.get("model_stats", ()))

    def metrics_text(self) -> str:
        """The page as UTF-8 text (undecodable bytes replaced). Asked for and read
        uncompressed, so every byte counted is a byte held: a page over `MAX_METRICS_BYTES`
        (or sent compressed) raises `TritonRejected` after reading no more than that."""
        try:
            with self._http.stream("GET", self.metrics_url, headers=_UNCOMPRESSED) as r:
                if r.status_code in _TRANSIENT_STATUS:
                    raise TritonUnreachable(self._address, "metrics", f"HTTP {r.status_code}")
                encoding = r.headers.get("content-encoding", "identity").strip().lower()
                if r.status_code == 200 and encoding != "identity":
                    raise TritonRejected(
                        self._address,
                        "metrics",
                        f"page sent with Content-Encoding {encoding!r}, not asked for",
                        r.status_code,
                    )
                if r.status_code != 200:
                    head = _read_at_most(r, _QUOTED_BYTES)[:_QUOTED_BYTES]
                    raise TritonRejected(self._address, "metrics", _decode(head), r.status_code)
                page = _read_at_most(r, MAX_METRICS_BYTES)
                if len(page) > MAX_METRICS_BYTES:
                    raise TritonRejected(
                        self._address,
                        "metrics",
                        f"page larger than {MAX_METRICS_BYTES} bytes (MAX_METRICS_BYTES): "
                        "refused, the rest unread",
                        r.status_code,
                    )
        except httpx.TransportError as e:
            raise TritonUnreachable(self._address, "metrics", repr(e)) from e
        return _decode(page)


def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The body as sent (not decompressed): all of it when it is at most `limit` bytes,
    else its first bytes, more than `limit` (at most one network read past it), so the
    caller sees that it was cut."""
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) > limit:
            break
    return bytes(body)


def _decode(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


def _int_or_none(status: str | None) -> int | None:
    try:
        return int(status) if status else None
    except ValueError:
        return None


def _statistics(m: dict[str, Any]) -> ModelStatistics:
    s: dict[str, dict[str, Any]] = m.get("inference_stats", {})

    def get(kind: str, field: str) -> int:
        return int(s.get(kind, {}).get(field, 0))

    return ModelStatistics(
        name=str(m["name"]),
        version=str(m.get("version", "")),
        last_inference_ms=int(m.get("last_inference", 0)),
        inference_count=int(m.get("inference_count", 0)),
        execution_count=int(m.get("execution_count", 0)),
        success_count=get("success", "count"),
        success_ns=get("success", "ns"),
        failure_count=get("fail", "count"),
        queue_ns=get("queue", "ns"),
        compute_input_ns=get("compute_input", "ns"),
        compute_infer_ns=get("compute_infer", "ns"),
        compute_output_ns=get("compute_output", "ns"),
    )
