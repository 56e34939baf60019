"""`Trail`: how a privileged action is recorded where it is carried out, with who did it,
what, on what, and the outcome. Each hook is one call:

- `record(action, target, outcome, detail)`: after the fact (the daemon's lends and
  returns, its rollout steps, the configuration it loaded);
- `record_text(action, target, text)`: the same from an outcome line ("refused: ...",
  "failed: ...", else ok), as the daemon's pass words them;
- `within(action, target)`: inside the write that carries the action out (an operator
  request, a pool hold), so the two commit together or not at all;
- `audited(action, target)`: around an action outside the database (a model publish, a
  token written to its file): the trail is checked first, so an unreachable trail
  refuses the action before it is done; the outcome is recorded after (ok, or refused /
  failed with the exception's words).

What a failed append does: `AuditError` (one line naming the action). An operator's
action is refused (the request is not queued, the publish not started) or, where the
database failed between the action and its record, the command exits non-zero saying
the action was done but not recorded. The daemon cannot undo what Slurm already did: its
pass reports an `audit` error (logged, counted, in /healthz), as a lease write that fails.
A deposed daemon's append is fenced (`Fenced` propagates, as from the lease store).

Who: a command's Unix user, its host and `SLURM_JOB_ID` when it runs inside a Slurm job
(`operator`); an API caller's token name (`api_caller`); the daemon as `daemon@host`
(`daemon`).
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from bridge.cli_text import first_line
from bridge.config import BridgeConfig
from bridge.leases.audit import AuditEntry, AuditStore, Record
from bridge.leases.requests import Audit
from bridge.leases.store import create_schema, make_engine

log = logging.getLogger(__name__)

#: every action the trail records, and what it means
ACTIONS: dict[str, str] = {
    "lend": "the daemon lent a node: recorded with the lease it made, in the same write "
    "(the detail: the lease, then why: its policy's reason or the operator request), or "
    "failed when the lease store refused it",
    "return": "the daemon began a lease's return: recorded with the lease's first move "
    "out, in the same write (the detail: the move, then why: its policy, an operator "
    "request, a held pool)",
    "adopt": "the daemon took a running Triton job no lease held as a lease of its own",
    "request.done": "the daemon finished an operator request: its outcome, recorded with "
    "it (what was lent, returned or placed, or why not)",
    "lend.request": "an operator asked for a lend (stb lend, POST /api/lend)",
    "return.request": "an operator asked for a return (stb return, POST /api/return)",
    "place.request": "an operator asked for a placement (stb place)",
    "pool.drain": "an operator held a pool (stb drain, POST /api/drain)",
    "pool.resume": "an operator lifted a pool's hold (stb resume, POST /api/resume)",
    "model.publish": "a model version published (stb models publish)",
    "model.canary": "a model version published for a gradual rollout (--canary)",
    "model.rollback": "a model's latest version set aside (stb models rollback)",
    "model.retire": "a model unloaded and archived (stb models retire)",
    "rollout.stop": "an operator stopped a rollout (stb models rollback during one)",
    "rollout.step": "the daemon moved a rollout (started, next step)",
    "rollout.promote": "the daemon promoted a rollout's new version",
    "rollout.rollback": "the daemon rolled a rollout back",
    "rollout.end": "the daemon finished a rollout's promotion or rollback",
    "token.issue": "an API token issued (stb token), or found new in the tokens file",
    "token.revoke": "an API token gone from the tokens file, as the daemon noticed",
    "config.load": "the daemon loaded its configuration at start (its SHA-256; changed "
    "or not since the last load)",
    "fleet.mode": "the fleet's mode switched (stb fleet mode or fallback: separate, "
    "advisory, shared)",
}


class AuditError(RuntimeError):
    """The trail could not be written: the message names the action and the cause."""


@dataclass(frozen=True)
class Actor:
    """Who acts: one name, and what is known of it."""

    name: str
    token: str | None = None
    unix_user: str | None = None
    slurm_job: str | None = None
    host: str | None = None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container)
        return f"uid {os.getuid()}"


def operator(environ: Mapping[str, str] | None = None) -> Actor:
    """The user running this command, its host, and its Slurm job if it runs in one."""
    env = os.environ if environ is None else environ
    user = _user()
    return Actor(user, None, user, env.get("SLURM_JOB_ID") or None, socket.gethostname())


def api_caller(token_name: str) -> Actor:
    """A caller of the HTTP API, known by its token's name."""
    return Actor(token_name, token=token_name, host=socket.gethostname())


def daemon() -> Actor:
    """The bridge daemon on this host."""
    host = socket.gethostname()
    return Actor(f"daemon@{host}", unix_user=_user(), host=host)


def fingerprint(token: str) -> str:
    """A token's short name in the trail: the first 12 hex digits of its SHA-256 (the
    digest the API compares), never the token."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def outcome_of(text: str) -> str:
    """The outcome an outcome line says: refused, failed, or ok."""
    for outcome in ("refused", "failed"):
        if text.startswith(outcome):
            return outcome
    return "ok"


@dataclass
class Note:
    """What `audited` records when its block ends: the block may add to it."""

    detail: str = ""


class Trail:
    """The audit trail as one actor writes it."""

    def __init__(
        self,
        store: AuditStore,
        actor: Actor,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.actor = actor
        self.clock = clock

    def as_(self, actor: Actor) -> Trail:
        """The same trail written by `actor` (an API call's token)."""
        return Trail(self.store, actor, self.clock)

    def _record(self, action: str, target: str, outcome: str, detail: str) -> Record:
        if action not in ACTIONS:
            raise ValueError(f"unknown audit action {action!r}")
        a = self.actor
        return Record(
            action, target, outcome, a.name, detail, a.token, a.unix_user, a.slurm_job, a.host
        )

    def record(self, action: str, target: str, outcome: str, detail: str = "") -> AuditEntry:
        """Append one entry now; `AuditError` if the database refuses it."""
        rec = self._record(action, target, outcome, detail)
        try:
            return self.store.append(rec, self.clock())
        except SQLAlchemyError as exc:
            raise AuditError(
                f"{action} {target} ({outcome}) not recorded: {first_line(exc)}"
            ) from exc

    def record_text(self, action: str, target: str, text: str) -> AuditEntry:
        """`record` of an outcome line: its first word says the outcome."""
        return self.record(action, target, outcome_of(text), text)

    def within(self, action: str, target: str, detail: str = "", outcome: str = "ok") -> Audit:
        """A recorder for a write's own transaction (`bridge.leases.requests.Audit`): the
        entry says what was written, then `detail`, with `outcome` (default ok)."""
        rec = self._record(action, target, outcome, detail)

        def audit(session: Session, written: str) -> None:
            text = f"{written}: {rec.detail}" if rec.detail else written
            self.store.append_in(session, replace(rec, detail=text), self.clock())

        return audit

    def check(self) -> None:
        """Reach the trail (read its newest entry): `AuditError` if it cannot be."""
        try:
            self.store.find(limit=1)
        except SQLAlchemyError as exc:
            raise AuditError(f"the audit trail cannot be read: {first_line(exc)}") from exc

    @contextmanager
    def audited(
        self,
        action: str,
        target: str,
        refusals: tuple[type[BaseException], ...] = (),
    ) -> Iterator[Note]:
        """Record the block as `action` on `target`: checked first (the block does not
        run if the trail cannot be reached), then ok with the note's detail, or refused
        (an exception of `refusals`) or failed with the exception's words, re-raised."""
        self._record(action, target, "ok", "")  # an unknown action fails before acting
        self.check()
        note = Note()
        try:
            yield note
        except Exception as exc:
            outcome = "refused" if isinstance(exc, refusals) else "failed"
            words = " ".join(str(exc).split()) or type(exc).__name__
            try:
                self.record(action, target, outcome, words)
            except AuditError as lost:
                exc.add_note(str(lost))
                log.error("%s", lost)
            raise
        try:
            self.record(action, target, "ok", note.detail)
        except AuditError as exc:
            raise AuditError(f"done, but {exc}") from exc


def open_trail(config: BridgeConfig, actor: Actor | None = None) -> Trail:
    """The trail of `config`'s database (its tables made or upgraded, as `stb lend` does),
    written by `actor` (default: this command's user)."""
    engine = make_engine(config.database_url)
    create_schema(engine)
    return Trail(AuditStore(engine), actor or operator())


__all__ = [
    "ACTIONS",
    "Actor",
    "AuditError",
    "Note",
    "Trail",
    "api_caller",
    "daemon",
    "fingerprint",
    "open_trail",
    "operator",
    "outcome_of",
]
