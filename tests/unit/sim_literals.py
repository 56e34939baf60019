"""Literal simulator results for the selection report's tests (not a test module)."""

from __future__ import annotations

from bridge.sim.result import ModelOutcome, PolicyResult, QueueOutcome


def policy_result(
    policy: str,
    pools: dict[str, int],
    *,
    within: float = 0.995,
    minutes: tuple[int, int] = (100, 99),
    replicas: list[float] | None = None,
    gpu_hours: dict[str, dict[str, float]] | None = None,
    waits: tuple[float, float] = (60.0, 600.0),
    lends: int = 0,
    preemptions: int = 0,
    lost: float = 0.0,
    used: float = 10.0,
) -> PolicyResult:
    """A literal result: one model of 10,000 requests, 10 training and 30 elastic jobs."""
    model = ModelOutcome(100.0, 10_000.0, 10_000.0 * within, *minutes)
    training = QueueOutcome(10, 10, 8, waits[0], 2 * waits[0], 7200.0, 7000.0, 50.0)
    elastic = QueueOutcome(30, 30, 27, waits[1], 3 * waits[1], 1800.0, 3600.0, 20.0)
    return PolicyResult(
        policy=policy,
        description=f"the {policy} set-up",
        pools=pools,
        models={"m0": model},
        gpu_hours=gpu_hours or {"inference": {"inference": 24.0, "idle": 0.0}},
        queues={"training": training, "elastic": elastic},
        inference_used_gpu_hours=used,
        preemptions=preemptions,
        gpu_hours_lost=lost,
        lends=lends,
        returns=lends,
        series={"replicas": replicas if replicas is not None else [float(pools["inference"])]},
    )
