"""Issue 33's batch-inference target on the lab: batch work on the reserved replica's spare
capacity off-peak, and the online load step still met as without it.

Each round, with the daemon's reconciler (`[batch]` on, `calm_s` short for the bench),
built afresh for each run:
0. Settle (`settle`, at most `--settle-s`): busy's online trickle on, passes until the
   daemon has measured busy's rate for `--warm-s`, no lease is open and no model's p99 is
   over `open_p99_ratio` x its SLO; it says how long it waited and for what. A daemon
   that has just started fits its rate trend (`bridge.policy.forecast`) over the
   trickle's first few samples and extrapolates their Poisson noise over a lend's lead
   time: without the warm-up it lent for the trickle in some rounds (the trickle's seed
   is the round's, so in both modes of that round), and the lease held the gate closed
   through the off-peak.
1. Off-peak, `--offpeak-s` seconds: busy's online trickle (4 req/s through nginx) and, in
   the `batch` mode only, a batch client on `/batch/v2/models/busy/infer` (`--batch-rps`,
   Poisson; a 429 waits out its Retry-After, capped at 1 s; in a process of its own).
   The reserved replica's busy share over the last two thirds of it: Triton's compute
   time of busy over the wall time (its `nv_inference_compute_infer_duration_us`
   delta), with the gate's state and its reason in each of those passes (`decide_gate`
   again on the pass's inputs) and the off-peak passes' events (lease moves, the gate's
   changes).
2. The lab's load step (`bridge.lab.showcase.Scenario`: busy at 70 req/s, the elastic
   node lent), the batch client still sending in the `batch` mode: how soon the lent
   replica serves and when the step's p99 is back under the SLO
   (`bridge.lab.stepfigures`), and the online requests lost.

Baseline in the same run: the `none` mode, the same with no batch client. The modes
alternate, `--rounds` each, `--pause-s` apart (75 s: Triton's p99 summary covers its last
60 s, and a step's slow answers in it would keep the next round's gate closed); odd
rounds run `batch` first. The step's figures are judged on their means over the rounds
(each is a whole number of 2 s passes or 5 s windows; the medians are printed too).
Beside the recovery (the first 5 s window back under the SLO) each run gives it to the
request: when the last request over the SLO before that window was sent (`drained`),
and the backlog queued when the lent replica began serving.

Target (issue 33): step-to-serving and p99 recovery within 10% of the run without batch
work, and the reserved replica's off-peak busy share at least 3x that without it.

Usage (lab up, root; under `flock /tmp/stb-lab.lock`):
    .venv/bin/python bench/batch_lab.py [--rounds 1] [--batch-rps 20] [--offpeak-s 45]
        [--warm-s 30] [--settle-s 180]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import signal
import statistics
import sys
import time
from multiprocessing.synchronize import Event as EventT
from typing import Any

import httpx

from bridge.config import BridgeConfig
from bridge.daemon.reconciler import Reconciler
from bridge.daemon.service import build, single_instance
from bridge.lab import lab as lab_mod
from bridge.lab.demo import lab_config
from bridge.lab.showcase import Load, Scenario
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir
from bridge.policy.batch import decide_gate
from bridge.triton.metrics import parse_page
from bridge.triton.ports import METRICS_PORT

BODY = {"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]}


def _send_batch(
    url: str,
    rate: float,
    seed: int,
    stop: EventT,
    ready: EventT,
    counts: Any,
) -> None:
    """The batch client's loop, in its own process (`BatchClient`)."""
    rng = random.Random(seed)
    with httpx.Client(timeout=10) as client:
        ready.set()
        due = time.monotonic()
        while not stop.is_set():
            due += rng.expovariate(rate)
            wait = due - time.monotonic()
            if wait > 0 and stop.wait(wait):
                break
            try:
                r = client.post(url, json=BODY)
            except httpx.HTTPError:
                counts[2] += 1
                continue
            if r.status_code == 200:
                counts[0] += 1
            elif r.status_code == 429:
                counts[1] += 1
                after = float(r.headers.get("Retry-After", "1") or 1)
                stop.wait(min(1.0, after))
                due = time.monotonic()
            else:
                counts[2] += 1


class BatchClient:
    """Poisson batch requests at `rate` on the batch route, each answered before the next
    is due or sent late; a 429 waits out its Retry-After (at most 1 s). In a process of
    its own, as a site's batch job is: in the bench's process it would share the GIL
    with the online senders and the daemon's passes whose latencies are measured."""

    def __init__(self, endpoint: str, rate: float, seed: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self._ready = ctx.Event()
        self._counts = ctx.Array("l", 3)  # ok, refused (429), failed
        url = f"http://{endpoint}/batch/v2/models/busy/infer"
        self._proc = ctx.Process(
            target=_send_batch,
            args=(url, rate, seed, self.stop, self._ready, self._counts),
            daemon=True,
        )

    def start(self) -> None:
        """Start the process and wait until it can send."""
        self._proc.start()
        if not self._ready.wait(30):
            raise RuntimeError("the batch client's process did not start")

    def join(self, timeout: float) -> None:
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()

    @property
    def ok(self) -> int:
        return int(self._counts[0])

    @property
    def refused(self) -> int:
        return int(self._counts[1])

    @property
    def failed(self) -> int:
        return int(self._counts[2])


def compute_us(addr: str) -> float | None:
    """busy's cumulative compute (infer) microseconds on the Triton at `addr`."""
    try:
        page = parse_page(httpx.get(f"http://{addr}:{METRICS_PORT}/metrics", timeout=2).text)
    except httpx.HTTPError:
        return None
    s = next((s for s in page.models.values() if s.model == "busy"), None)
    return (
        None
        if s is None or s.compute_infer_duration_us is None
        else float(s.compute_infer_duration_us)
    )


def gate_pass(rec: Reconciler, config: BridgeConfig) -> tuple[bool, str, list[str]]:
    """One reconciler pass: whether the batch gate is open after it, the gate's reason (what
    closed it or keeps it closed, "" when open: `decide_gate` again on the pass's own
    inputs, which it is pure in) and the pass's events (lease moves, gate changes)."""
    before = rec.batch_gate
    report = rec.run_once()
    snap, why = rec.last_snapshot, ""
    if snap is not None:
        why = decide_gate(before, snap, config, report.at.timestamp(), report.actions).reason
    return rec.batch_gate.open, why, report.lines()


def runs(reasons: list[str]) -> str:
    """The passes' reasons as runs of alike ones (numbers aside): `3x "calm for 2 s, ..."`."""
    out: list[tuple[str, str, int]] = []
    for why in reasons:
        key = re.sub(r"[0-9.]+", "#", why or "open")
        if out and out[-1][0] == key:
            out[-1] = (key, out[-1][1], out[-1][2] + 1)
        else:
            out.append((key, why or "open", 1))
    return ", ".join(f'{k}x "{first}"' for _, first, k in out)


def settle(
    rec: Reconciler, config: BridgeConfig, warm_s: float, limit_s: float
) -> tuple[float, str]:
    """Before an off-peak phase, busy's trickle already sending: passes until the daemon
    (built fresh for each run) has measured busy's rate for `warm_s`, no lease is open and
    every model's newest p99 is under `open_p99_ratio` x its SLO (Triton's 60 s window
    clear of the last step's answers); at most `limit_s`. Without the warm-up the policy's
    rate trend (`bridge.policy.forecast`) is fitted over the trickle's first few samples,
    whose Poisson noise it extrapolates over a lend's lead time: a lend for a trickle, its
    lease holding the gate closed through the off-peak. (Seconds waited, what for.)"""
    began, waited_for, last = time.monotonic(), list[str](), ""
    measured_since: float | None = None
    ratio = config.batch.open_p99_ratio
    while True:
        tick = time.monotonic()
        _, why, said = gate_pass(rec, config)
        for line in said:
            waited_for.append(f"{tick - began:.0f} s: {line}")
        snap = rec.last_snapshot
        history = snap.history if snap is not None else {}
        busy = history.get("busy", ())
        if busy and busy[-1].request_rate is not None:
            measured_since = tick if measured_since is None else measured_since
        else:
            measured_since = None
        waiting = [f"lease {x.id} {x.node} {x.state.value}" for x in rec.store.open_leases()]
        waiting += [
            f"{m} p99 {h[-1].p99_ms:.0f} ms"
            for m, h in sorted(history.items())
            if h
            and snap is not None
            and m in snap.models
            and h[-1].p99_ms is not None
            and h[-1].p99_ms > ratio * snap.models[m].slo_p99_ms
        ]
        if measured_since is None or tick - measured_since < warm_s:
            waiting.append(f"busy's rate measured for {warm_s:.0f} s")
        key = re.sub(r"[0-9.]+", "#", "; ".join(waiting))
        if waiting and key != last:  # each new thing waited for, once
            last = key
            waited_for.append(f"{tick - began:.0f} s: waits for {'; '.join(waiting)}")
        # on the passes' 2 s grid to the off-peak's first pass too: a pass right after
        # another measures the rate over a fraction of a second (a spike, and a lend)
        time.sleep(max(0.0, tick + 2.0 - time.monotonic()))
        if not waiting or time.monotonic() - began >= limit_s:
            break
    if waiting:
        waited_for.append(f"still {'; '.join(waiting)} after {limit_s:.0f} s (gate: {why})")
    return time.monotonic() - began, " | ".join(waited_for)


def one(spec: LabSpec, batch: bool, args: argparse.Namespace, n: int) -> dict[str, float]:
    base = lab_config(spec)
    config = base.model_copy(
        update={
            "batch": base.batch.model_copy(
                update={
                    "enabled": True,
                    "access_log": spec.lab_dir / "routing" / "batch-access.log",
                    "calm_s": args.calm_s,
                }
            )
        }
    )
    reserved = spec.pool_nodes("infer")[0].addr
    mode = "batch" if batch else "none"
    with single_instance(config.daemon.lock_file):
        bridge = build(config, slurm_env=spec.env())
        client: BatchClient | None = None
        try:
            rec, endpoint = bridge.reconciler, config.routing.listen
            slo_ms = rec.observer.models().scaled["busy"].slo_p99_ms
            # busy's trickle from here to the step; before the off-peak: the daemon's rate
            # history warmed up, the last round's lends returned and its step's answers out
            # of Triton's p99 window (else the gate stays closed through the off-peak)
            duration = args.settle_s + args.offpeak_s + 60
            trickle = Load(endpoint, rate=4, duration=duration, seed=20 + n)
            trickle.start()
            settled_s, settled_for = settle(rec, config, args.warm_s, args.settle_s)
            print(f"[{mode}] settled in {settled_s:.0f} s: {settled_for}", flush=True)
            if batch:
                client = BatchClient(endpoint, args.batch_rps, seed=30 + n)
                client.start()
            began = time.monotonic()
            share_from = began + args.offpeak_s / 3
            first: tuple[float, float] | None = None
            open_passes = passes = 0
            reasons: list[str] = []  # the gate's reason in each pass of the share's window
            events: list[str] = []  # the off-peak passes' events (lease moves, the gate)
            while time.monotonic() - began < args.offpeak_s:
                tick = time.monotonic()
                is_open, why, lines = gate_pass(rec, config)
                events += [f"{tick - began:.0f} s: {line}" for line in lines]
                if time.monotonic() >= share_from:
                    passes += 1
                    open_passes += int(is_open)
                    reasons.append(why)
                    if first is None and (us := compute_us(reserved)) is not None:
                        first = (time.monotonic(), us)
                time.sleep(max(0.0, tick + 2.0 - time.monotonic()))
            last = compute_us(reserved)
            print(
                f"[{mode}] off-peak gate per pass: {runs(reasons)}"
                f"{'; events: ' + ' | '.join(events) if events else ''}",
                flush=True,
            )
            assert first is not None and last is not None, "the reserved replica's metrics"
            share = (last - first[1]) / 1e6 / (time.monotonic() - first[0])
            trickle.stop_sending.set()
            res = Scenario(spec, rec, endpoint, say=lambda line: None).run()
        finally:
            if client is not None:
                client.stop.set()
                client.join(15)
            for job in bridge.reconciler.slurm.jobs(tag="stb:triton"):
                if "stb:baseline" not in job.tags:
                    bridge.reconciler.slurm.cancel(job.job_id)
            bridge.close()
    fig = res.step_figures(slo_ms)
    assert fig is not None and res.heavy is not None
    lost = sum(res.heavy.total.errors.values()) + res.heavy.total.dropped
    recovered = float("nan") if fig.recovered_s is None else fig.recovered_s
    drained = float("nan") if fig.drained_s is None else fig.drained_s
    said = ""
    if client is not None:
        said = f"  batch ok {client.ok} 429 {client.refused} failed {client.failed}"
    print(
        f"[{mode}] off-peak busy share {share:.3f} (gate open {open_passes}/{passes} passes)  "
        f"step: lend {fig.lend_s:.1f} s, serving {fig.serving_s:.1f} s, "
        f"p99 under SLO {fig.p99_under_slo_s:.0f} s, "
        f"recovered {recovered:.0f} s, online lost {lost}{said}  load {os.getloadavg()[0]:.2f}"
        f"\n[{mode}] step detail: last request over the SLO sent at {drained:.1f} s, "
        f"backlog at serving {fig.backlog}, answers/s one replica "
        f"{_rate(fig.one_replica_rate)} two {_rate(fig.two_replicas_rate)} "
        f"(arrivals {fig.arrival_rate:.1f}/s), worst p99 {fig.worst_p99_ms:.0f} ms, "
        f"sender lag p99 {fig.send_lag_p99_ms:.1f} ms",
        flush=True,
    )
    return {
        "share": share,
        "lend_s": fig.lend_s,
        "serving_s": fig.serving_s,
        "p99_under_slo_s": fig.p99_under_slo_s,
        "recovered_s": recovered,
        "drained_s": drained,
        "backlog": float(fig.backlog),
        "lost": float(lost),
        "batch_failed": float(client.failed if client else 0),
    }


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-rps", type=float, default=20.0)
    parser.add_argument("--offpeak-s", type=float, default=45.0)
    parser.add_argument("--calm-s", type=float, default=6.0)
    parser.add_argument("--pause-s", type=float, default=75.0, help="between rounds")
    parser.add_argument(
        "--warm-s", type=float, default=30.0, help="busy's rate measured before an off-peak"
    )
    parser.add_argument(
        "--settle-s", type=float, default=180.0, help="at most, before each off-peak"
    )
    args = parser.parse_args()
    # stopped with SIGTERM, unwind as on Ctrl-C: each run's `finally` cancels its Triton
    # jobs and closes its bridge, whose nginx would otherwise keep the routing port
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    rows: dict[str, list[dict[str, float]]] = {"none": [], "batch": []}
    for n in range(args.rounds):
        # the order alternates too: neither mode always follows the other's step
        for mode in ("none", "batch") if n % 2 == 0 else ("batch", "none"):
            rows[mode].append(one(spec, mode == "batch", args, n))
            # Triton's p99 summary covers its last 60 s: the step's slow answers would
            # hold the next round's gate closed (over close_p99_ratio) for its off-peak
            time.sleep(args.pause_s)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[mode])

    def mean(mode: str, key: str) -> float:
        return statistics.fmean(r[key] for r in rows[mode])

    # The step's figures are judged on their means over the rounds: each one is a whole
    # number of passes (serving, 2 s) or of p99 windows (5 s), so a median moves by a
    # whole pass or window (20-25% of the figure) and cannot resolve 10%; a mean over
    # the rounds can. The medians are printed beside them.
    share_x = med("batch", "share") / max(1e-9, med("none", "share"))
    serving_x = mean("batch", "serving_s") / max(1e-9, mean("none", "serving_s"))
    p99_x = mean("batch", "p99_under_slo_s") / max(1e-9, mean("none", "p99_under_slo_s"))
    # recovered: the backlog worked off (the first 5 s window back under the SLO after
    # the lent replica served); p99 under SLO: after the last window over it, which a
    # single slow window long after the recovery moves (`bridge.lab.stepfigures`)
    recovered_x = mean("batch", "recovered_s") / max(1e-9, mean("none", "recovered_s"))
    # the same to the request (the last one over the SLO before the recovery's window),
    # not a whole 5 s window: the finer figure of the backlog worked off
    drained_x = mean("batch", "drained_s") / max(1e-9, mean("none", "drained_s"))
    met = share_x >= 3 and serving_x <= 1.1 and p99_x <= 1.1
    lost = sum(r["lost"] for rs in rows.values() for r in rs)
    print(
        f"RESULT rounds={args.rounds} batch_rps={args.batch_rps:g} "
        f"share_none={med('none', 'share'):.3f} share_batch={med('batch', 'share'):.3f} "
        f"share_x={share_x:.2f} lend_none_s={mean('none', 'lend_s'):.1f} "
        f"lend_batch_s={mean('batch', 'lend_s'):.1f} "
        f"serving_none_s={mean('none', 'serving_s'):.1f} "
        f"serving_batch_s={mean('batch', 'serving_s'):.1f} serving_x={serving_x:.2f} "
        f"serving_median_none_s={med('none', 'serving_s'):.1f} "
        f"serving_median_batch_s={med('batch', 'serving_s'):.1f} "
        f"p99_under_slo_none_s={mean('none', 'p99_under_slo_s'):.1f} "
        f"p99_under_slo_batch_s={mean('batch', 'p99_under_slo_s'):.1f} p99_x={p99_x:.2f} "
        f"p99_median_none_s={med('none', 'p99_under_slo_s'):.0f} "
        f"p99_median_batch_s={med('batch', 'p99_under_slo_s'):.0f} "
        f"recovered_none_s={mean('none', 'recovered_s'):.1f} "
        f"recovered_batch_s={mean('batch', 'recovered_s'):.1f} "
        f"recovered_x={recovered_x:.2f} "
        f"drained_none_s={mean('none', 'drained_s'):.1f} "
        f"drained_batch_s={mean('batch', 'drained_s'):.1f} drained_x={drained_x:.2f} "
        f"backlog_none={mean('none', 'backlog'):.0f} "
        f"backlog_batch={mean('batch', 'backlog'):.0f} "
        f"online_lost={lost:.0f} target_met={'yes' if met else 'no'}"
    )


if __name__ == "__main__":
    main()
