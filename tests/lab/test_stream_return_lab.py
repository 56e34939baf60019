"""A return during open token streams cuts none, on the lab: the LLM (smol) serves on the
reserved node's baseline (loaded there by Triton's explicit model control: a baseline
leaves it out) and, lent, on the elastic node; three curl clients keep streams open
through the bridge's nginx (`bridge.lab.streams`: a plain HTTP client reading the
events, not the project's load generator) while the daemon's pass lends the node for smol
and returns it. Every stream that began must end whole (its last event has the model's
finish reason and the response closed properly), and some of them ran on the lent
replica while it drained, or the test proved nothing. One cycle (about a minute);
bench/stream_returns.py runs ten.
"""

from __future__ import annotations

import time

import pytest

from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.lab.streams import StreamLoad, cycle, tick
from bridge.triton.client import TritonHttpClient

from .helpers import tick_until_baseline

pytestmark = pytest.mark.lab

MODEL = "smol"


def test_a_return_during_open_streams_cuts_none(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    obs = rec.last_observation
    assert obs is not None
    reserved = lab.pool_nodes("infer")[0].name
    (base,) = [s for s in obs.servers if s.ready and s.node == reserved]
    with TritonHttpClient(base.address, api_key=triton.api_key(lab)) as client:
        client.load_model(MODEL)
    tick(rec, lambda: bool(rec.last_observation and _routed(rec, base.address)), 60, log)
    load = StreamLoad(endpoint, MODEL, clients=3).start()
    try:
        done = cycle(rec, lab, MODEL, load, hold_s=4.0, log=log)
        time.sleep(1.0)  # streams begun just before the return's end, through to the end
    finally:
        results = load.stop()
    lent = done.address
    broken = [r for r in results if r.broken]
    refused = [r for r in results if r.refused]
    on_lent = [r for r in results if r.upstream == lent]
    # streams on the lent replica still open when the return was asked
    open_at_return = [r for r in on_lent if r.started < done.asked_at < r.ended]
    print(
        f"\n{len(results)} streams ({len(on_lent)} on the lent replica {lent}, "
        f"{len(open_at_return)} open there at the return), "
        f"{len(broken)} broken, {len(refused)} refused; return {done.returned_s:.1f} s "
        f"(draining {done.draining_s:.1f} s)"
    )
    assert not broken, [(r.upstream, r.events, r.finish_reason, r.curl_rc, r.error) for r in broken]
    assert not refused, [(r.status, r.error) for r in refused]
    assert open_at_return, "no stream was open on the lent replica when it was returned"
    assert all(r.events >= 2 for r in results)


def _routed(rec: Reconciler, address: str) -> bool:
    obs = rec.last_observation
    return obs is not None and any(
        s.address == address and MODEL in s.models for s in obs.servers if s.ready
    )
