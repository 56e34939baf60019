"""A load step on the lab, as `stb lab demo` plays it (busy from a trickle to 70 req/s,
1.4x what one replica serves; the training nodes busy, so the elastic node is the one to
lend, its job requeued): how soon the lent replica serves, how big the backlog on the
first replica is then, when the two replicas have worked it off (the requests' own p99,
client side, through nginx, per 5 s of schedule, back under the SLO), and how the windows
after that stand against the SLO (`bridge.lab.stepfigures`). Each set of rounds prints
the machine's load averages (`uptime`) before and after, and min / median / max.

Baseline in the same run: the same step with `[leases] requeue_victims = false`, the
lend waiting for slurmctld's own preemption pass (`--modes direct` skips it). Each mode
runs `--rounds` times, alternating. `--busy-cpu N` keeps CPU N busy (a Python busy loop
pinned with taskset, bounded by `timeout`) during each round: the other work a shared
machine has. `--trace DIR` writes each round's requests (with the replica nginx chose)
and each Triton's queue per second (pending requests, queue and compute time) as JSON.
Usage (lab up, root; under `flock /tmp/stb-lab.lock`):
    .venv/bin/python bench/lab_step.py [--rounds 2] [--modes direct] [--busy-cpu 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bridge.daemon.service import build, single_instance
from bridge.lab import lab as lab_mod
from bridge.lab.demo import lab_config
from bridge.lab.showcase import Scenario, ScenarioResult
from bridge.lab.spec import LabSpec
from bridge.lab.stepfigures import StepFigures
from bridge.paths import default_lab_dir
from bridge.triton.metrics import parse_page
from bridge.triton.ports import METRICS_PORT

#: a round's bound for the busy loop (a round takes about 2.5 minutes)
BUSY_LIMIT_S = 400


class TritonQueues(threading.Thread):
    """Each second, busy's counters on every Triton that may serve it (the reserved and
    the elastic nodes): pending requests, and cumulative successes, queue and compute
    microseconds (a window's mean queue time is the difference over successes)."""

    def __init__(self, addrs: list[str]) -> None:
        super().__init__(daemon=True)
        self.addrs = addrs
        self.rows: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=1) as client:
            while not self.stop.is_set():
                row: dict[str, Any] = {"at": time.time()}
                for addr in self.addrs:
                    try:
                        page = parse_page(client.get(f"http://{addr}:{METRICS_PORT}/metrics").text)
                    except httpx.HTTPError:
                        continue  # not running (yet): no row for it
                    s = next((s for s in page.models.values() if s.model == "busy"), None)
                    if s is not None:
                        row[addr] = {
                            "pending": s.pending_requests,
                            "success": s.request_success,
                            "queue_us": s.queue_duration_us,
                            "compute_us": s.compute_infer_duration_us,
                        }
                self.rows.append(row)
                self.stop.wait(1.0)


def busy_loop(cpu: int | None) -> subprocess.Popen[bytes] | None:
    if cpu is None:
        return None
    loop = [sys.executable, "-c", "while True: pass"]
    argv = ["timeout", str(BUSY_LIMIT_S), "taskset", "-c", str(cpu), *loop]
    return subprocess.Popen(argv)


def one(spec: LabSpec, requeue: bool, args: argparse.Namespace, n: int) -> tuple[StepFigures, int]:
    base = lab_config(spec)
    config = base.model_copy(
        update={"leases": base.leases.model_copy(update={"requeue_victims": requeue})}
    )
    addrs = [node.addr for pool in ("infer", "elastic") for node in spec.pool_nodes(pool)]
    queues = TritonQueues(addrs) if args.trace else None
    busy = busy_loop(args.busy_cpu)
    try:
        with single_instance(config.daemon.lock_file):
            bridge = build(config, slurm_env=spec.env())
            try:
                rec, endpoint = bridge.reconciler, config.routing.listen
                slo_ms = rec.observer.models().scaled["busy"].slo_p99_ms
                if queues is not None:
                    queues.start()
                res = Scenario(spec, rec, endpoint, say=lambda line: None).run()
            finally:
                for job in bridge.reconciler.slurm.jobs(tag="stb:triton"):
                    if "stb:baseline" not in job.tags:
                        bridge.reconciler.slurm.cancel(job.job_id)
                bridge.close()
    finally:
        if busy is not None:
            busy.terminate()  # `timeout` passes it on to the loop
            busy.wait()
        if queues is not None:
            queues.stop.set()
            queues.join()
    fig = res.step_figures(slo_ms)
    assert fig is not None and res.heavy is not None
    failed = sum(res.heavy.total.errors.values()) + res.heavy.total.dropped
    mode = "direct" if requeue else "slurmctld"
    if args.trace:
        write_trace(args.trace / f"{mode}-{n}.json", res, fig, queues, failed)
    recovered = "never" if fig.recovered_s is None else f"{fig.recovered_s:.0f}"
    print(
        f"[{mode}] serving {fig.serving_s:.1f}  backlog {fig.backlog}  one/two replicas "
        f"{fig.one_replica_rate or 0:.1f}/{fig.two_replicas_rate or 0:.1f} per s  recovered "
        f"{recovered} (expected {fig.expected_recovered_s or 0:.1f})  p99 under SLO "
        f"{fig.p99_under_slo_s:.0f}  windows after over SLO {fig.after_late}/"
        f"{fig.after_windows} (median p99 {fig.after_median_p99_ms or 0:.0f} ms)  worst "
        f"{fig.worst_p99_ms:.0f} ms  send lag p99 {fig.send_lag_p99_ms:.0f} ms  failed "
        f"{failed}  load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return fig, failed


def write_trace(
    path: Path, res: ScenarioResult, fig: StepFigures, q: TritonQueues | None, failed: int
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "step_at": res.step_at,
        "figures": dataclasses.asdict(fig),
        "failed": failed,
        "timeline": res.timeline,
        "requests": [dataclasses.asdict(r) for r in res.heavy_records],
        "tritons": [] if q is None else q.rows,
    }
    path.write_text(json.dumps(doc))


def spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", choices=("both", "direct", "slurmctld"), default="both")
    parser.add_argument("--busy-cpu", type=int, default=None, metavar="N")
    parser.add_argument("--trace", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    if args.busy_cpu is not None and args.busy_cpu not in os.sched_getaffinity(0):
        sys.exit(f"--busy-cpu {args.busy_cpu}: not one of this machine's CPUs")
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    modes = [m for m in ("direct", "slurmctld") if args.modes in ("both", m)]
    load_before = os.getloadavg()
    print(f"uptime before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout}")
    rows: dict[str, list[StepFigures]] = {m: [] for m in modes}
    failed: dict[str, int] = dict.fromkeys(modes, 0)
    for n in range(args.rounds):
        for name in modes:
            fig, lost = one(spec, name == "direct", args, n)
            rows[name].append(fig)
            failed[name] += lost
            time.sleep(5)
    load_after = os.getloadavg()
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout}")
    busy = "" if args.busy_cpu is None else f", CPU {args.busy_cpu} kept busy"
    print(f"min / median / max over {args.rounds} rounds, s after the step (70 req/s{busy}):")
    result: list[str] = [f"rounds={args.rounds}", f"busy_cpu={args.busy_cpu is not None}"]
    for name, figs in rows.items():
        never = sum(1 for f in figs if f.recovered_s is None)
        rec = [f.recovered_s for f in figs if f.recovered_s is not None] or [float("nan")]
        cols = {
            "serving": [f.serving_s for f in figs],
            "backlog": [float(f.backlog) for f in figs],
            "recovered": rec,
            "p99 under SLO": [f.p99_under_slo_s for f in figs],
            "windows after over SLO": [float(f.after_late) for f in figs],
            "median p99 after ms": [f.after_median_p99_ms or 0.0 for f in figs],
            "worst p99 ms": [f.worst_p99_ms for f in figs],
            "send lag p99 ms": [f.send_lag_p99_ms for f in figs],
        }
        print(f"  {name}:" + (f" (never worked off in {never} rounds)" if never else ""))
        for k, v in cols.items():
            print(f"    {k:<24}{spread(v)}")
        key = "" if name == "direct" else "baseline_"
        for k, v in (
            ("serving_s", cols["serving"]),
            ("recovered_s", rec),
            ("p99_under_slo_s", cols["p99 under SLO"]),
        ):
            result.append(
                f"{key}{k}={statistics.median(v):.1f} {key}{k}_min={min(v):.1f} "
                f"{key}{k}_max={max(v):.1f}"
            )
        result.append(f"{key}worst_p99_ms={statistics.median(cols['worst p99 ms']):.0f}")
        result.append(f"{key}never_recovered={never} {key}failed={failed[name]}")
    result.append(f"load1_before={load_before[0]:.2f} load1_after={load_after[0]:.2f}")
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
