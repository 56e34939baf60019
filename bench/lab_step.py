"""A load step on the lab, as `stb lab demo` plays it (busy from a trickle to 70 req/s,
1.4x what one replica serves; the training nodes busy, so the elastic node is the one to
lend, its job requeued): how soon the lent replica serves and how soon the requests'
own p99 (client side, through nginx, per 5 s of schedule) is back under the SLO.

Baseline in the same run: the same step with `[leases] requeue_victims = false`, the
lend waiting for slurmctld's own preemption pass. Each mode runs `--rounds` times,
alternating. Usage (lab up, root):
    .venv/bin/python bench/lab_step.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bridge.daemon.service import build, single_instance
from bridge.lab import lab as lab_mod
from bridge.lab.demo import lab_config
from bridge.lab.showcase import Scenario
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir


def one(spec: LabSpec, requeue: bool) -> dict[str, float]:
    base = lab_config(spec)
    config = base.model_copy(
        update={"leases": base.leases.model_copy(update={"requeue_victims": requeue})}
    )
    with single_instance(config.daemon.lock_file):
        bridge = build(config, slurm_env=spec.env())
        try:
            rec, endpoint = bridge.reconciler, config.routing.listen
            slo_ms = rec.observer.models().scaled["busy"].slo_p99_ms
            res = Scenario(spec, rec, endpoint, say=lambda line: None).run()
        finally:
            for job in bridge.reconciler.slurm.jobs(tag="stb:triton"):
                if "stb:baseline" not in job.tags:
                    bridge.reconciler.slurm.cancel(job.job_id)
            bridge.close()
    times = res.step_times(slo_ms)
    assert times is not None and res.heavy is not None
    row = {
        "lend": times.lend_s,
        "serving": times.serving_s,
        "p99 under SLO": times.p99_under_slo_s,
        "worst 5s p99 ms": times.worst_p99_ms,
        "failed": float(sum(res.heavy.total.errors.values()) + res.heavy.total.dropped),
    }
    print(
        f"[{'direct' if requeue else 'slurmctld'}] "
        + "  ".join(f"{k} {v:.1f}" for k, v in row.items()),
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    rows: dict[str, list[dict[str, float]]] = {"direct": [], "slurmctld": []}
    for _ in range(args.rounds):
        for name, requeue in (("direct", True), ("slurmctld", False)):
            rows[name].append(one(spec, requeue))
            time.sleep(5)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in rows.items()}
    print(f"\nmedians over {args.rounds} rounds, seconds after the step (70 req/s on busy):")
    for name, m in med.items():
        print(f"  {name:<10}" + "  ".join(f"{k} {v:.1f}" for k, v in m.items()))
    d, b = med["direct"], med["slurmctld"]
    print(
        f"RESULT rounds={args.rounds} serving_s={d['serving']:.1f} "
        f"p99_under_slo_s={d['p99 under SLO']:.1f} worst_p99_ms={d['worst 5s p99 ms']:.0f} "
        f"failed={d['failed']:.0f} baseline_serving_s={b['serving']:.1f} "
        f"baseline_p99_under_slo_s={b['p99 under SLO']:.1f} "
        f"baseline_worst_p99_ms={b['worst 5s p99 ms']:.0f}"
    )


if __name__ == "__main__":
    main()
