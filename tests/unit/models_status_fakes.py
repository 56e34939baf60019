"""Fakes the `stb models status` tests share: a Triton server's index and metrics page
(`FakeClient`, `FakeServer`), and a real HTTP server on 127.0.0.1 that answers Prometheus'
instant queries from recorded answers (`prometheus`, `vector`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bridge.triton.errors import TritonUnreachable
from bridge.triton.protocol import ModelStatistics, RepositoryModel, ServerMetadata

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)


# ---- a small fake of `TritonInstance`: what a server's index and metrics page say -------


class FakeClient:
    """A Triton server that holds `ready` (model -> READY versions) and serves `page`."""

    def __init__(self, address: str, ready: Mapping[str, list[str]], page: str = "") -> None:
        self._address, self.ready, self.page = address, ready, page
        self.unreachable = False

    @property
    def address(self) -> str:
        return self._address

    def _check(self, op: str) -> None:
        if self.unreachable:
            raise TritonUnreachable(self._address, op, "connection refused")

    def repository_index(self) -> tuple[RepositoryModel, ...]:
        self._check("index")
        return tuple(RepositoryModel(m, v, "READY", "") for m, vs in self.ready.items() for v in vs)

    def metrics_text(self) -> str:
        self._check("metrics")
        return self.page

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("triton", "2.51.0", ())

    def load_model(self, name: str) -> None:
        raise AssertionError("a status reads only")

    def unload_model(self, name: str) -> None:
        raise AssertionError("a status reads only")

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return version in self.ready.get(name, [])

    def model_statistics(self, name: str = "") -> tuple[ModelStatistics, ...]:
        return ()

    def infer(self, name: str, inputs: Mapping[str, Any], version: str = "") -> dict[str, Any]:
        raise AssertionError("a status reads only")

    def close(self) -> None:
        pass


@dataclass
class FakeServer:
    address: str
    client: FakeClient


T = NOW.timestamp()


def vector(*rows: tuple[dict[str, str], str]) -> dict[str, Any]:
    """A Prometheus instant-query answer, as /api/v1/query gives it."""
    result = [{"metric": labels, "value": [T, value]} for labels, value in rows]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@dataclass
class FakePrometheus:
    url: str
    #: (query, time) of each request, as received
    asked: list[tuple[str, str]]


@contextmanager
def prometheus(answers: Mapping[str, dict[str, Any]]) -> Iterator[FakePrometheus]:
    """A real HTTP server on 127.0.0.1 that answers /api/v1/query (GET or POST form) with
    the recorded answer of the query's exact text; any other query is a bad_data error."""
    asked: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, form: dict[str, list[str]]) -> None:
            query, at = form.get("query", [""])[0], form.get("time", [""])[0]
            asked.append((query, at))
            code, doc = 200, answers.get(query)
            if urlsplit(self.path).path != "/api/v1/query":
                code, doc = 404, {"status": "error", "error": "not found"}
            elif doc is None:
                code = 400
                doc = {"status": "error", "errorType": "bad_data", "error": "unknown query"}
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(parse_qs(urlsplit(self.path).query))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self._answer(parse_qs(self.rfile.read(length).decode()))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakePrometheus(f"http://127.0.0.1:{server.server_address[1]}", asked)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
