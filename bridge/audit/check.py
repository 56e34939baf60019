"""`reconcile`: the audit trail held against the facts it records, in the same database.
Each privileged action the bridge writes down elsewhere must be in the trail once:

- each lease made: one `lend` (or `adopt`) entry naming it ("lease 7: ..."), written
  with the lease;
- each lease given back by a return (a move whose reason says `return:` or
  `abandoned:`): one `return` entry on it, written with that first move;
- each operator request (but a standby's `wake`): one `<kind>.request` entry ("request
  7"), written with the request; and once it is finished, one `request.done` entry;
- each pool hold: one `pool.drain` entry ("hold 3"), and once lifted one `pool.resume`
  entry ("hold 3 by ... lifted");
- each fleet switch: one `fleet.mode` entry ("switch 2");
- each gradual rollout: one `model.canary` entry ("rollout 3: ..."), and each of its
  moves one `rollout.*` entry ("rollout 3 running -> running step 2"), written with it.

And the other way: an entry naming a lease, request, hold or switch the database does not
hold. What a finding means is what a security review asks: an action written past the
bridge's own paths (straight into the database), recorded twice, or a record deleted; and
the chain's first broken link (`verify`). `stb audit check` prints the findings; the lab
tests run it on every bridge database a test used.

Facts older than the trail's first entry are not held against it (a database the trail
was added to). Token and model actions leave no other record in this database (the tokens
file, the model repository's journal) and are not reconciled here, but for a rollout's
start (`model.canary`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from bridge.leases.audit import AuditEntry, AuditStore
from bridge.leases.fleet import FleetSwitch
from bridge.leases.models import Lease, LeaseEvent
from bridge.leases.requests import OperatorRequest, PoolHold
from bridge.leases.rollouts import Rollout, RolloutEvent, move_words
from bridge.policy.leasesync import return_reasons

#: the reasons of a return's first move begin so (`return_reasons` of no reason)
RETURN_MOVES = return_reasons("")
_LEASE = re.compile(r"lease (\d+)[: ]")
_REQUEST = re.compile(r"request (\d+)[: ]")
_HOLD = re.compile(r"hold (\d+)[: ]")
_LIFTED = re.compile(r"hold (\d+) by .* lifted")
_SWITCH = re.compile(r"switch (\d+)[: ]")
_ROLLOUT = re.compile(r"rollout (\d+)[: ]")
#: a rollout move's words, as `RolloutStore.move` tells its entry
_MOVE = re.compile(r"(rollout \d+ \w+ -> \w+(?: step \d+)?)(?::|$)")
#: the actions a rollout's moves are recorded as
ROLLOUT_ACTIONS = (
    "rollout.step",
    "rollout.promote",
    "rollout.rollback",
    "rollout.end",
    "rollout.stop",
)
#: what a fact is known by: an id, or a rollout move's words
K = TypeVar("K", int, str)


@dataclass
class Reconciliation:
    """What `reconcile` found: one line per finding, and what it held against the trail."""

    findings: list[str] = field(default_factory=list)
    #: per kind of fact, how many were reconciled ("leases": 4, "requests": 2, ...)
    checked: Counter[str] = field(default_factory=Counter)
    #: the trail's entries read
    entries: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings


def _ids(texts: Iterable[str], pattern: re.Pattern[str]) -> Counter[int]:
    """How often each id `pattern` reads at the start of `texts`."""
    found: Counter[int] = Counter()
    for t in texts:
        m = pattern.match(t + " ")
        if m is not None:
            found[int(m.group(1))] += 1
    return found


def _compare(
    out: Reconciliation,
    what: str,
    action: str,
    expected: Iterable[K],
    recorded: Counter[K],
    since: datetime,
    born: Mapping[K, datetime],
) -> None:
    """Each id of `expected` recorded once by `action`; each recorded id expected."""
    want = set(expected)
    for i in sorted(want | set(recorded), key=str):
        n = recorded.get(i, 0)
        if i in want and n != 1:
            out.findings.append(
                f"{what} {i}: {n} {action} entries, not 1"
                + (" (written past the bridge, straight into the database?)" if n == 0 else "")
            )
        elif i not in want and n and born.get(i, since) >= since:
            gone = "" if i in born else ", which the database does not hold"
            out.findings.append(f"{what} {i}: {n} {action} entries for no such action{gone}")
    out.checked[f"{what}s"] += len(want)


def reconcile(engine: Engine) -> Reconciliation:
    """The trail of `engine`'s bridge database against its leases, requests, holds and
    fleet switches (see the module's doc)."""
    store = AuditStore(engine)
    out = Reconciliation()
    verdict = store.verify()
    if verdict.broken is not None:
        out.findings.append(f"the chain is broken at {verdict.broken.line()}")
    entries = list(store.walk())
    out.entries = len(entries)
    # an empty trail holds everything against it: nothing was recorded at all
    since = _naive(entries[0].at) if entries else datetime.min
    by: dict[str, list[AuditEntry]] = {}
    for e in entries:
        # a request's outcome is recorded whatever it was; the other facts only when done
        if e.outcome == "ok" or e.action == "request.done":
            by.setdefault(e.action, []).append(e)

    def ids(action: str, pattern: re.Pattern[str], where: str = "detail") -> Counter[int]:
        return _ids((getattr(e, where) for e in by.get(action, [])), pattern)

    with Session(engine) as session:
        leases = {x.id: x.created_at for x in session.exec(select(Lease)) if x.id is not None}
        returned = {
            ev.lease_id
            for ev in session.exec(select(LeaseEvent))
            if ev.reason.startswith(RETURN_MOVES)
        }
        requests = [
            r
            for r in session.exec(select(OperatorRequest))
            if r.id is not None and r.kind != "wake"
        ]
        holds = list(session.exec(select(PoolHold).order_by(col(PoolHold.id))))
        switches = list(session.exec(select(FleetSwitch).order_by(col(FleetSwitch.id))))
        rollouts = list(session.exec(select(Rollout)))
        rollout_events = list(session.exec(select(RolloutEvent)))

    born = {i: _naive(at) for i, at in leases.items()}
    mine = {i for i, at in born.items() if at >= since}
    _compare(out, "lease", "lend", mine, ids("lend", _LEASE) + ids("adopt", _LEASE), since, born)
    back = ids("return", _LEASE, "target")
    _compare(out, "returned lease", "return", mine & returned, back, since, born)

    asked = {r.id: _naive(r.created_at) for r in requests if r.id is not None}
    new = {i for i, at in asked.items() if at >= since}
    for kind in ("lend", "return", "place"):
        of_kind = {r.id or 0 for r in requests if r.kind == kind} & new
        action = f"{kind}.request"
        _compare(out, f"{kind} request", action, of_kind, ids(action, _REQUEST), since, asked)
    done = {r.id or 0 for r in requests if r.done_at is not None} & new
    finished = ids("request.done", _REQUEST, "target")
    _compare(out, "finished request", "request.done", done, finished, since, asked)

    held = {h.id: _naive(h.held_at) for h in holds if h.id is not None}
    new = {i for i, at in held.items() if at >= since}
    _compare(out, "pool hold", "pool.drain", new, ids("pool.drain", _HOLD), since, held)
    lifted = {h.id or 0 for h in holds if h.released_at is not None} & new
    _compare(out, "lifted hold", "pool.resume", lifted, ids("pool.resume", _LIFTED), since, held)

    started = {r.id: _naive(r.created_at) for r in rollouts if r.id is not None}
    new = {i for i, at in started.items() if at >= since}
    _compare(out, "rollout", "model.canary", new, ids("model.canary", _ROLLOUT), since, started)
    moves = {
        move_words(e.rollout_id, e.from_state, e.to_state, e.step): _naive(e.at)
        for e in rollout_events
        if e.from_state and e.rollout_id in started
    }
    moved: Counter[str] = Counter()
    for action in ROLLOUT_ACTIONS:
        for e in by.get(action, []):
            m = _MOVE.match(e.detail)
            if m is not None:
                moved[m.group(1)] += 1
    new_moves = {k for k, at in moves.items() if at >= since}
    _compare(out, "rollout move", "rollout.*", new_moves, moved, since, moves)

    switched = {s.id: _naive(s.at) for s in switches if s.id is not None}
    new = {i for i, at in switched.items() if at >= since}
    _compare(out, "fleet switch", "fleet.mode", new, ids("fleet.mode", _SWITCH), since, switched)
    return out


def _naive(at: datetime) -> datetime:
    """`at` (UTC, aware or not as the database hands it back) as a naive UTC time."""
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo is not None else at


__all__ = ["RETURN_MOVES", "Reconciliation", "reconcile"]
