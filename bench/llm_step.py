"""A load step on the lab's LLM: streams on `smol` through the bridge's nginx step to
1.5x what one replica carries within its token SLOs; the bridge sizes smol by its token
profile and lends a second node (the elastic node, its job requeued). Measured, per
round: seconds from the step to the lend and to the lent replica serving (its model
loaded), and the first 5 s window of the step (by scheduled time) from which every
window's client TTFT p99 is back under the SLO; TPOT p99 and broken streams beside.

Baseline in the same run: the same step with lending off (`max_lent_nodes = 0`: the
separate fleet of one replica), alternating rounds.

The set-up, in a copy of the lab's model repository holding smol alone: smol loaded by
the reserved node's baseline (`stb.load_at_start` true, one replica at least) and paced
(`token_interval_ms`, 60 by default, its TPOT objective raised by twice the pace; the
lab's four nodes share the host's two cores, so without a pace a second replica adds no
compute; paced, each replica's token rate is its own, as on GPUs of their own). Its
profile is measured first through the baseline (closed batches of 1 and 2 streams) and
written beside it (`stb_profile.json`), which is what the daemon sizes it by. Training
runs on the training nodes (so the elastic node is the one lent), the daemon's
reconciler ticks every 2 s (`bridge.lab.llm_showcase`, which `stb lab demo --llm` runs).

Usage (lab up, root; under `flock /tmp/stb-lab.lock`):
    .venv/bin/python bench/llm_step.py [--rounds 1] [--pace-ms 60] [--step 1.5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys

from bridge.lab import lab as lab_mod
from bridge.lab.llm_showcase import describe, one_round, prepare
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir

FIGURES = ("serving_s", "ttft_under_s", "ttft_p99_ms", "tpot_p99_ms", "broken")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pace-ms", type=int, default=60)
    parser.add_argument("--step", type=float, default=1.5, help="x one replica's capacity")
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")

    def say(line: str) -> None:
        print(line, flush=True)

    prepared = prepare(spec, args.pace_ms, say)
    rate = args.step * prepared.one_replica_rate
    say(describe(prepared, args.pace_ms) + f"; step to {rate:.2f}/s")
    rows: dict[str, list[dict[str, float | None]]] = {"bridge": [], "separate": []}
    try:
        for n in range(args.rounds):
            for mode in rows:
                cfg = prepared.config if mode == "bridge" else prepared.without_lending()
                say(f"round {n + 1}, {mode}:")
                got = one_round(spec, cfg, rate, say)
                say(f"  {got}")
                rows[mode].append(got)
    finally:
        shutil.rmtree(prepared.repo, ignore_errors=True)
    result = [f"rounds={args.rounds}", f"pace_ms={args.pace_ms}", f"step_rate={rate:.2f}"]
    for mode, figs in rows.items():
        key = "" if mode == "bridge" else "separate_"
        for name in FIGURES:
            if mode == "separate" and name == "serving_s":
                continue  # nothing is lent
            values = [v for f in figs if (v := f.get(name)) is not None]
            shown = "never" if not values else f"{statistics.median(values):.1f}"
            result.append(f"{key}{name}={shown}")
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
