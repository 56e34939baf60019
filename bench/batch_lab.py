"""Issue 33's batch-inference target on the lab: batch work on the reserved replica's spare
capacity off-peak, and the online load step still met as without it.

Each round, with the daemon's reconciler (`[batch]` on, `calm_s` short for the bench):
1. Off-peak, `--offpeak-s` seconds: busy's online trickle (4 req/s through nginx) and, in
   the `batch` mode only, a batch client on `/batch/v2/models/busy/infer` (`--batch-rps`,
   Poisson; a 429 waits out its Retry-After, capped at 1 s). The reserved replica's busy
   share over the last two thirds of it: Triton's compute time of busy over the wall
   time (its `nv_inference_compute_infer_duration_us` delta), with the gate's state.
2. The lab's load step (`bridge.lab.showcase.Scenario`: busy at 70 req/s, the elastic
   node lent), the batch client still sending in the `batch` mode: how soon the lent
   replica serves and when the step's p99 is back under the SLO
   (`bridge.lab.stepfigures`), and the online requests lost.

Baseline in the same run: the `none` mode, the same with no batch client. The modes
alternate, `--rounds` each, `--pause-s` apart (75 s: Triton's p99 summary covers its last
60 s, and a step's slow answers in it would keep the next round's gate closed).

Target (issue 33): step-to-serving and p99 recovery within 10% of the run without batch
work, and the reserved replica's off-peak busy share at least 3x that without it.

Usage (lab up, root; under `flock /tmp/stb-lab.lock`):
    .venv/bin/python bench/batch_lab.py [--rounds 1] [--batch-rps 20] [--offpeak-s 45]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time

import httpx

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


class BatchClient(threading.Thread):
    """Poisson batch requests at `rate` on the batch route, each answered before the next
    is due or sent late; a 429 waits out its Retry-After (at most 1 s)."""

    def __init__(self, endpoint: str, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{endpoint}/batch/v2/models/busy/infer"
        self.rate = rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.ok = self.refused = self.failed = 0

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            due = time.monotonic()
            while not self.stop.is_set():
                due += self.rng.expovariate(self.rate)
                wait = due - time.monotonic()
                if wait > 0 and self.stop.wait(wait):
                    break
                try:
                    r = client.post(self.url, json=BODY)
                except httpx.HTTPError:
                    self.failed += 1
                    continue
                if r.status_code == 200:
                    self.ok += 1
                elif r.status_code == 429:
                    self.refused += 1
                    after = float(r.headers.get("Retry-After", "1") or 1)
                    self.stop.wait(min(1.0, after))
                    due = time.monotonic()
                else:
                    self.failed += 1


def compute_us(addr: str) -> float | None:
    """busy's cumulative compute (infer) microseconds on the Triton at `addr`."""
    try:
        page = parse_page(httpx.get(f"http://{addr}:{METRICS_PORT}/metrics", timeout=2).text)
    except httpx.HTTPError:
        return None
    s = next((s for s in page.models.values() if s.model == "busy"), None)
    return None if s is None else float(s.compute_infer_duration_us)


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
            trickle = Load(endpoint, rate=4, duration=args.offpeak_s + 60, seed=20 + n)
            trickle.start()
            if batch:
                client = BatchClient(endpoint, args.batch_rps, seed=30 + n)
                client.start()
            began = time.monotonic()
            share_from = began + args.offpeak_s / 3
            first: tuple[float, float] | None = None
            open_passes = passes = 0
            while time.monotonic() - began < args.offpeak_s:
                tick = time.monotonic()
                rec.run_once()
                if time.monotonic() >= share_from:
                    passes += 1
                    open_passes += int(rec.batch_gate.open)
                    if first is None and (us := compute_us(reserved)) is not None:
                        first = (time.monotonic(), us)
                time.sleep(max(0.0, tick + 2.0 - time.monotonic()))
            last = compute_us(reserved)
            # why the gate stands as it does at the off-peak's end (what held it closed)
            snap = rec.last_snapshot
            why = (
                ""
                if snap is None
                else decide_gate(rec.batch_gate, snap, config, time.time()).reason
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
    said = ""
    if client is not None:
        said = f"  batch ok {client.ok} 429 {client.refused} failed {client.failed}"
    print(
        f"[{mode}] off-peak busy share {share:.3f} (gate open {open_passes}/{passes} passes"
        f"{': ' + why if why else ''})  "
        f"step: serving {fig.serving_s:.1f} s, p99 under SLO {fig.p99_under_slo_s:.0f} s, "
        f"recovered {recovered:.0f} s, online lost {lost}{said}  load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return {
        "share": share,
        "serving_s": fig.serving_s,
        "p99_under_slo_s": fig.p99_under_slo_s,
        "lost": float(lost),
        "batch_failed": float(client.failed if client else 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-rps", type=float, default=20.0)
    parser.add_argument("--offpeak-s", type=float, default=45.0)
    parser.add_argument("--calm-s", type=float, default=6.0)
    parser.add_argument("--pause-s", type=float, default=75.0, help="between rounds")
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    rows: dict[str, list[dict[str, float]]] = {"none": [], "batch": []}
    for n in range(args.rounds):
        for mode in ("none", "batch"):
            rows[mode].append(one(spec, mode == "batch", args, n))
            # Triton's p99 summary covers its last 60 s: the step's slow answers would
            # hold the next round's gate closed (over close_p99_ratio) for its off-peak
            time.sleep(args.pause_s)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[mode])

    share_x = med("batch", "share") / max(1e-9, med("none", "share"))
    serving_x = med("batch", "serving_s") / max(1e-9, med("none", "serving_s"))
    p99_x = med("batch", "p99_under_slo_s") / max(1e-9, med("none", "p99_under_slo_s"))
    met = share_x >= 3 and serving_x <= 1.1 and p99_x <= 1.1
    lost = sum(r["lost"] for rs in rows.values() for r in rs)
    print(
        f"RESULT rounds={args.rounds} batch_rps={args.batch_rps:g} "
        f"share_none={med('none', 'share'):.3f} share_batch={med('batch', 'share'):.3f} "
        f"share_x={share_x:.2f} serving_none_s={med('none', 'serving_s'):.1f} "
        f"serving_batch_s={med('batch', 'serving_s'):.1f} serving_x={serving_x:.2f} "
        f"p99_under_slo_none_s={med('none', 'p99_under_slo_s'):.0f} "
        f"p99_under_slo_batch_s={med('batch', 'p99_under_slo_s'):.0f} p99_x={p99_x:.2f} "
        f"online_lost={lost:.0f} target_met={'yes' if met else 'no'}"
    )


if __name__ == "__main__":
    main()
