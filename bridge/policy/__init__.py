"""The policy: a pure `decide(snapshot, config, now) -> list[Action]`. No I/O, no clock,
no adapters (import-linter checks it); the reconciler builds the snapshot and carries out
the actions. See `decide.py`; the capacity model (`capacity.py`) and the rate forecast
(`forecast.py`) are shared with the simulator; `placement.py` re-purposes lent replicas
for the models found late (model placement, `Place`). `rollout.py`: a gradual model rollout's
step plan and verdict (its driver is `bridge.daemon.rollouts`). `snapshot.LeaseView` is
the one lease view, and `leasesync.py` the one per-state sync of a lease (its commands in
`steps.py`), which the daemon's planner, advisory mode's shadow book and the simulator
all call."""

from bridge.policy.actions import Action, Lend, Place, Return, StartBaseline
from bridge.policy.decide import Assessment, assess, decide
from bridge.policy.hysteresis import ModelStatus, evaluate_model, history_depth
from bridge.policy.snapshot import (
    JobView,
    LeaseView,
    ModelSample,
    NodeView,
    ReplicaView,
    Snapshot,
)

__all__ = [
    "Action",
    "Assessment",
    "JobView",
    "LeaseView",
    "Lend",
    "ModelSample",
    "ModelStatus",
    "NodeView",
    "Place",
    "ReplicaView",
    "Return",
    "Snapshot",
    "StartBaseline",
    "assess",
    "decide",
    "evaluate_model",
    "history_depth",
]
