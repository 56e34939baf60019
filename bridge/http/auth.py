"""Who is calling the bridge's HTTP API: bearer tokens from a file, each with a name and
roles.

The file (`[api] tokens_file`) has one token per line, `name roles token`, roles
comma-separated, `#` comments; it must not be readable by group or others (like ssh's
keys), and each token is at least `MIN_TOKEN_CHARS` long. The file is read again when it
changes, so a token is added or revoked without restarting the daemon.

`authorize(header, role)` compares the presented token with every known one by
`hmac.compare_digest` over SHA-256 digests (equal length, constant time, no early exit),
and answers 401 (no or unknown token) or 403 (a known token without the role). Used by
the HTTP surface's bearer dependency (`bridge.http.guard`) for every path but /metrics,
/healthz and /openapi.json, and by `stb token` (`add_token`). Free of any web framework,
so the CLI reads and writes tokens without loading one.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROLES = frozenset({"finance", "operator", "metrics"})
MIN_TOKEN_CHARS = 16
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.@-")


class TokensError(ValueError):
    """The tokens file cannot be used; the message names the line or the problem."""


@dataclass(frozen=True)
class Principal:
    """A caller the API knows."""

    name: str
    roles: frozenset[str]


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: a principal (allowed), or an HTTP status and why."""

    principal: Principal | None
    status: int = 200
    reason: str = ""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_tokens(text: str, source: str = "tokens file") -> list[tuple[bytes, Principal]]:
    """(digest, principal) for each line; raises `TokensError` naming the first bad one."""
    out: list[tuple[bytes, Principal]] = []
    seen: set[bytes] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3:
            raise TokensError(f"{source} line {number}: expected `name roles token`")
        name, roles_text, token = parts
        if not set(name) <= _NAME_CHARS:
            raise TokensError(f"{source} line {number}: bad name {name!r}")
        roles = frozenset(r for r in roles_text.split(",") if r)
        unknown = sorted(roles - ROLES)
        if not roles or unknown:
            raise TokensError(
                f"{source} line {number}: unknown role(s) {', '.join(unknown) or '(none)'}; "
                f"known: {', '.join(sorted(ROLES))}"
            )
        if len(token) < MIN_TOKEN_CHARS:
            raise TokensError(
                f"{source} line {number}: the token of {name} is shorter than "
                f"{MIN_TOKEN_CHARS} characters"
            )
        digest = _digest(token)
        if digest in seen:
            raise TokensError(f"{source} line {number}: the token of {name} is used twice")
        seen.add(digest)
        out.append((digest, Principal(name, roles)))
    return out


def add_token(path: Path, name: str, roles: frozenset[str] | set[str]) -> str:
    """Append a new random token for `name` with `roles` to the tokens file `path`
    (created mode 0600 if missing) and return it; the line is checked as `TokenTable`
    would read it, and nothing is written if it would not parse."""
    token = secrets.token_urlsafe(32)
    line = f"{name} {','.join(sorted(roles))} {token}\n"
    existing = path.read_text() if path.exists() else ""
    parse_tokens(existing + line, str(path))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line)
    return token


#: told what a re-read of the tokens file changed: the (digest, principal) of each token
#: added, then of each removed (the daemon records them in its audit trail)
Changes = Callable[[list[tuple[bytes, Principal]], list[tuple[bytes, Principal]]], None]


class TokenTable:
    """The tokens of `path`, re-read when the file changes (size or mtime); `on_change`
    is told what each re-read after the first added and removed."""

    def __init__(self, path: Path | None, on_change: Changes | None = None) -> None:
        self.path = path
        self.on_change = on_change
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: list[tuple[bytes, Principal]] = []
        if path is not None:
            self._reload()

    def _reload(self) -> None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise TokensError(f"api.tokens_file {self.path}: {exc.strerror}") from exc
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokensError(
                f"api.tokens_file {self.path} is readable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it"
            )
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        entries = parse_tokens(self.path.read_text(), f"api.tokens_file {self.path}")
        first, before = self._stamp is None, self._entries
        self._entries, self._stamp = entries, stamp
        if not first and self.on_change is not None:
            old, new = {d for d, _ in before}, {d for d, _ in entries}
            added = [e for e in entries if e[0] not in old]
            removed = [e for e in before if e[0] not in new]
            if added or removed:
                self.on_change(added, removed)

    def entries(self) -> list[tuple[bytes, Principal]]:
        """The current tokens; a file that became unusable keeps the last good ones (and
        an unreadable first read leaves none)."""
        if self.path is None:
            return []
        with self._lock:
            with contextlib.suppress(TokensError, OSError):
                self._reload()
            return list(self._entries)

    def authorize(self, header: str | None, role: str) -> Verdict:
        """The verdict for an `Authorization` header on a path that needs `role`."""
        if self.path is None:
            return Verdict(None, 401, "the API is closed: no api.tokens_file configured")
        if not header:
            return Verdict(None, 401, "missing bearer token (Authorization: Bearer <token>)")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(None, 401, "expected Authorization: Bearer <token>")
        presented = _digest(token.strip())
        found: Principal | None = None
        for digest, principal in self.entries():
            # every entry is compared: the time taken does not say which one matched
            if hmac.compare_digest(digest, presented):
                found = principal
        if found is None:
            return Verdict(None, 401, "unknown token")
        if role not in found.roles:
            return Verdict(found, 403, f"{found.name} does not hold the role {role!r}")
        return Verdict(found)


__all__ = [
    "ROLES",
    "Principal",
    "TokenTable",
    "TokensError",
    "Verdict",
    "add_token",
    "parse_tokens",
]
