"""What stands between a request and a route's handler: the bearer dependency (token and
role, then the request's bounds), the JSON body reader, and the error answers.

A guarded route takes `Annotated[Caller, Security(bearer, scopes=[role])]` as its first
parameter and its body, if any, through `json_body(Model)` after it, so the checks run
in this order (the one the hand-written server before it kept):

1. the path and method (FastAPI's router: 404 `no such path`, 405 `... takes GET`);
2. the token (401, with `WWW-Authenticate: Bearer`) and the role (403);
3. the query string's length (414 over `MAX_QUERY_CHARS`), a POST's `Content-Length`
   (411 without one, 413 over `MAX_BODY_BYTES`), the query's fields (400 over
   `MAX_QUERY_FIELDS`);
4. the body: JSON (400 `the body is not JSON`), an object, then the model's fields,
   strictly (400 naming the first bad field); read no further than `MAX_BODY_BYTES`
   whatever the headers said.

So a caller without a token learns nothing about bodies or bounds, and nothing is read
for a refused request. Every refusal is `{"error": "..."}` (`ApiError` and the handlers
`install_error_handlers` adds). The roles are OpenAPI scopes of the one `bearer` scheme,
so `/openapi.json` names each route's role. Used by `bridge.http.app` and
`bridge.http.routes`.
"""

# No `from __future__ import annotations`: FastAPI 0.123 (the lower bound) reads a callable
# object's string annotations without its module's globals (`Bearer.__call__` loses `Request`).

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security import SecurityScopes
from fastapi.security.base import SecurityBase
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from bridge.http.auth import Principal, TokenTable

#: longest query string, most query fields, and longest POST body a guarded request carries
MAX_QUERY_CHARS = 4096
MAX_QUERY_FIELDS = 50
MAX_BODY_BYTES = 64 * 1024


class ApiError(ValueError):
    """A request refused: (HTTP status, message); answered `{"error": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_response(status: int, doc: Mapping[str, Any]) -> Response:
    """`doc` as the JSON body (the standard library's encoding, as before)."""
    return Response(json.dumps(doc).encode(), status, media_type="application/json")


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    response = json_response(status, {"error": message})
    response.headers.update(headers or {})
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="stb"'
    return response


@dataclass(frozen=True)
class Caller:
    """An authorized request, as a route's handler sees it: who, and the query parsed
    (every value of every key, as `parse_qs` gives them)."""

    principal: Principal
    query: Mapping[str, Sequence[str]]


class Bearer(SecurityBase):
    """The security dependency of every guarded route: the token against the app's
    `state.tokens` (a `TokenTable`) for the route's one role (its scope), then the
    request's bounds. Sync, so a tokens file re-read never stalls the event loop."""

    def __init__(self) -> None:
        self.model = HTTPBearerModel(
            bearerFormat="stb token",
            description="`Authorization: Bearer <token>`; a token's roles are in "
            "[api] tokens_file (`stb token`); each route's scope is the role it needs",
        )
        self.scheme_name = "bearer"

    def __call__(self, request: Request, security_scopes: SecurityScopes) -> Caller:
        if len(security_scopes.scopes) != 1:
            raise RuntimeError(f"a guarded route names one role, not {security_scopes.scopes}")
        tokens: TokenTable = request.app.state.tokens
        verdict = tokens.authorize(request.headers.get("authorization"), security_scopes.scopes[0])
        if verdict.status != 200 or verdict.principal is None:
            raise ApiError(verdict.status, verdict.reason)
        query = request.scope.get("query_string", b"").decode("latin-1")
        if len(query) > MAX_QUERY_CHARS:
            raise ApiError(414, f"query string over {MAX_QUERY_CHARS} characters")
        if request.method == "POST":
            length = request.headers.get("content-length", "")
            if not (length.isascii() and length.isdigit()):
                raise ApiError(411, "a POST needs a Content-Length")
            if int(length) > MAX_BODY_BYTES:
                raise ApiError(413, f"body over {MAX_BODY_BYTES} bytes")
        try:
            fields = parse_qs(query, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS)
        except ValueError as exc:
            raise ApiError(400, f"bad query string: {exc}") from exc
        return Caller(verdict.principal, fields)


#: the one bearer scheme: `Security(bearer, scopes=["operator"])`
bearer = Bearer()


class StrictBody(BaseModel):
    """A request body: a JSON object, no extra keys, no coercion ("7" is not 7)."""

    model_config = ConfigDict(extra="forbid", strict=True)


B = TypeVar("B", bound=StrictBody)


def parse_body(kind: type[B], raw: bytes) -> B:
    """`raw` as a `kind`; an `ApiError` (400) naming what was wrong."""
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


def json_body(kind: type[B]) -> Callable[[Request], Awaitable[B]]:
    """A dependency reading the body as a `kind`, no further than `MAX_BODY_BYTES` (a
    chunked body has no Content-Length the bearer check could read)."""

    async def read(request: Request) -> B:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ApiError(413, f"body over {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
        except ClientDisconnect as exc:
            raise ApiError(400, "the client went away before its body was sent") from exc
        return parse_body(kind, b"".join(chunks))

    return read


def body_doc(kind: type[StrictBody]) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route whose body `json_body(kind)` reads."""
    schema = kind.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal and failure answered `{"error": ...}`."""

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, str(exc))

    async def routing(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        if exc.status_code == 404:
            return error_response(404, f"no such path: {path[:100]}")
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            takes = sorted(m.strip() for m in allow.split(",") if m.strip() not in ("", "HEAD"))
            return error_response(405, f"{path} takes {' or '.join(takes)}", exc.headers)
        return error_response(exc.status_code, str(exc.detail), exc.headers)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"][1:]) or "request"
        return error_response(400, f"{where}: {first['msg']}")

    async def failed(request: Request, exc: Exception) -> Response:
        # Starlette re-raises it after this answer, so the server logs the traceback.
        return error_response(
            500, f"internal error ({type(exc).__name__}); the daemon's log has the details"
        )

    app.add_exception_handler(ApiError, refused)
    app.add_exception_handler(HTTPException, routing)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, failed)


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_FIELDS",
    "ApiError",
    "Bearer",
    "Caller",
    "StrictBody",
    "bearer",
    "body_doc",
    "error_response",
    "install_error_handlers",
    "json_body",
    "json_response",
    "parse_body",
]
