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
act, route) over the cycle. With `--preempt` the cycles alternate between the bridge
requeueing the victim itself (`[leases] requeue_victims`, the default) and the baseline,
slurmctld's own preemption pass, and both are reported. Usage (lab up, root):
    .venv/bin/python bench/lend_latency.py [--cycles 3] [--preempt]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime

from bridge.config import BridgeConfig
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


def _cycles(
    spec: LabSpec, config: BridgeConfig, count: int, preempt: bool
) -> list[dict[str, float]]:
    """`count` lend-return cycles of the elastic node; one row of phase times each."""
    node = spec.pool_nodes("elastic")[0].name
    rows: list[dict[str, float]] = []
    with single_instance(config.daemon.lock_file):
        bridge = build(config, slurm_env=spec.env())
        rec, queue = bridge.reconciler, bridge.reconciler.requests
        assert queue is not None
        try:
            for cycle in range(count):
                victim = None
                if preempt:
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
                    waited = time.monotonic()
                    while "RUNNING" not in slurm(spec, "squeue", "-h", "-j", victim, "-o", "%T"):
                        if time.monotonic() - waited > 120:
                            slurm(spec, "scancel", victim, check=False)
                            sys.exit(f"the victim job {victim} did not start on {node} in 120 s")
                        time.sleep(0.5)
                tick_s = 0.0
                request = queue.request_lend(node, ["busy"], datetime.now(UTC))
                lease_id = None
                for want_open in (True, False):
                    deadline = time.monotonic() + 300
                    while time.monotonic() < deadline:
                        t = time.monotonic()
                        rec.run_once(datetime.now(UTC))
                        tick_s += time.monotonic() - t
                        leases = rec.store.open_leases()
                        answer = queue.get(request.id or 0)
                        if answer is not None and answer.outcome.startswith("refused"):
                            sys.exit(f"lend of {node} {answer.outcome}; see `stb status`")
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
                row["to serving"] = (at[S.SERVING] - at[S.REQUESTED]).total_seconds()
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
    return rows


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument(
        "--preempt",
        action="store_true",
        help="run an elastic job on the node first; alternate direct requeue and slurmctld",
    )
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    base = lab_config(spec)
    modes = [("direct", True), ("slurmctld", False)] if args.preempt else [("direct", True)]
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in modes}
    for _ in range(args.cycles):
        for name, requeue in modes:
            config = base.model_copy(
                update={"leases": base.leases.model_copy(update={"requeue_victims": requeue})}
            )
            print(f"[{name}]", end=" ")
            rows[name] += _cycles(spec, config, 1, args.preempt)
    med = {name: _medians(r) for name, r in rows.items()}
    for name, m in med.items():
        print(f"\nmedians over {len(rows[name])} cycles ({name}, preempt={args.preempt}):")
        for key, value in m.items():
            print(f"  {key:<13}{value:8.2f} s")
        print(f"  the bridge's own ticks: {m['bridge ticks'] / m['total']:.1%} of lend-to-return")
    direct = med["direct"]
    figures = " ".join(f"{k.replace(' ', '_')}_s={v:.2f}" for k, v in direct.items())
    extra = ""
    if "slurmctld" in med:
        base_s = med["slurmctld"]["to serving"]
        extra = (
            f" slurmctld_to_serving_s={base_s:.2f}"
            f" slurmctld_slurm_s={med['slurmctld']['slurm']:.2f}"
            f" speedup={base_s / max(direct['to serving'], 1e-9):.2f}"
        )
    share = direct["bridge ticks"] / direct["total"]
    print(
        f"RESULT cycles={len(rows['direct'])} preempt={int(args.preempt)} {figures}"
        f"{extra} bridge_share={share:.4f}"
    )


if __name__ == "__main__":
    main()
