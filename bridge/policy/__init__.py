"""The policy: a pure `decide(snapshot, config, now) -> list[Action]`. No I/O, no clock,
no adapters (import-linter checks it); the reconciler builds the snapshot and carries out
the actions. See `decide.py`."""

from bridge.policy.actions import Action, Lend, Return, StartBaseline
from bridge.policy.decide import ModelStatus, decide, evaluate_model
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
    "JobView",
    "LeaseView",
    "Lend",
    "ModelSample",
    "ModelStatus",
    "NodeView",
    "ReplicaView",
    "Return",
    "Snapshot",
    "StartBaseline",
    "decide",
    "evaluate_model",
]
