"""Lend and return cycles on the lab: where the time goes.

For each cycle an operator lend of the elastic node (with `--preempt`, an elastic job runs
there first and Slurm requeues it) is carried to `serving` and returned, by the real
reconciler ticking every second. Phases come from the lease's status history:

  bridge: requested -> submitted   (the bridge's decision to sbatch)
  slurm:  submitted -> starting    (Slurm scheduling, and preemption with --preempt)
  triton: starting -> serving      (Triton start, model load, readiness, routing update)
  drain:  serving -> releasing     (out of routing, in-flight requests, unload)
  end:    releasing -> returned    (Slurm ends the job, Triton's graceful exit)

Beside them, the bridge's own time: the wall time of its ticks (observe, sync, decide,
act, route) over the cycle. Usage (lab up, root):
    .venv/bin/python bench/lend_latency.py [--cycles 3] [--preempt]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime

from bridge.daemon.service import build, single_instance
from bridge.lab import lab as lab_mod
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState as S
from bridge.paths import default_lab_dir

PHASES = [
    ("bridge", S.REQUESTED, S.SUBMITTED),
    ("slurm", S.SUBMITTED, S.STARTING),
    ("triton", S.STARTING, S.SERVING),
    ("drain", S.SERVING, S.RELEASING),
    ("end", S.RELEASING, S.RETURNED),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument(
        "--preempt",
        action="store_true",
        help="run an elastic job on the node first (Slurm requeues it)",
    )
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    config = lab_config(spec)
    node = spec.pool_nodes("elastic")[0].name
    rows: list[dict[str, float]] = []
    with single_instance(config.daemon.lock_file):
        bridge = build(config, slurm_env=spec.env())
        rec, queue = bridge.reconciler, bridge.reconciler.requests
        assert queue is not None
        try:
            for cycle in range(args.cycles):
                victim = None
                if args.preempt:
                    victim = slurm(
                        spec,
                        "sbatch",
                        "--parsable",
                        "-p",
                        "elastic",
                        "-A",
                        "team-nlp",
                        "--exclusive",
                        f"--gres=gpu:{spec.gpus_per_node}",
                        "--requeue",
                        "-o",
                        "/dev/null",
                        "--wrap",
                        "sleep 3600",
                    ).strip()
                    while "RUNNING" not in slurm(spec, "squeue", "-h", "-j", victim, "-o", "%T"):
                        time.sleep(0.5)
                tick_s = 0.0
                queue.request_lend(node, ["busy"], datetime.now(UTC))
                lease_id = None
                for want_open in (True, False):
                    deadline = time.monotonic() + 300
                    while time.monotonic() < deadline:
                        t = time.monotonic()
                        rec.run_once(datetime.now(UTC))
                        tick_s += time.monotonic() - t
                        leases = rec.store.open_leases()
                        if want_open and leases and leases[0].state == S.SERVING:
                            lease_id = leases[0].id
                            queue.request_return(lease_id or 0, datetime.now(UTC))
                            break
                        if not want_open and not leases:
                            break
                        time.sleep(1)
                    else:
                        sys.exit(f"cycle {cycle + 1} stuck; see `stb status`")
                at = {e.to_state: e.at for e in rec.store.history(lease_id or 0)}
                row = {name: (at[b] - at[a]).total_seconds() for name, a, b in PHASES}
                row["total"] = (at[S.RETURNED] - at[S.REQUESTED]).total_seconds()
                row["bridge ticks"] = tick_s
                rows.append(row)
                print(
                    f"cycle {cycle + 1}: " + "  ".join(f"{k} {v:.2f}s" for k, v in row.items()),
                    flush=True,
                )
                if victim:
                    slurm(spec, "scancel", victim, check=False)
        finally:
            for job in rec.slurm.jobs(tag="stb:triton"):
                rec.slurm.cancel(job.job_id)
            bridge.close()
    print(f"\nmedians over {len(rows)} cycles ({'with' if args.preempt else 'no'} preemption):")
    for key in rows[0]:
        print(f"  {key:<13}{statistics.median(r[key] for r in rows):8.2f} s")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    share = med["bridge ticks"] / med["total"]
    print(f"  the bridge's own ticks: {share:.1%} of the lend-to-return time")
    figures = " ".join(f"{k.replace(' ', '_')}_s={v:.2f}" for k, v in med.items())
    print(
        f"RESULT cycles={len(rows)} preempt={int(args.preempt)} {figures} bridge_share={share:.4f}"
    )


if __name__ == "__main__":
    main()
