"""`AuditStore`: the audit trail's table (`audit_entry`, in the bridge's database beside
the leases, made by the bridge's migrations) and its hash chain.

One row per privileged action (what `bridge.audit` records: lends and returns, holds,
model publishes, rollout steps, tokens, the configuration loaded), append-only. Each row
carries `prev_hash`, the hash of the row before it, and `hash`, SHA-256 over its own
fields and `prev_hash` in one canonical form (`canonical`): a row changed, removed or moved
after it was written no longer matches its hash or its successor's link, and `verify`
names the first one that does not.

The chain stays linear however many processes append at once (the daemon, `stb`
commands, the HTTP API): `append_in` reads the head and inserts the next row in one
write transaction that first takes the trail's lock: on PostgreSQL the transaction
advisory lock `AUDIT_LOCK_KEY`, on SQLite the write lock `BEGIN IMMEDIATE` takes (every
write transaction here begins so: `bridge.db`). `seq` is unique besides, so a writer that
somehow read a stale head fails rather than fork the chain.

An entry is appended on its own (`append`, fenced by the leader like the lease store's
writes when the store has a fence: a deposed daemon records nothing), or inside another
write's transaction (`append_in`: an operator request and its entry commit together or
not at all). Called through `bridge.audit.trail`; read by `stb audit`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Column, Integer, String, Text, UniqueConstraint, text
from sqlmodel import Field, Session, SQLModel, col, or_, select

from bridge.db import Transactions, UTCDateTime

TABLES = ("audit_entry",)
#: the link of the first entry
GENESIS = "0" * 64
#: the PostgreSQL transaction advisory lock every append takes (b"stb-aud" and a zero
#: byte, read as a big-endian integer), beside `bridge.db.SCHEMA_LOCK_KEY`
AUDIT_LOCK_KEY = int.from_bytes(b"stb-aud\0", "big")
#: the outcomes an entry may have
OUTCOMES = ("ok", "refused", "failed")
#: the fields the hash covers, in the canonical form's order (sorted keys, in fact)
HASHED = (
    "seq", "at", "action", "target", "outcome", "detail", "actor", "token", "unix_user",
    "slurm_job", "host", "epoch", "prev_hash",
)  # fmt: skip


class AuditEntry(SQLModel, table=True):
    """One privileged action: who, when, what and the outcome, linked to the one before."""

    __tablename__ = "audit_entry"
    __table_args__ = (UniqueConstraint("seq", name="ux_audit_entry_seq"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    #: the entry's place in the chain: 1, 2, ... with no gap
    seq: int = Field(sa_column=Column(Integer, nullable=False))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    #: what was done, `bridge.audit.trail.ACTIONS` ("lend", "pool.drain", "model.publish")
    action: str = Field(sa_column=Column(String(64), nullable=False, index=True))
    #: what it was done to ("node n3", "lease 7", "pool training", "model echo")
    target: str = Field(sa_column=Column(String(255), nullable=False))
    #: ok | refused | failed
    outcome: str = Field(sa_column=Column(String(16), nullable=False))
    #: what happened, or why it was refused or failed
    detail: str = Field(default="", sa_column=Column(Text, nullable=False))
    #: who, as one name: a token's name, a Unix user, or `daemon@host`
    actor: str = Field(sa_column=Column(String(255), nullable=False, index=True))
    #: the API token's name, when the action came through the HTTP API
    token: str | None = Field(default=None, sa_column=Column(String(128), nullable=True))
    unix_user: str | None = Field(default=None, sa_column=Column(String(128), nullable=True))
    #: SLURM_JOB_ID of the command, when it ran inside a Slurm job
    slurm_job: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    host: str | None = Field(default=None, sa_column=Column(String(255), nullable=True))
    #: the leader's fencing epoch a daemon's entry was written under (None: unfenced)
    epoch: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    prev_hash: str = Field(sa_column=Column(String(64), nullable=False))
    hash: str = Field(sa_column=Column(String(64), nullable=False))


@dataclass(frozen=True)
class Record:
    """What one entry says, before the chain places it (seq, links, hash)."""

    action: str
    target: str
    outcome: str
    actor: str
    detail: str = ""
    token: str | None = None
    unix_user: str | None = None
    slurm_job: str | None = None
    host: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"audit outcome {self.outcome!r}: one of {', '.join(OUTCOMES)}")
        if not self.action or not self.actor:
            raise ValueError("an audit entry needs an action and an actor")


def _at(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: audit times are timezone-aware")
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def canonical(entry: AuditEntry) -> bytes:
    """The bytes an entry's hash covers: its `HASHED` fields as one JSON object, keys
    sorted, no spaces, UTF-8, the time as UTC ISO 8601 with microseconds."""
    fields: dict[str, object] = {name: getattr(entry, name) for name in HASHED}
    fields["at"] = _at(entry.at)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entry_hash(entry: AuditEntry) -> str:
    """SHA-256 of `canonical(entry)`, hex."""
    return hashlib.sha256(canonical(entry)).hexdigest()


@dataclass(frozen=True)
class Break:
    """The first entry where the chain does not hold."""

    seq: int
    id: int | None
    why: str

    def line(self) -> str:
        return f"entry {self.seq} (row id {self.id}): {self.why}"


@dataclass(frozen=True)
class Verdict:
    """What `verify` found: the entries checked, the head, and the first break if any."""

    checked: int
    head_seq: int
    head_hash: str
    broken: Break | None


def verify(entries: Iterable[AuditEntry]) -> Verdict:
    """Walk `entries` in `seq` order from the first: each must be one after the last,
    link to its hash, and match its own. Stops at the first that does not."""
    seq, last = 0, GENESIS
    checked = 0
    for entry in entries:
        if entry.seq != seq + 1:
            why = (
                f"follows entry {seq}: entries {seq + 1} to {entry.seq - 1} are missing"
                if entry.seq > seq + 1
                else f"follows entry {seq}: out of order or numbered twice"
            )
            return Verdict(checked, seq, last, Break(entry.seq, entry.id, why))
        if entry.prev_hash != last:
            why = (
                f"its link {entry.prev_hash[:16]}... is not the hash of entry {seq} "
                f"({last[:16]}...): the entry before it was changed, removed or rehashed"
            )
            return Verdict(checked, seq, last, Break(entry.seq, entry.id, why))
        if entry_hash(entry) != entry.hash:
            why = "its fields do not match its hash: it was changed after it was written"
            return Verdict(checked, seq, last, Break(entry.seq, entry.id, why))
        seq, last = entry.seq, entry.hash
        checked += 1
    return Verdict(checked, seq, last, None)


#: how many entries a walk over the trail reads at a time
PAGE = 1000


class AuditStore(Transactions):
    """The trail on one engine; writes behind the store's fence, if it has one."""

    @classmethod
    def beside(cls, other: Transactions, *, fenced: bool = True) -> AuditStore:
        """The trail in `other`'s database, behind its fence (unless not `fenced`: what
        an instance records of itself, such as the configuration it loaded)."""
        return cls(other._engine, other._fence if fenced else None)

    @property
    def epoch(self) -> int | None:
        """The fencing epoch this store writes under: that of the leader whose `fence`
        guards it (`LeaderLease.fence`, a bound method); None: unfenced."""
        holder = getattr(self._fence, "__self__", None)
        value = getattr(holder, "epoch", None)
        return value if isinstance(value, int) else None

    def append(self, record: Record, now: datetime) -> AuditEntry:
        """Append `record` as the next entry, in a transaction of its own (fenced)."""
        with self._write() as session:
            return self.append_in(session, record, now)

    def append_in(self, session: Session, record: Record, now: datetime) -> AuditEntry:
        """Append `record` as the next entry in `session`'s transaction, which must be a
        write transaction (`BEGIN IMMEDIATE` on SQLite: `Transactions._write`, or a
        session on `_writer`). Takes the trail's lock first (PostgreSQL), then reads
        the head, so concurrent appenders queue and the chain stays one line."""
        _at(now)  # a naive time is refused before anything is written
        conn = session.connection()
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY})
        head = session.exec(select(AuditEntry).order_by(col(AuditEntry.seq).desc())).first()
        entry = AuditEntry(
            seq=1 if head is None else head.seq + 1,
            at=now,
            action=record.action,
            target=record.target,
            outcome=record.outcome,
            detail=record.detail,
            actor=record.actor,
            token=record.token,
            unix_user=record.unix_user,
            slurm_job=record.slurm_job,
            host=record.host,
            epoch=self.epoch,
            prev_hash=GENESIS if head is None else head.hash,
            hash="",
        )
        entry.hash = entry_hash(entry)
        session.add(entry)
        session.flush()
        return entry

    # ---- reads --------------------------------------------------------------------

    def walk(self, after: int = 0) -> Iterator[AuditEntry]:
        """Every entry after `seq` `after`, in chain order, read a page at a time."""
        while True:
            with self._read() as session:
                page = list(
                    session.exec(
                        select(AuditEntry)
                        .where(col(AuditEntry.seq) > after)
                        .order_by(col(AuditEntry.seq))
                        .limit(PAGE)
                    ).all()
                )
            yield from page
            if len(page) < PAGE:
                return
            after = page[-1].seq

    def find(
        self,
        *,
        since: datetime | None = None,
        who: str | None = None,
        action: str | None = None,
        target: str | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        """The entries at or after `since`, by `who` (the actor, the token's name or the
        Unix user), whose action is `action` or begins with `action.`, on `target`; in
        chain order (with `limit`, the newest `limit` of them)."""
        query = select(AuditEntry)
        if since is not None:
            query = query.where(col(AuditEntry.at) >= since)
        if who:
            query = query.where(
                or_(AuditEntry.actor == who, AuditEntry.token == who, AuditEntry.unix_user == who)
            )
        if action:
            query = query.where(
                or_(AuditEntry.action == action, col(AuditEntry.action).startswith(f"{action}."))
            )
        if target is not None:
            query = query.where(AuditEntry.target == target)
        with self._read() as session:
            if limit is None:
                return list(session.exec(query.order_by(col(AuditEntry.seq))).all())
            rows = session.exec(query.order_by(col(AuditEntry.seq).desc()).limit(limit)).all()
            return list(reversed(rows))

    def verify(self) -> Verdict:
        """`verify` over the whole trail as stored now."""
        return verify(self.walk())


__all__ = [
    "AUDIT_LOCK_KEY",
    "GENESIS",
    "OUTCOMES",
    "TABLES",
    "AuditEntry",
    "AuditStore",
    "Break",
    "Record",
    "Verdict",
    "canonical",
    "entry_hash",
    "verify",
]
