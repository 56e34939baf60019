"""`LeaseStore`: the one place that creates leases and changes their status.

Called by the reconciler (each tick's passive sync and active steps) and by the operator
CLI (`stb lend`, `stb return`, `stb status`). Every write is one transaction:

- `create` is idempotent by `request_key` (a retry after a crash returns the lease the
  first attempt made) and keeps at most one open lease per node, save leases of some of
  a node's GPUs by preemption, which share it, each on a port slot of its own.
- `set_status` re-reads the row under a lock (`SELECT ... FOR UPDATE` on PostgreSQL,
  `BEGIN IMMEDIATE` on SQLite), checks the move against `bridge.lifecycle.TRANSITIONS`,
  updates the row and appends a `LeaseEvent`. Asking for the state the lease is already in
  is a no-op; an illegal move raises `IllegalTransition` and writes nothing.
- `place` changes a serving lease's models (model placement, `bridge.daemon.placer`): the
  lease stays `serving` (no transition: the table is not consulted) and its history gets
  a `serving -> serving` event naming the placement; `placed_at` finds the latest.

Leases returned are detached copies: changing one changes nothing in the database.

Schema: the bridge's Alembic migrations (`bridge.leases.schema`); `create_schema` is
re-exported here for its callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypedDict, Unpack

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, and_, col, or_, select

from bridge.config import GRES_TYPE
from bridge.db import Fence, Transactions, make_engine
from bridge.leases.errors import (
    IllegalTransition,
    LeaseNotFound,
    NodeAlreadyLeased,
    RequestKeyConflict,
    UnexpectedState,
)
from bridge.leases.models import Lease, LeaseEvent, LendMode
from bridge.leases.requests import Audit
from bridge.leases.schema import create_schema
from bridge.lifecycle import LeaseState, allowed

__all__ = ["PLACE_PREFIX", "Fence", "LeaseFields", "LeaseStore", "create_schema", "make_engine"]

#: how often a lease of a shared node is tried when concurrent creates took the slot it
#: chose (each try takes the lowest slot free then; one of the racers wins each round)
SHARE_ATTEMPTS = 8

#: the reason of a placement's history event begins so (`LeaseStore.place`)
PLACE_PREFIX = "place: "


class LeaseFields(TypedDict, total=False):
    """Columns `set_status` may set along with the state."""

    slurm_job_id: str | None
    models: Sequence[str]


_SETTABLE = frozenset(LeaseFields.__annotations__)


def _locked(session: Session, lease_id: int) -> Lease:
    """The lease's row, locked to the end of `session`'s transaction (a writer re-reads
    it under the lock), or `LeaseNotFound`."""
    lease = session.exec(select(Lease).where(Lease.id == lease_id).with_for_update()).first()
    if lease is None:
        raise LeaseNotFound(lease_id)
    return lease


def _created(now: datetime, reason: str, detail: str, lease_id: int) -> LeaseEvent:
    """A new lease's first history event (from nothing to `requested`)."""
    return LeaseEvent(
        lease_id=lease_id,
        from_state=None,
        to_state=LeaseState.REQUESTED,
        at=now,
        reason=reason,
        detail=detail,
    )


def _shares(lease: Lease, node: str) -> bool:
    """Whether open `lease` leaves `node` to another lease of some of its GPUs by
    preemption: it is one itself, on `node` (not a gang's member there)."""
    return (
        lease.node == node
        and lease.gpus is not None
        and not lease.members
        and lease.lend_mode == LendMode.PREEMPT
    )


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"naive datetime {now!r}: pass a timezone-aware time (UTC)")


def _model_names(models: Sequence[str]) -> list[str]:
    if isinstance(models, str):
        raise TypeError(f"models must be a sequence of names, not the string {models!r}")
    return [str(m) for m in models]


#: the states a lease's return begins with
_LEAVING = (LeaseState.DRAINING, LeaseState.RELEASING)


class LeaseStore(Transactions):
    # ---- writes -------------------------------------------------------------------

    def create(
        self,
        node: str,
        pool: str,
        lend_mode: LendMode | str,
        models: Sequence[str],
        request_key: str,
        now: datetime,
        *,
        reason: str = "lend requested",
        gpus: int | None = None,
        members: Sequence[str] = (),
        audit: Audit | None = None,
        gpu_type: str | None = None,
        slot: int | None = None,
    ) -> Lease:
        """Record a lend in state `requested` (with its first history event), or return
        the lease this `request_key` already made, whatever its state now. `audit`
        records the new lease in the same transaction (told "lease 7"); a lease this key
        already made records nothing, so a lend taken again is recorded once. Raises
        `NodeAlreadyLeased` when `node` (or one of `members`) has an open lease made under
        another key, and `RequestKeyConflict` when the key was used for another node, pool
        or mode. `gpus`: the GPUs of the node the lease holds (None: the whole node).
        `members`: a gang's other nodes (whole nodes, so with `gpus` None). `gpu_type`:
        the GRES type its `gpus` are of (a lend of MIG slices; None: any GPU).

        Leases of some GPUs of a node by preemption (`gpus` set, no `members`, mode
        preempt) may share the node: such a lease of a node whose open leases are all of
        that kind takes the lowest port slot they leave free (`Lease.slot`); any other
        lease of a held node is refused. Whether the node has the GPUs is Slurm's to say
        (the Triton job asks `--gres=gpu:k` and waits for them). `slot`: the slot the lease
        must take (an adopted job's, whose server listens there already): refused when an
        open lease holds it; None: the lowest free."""
        _require_aware(now)
        if gpus is not None and gpus < 1:
            raise ValueError(f"a lease holds at least one GPU, got gpus={gpus}")
        if gpu_type is not None and (gpus is None or not GRES_TYPE.match(gpu_type)):
            raise ValueError(
                f"a lease of GPUs of type {gpu_type!r} holds some GPUs (gpus) of a GRES "
                "type name (letters, digits, '.', '_', '-', '+')"
            )
        gang = list(dict.fromkeys(members))
        if node in gang or len(gang) != len(members) or not all(gang):
            raise ValueError(f"a gang's members are other nodes, each once: {node} + {members}")
        if gang and gpus is not None:
            raise ValueError(f"a gang holds whole nodes, got gpus={gpus}")
        mode = LendMode(lend_mode)
        names = _model_names(models)
        if not request_key:
            raise ValueError("request_key must not be empty")
        if slot is not None and slot < 0:
            raise ValueError(f"a port slot is 0 or more, got slot={slot}")
        shares = gpus is not None and not gang and mode == LendMode.PREEMPT
        for attempt in range(SHARE_ATTEMPTS):
            try:
                with self._write() as session:
                    existing, free = self._check_create(
                        session, node, pool, mode, request_key, gang, shares, slot
                    )
                    if existing is not None:
                        return existing
                    lease = Lease(
                        node=node,
                        pool=pool,
                        lend_mode=mode,
                        models=names,
                        gpus=gpus,
                        members=gang or None,
                        gpu_type=gpu_type,
                        slot=free,
                        state=LeaseState.REQUESTED,
                        request_key=request_key,
                        reason=reason,
                        created_at=now,
                        updated_at=now,
                    )
                    detail = (
                        f"node={node} pool={pool} mode={mode.value} models={names}"
                        + ("" if gpus is None else f" gpus={gpus}")
                        + ("" if gpu_type is None else f" gpu_type={gpu_type}")
                        + (f" members={','.join(gang)}" if gang else "")
                        + (f" slot={free}" if free else "")
                    )
                    self._insert(session, lease, partial(_created, now, reason, detail))
                    if audit is not None:
                        audit(session, f"lease {lease.id}")
                return lease
            except IntegrityError:
                # A concurrent create committed first (same key, same node, or the same
                # slot of a shared node): its row decides, or the next free slot does.
                with self._read() as session:
                    existing, _ = self._check_create(
                        session, node, pool, mode, request_key, gang, shares, slot
                    )
                if existing is not None:
                    return existing
                if not shares or attempt == SHARE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _check_create(
        self,
        session: Session,
        node: str,
        pool: str,
        mode: LendMode,
        request_key: str,
        members: Sequence[str] = (),
        shares: bool = False,
        slot: int | None = None,
    ) -> tuple[Lease | None, int]:
        """The lease `request_key` already made (and 0), or None and the port slot a new
        lease takes (`slot` where given); raises when the key was used for another lend
        or a node (or `slot` of it) is held."""
        # One statement, so one snapshot: under READ COMMITTED two separate queries could
        # miss a concurrent create's key and then see its node. A gang's members live in a
        # JSON list no index covers: the open leases that have members are read too (few:
        # gangs are the large models' replicas) and matched here.
        wanted = {node, *members}
        rows = [
            lease
            for lease in session.exec(
                select(Lease).where(
                    or_(
                        Lease.request_key == request_key,
                        and_(
                            col(Lease.state) != LeaseState.RETURNED,
                            or_(col(Lease.node).in_(wanted), col(Lease.members).is_not(None)),
                        ),
                    )
                )
            ).all()
            if lease.request_key == request_key or wanted & {lease.node, *(lease.members or ())}
        ]
        for lease in rows:
            assert lease.id is not None
            if lease.request_key != request_key:
                continue
            theirs = (lease.node, lease.pool, lease.lend_mode)
            if theirs != (node, pool, mode):
                raise RequestKeyConflict(
                    request_key,
                    lease.id,
                    f"node {lease.node}, pool {lease.pool}, mode {lease.lend_mode}; "
                    f"asked for node {node}, pool {pool}, mode {mode}",
                )
            return lease, 0
        # no row has our key, so each is an open lease of one of our nodes
        for holder in rows:
            assert holder.id is not None
            if not (shares and _shares(holder, node)):
                taken = sorted(wanted & {holder.node, *(holder.members or ())})
                raise NodeAlreadyLeased(",".join(taken), holder.id, holder.state.value)
        used = {lease.slot: lease for lease in rows}
        if slot is not None and slot in used:
            holder = used[slot]
            assert holder.id is not None
            raise NodeAlreadyLeased(node, holder.id, f"{holder.state.value}, on slot {slot}")
        free = next(s for s in range(len(used) + 1) if s not in used)
        return None, free if slot is None else slot

    def set_status(
        self,
        lease_id: int,
        new_state: LeaseState,
        now: datetime,
        reason: str,
        *,
        expected: LeaseState | None = None,
        detail: str | None = None,
        audit: Audit | None = None,
        **fields: Unpack[LeaseFields],
    ) -> Lease:
        """THE one function that changes a lease's status. In one transaction: lock and
        re-read the row, check `state -> new_state` against the table, set the state, the
        reason, `updated_at` and any `fields` (e.g. `slurm_job_id`), append a LeaseEvent.

        - Already in `new_state`: a no-op (nothing written, fields untouched); returns the
          stored lease, so a retrying caller can compare e.g. its job id with the stored one.
        - `expected` (compare-and-set): the state the caller's decision was based on. If
          another writer moved the lease meanwhile, raises `UnexpectedState` (an
          `IllegalTransition`) and writes nothing. Two actors racing from the same state
          thus get exactly one winner.
        - An illegal move raises `IllegalTransition` and writes nothing; `LeaseNotFound`
          for an unknown id.
        - `audit` records the move in the same transaction (told "lease 7 serving ->
          draining"), only when the move is made.
        """
        _require_aware(now)
        new_state = LeaseState(new_state)
        unknown = set(fields) - _SETTABLE
        if unknown:
            raise TypeError(f"set_status cannot set {sorted(unknown)}; only {sorted(_SETTABLE)}")
        values: dict[str, Any] = dict(fields)
        if "models" in values:
            values["models"] = _model_names(values["models"])
        with self._write() as session:
            lease = _locked(session, lease_id)
            old = lease.state
            if old == new_state:
                return lease
            if expected is not None and old != expected:
                raise UnexpectedState(lease_id, LeaseState(expected).value, old.value, new_state)
            if not allowed(old, new_state):
                raise IllegalTransition(old.value, new_state.value, lease_id=lease_id)
            lease.state = new_state
            lease.reason = reason
            lease.updated_at = now
            for name, value in values.items():
                setattr(lease, name, value)
            parts = [detail] if detail else []
            parts += [f"{name}={value!r}" for name, value in values.items()]
            session.add(
                LeaseEvent(
                    lease_id=lease_id,
                    from_state=old,
                    to_state=new_state,
                    at=now,
                    reason=reason,
                    detail="; ".join(parts) or None,
                )
            )
            if audit is not None:
                audit(session, f"lease {lease_id} {old.value} -> {new_state.value}")
        return lease

    def place(
        self, lease_id: int, models: Sequence[str], now: datetime, reason: str
    ) -> tuple[Lease, list[str]]:
        """Give serving lease `lease_id` the models `models` in place of those it holds, in
        one transaction: lock and re-read the row, check that it is `serving`, set its
        models and append a `serving -> serving` LeaseEvent (reason `place: <reason>`, the
        old and new models in its detail). Its state, reason and `updated_at` (when it
        entered its state: deadlines, the lend lead time) are left as they are. Returns the
        stored lease and the models it held before. The same models again: a no-op.
        `UnexpectedState` for a lease that is not serving, `LeaseNotFound`, `ValueError`
        for an empty list."""
        _require_aware(now)
        names = _model_names(models)
        if not names:
            raise ValueError("a placement needs at least one model")
        with self._write() as session:
            lease = _locked(session, lease_id)
            if lease.state != LeaseState.SERVING:
                raise UnexpectedState(
                    lease_id, LeaseState.SERVING.value, lease.state.value, "placed"
                )
            old = list(lease.models)
            if sorted(old) == sorted(names):
                return lease, old
            lease.models = names
            session.add(
                LeaseEvent(
                    lease_id=lease_id,
                    from_state=LeaseState.SERVING,
                    to_state=LeaseState.SERVING,
                    at=now,
                    reason=f"{PLACE_PREFIX}{reason}",
                    detail=f"models={old!r} -> {names!r}",
                )
            )
        return lease, old

    # ---- reads --------------------------------------------------------------------

    def get(self, lease_id: int) -> Lease:
        """The lease, or `LeaseNotFound`."""
        with self._read() as session:
            lease = session.get(Lease, lease_id)
        if lease is None:
            raise LeaseNotFound(lease_id)
        return lease

    def open_leases(self) -> list[Lease]:
        """Every lease not yet returned, oldest first."""
        with self._read() as session:
            query = select(Lease).where(col(Lease.state) != LeaseState.RETURNED)
            return list(session.exec(query.order_by(col(Lease.id))).all())

    def touched_since(self, since: datetime) -> list[Lease]:
        """Every lease open at or after `since` (its last change is not earlier): the
        leases whose serving time the ledger may book for a window starting then."""
        with self._read() as session:
            query = select(Lease).where(col(Lease.updated_at) >= since)
            return list(session.exec(query.order_by(col(Lease.id))).all())

    def lends_since(self, since: datetime) -> list[tuple[Lease, datetime | None]]:
        """The leases touched at or after `since` (`touched_since`), each with when its
        return began (its first move to draining, or to releasing where it never served;
        a failed lease's release counts too; None: still serving or on its way): what a
        restarted daemon's lend memory replays."""
        leases = self.touched_since(since)
        ids = [lease.id for lease in leases]
        drained: dict[int, datetime] = {}
        with self._read() as session:
            for i in range(0, len(ids), 500):
                query = (
                    select(LeaseEvent)
                    .where(col(LeaseEvent.lease_id).in_(ids[i : i + 500]))
                    .where(col(LeaseEvent.to_state).in_(_LEAVING))
                )
                for event in session.exec(query.order_by(col(LeaseEvent.id))):
                    drained.setdefault(event.lease_id, event.at)
        return [(lease, drained.get(lease.id or 0)) for lease in leases]

    def by_node(self, node: str, *, open_only: bool = False) -> list[Lease]:
        """The node's leases, oldest first (its open one, if any, is last)."""
        with self._read() as session:
            query = select(Lease).where(Lease.node == node)
            if open_only:
                query = query.where(col(Lease.state) != LeaseState.RETURNED)
            return list(session.exec(query.order_by(col(Lease.id))).all())

    def by_request_key(self, request_key: str) -> Lease | None:
        """The lease `request_key` made (whatever its state now), or None: how an
        operator request taken again after a failover finds the lease it lent."""
        with self._read() as session:
            return session.exec(select(Lease).where(Lease.request_key == request_key)).first()

    def by_job(self, job_id: str) -> Lease | None:
        """The lease that holds Slurm job `job_id` (the newest one, should Slurm have
        reused the id), or None: how the reconciler spots tagged jobs with no lease."""
        with self._read() as session:
            query = select(Lease).where(Lease.slurm_job_id == job_id)
            return session.exec(query.order_by(col(Lease.id).desc())).first()

    def failures_since(self, since: datetime) -> list[tuple[Lease, LeaseEvent]]:
        """Every move into `failed` at or after `since`, with its lease, oldest first:
        what `stb status` shows as recent failures (the event's reason quotes the cause)."""
        with self._read() as session:
            query = (
                select(Lease, LeaseEvent)
                .where(LeaseEvent.lease_id == Lease.id)
                .where(LeaseEvent.to_state == LeaseState.FAILED)
                .where(col(LeaseEvent.at) >= since)
            )
            return [
                (lease, event) for lease, event in session.exec(query.order_by(col(LeaseEvent.id)))
            ]

    def placed_at(self, lease_id: int) -> datetime | None:
        """When the lease's latest placement was recorded (its latest `serving -> serving`
        event), or None: it was never placed."""
        with self._read() as session:
            query = (
                select(LeaseEvent)
                .where(LeaseEvent.lease_id == lease_id)
                .where(LeaseEvent.from_state == LeaseState.SERVING)
                .where(LeaseEvent.to_state == LeaseState.SERVING)
            )
            event = session.exec(query.order_by(col(LeaseEvent.id).desc())).first()
        return event.at if event is not None else None

    def history(self, lease_id: int) -> list[LeaseEvent]:
        """The lease's status changes in the order they happened, creation first."""
        with self._read() as session:
            query = select(LeaseEvent).where(LeaseEvent.lease_id == lease_id)
            return list(session.exec(query.order_by(col(LeaseEvent.id))).all())
