"""Model placement (a frozen model layout thawed): re-purposing a serving lease's
replica for the models the capacity model finds late, before a node is lent for them.
Pure; `bridge.policy.decide.assess` calls it on its lend path.

Without it a lent replica keeps the models it was lent for: on a bursty multi-model day
every lendable node goes to the models that breached first, and a model whose demand grows
later finds no room. With it, when models are late (`capacity.over` at the lend's demand),
each serving lease past `scale_in_cooldown_s` is looked at, in turn:

- its replica is taken off the count, and the models `capacity.plan_nodes` would put on a
  new node of its GPUs are planned for it instead (the late models with room);
- the place is made (`Place`) when it gains a model and every model it does not gain
  (the ones it drops above all) is still carried, by `capacity.predict`, at the return's
  demand `keep` (return_headroom x the highest rate of the model's return dwell, longer
  for a model that was lent again too soon, and the forecast): the return's own test,
  so its dwell and peak protection hold. A model with traffic whose last replica this
  is never loses it (its predicted p99 is infinite), however slow its requests;
- one fewer node is then lent: `plan_nodes` plans the rest on the count with the placed
  replica holding its new models.

A lease this tick's return would give back is looked at first: it is placed instead of
returned (its node stays lent; the lend it spares would preempt another). Then the other
serving leases, those whose models are all calm first, the longest serving first.

Cost: a place costs its gained models' load (the lead minus Slurm's and Triton's start);
a lend costs a preemption, Slurm's and Triton's start, and the same load. So a place that
passes the test above is always the cheaper, and is preferred; the test is what keeps it
from being dearer later (a model dropped then lent again).

A lease mid-placement (`in_placement`: its replica holds other models than the lease, as
the daemon's observation or the simulator shows it while the gained models load) is
neither placed again nor returned, and counts as a replica of the lease's models (like a
lend in flight) so the models it gains are not lent for again while they load.
`policy.placement = false` turns the rule off (the bench's before)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bridge.lifecycle import LeaseState
from bridge.policy import capacity
from bridge.policy.actions import Place
from bridge.policy.snapshot import LeaseView, Snapshot

#: replicas counted by (model set, GPUs), as `bridge.policy.decide` counts them
Count = Counter[tuple[tuple[str, ...], int]]
Key = tuple[tuple[str, ...], int]


def in_placement(snapshot: Snapshot) -> dict[int, tuple[str, ...]]:
    """The serving leases whose replica holds other models than the lease's (a placement
    under way): lease id -> the lease's models."""
    serving = {
        lease.lease_id: lease.models
        for lease in snapshot.leases
        if lease.state == LeaseState.SERVING
    }
    if not serving:
        return {}
    out: dict[int, tuple[str, ...]] = {}
    for replica in snapshot.replicas:
        lease_id = replica.lease_id
        if lease_id is None:
            continue
        models = serving.get(lease_id)
        if models is not None and set(models) != set(replica.models):
            out[lease_id] = models
    return out


@dataclass(frozen=True)
class Candidate:
    """A serving lease that may be placed: its replica's key in the count, and whether this
    tick's return gives it back (its key is then already off the count)."""

    lease: LeaseView
    key: Key
    returning: bool = False


def candidates(
    settled: Sequence[LeaseView],
    returning: Sequence[int],
    replica_of: Mapping[int, Key],
    all_calm: Callable[[Sequence[str]], bool],
) -> list[Candidate]:
    """The leases `place` looks at, in order: this tick's returns (`returning`, in their
    order), then the other `settled` leases (serving, past their cooldown, not
    mid-placement), those whose models are all calm first, the longest serving first; each
    with a replica (`replica_of`: lease id -> its replica's key)."""
    by_id = {lease.lease_id: lease for lease in settled}
    out = [Candidate(by_id[i], replica_of[i], True) for i in returning if i in replica_of]
    back = set(returning)
    rest = sorted(
        (x for x in settled if x.lease_id not in back and x.lease_id in replica_of),
        key=lambda x: (not all_calm(x.models), x.serving_since or 0.0, x.lease_id),
    )
    out.extend(Candidate(x, replica_of[x.lease_id]) for x in rest)
    return out


def place(
    count: Count,
    candidates: Sequence[Candidate],
    demand: Mapping[str, capacity.Demand],
    keep: Callable[[], Mapping[str, capacity.Demand]],
    room: Callable[[str, int], bool],
    cv2: float,
    model_set: Callable[[tuple[str, ...]], tuple[str, ...]],
) -> list[Place]:
    """The places to make, in order (see the module docstring). `count` is the replicas by
    key (ready, less this tick's returns, and the lends in flight) and is updated with each
    place made (the old key off, the planned models on; a returning lease's key is off
    already); `demand` the lend's, `keep()` the return's (called only when a place is
    tested against it: the caller may read it then, as it reads every model's samples)."""
    places: list[Place] = []
    # a key whose place failed on `count` as it is now: another lease of it fails too
    # (forgotten when a place changes `count`)
    failed: set[Key] = set()
    late = capacity.over(_groups(count), demand, cv2)
    for c in candidates:
        if not late:
            break
        if not c.returning and c.key in failed:
            continue
        if not c.returning:
            count[c.key] -= 1
        without = _groups(count)
        planned = capacity.plan_nodes(without, demand, [c.key[1]], room, cv2)
        models = model_set(planned[0]) if planned else ()
        gains = set(models) - set(c.key[0])
        if not gains or not (c.returning or _keeps(without, models, c.key, keep(), late, cv2)):
            if not c.returning:
                count[c.key] += 1
                failed.add(c.key)
            continue
        failed.clear()
        count[models, c.key[1]] += 1
        places.append(Place(c.lease.lease_id, models, _reason(c.key[0], models, demand)))
        late = capacity.over(_groups(count), demand, cv2)
    return places


def _keeps(
    without: list[capacity.Group],
    models: tuple[str, ...],
    key: Key,
    keep: Mapping[str, capacity.Demand],
    late: Sequence[str],
    cv2: float,
) -> bool:
    """Whether, with the replica of `key` holding `models` instead, every model it does
    not gain is carried at the return's demand `keep` (the models late at the lend's
    demand that it keeps aside: the lend path is already at them). A dropped model that
    cannot be sized (no service time yet) is kept where it is."""
    dropped = [m for m in key[0] if m not in models]
    if any(m not in keep for m in dropped):
        return False
    after = [*without, capacity.Group(models, 1, key[1])]
    replicas = capacity.replicas_of(after)
    # a model with traffic keeps a replica even when it cannot meet its objective anyway
    if any(keep[m].rate > 0 and not replicas.get(m) for m in dropped):
        return False
    p99 = capacity.predict(after, keep, cv2)
    skip = (set(models) | set(late)) - set(dropped)
    return not any(
        d.rate > 0 and d.feasible and p99[m] > d.slo_s for m, d in keep.items() if m not in skip
    )


def _groups(count: Count) -> list[capacity.Group]:
    return [capacity.Group(models, n, gpus) for (models, gpus), n in count.items() if n > 0]


def _reason(
    old: tuple[str, ...], new: tuple[str, ...], demand: Mapping[str, capacity.Demand]
) -> str:
    gained = [m for m in new if m not in old]
    rates = ", ".join(f"{m} {demand[m].rate:.0f} req/s" for m in gained if m in demand)
    dropped = [m for m in old if m not in new]
    off = f" in place of {','.join(dropped)}" if dropped else ""
    return f"placement: {rates}{off}"
