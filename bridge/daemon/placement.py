"""Model placement, the pure part: what a serving lease's replica needs so that it holds
the models its lease lists (`bridge.policy.Place`, `stb place`). Pure: no I/O, no clock
(`now` is the observation's time, epoch seconds); carried out by `bridge.daemon.placer`.

A placement is recorded first (`LeaseStore.place`: the lease's models become the new set),
then made true from what the store and Triton say, pass after pass, so a crash anywhere in
between is finished by the next pass:

- `withheld`: the (Triton job, model) pairs routing must not publish: a model a serving
  lease's server holds READY that its lease no longer lists leaves routing at once, on
  every publish (the leader's, a standby's, a rollout's), whatever the pass remembers;
- `plan_placement`: per lease, the models to load (listed, not READY on its server) and
  the dropped ones to unload: out of routing since an earlier pass's publish, then, as a
  return's drain (`bridge.policy.leasesync`, `draining`), none of their requests in
  flight on that server, or `drain_timeout_s` passed since they left routing;
- `asks`: which of the models to load are asked of Triton and which it loads already (a
  load asked by a process that died: waited for, never asked twice);
- `judge_load`: what became of one load under way (asked, then polled pass after pass:
  `bridge.daemon.placer` runs the ask off the pass);
- `check_place`: an operator's or the policy's placement, validated.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from bridge.lifecycle import LeaseState
from bridge.policy.leasesync import SeenServer
from bridge.policy.snapshot import LeaseView

S = LeaseState


@dataclass(frozen=True)
class PlacementPlan:
    """What one lease's replica needs this pass."""

    lease_id: int
    address: str
    #: listed by the lease, not READY on its server: load them
    load: tuple[str, ...] = ()
    #: held READY, no longer listed, out of routing and drained: unload them
    unload: tuple[str, ...] = ()
    #: held READY, no longer listed, still waiting (routing, or requests in flight)
    waiting: tuple[str, ...] = ()
    #: why the unloads may go ("no request in flight", "drain timeout, 2 pending")
    why: str = ""


def dropped(lease: LeaseView, server_models: Iterable[str]) -> tuple[str, ...]:
    """The models a lease's server holds that its lease no longer lists. None for a lease
    whose models were never recorded (an adopted job's lease lists none): nothing of it
    is taken away."""
    if not lease.models:
        return ()
    listed = set(lease.models)
    return tuple(sorted(m for m in server_models if m not in listed))


def gained(lease: LeaseView, server_models: Iterable[str]) -> tuple[str, ...]:
    """The models a lease lists that its server does not hold READY, in its order."""
    held = set(server_models)
    return tuple(m for m in lease.models if m not in held)


def withheld(
    leases: Iterable[LeaseView], server_models: Mapping[str, Sequence[str]]
) -> frozenset[tuple[str, str]]:
    """The (Triton job id, model) pairs routing leaves out: each model a lease's server
    holds READY (`server_models` by job id) that its lease no longer lists."""
    pairs: set[tuple[str, str]] = set()
    for lease in leases:
        job = lease.slurm_job_id
        if job is None or job not in server_models:
            continue
        pairs.update((job, m) for m in dropped(lease, server_models[job]))
    return frozenset(pairs)


def plan_placement(
    lease: LeaseView,
    server: SeenServer | None,
    out_since: Mapping[str, float],
    now: float,
    drain_timeout_s: float,
    *,
    placed: bool = True,
) -> PlacementPlan | None:
    """What a serving lease's replica needs so that it holds its lease's models; None when
    it holds them (or it is not serving, or its server does not answer ready).

    `out_since`: per dropped model, the observation time of the pass whose publish first
    left it out of this server's routes (`Actuator.withheld_since`; absent: not yet
    published). A dropped model is unloaded once an observation taken after that publish
    shows none of its requests in flight on the server, or `drain_timeout_s` after it.
    `placed`: the lease has a placement on record (`LeaseStore.placed_at`); a server that
    holds models its lease never gave it (not ours) is left as it is."""
    if lease.state != S.SERVING or server is None or not server.ready:
        return None
    load = gained(lease, server.models)
    drop = dropped(lease, server.models)
    if not load and not drop:
        return None
    if not placed:
        return None
    unload, waiting, why = [], [], []
    for m in drop:
        since = out_since.get(m)
        if since is None or now <= since:  # not yet out of routing as of an observation
            waiting.append(m)
            continue
        pending = server.pending.get(m, 0.0)
        if pending > 0 and now - since < drain_timeout_s:
            waiting.append(m)
            continue
        unload.append(m)
        why.append(
            f"{m}: no request in flight"
            if pending == 0
            else f"{m}: drain timeout, {pending:g} pending"
        )
    return PlacementPlan(
        lease.id, server.address, load, tuple(unload), tuple(waiting), "; ".join(why)
    )


def asks(
    load: Sequence[str], under_way: Collection[str], states: Mapping[str, str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Of a plan's models to load (`PlacementPlan.load`), those none is under way for:
    (to ask Triton to load, to wait for as Triton loads them already). `states`: Triton's
    state of each model on the server (its repository index). A model LOADING there was
    asked by a process that died (or before a restart): asking again would start a second
    load of it beside the first, and hold Triton's other model calls until both end."""
    todo = [m for m in load if m not in under_way]
    return (
        tuple(m for m in todo if states.get(m) != "LOADING"),
        tuple(m for m in todo if states.get(m) == "LOADING"),
    )


class Verdict(StrEnum):
    """What a pass makes of one load under way (`judge_load`)."""

    LOADING = "loading"  # under way: wait (the pass goes on)
    LOADED = "loaded"  # done: its time recorded; routing publishes it once seen READY
    REFUSED = "refused"  # Triton said no: the placement is undone
    RETRY = "retry"  # no answer and Triton not loading it: asked again after the backoff
    TIMED_OUT = "timed out"  # still loading past the bound: undone as a refusal
    WAIT = "wait"  # refused or timed out, its server not seen ready: undone on a later pass


@dataclass(frozen=True)
class Load:
    """One load under way on a lease's server, as a pass sees it. Times are the placer's
    clock, seconds."""

    model: str
    #: when it was asked (or, `asked` False, first found loading)
    asked_at: float
    #: this process asked it; False: Triton was found loading it (a dead process's ask):
    #: its load time is not known
    asked: bool = True
    #: the ask's call has not answered yet
    running: bool = True
    #: once answered: "loaded", "refused" (Triton said no) or "unanswered" (no answer: the
    #: client's timeout, the server gone)
    answer: str = ""
    #: when the call began and when it answered (the load time: one from the other)
    began_at: float | None = None
    answered_at: float | None = None
    #: the refusal's or the missing answer's words
    message: str = ""


@dataclass(frozen=True)
class LoadOutcome:
    verdict: Verdict
    #: LOADED: seconds from the ask to its completion (None: not known); else seconds since
    #: it was asked
    seconds: float | None
    #: REFUSED, RETRY, TIMED_OUT: why
    why: str = ""


def judge_load(
    load: Load, state: str | None, now: float, timeout_s: float, *, server_ready: bool = True
) -> LoadOutcome:
    """What became of `load` at `now`. `state`: Triton's state of the model on its server
    (READY, LOADING, UNAVAILABLE, ...; "" when its index does not list it as either; None:
    not known, the index unread). An answer is taken as given; without one (the call
    still running, no answer came, or found loading) Triton's state says: READY is done,
    LOADING goes on, UNAVAILABLE is a refusal, anything else means the ask was lost and is
    retried. A load still running `timeout_s` after its ask is given up and undone as a
    refusal would be. An undo waits for an observation of the server ready
    (`server_ready`: the models it still holds known)."""
    since = now - load.asked_at
    began = load.began_at if load.began_at is not None else load.asked_at
    if load.answer == "loaded":
        done = load.answered_at if load.answered_at is not None else now
        return LoadOutcome(Verdict.LOADED, max(0.0, done - began) if load.asked else None)
    if load.answer == "refused":
        return _undo(Verdict.REFUSED, since, load.message, server_ready)
    if not load.running:  # no answer came, or a dead process's ask: Triton's state says
        if state == "READY":
            return LoadOutcome(Verdict.LOADED, max(0.0, now - began) if load.asked else None)
        if state == "UNAVAILABLE":
            return _undo(Verdict.REFUSED, since, load.message or "UNAVAILABLE", server_ready)
        if state not in ("LOADING", None):
            return LoadOutcome(Verdict.RETRY, since, load.message or "not loading")
    if since > timeout_s:
        why = f"still loading {since:.0f}s after it was asked (model_load_timeout_s {timeout_s:g})"
        return _undo(Verdict.TIMED_OUT, since, why, server_ready)
    return LoadOutcome(Verdict.LOADING, since)


def _undo(verdict: Verdict, since: float, why: str, server_ready: bool) -> LoadOutcome:
    return LoadOutcome(verdict if server_ready else Verdict.WAIT, since, why)


def check_place(
    lease: LeaseView | None, lease_id: int, models: Sequence[str], known: Iterable[str]
) -> str | None:
    """A placement, validated: None when it may go, else the refusal's text."""
    if lease is None:
        return f"refused: no lease with id {lease_id}"
    if not models:
        return "refused: a placement needs at least one model"
    if len(set(models)) != len(models):
        return f"refused: a model is named twice in {','.join(models)}"
    unknown = sorted(set(models) - set(known))
    if unknown:
        return f"refused: unknown models {', '.join(unknown)}"
    if lease.state != S.SERVING:
        return f"refused: lease {lease_id} is {lease.state.value}, not serving"
    return None


def change(old: Sequence[str], new: Sequence[str]) -> str:
    """A placement's change in a line: "+b -a" (the models gained, then those dropped)."""
    plus = [f"+{m}" for m in new if m not in old]
    minus = [f"-{m}" for m in old if m not in new]
    return " ".join(plus + minus) or "no change"


__all__ = [
    "Load",
    "LoadOutcome",
    "PlacementPlan",
    "Verdict",
    "asks",
    "change",
    "check_place",
    "dropped",
    "gained",
    "judge_load",
    "plan_placement",
    "withheld",
]
