"""Model placement on the lab (`stb place`: an operator request the reconciler's pass
carries out, `bridge.daemon.placer`): a node lent for `busy` is given `echo` in its
place under a steady load of both through the lab's nginx; `echo` is loaded on the lent
server and routed there, `busy` leaves that server's routes before it is unloaded, and
no request of either fails across the move."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from bridge.audit.asks import ask_place
from bridge.daemon.reconciler import Reconciler
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import poisson

from .helpers import RecordingRouter, Sender, lend_serving, tick_until_placed, upstreams

pytestmark = pytest.mark.lab

RATE = 12.0  # requests/s of each model: a steady load the baseline alone carries too


class RecordingTriton:
    """A Triton client whose unloads are kept with when they were asked."""

    def __init__(self, client: Any, unloads: list[tuple[float, str, str]]) -> None:
        self._client = client
        self._unloads = unloads

    def unload_model(self, name: str) -> None:
        self._unloads.append((time.monotonic(), self._client.address, name))
        self._client.unload_model(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_lent_replica_is_placed_from_busy_to_echo_with_no_failed_request(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    # the operator's placement alone: the policy neither places nor returns the lease
    policy = rec.config.policy.model_copy(update={"placement": False, "scale_in_cooldown_s": 3600})
    rec.config = rec.config.model_copy(update={"policy": policy})
    queue, store, act = rec.requests, rec.store, rec.actuator
    router = RecordingRouter(act.router)
    act.router = router
    unloads: list[tuple[float, str, str]] = []
    triton_for = act.triton_for
    act.triton_for = lambda address: RecordingTriton(triton_for(address), unloads)
    elastic = lab.pool_nodes("elastic")[0].name
    log: list[str] = []
    lease, address = lend_serving(rec, lab, ["busy"], log)
    routes = router.routes
    assert address in routes("busy") and address not in routes("echo")
    busy = Sender(endpoint, poisson(RATE, 25.0, seed=31), "busy")
    echo = Sender(endpoint, poisson(RATE, 25.0, seed=32), "echo")
    echo.config = replace(echo.config, shape=(1, 16))
    busy.start()
    echo.start()
    try:
        time.sleep(3)  # both models under load on their replicas before the move
        request = ask_place(queue, lease.id, ["echo"])
        placed_at = time.monotonic()

        tick_until_placed(rec, lease.slurm_job_id, address, routes, "echo", "busy", log)
        busy.finish()
        echo.finish()
    finally:
        busy.stop()
        echo.stop()
    done = queue.get(request.id or 0)
    assert done is not None and done.outcome == f"lease {lease.id} placing echo on {elastic}"
    assert store.get(lease.id).models == ["echo"]
    assert store.get(lease.id).state == LeaseState.SERVING
    last = store.history(lease.id)[-1]
    assert (last.from_state, last.to_state) == (LeaseState.SERVING, LeaseState.SERVING)
    assert last.reason.startswith("place: operator request") and "['busy'] -> ['echo']" in (
        last.detail or ""
    )
    # busy left the lent server's routes before it was unloaded there, and never came back
    (unloaded_at,) = [t for t, at, m in unloads if at == address and m == "busy"]
    after = [(t, table) for t, table in router.tables if t >= placed_at]
    out = [t for t, table in after if address not in dict(table.routes).get("busy", ())]
    assert out and out[0] < unloaded_at, "\n".join(log)
    assert all(
        address not in dict(table.routes).get("busy", ()) for t, table in after if t >= out[0]
    )
    # echo is served by the lent replica too
    seen = upstreams(
        endpoint,
        "echo",
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
    )
    assert address in seen, seen
    for sender in (busy, echo):
        c = sender.counters
        assert c.sent > 60 and c.ok == c.sent and c.errors == 0 and c.dropped == 0, (
            sender.config.model,
            c,
            "\n".join(log),
        )
