"""The daemon's HTTP app (FastAPI): `/metrics`, `/healthz` and `/openapi.json` open;
`/sd` (role `metrics`) and the routes the daemon adds (`bridge.http.routes`) behind a
bearer token with the route's role (`bridge.http.guard`).

- `/metrics`: the registry in the format the scraper asks for (prometheus_client's own
  `choose_encoder`, as its ASGI and WSGI apps do: OpenMetrics for Prometheus, the text
  format otherwise; `?name[]=` picks families). A sync route, so collecting it (the
  ledger's collector reads its database) runs on a worker thread, never on the event
  loop that answers `/healthz`.
- `/healthz`: 200 while the last good tick is recent, 503 otherwise, with a JSON body
  saying why (`health(tick_s)` of the daemon's metrics). Async and in memory: it answers
  even while every worker thread waits on a database.
- `/sd`: the http_sd document of Triton targets, where the daemon publishes routing.
- `/v2/models/<model>/...` (the daemon's routers, where routing runs): the activator's
  open routes, where nginx sends the requests of a model served from zero while it has
  no ready replica (`bridge.http.activator`).
- `/openapi.json`: every route with its methods, bodies and the role it needs (the
  `bearer` scheme's scopes). Open, like /metrics: it holds no data, only the API's shape,
  which the package and its README publish anyway, and tools read it without a token.

Called by the daemon's service (`create_app`, then `bridge.http.server.HttpServer`).
It knows the daemon only through `Exported`, so the HTTP layer imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, FastAPI, Request, Response, Security
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

import bridge
from bridge.http.auth import TokenTable
from bridge.http.guard import Caller, bearer, install_error_handlers, json_response


class Exported(Protocol):
    """What the app serves of the daemon's metrics (`bridge.daemon.metrics.BridgeMetrics`)."""

    @property
    def registry(self) -> CollectorRegistry: ...

    def health(self, tick_s: float) -> tuple[bool, Mapping[str, object]]: ...


def create_app(
    metrics: Exported,
    tick_s: float,
    *,
    tokens: TokenTable | None = None,
    sd_document: Callable[[], bytes] | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The app: `metrics`' registry and health (healthy while the last good tick is
    younger than three `tick_s`), `/sd` when `sd_document` is given, and `routers`.
    Without `tokens` (no `[api] tokens_file`) every guarded route answers 401."""
    app = FastAPI(
        title="Slurm-Triton bridge",
        version=bridge.__version__,
        summary="The bridge daemon's metrics, health, routing targets and operator API.",
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.tokens = tokens or TokenTable(None)
    install_error_handlers(app)

    @app.get(
        "/metrics",
        tags=["open"],
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}},
    )
    def metrics_page(request: Request) -> Response:
        """The daemon's metrics (open)."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        names = request.query_params.getlist("name[]")
        registry: Collector = metrics.registry
        if names:
            registry = metrics.registry.restricted_registry(names)
        return Response(encoder(registry), headers={"Content-Type": content_type})

    @app.get("/healthz", tags=["open"], responses={503: {"description": "unhealthy: why"}})
    async def healthz() -> Response:
        """Whether the last good tick is recent, the instance's role and the last errors."""
        ok, body = metrics.health(tick_s)
        return json_response(200 if ok else 503, body)

    if sd_document is not None:
        document = sd_document

        @app.get("/sd", tags=["metrics"], responses=_sd_responses)
        def sd(call: Annotated[Caller, Security(bearer, scopes=["metrics"])]) -> Response:
            """Prometheus' http_sd document of the Triton servers' metrics targets."""
            return Response(document(), media_type="application/json")

    for router in routers:
        app.include_router(router)
    return app


_sd_responses: dict[int | str, dict[str, Any]] = {
    200: {"description": "http_sd targets"},
    401: {"description": "no or unknown bearer token"},
    403: {"description": "the token lacks the role `metrics`"},
}


__all__ = ["Exported", "create_app"]
