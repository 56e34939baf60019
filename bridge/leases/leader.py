"""Which of several bridge daemons acts: a leader lease row in the bridge's PostgreSQL
database, with a heartbeat and a fencing token.

Two or more `stb daemon` processes on different hosts share one PostgreSQL database. Each
beats every `ttl/3` seconds (`LeaderLease.beat`):

- the holder renews `expires_at = now() + ttl` (the database's clock, never a host's);
- the others try to take the row, which succeeds only once it has expired, and each
  taking adds one to `epoch`, the fencing token.

An instance believes it leads only until its last successful renewal, as timed by its
own monotonic clock from before the request was sent, plus `ttl`: it stops believing
before the database would let anyone else take over, so two instances never both
believe they lead. What it may still have in flight when it stops is fenced: every write
of the lease store and the operator queue first runs `fence(session)`, which reads the
row `FOR SHARE` and refuses (`Fenced`) unless this instance's epoch still holds it. The
row lock also orders a takeover after every write of the epoch before it.

Why a lease row and not `pg_try_advisory_lock`: a session advisory lock is released only
when PostgreSQL notices the holder's connection is gone, which for a host that lost power
or its network is TCP keepalive's time (two hours by default), and it does not pass
through a transaction-pooling PgBouncer. The row bounds takeover to `ttl` plus one beat,
whatever happened to the holder, and its epoch is a fencing token the writes can check.
It is Kubernetes' Lease-object leader election, with the database as the arbiter.

SQLite has no such row: one host, one daemon, the file lock (`bridge.daemon.service`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Column, DateTime, Engine, Integer, String, text
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Field, Session, SQLModel

log = logging.getLogger(__name__)

#: the row's name: one bridge per database
ROW = "bridge"


class Fenced(RuntimeError):
    """This instance does not hold the leadership (any more): its write was refused."""


class LeaderRow(SQLModel, table=True):
    __tablename__ = "stb_leader"

    name: str = Field(sa_column=Column(String(64), primary_key=True))
    holder: str = Field(sa_column=Column(String(255), nullable=False))
    #: the fencing token: one more at each change of holder
    epoch: int = Field(sa_column=Column(Integer, nullable=False))
    expires_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    acquired_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


@dataclass(frozen=True)
class Holder:
    """The row as `stb status` shows it."""

    holder: str
    epoch: int
    expires_in_s: float
    acquired_at: datetime


_ACQUIRE = text(
    """
    INSERT INTO stb_leader (name, holder, epoch, expires_at, acquired_at)
    VALUES (:name, :me, 1, now() + make_interval(secs => :ttl), now())
    ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = stb_leader.epoch + 1,
            expires_at = EXCLUDED.expires_at, acquired_at = now()
        WHERE stb_leader.expires_at < now()
    RETURNING epoch
    """
)
_RENEW = text(
    """
    UPDATE stb_leader SET expires_at = now() + make_interval(secs => :ttl)
    WHERE name = :name AND holder = :me AND epoch = :epoch AND expires_at >= now()
    RETURNING epoch
    """
)
_RELEASE = text(
    """
    UPDATE stb_leader SET expires_at = now() - interval '1 second'
    WHERE name = :name AND holder = :me AND epoch = :epoch
    """
)
_FENCE = text("SELECT holder, epoch FROM stb_leader WHERE name = :name FOR SHARE")
_SHOW = text(
    "SELECT holder, epoch, EXTRACT(EPOCH FROM expires_at - now()), acquired_at "
    "FROM stb_leader WHERE name = :name"
)


def supported(engine: Engine) -> bool:
    """Leader election needs PostgreSQL; SQLite keeps the single-host file lock."""
    return engine.dialect.name == "postgresql"


class LeaderLease:
    """This instance's side of the election. `beat()` from one thread every `ttl_s / 3`;
    `active` and `fence` from any thread."""

    def __init__(
        self,
        engine: Engine,
        instance: str,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = ROW,
    ) -> None:
        if not supported(engine):
            raise ValueError(f"leader election needs PostgreSQL, not {engine.dialect.name}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, not {ttl_s}")
        self.engine = engine
        self.instance = instance
        self.ttl_s = float(ttl_s)
        self.name = name
        self._clock = clock
        #: the epoch this instance holds (None: standing by)
        self.epoch: int | None = None
        self._valid_until = 0.0
        #: the last beat's error, if it could not reach the database
        self.last_error: str | None = None

    @property
    def beat_s(self) -> float:
        return self.ttl_s / 3

    @property
    def active(self) -> bool:
        return self.epoch is not None and self._clock() < self._valid_until

    def beat(self) -> bool:
        """Renew (holder) or try to take over (standby); True while this instance leads.
        A database that cannot be reached changes nothing here: the holder keeps leading
        until its lease would have run out, then stands by."""
        sent = self._clock()
        params = {"name": self.name, "me": self.instance, "ttl": self.ttl_s}
        try:
            with self.engine.begin() as conn:
                if self.epoch is not None:
                    got = conn.execute(_RENEW, params | {"epoch": self.epoch}).scalar()
                    if got is None:
                        log.warning("leader: lost the lease (epoch %s)", self.epoch)
                        self.epoch = None
                if self.epoch is None:
                    got = conn.execute(_ACQUIRE, params).scalar()
                    if got is not None:
                        log.info("leader: %s took the lease, epoch %s", self.instance, got)
        except SQLAlchemyError as exc:
            self.last_error = str(exc).strip().splitlines()[0] if str(exc).strip() else "error"
            if self.epoch is not None and not self.active:
                log.warning("leader: lease ran out unrenewed: %s", self.last_error)
                self.epoch = None
            return self.active
        self.last_error = None
        if got is not None:
            self.epoch = int(got)
            self._valid_until = sent + self.ttl_s
        return self.active

    def fence(self, session: Session) -> None:
        """Refuse a write (raise `Fenced`) unless this instance's epoch holds the row; the
        row stays share-locked to the end of the caller's transaction."""
        epoch = self.epoch
        if epoch is None or not self.active:
            raise Fenced(f"{self.instance} is not the active bridge")
        row = session.connection().execute(_FENCE, {"name": self.name}).first()
        if row is None or row[0] != self.instance or int(row[1]) != epoch:
            self.epoch = None
            now = f"{row[0]} (epoch {row[1]})" if row is not None else "nobody"
            raise Fenced(f"{self.instance} (epoch {epoch}) was deposed: {now} leads")

    def release(self) -> None:
        """Give the lease up now (a clean shutdown): a standby takes over at its next
        beat instead of after `ttl`."""
        epoch, self.epoch = self.epoch, None
        if epoch is None:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(_RELEASE, {"name": self.name, "me": self.instance, "epoch": epoch})
        except SQLAlchemyError as exc:
            log.warning("leader: could not release the lease: %s", exc)


def current(engine: Engine, name: str = ROW) -> Holder | None:
    """Who holds the row now (None: nobody ever has, or not PostgreSQL)."""
    if not supported(engine):
        return None
    with engine.connect() as conn:
        row = conn.execute(_SHOW, {"name": name}).first()
    if row is None:
        return None
    return Holder(str(row[0]), int(row[1]), float(row[2]), row[3])


__all__ = ["ROW", "Fenced", "Holder", "LeaderLease", "LeaderRow", "current", "supported"]
