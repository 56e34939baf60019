"""The operator's and finance's routes, typed for the OpenAPI document.

Role `operator`:
- `POST /api/lend` `{"node": "n3", "models": ["echo"]}` -> 202 `{"request": 7}`
- `POST /api/return` `{"lease": 12}` -> 202 `{"request": 8}`
- `POST /api/drain` `{"pool": "training", "reason": "..."}` -> 200: the pool is held (no
  lends; its leases are returned); `POST /api/resume` `{"pool": "training"}` lifts it.
- `GET /api/request?id=7`: the request's state and outcome.
- `GET /api/models/status?model=echo`: the model's status, the JSON of `stb models status
  echo --json` (`bridge.models.status.gather`): 404 for a model neither the repository
  nor its history knows; reads only.
Role `finance`: `GET /api/report?...` (`accounting.api`).

Each request is recorded under the token's name, so operators need no access to the
bridge's database and every lend, return and hold says who asked; each is written with
its audit trail entry in one transaction (`bridge.audit`), and a resume of a pool that
is not held is recorded as refused. Bodies are JSON
objects checked field by field (`bridge.http.guard`: extra keys, wrong types, bad names:
400 naming the field); nothing is written for a refused request. Requests go through the
same queue as `stb lend`/`stb return` (`bridge.leases.requests`): the active daemon
carries them out. The handlers are sync: FastAPI runs them on its worker threads, so a
slow database or Slurm never stalls `/healthz`. Built by the daemon's service
(`operator_routes`, `finance_routes`) and mounted by `bridge.http.app.create_app`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, Security
from pydantic import BaseModel, Field, StringConstraints
from sqlalchemy import Engine

from accounting.api import report_response
from bridge.audit.asks import ask_lend, ask_return, hold_pool, release_pool
from bridge.audit.trail import Trail, api_caller, daemon
from bridge.config import BridgeConfig
from bridge.http.guard import (
    ApiError,
    Caller,
    StrictBody,
    bearer,
    body_doc,
    json_body,
    json_response,
)
from bridge.leases.audit import AuditStore
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore
from bridge.modelfacts import ModelFacts
from bridge.models.repo import ModelRepository, RepositoryError
from bridge.models.servers import running_servers
from bridge.models.status import UnknownModel, check_known, gather
from bridge.models.status_sources import StatusServer
from bridge.slurm.errors import SlurmError
from bridge.triton.catalog import site_models

#: a Slurm node or pool name as the API takes it
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
#: the running Triton servers, closed after (default: Slurm's, as `stb models` finds them)
Servers = Callable[[], AbstractContextManager[Sequence[StatusServer]]]

Operator = Annotated[Caller, Security(bearer, scopes=["operator"])]
Finance = Annotated[Caller, Security(bearer, scopes=["finance"])]


class LendBody(StrictBody):
    node: Name
    models: list[Name] = Field(default_factory=list, max_length=256)


class ReturnBody(StrictBody):
    lease: int = Field(ge=1)


class PoolBody(StrictBody):
    pool: Name
    reason: str = Field(default="", max_length=500)


class Refused(BaseModel):
    """Every refusal: what was wrong."""

    error: str


class Queued(BaseModel):
    """A lend or return queued for the active daemon."""

    request: int
    kind: str
    node: str | None = None
    lease: int | None = None


class Held(BaseModel):
    pool: str
    held_by: str
    reason: str


class Released(BaseModel):
    pool: str
    released_by: str


class RequestState(BaseModel):
    request: int
    kind: str
    requested_by: str
    done: bool
    outcome: str


def _query_doc(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The refusals a guarded route may answer, for the document."""
    why = {
        400: "a bad body or query (the field is named)",
        401: "no or unknown bearer token",
        403: "the token lacks the route's role",
        404: "no such object",
        411: "a POST without Content-Length",
        413: "a body over 64 KiB",
        414: "a query string over 4,096 characters",
    }
    return {c: {"model": Refused, "description": why[c]} for c in (400, 401, 403, 414, *codes)}


def operator_routes(
    config: BridgeConfig,
    queue: RequestQueue,
    store: LeaseStore,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    models: Callable[[], ModelFacts] | None = None,
    servers: Servers | None = None,
    audit: Trail | None = None,
) -> APIRouter:
    """The operator routes on `queue` (writes no lease: the daemon does). `models`: the
    models' facts now (the daemon's observer's; default: the repository read for each
    lend); `servers`: the running Triton servers a model status reads; `audit`: the
    trail each request and hold is recorded in, in its own transaction, under the
    caller's token name (default: the trail in `queue`'s database)."""
    facts = models or (lambda: site_models(config))
    # unfenced, as the requests are: a standby's API takes them for the leader
    trail = audit or Trail(AuditStore.beside(queue, fenced=False), daemon())

    def by(call: Caller) -> Trail:
        return trail.as_(api_caller(call.principal.name))

    find = servers or (lambda: running_servers(config))
    router = APIRouter(tags=["operator"])
    post = _refusals(404, 411, 413)

    @router.post(
        "/api/lend",
        status_code=202,
        openapi_extra=body_doc(LendBody),
        responses={202: {"model": Queued}, **post},
    )
    def lend(call: Operator, body: Annotated[LendBody, Depends(json_body(LendBody))]) -> Response:
        """Ask the active daemon to lend `node` (serving `models`)."""
        unknown = sorted(set(body.models) - set(facts().names))
        if unknown:
            raise ApiError(400, f"models: unknown {', '.join(unknown)}")
        row = ask_lend(queue, body.node, body.models, trail=by(call), now=clock())
        return json_response(202, {"request": row.id, "kind": "lend", "node": body.node})

    @router.post(
        "/api/return",
        status_code=202,
        openapi_extra=body_doc(ReturnBody),
        responses={202: {"model": Queued}, **post},
    )
    def return_(
        call: Operator, body: Annotated[ReturnBody, Depends(json_body(ReturnBody))]
    ) -> Response:
        """Ask the active daemon to return an open lease."""
        if body.lease not in {lease.id for lease in store.open_leases()}:
            raise ApiError(404, f"lease: {body.lease} is not an open lease")
        row = ask_return(queue, body.lease, trail=by(call), now=clock())
        return json_response(202, {"request": row.id, "kind": "return", "lease": body.lease})

    @router.post(
        "/api/drain", openapi_extra=body_doc(PoolBody), responses={200: {"model": Held}, **post}
    )
    def drain(call: Operator, body: Annotated[PoolBody, Depends(json_body(PoolBody))]) -> Response:
        """Hold a pool: no lends from it, its leases returned (the hold in force, if any)."""
        if body.pool not in config.pools:
            raise ApiError(404, f"pool: no pool {body.pool!r}")
        if config.pools[body.pool].lend_mode == "reserved":
            raise ApiError(400, f"pool: {body.pool} is the reserved pool; it is never lent")
        hold = hold_pool(queue, body.pool, body.reason, trail=by(call), now=clock())
        return json_response(
            200, {"pool": hold.pool, "held_by": hold.held_by, "reason": hold.reason}
        )

    @router.post(
        "/api/resume",
        openapi_extra=body_doc(PoolBody),
        responses={200: {"model": Released}, **post},
    )
    def resume(call: Operator, body: Annotated[PoolBody, Depends(json_body(PoolBody))]) -> Response:
        """Lift a pool's hold."""
        hold = release_pool(queue, body.pool, trail=by(call), now=clock())
        if hold is None:
            raise ApiError(404, f"pool: {body.pool} is not held")
        return json_response(200, {"pool": hold.pool, "released_by": call.principal.name})

    @router.get(
        "/api/request",
        responses={200: {"model": RequestState}, **_refusals(404)},
        openapi_extra={"parameters": [_query_doc("id", {"type": "integer"}, "the request")]},
    )
    def request(call: Operator) -> Response:
        """A lend's or return's state and outcome."""
        ids = call.query.get("id", [])
        if len(ids) != 1 or not ids[0].isdigit() or len(ids[0]) > 12:
            raise ApiError(400, "id: one request id (a number) is required")
        row = queue.get(int(ids[0]))
        if row is None:
            raise ApiError(404, f"id: no request {ids[0]}")
        return json_response(
            200,
            {
                "request": row.id,
                "kind": row.kind,
                "requested_by": row.requested_by,
                "done": row.done_at is not None,
                "outcome": row.outcome,
            },
        )

    @router.get(
        "/api/models/status",
        responses={200: {"description": "`stb models status M --json`"}, **_refusals(404)},
        openapi_extra={"parameters": [_query_doc("model", {"type": "string"}, "the model")]},
    )
    def model_status(call: Operator) -> Response:
        """A model's status: its facts, versions, servers and hours (reads only)."""
        names = call.query.get("model", [])
        if len(names) != 1:
            raise ApiError(400, "model: one model name is required")
        repo = ModelRepository(config.triton.model_repository)
        try:
            check_known(names[0], repo)
        except RepositoryError as exc:
            raise ApiError(400, f"model: {exc}") from exc
        except UnknownModel as exc:
            raise ApiError(404, f"model: {exc}") from exc

        def at(found: Sequence[StatusServer] | None, note: str = "") -> Response:
            status = gather(
                names[0], repo, facts(), database_url=config.database_url,
                ledger_url=config.accounting.ledger_url, servers=found, now=clock(),
                servers_note=note, observe=config.observe,
            )  # fmt: skip
            return json_response(200, status.to_json())

        try:
            with find() as found:
                return at(found)
        except SlurmError as exc:
            return at(None, f"Slurm does not answer: {exc}")

    return router


def finance_routes(ledger: Engine, idle: str) -> APIRouter:
    """The ledger's report for role `finance`."""
    router = APIRouter(tags=["finance"])
    window = _query_doc("window", {"type": "string"}, "YYYY-MM, YYYY-MM-DD or START..END")

    @router.get(
        "/api/report",
        responses={200: {"description": "`stb report --format json`"}, **_refusals()},
        openapi_extra={"parameters": [window]},
    )
    def report(call: Finance) -> Response:
        """The ledger's report (`accounting.api`: window, aggregate/by, step, idle, where)."""
        status, body = report_response(ledger, call.query, idle)  # type: ignore[arg-type]
        return Response(body, status, media_type="application/json")

    return router


__all__ = ["ApiError", "finance_routes", "operator_routes"]
