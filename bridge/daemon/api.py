"""The operator's and finance's HTTP API, served by the daemon's exporter.

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
bridge's database and every lend, return and hold says who asked. Bodies are JSON
objects checked field by field (`extra` keys, wrong types, bad names: 400 naming the
field); nothing is written for a refused request. Requests go through the same queue as
`stb lend`/`stb return` (`bridge.leases.requests`): the active daemon carries them out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from sqlalchemy import Engine

from accounting.api import report_response
from bridge.config import BridgeConfig
from bridge.daemon.exporter import ApiRequest, Endpoint
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore
from bridge.modelfacts import ModelFacts
from bridge.models.repo import ModelRepository, RepositoryError
from bridge.models.servers import running_servers
from bridge.models.status import StatusServer, UnknownModel, check_known, gather
from bridge.slurm.errors import SlurmError
from bridge.triton.catalog import site_models

#: a Slurm node or pool name as the API takes it
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


B = TypeVar("B", bound=_Body)
#: the running Triton servers, closed after (default: Slurm's, as `stb models` finds them)
Servers = Callable[[], AbstractContextManager[Sequence[StatusServer]]]


class LendBody(_Body):
    node: Name
    models: list[Name] = Field(default_factory=list, max_length=256)


class ReturnBody(_Body):
    lease: int = Field(ge=1)


class PoolBody(_Body):
    pool: Name
    reason: str = Field(default="", max_length=500)


class ApiError(ValueError):
    """A request refused: (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(status: int, doc: dict[str, Any]) -> tuple[int, bytes]:
    return status, json.dumps(doc).encode()


def _body(kind: type[B], raw: bytes) -> B:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return kind.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}") from exc


def _guard(
    handler: Callable[[ApiRequest], tuple[int, bytes]],
) -> Callable[[ApiRequest], tuple[int, bytes]]:
    def run(req: ApiRequest) -> tuple[int, bytes]:
        try:
            return handler(req)
        except ApiError as exc:
            return _json(exc.status, {"error": str(exc)})

    return run


def operator_routes(
    config: BridgeConfig,
    queue: RequestQueue,
    store: LeaseStore,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    models: Callable[[], ModelFacts] | None = None,
    servers: Servers | None = None,
) -> dict[str, Endpoint]:
    """The operator endpoints on `queue` (writes no lease: the daemon does). `models`:
    the models' facts now (the daemon's observer's; default: the repository read for
    each lend); `servers`: the running Triton servers a model status reads."""
    facts = models or (lambda: site_models(config))
    find = servers or (lambda: running_servers(config))

    def lend(req: ApiRequest) -> tuple[int, bytes]:
        body = _body(LendBody, req.body)
        unknown = sorted(set(body.models) - set(facts().names))
        if unknown:
            raise ApiError(400, f"models: unknown {', '.join(unknown)}")
        row = queue.request_lend(body.node, body.models, clock(), req.principal.name)
        return _json(202, {"request": row.id, "kind": "lend", "node": body.node})

    def return_(req: ApiRequest) -> tuple[int, bytes]:
        body = _body(ReturnBody, req.body)
        if body.lease not in {lease.id for lease in store.open_leases()}:
            raise ApiError(404, f"lease: {body.lease} is not an open lease")
        row = queue.request_return(body.lease, clock(), req.principal.name)
        return _json(202, {"request": row.id, "kind": "return", "lease": body.lease})

    def drain(req: ApiRequest) -> tuple[int, bytes]:
        body = _body(PoolBody, req.body)
        if body.pool not in config.pools:
            raise ApiError(404, f"pool: no pool {body.pool!r}")
        if config.pools[body.pool].lend_mode == "reserved":
            raise ApiError(400, f"pool: {body.pool} is the reserved pool; it is never lent")
        hold = queue.hold(body.pool, clock(), req.principal.name, body.reason)
        return _json(200, {"pool": hold.pool, "held_by": hold.held_by, "reason": hold.reason})

    def resume(req: ApiRequest) -> tuple[int, bytes]:
        body = _body(PoolBody, req.body)
        hold = queue.release(body.pool, clock(), req.principal.name)
        if hold is None:
            raise ApiError(404, f"pool: {body.pool} is not held")
        return _json(200, {"pool": hold.pool, "released_by": req.principal.name})

    def request(req: ApiRequest) -> tuple[int, bytes]:
        ids = req.query.get("id", [])
        if len(ids) != 1 or not ids[0].isdigit() or len(ids[0]) > 12:
            raise ApiError(400, "id: one request id (a number) is required")
        row = queue.get(int(ids[0]))
        if row is None:
            raise ApiError(404, f"id: no request {ids[0]}")
        return _json(
            200,
            {
                "request": row.id,
                "kind": row.kind,
                "requested_by": row.requested_by,
                "done": row.done_at is not None,
                "outcome": row.outcome,
            },
        )

    def model_status(req: ApiRequest) -> tuple[int, bytes]:
        names = req.query.get("model", [])
        if len(names) != 1:
            raise ApiError(400, "model: one model name is required")
        repo = ModelRepository(config.triton.model_repository)
        try:
            check_known(names[0], repo)
        except RepositoryError as exc:
            raise ApiError(400, f"model: {exc}") from exc
        except UnknownModel as exc:
            raise ApiError(404, f"model: {exc}") from exc

        def at(found: Sequence[StatusServer] | None, note: str = "") -> tuple[int, bytes]:
            status = gather(
                names[0], repo, facts(), database_url=config.database_url,
                ledger_url=config.accounting.ledger_url, servers=found, now=clock(),
                servers_note=note, observe=config.observe,
            )  # fmt: skip
            return _json(200, status.to_json())

        try:
            with find() as found:
                return at(found)
        except SlurmError as exc:
            return at(None, f"Slurm does not answer: {exc}")

    return {
        "/api/lend": Endpoint("POST", "operator", _guard(lend)),
        "/api/return": Endpoint("POST", "operator", _guard(return_)),
        "/api/drain": Endpoint("POST", "operator", _guard(drain)),
        "/api/resume": Endpoint("POST", "operator", _guard(resume)),
        "/api/request": Endpoint("GET", "operator", _guard(request)),
        "/api/models/status": Endpoint("GET", "operator", _guard(model_status)),
    }


def finance_routes(ledger: Engine, idle: str) -> dict[str, Endpoint]:
    """The ledger's report for role `finance`."""
    return {
        "/api/report": Endpoint(
            "GET",
            "finance",
            lambda req: report_response(ledger, req.query, idle),  # type: ignore[arg-type]
        )
    }


__all__ = ["ApiError", "finance_routes", "operator_routes"]
