"""The bridge at work on an LLM, as one scenario: `stb lab demo --llm` and
bench/llm_step.py both run it.

The set-up, in a copy of the lab's model repository holding smol alone (`repository`):
smol loaded by the reserved node's baseline (`stb.load_at_start` true, one replica at
least) and paced (`token_interval_ms`: the lab's nodes share the host's two cores, so
without a pace a second replica adds no compute; paced, each replica's token rate is its
own, as on GPUs of their own). Its profile is measured through the baseline
(`measure_profile`: `stb models profile`'s run, 1 and 2 streams at once) and written
beside it (`stb_profile.json`), which is what the daemon sizes it by (`bridge.policy.llm`). Then
(`one_round`) training on the training nodes and an elastic job on the elastic node,
the daemon's reconciler ticking every 2 s on a thread, and streams through the bridge's
nginx step to a rate (`one_replica_rate` x the step): the bridge lends the elastic node
for smol, its replica serves, and the streams' client TTFT p99 per 5 s window is
measured against the SLO. The lend goes back once the load has stopped.
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bridge.config import BridgeConfig
from bridge.daemon.reconciler import Reconciler
from bridge.daemon.service import build, single_instance
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import Schedule, poisson
from bridge.load.runner import parse_endpoint
from bridge.load.streams import StreamConfig, StreamRecord, StreamResult, run_streams
from bridge.models.profile import write_profile
from bridge.models.profile_run import Measured, make_plan, measure
from bridge.paths import project_root
from bridge.policy.tokens import TokenDemand, TokenProfile, predict
from bridge.slurm.model import TRITON_TAG
from bridge.triton.repository import read_published

MODEL = "smol"
#: the step's lengths: short prompts (the prefill is CPU the replicas share), answers
#: long enough that the decode (paced) is most of a stream
PROMPT, OUTPUT = 40, 8
#: the chat template's tokens around a prompt (smol's chatml: `prompt_overhead` in
#: bench/llm_capacity.py measures it): PROMPT counts them
OVERHEAD = 30
WINDOW_S = 5.0
STEP_S = 90.0
TICK_S = 2.0


def repository(pace_ms: int) -> Path:
    """A copy of the lab's repository with smol alone, loaded at start and paced."""
    root = Path(tempfile.mkdtemp(prefix="stb-llm-step-"))
    shutil.copytree(project_root() / "triton_repo" / MODEL, root / MODEL)
    cfg = root / MODEL / "config.pbtxt"
    text = cfg.read_text()
    for key, value in (
        ("stb.load_at_start", "true"),
        ("stb.min_replicas", "1"),
        ("token_interval_ms", str(pace_ms)),
        # the pace is in every token's time: the repository's TPOT objective (150 ms, for
        # the unpaced model) plus twice the pace, so that the step is a TTFT one
        ("stb.slo_tpot_p99_ms", str(150 + 2 * pace_ms)),
    ):
        text, n = re.subn(
            rf'(key: "{re.escape(key)}"\s*value: {{ string_value: )"[^"]*"',
            rf'\1"{value}"',
            text,
        )
        assert n == 1, f"{key} not in smol's config.pbtxt"
    cfg.write_text(text)
    (root / MODEL / "stb_profile.json").unlink(missing_ok=True)
    return root


def streams(
    endpoint: str, schedule: Schedule, seed: int, stop: threading.Event | None = None
) -> StreamResult:
    config = StreamConfig(
        endpoints=(parse_endpoint(endpoint),),
        model=MODEL,
        lengths=((PROMPT, OUTPUT),),
        prompt_overhead=OVERHEAD,
        temperature=1.0,
        seed=seed,
        max_requests=max(1, len(schedule.offsets)),
        max_duration_s=max(schedule.window_s, 1.0) + 1.0,
        concurrency_cap=256,
        timeout_s=120.0,
    )
    return asyncio.run(run_streams(schedule, config, stop=stop))


def measure_profile(endpoint: str, sequences: int) -> Measured:
    """`stb models profile`'s run (`bridge.models.profile_run`) through `endpoint`: 12
    streams, 1 and 2 at once, prompts of the step's length and twice it, the step's
    answers."""
    plan = make_plan(
        sequences, requests=12, prompt_tokens=(PROMPT, 2 * PROMPT), output_tokens=OUTPUT
    )
    return measure(endpoint, MODEL, "1", plan)


def one_replica_rate(profile: TokenProfile, slo_ttft_s: float, slo_tpot_s: float) -> float:
    """The highest rate one replica carries within both SLOs (bisection)."""
    lo, hi = 0.0, 50.0
    for _ in range(40):
        mid = (lo + hi) / 2
        demand = TokenDemand(mid, (float(PROMPT),), (float(OUTPUT),))
        if predict(profile, demand, 1).within(slo_ttft_s, slo_tpot_s):
            lo = mid
        else:
            hi = mid
    return lo


def windows(records: Sequence[StreamRecord], step_s: float) -> list[tuple[float, float | None]]:
    """Per WINDOW_S of schedule from the step: the client TTFT p99 (s) of its streams."""
    out: list[tuple[float, float | None]] = []
    for k in range(int(step_s // WINDOW_S)):
        lo, hi = k * WINDOW_S, (k + 1) * WINDOW_S
        ttfts = sorted(
            t for r in records if lo <= r.scheduled_s < hi and (t := r.ttft_s) is not None
        )
        p99 = ttfts[min(len(ttfts) - 1, math.ceil(0.99 * len(ttfts)) - 1)] if ttfts else None
        out.append((lo, p99))
    return out


def back_under(wins: Sequence[tuple[float, float | None]], slo_s: float) -> float | None:
    """The start of the first window from which every window is under the SLO."""
    for i, (start, _) in enumerate(wins):
        if all(p is not None and p <= slo_s for _, p in wins[i:]):
            return start
    return None


def one_round(
    spec: LabSpec, config: BridgeConfig, rate: float, say: Callable[[str], None]
) -> dict[str, float | None]:
    gpus = f"--gres=gpu:{spec.gpus_per_node}"
    sb = ("sbatch", "--parsable", "-o", "/dev/null")
    jobs = [
        slurm(
            spec, *sb, "-p", "train", "-A", "team-vision", "-w", n.name, gpus, "--wrap", "sleep 900"
        ).strip()
        for n in spec.pool_nodes("train")
    ]
    jobs.append(
        slurm(spec, *sb, "-p", "elastic", "-A", "team-nlp", "--exclusive", gpus, "--requeue",
              "--wrap", "sleep 900").strip()
    )  # fmt: skip
    out: dict[str, float | None] = {}
    t0 = time.time()
    try:
        with single_instance(config.daemon.lock_file):
            bridge = build(config, slurm_env=spec.env())
            rec, store = bridge.reconciler, bridge.reconciler.store
            stop_ticking = threading.Event()

            def tick() -> None:
                while not stop_ticking.is_set():
                    for line in rec.run_once(datetime.now(UTC)).lines():
                        say(f"  {time.time() - t0:5.1f}s  {line}")
                    stop_ticking.wait(TICK_S)

            try:
                wait_serving(rec)
                say("baseline serving smol; the reconciler ticks every 2 s")
                ticker = threading.Thread(target=tick, daemon=True)
                ticker.start()
                schedule = poisson(rate, STEP_S, seed=7)
                step_at = time.time()
                say(f"step: {rate:.2f} streams/s for {STEP_S:.0f} s")
                result = streams(config.routing.listen, schedule, seed=100)
                lends = store.touched_since(datetime.fromtimestamp(step_at - 1, UTC))
                first = min(lends, key=lambda lease: lease.created_at, default=None)
                if first is not None:
                    at = {e.to_state: e.at.timestamp() for e in store.history(first.id or 0)}
                    out["lend_s"] = at[LeaseState.REQUESTED] - step_at
                    serving = at.get(LeaseState.SERVING)
                    out["serving_s"] = None if serving is None else serving - step_at
                slo = rec.observer.models().scaled[MODEL]
                wins = windows(result.records, STEP_S)
                under = back_under(wins, (slo.slo_ttft_p99_ms or 0) / 1000.0)
                out["ttft_under_s"] = None if under is None else under + WINDOW_S
                ttfts = sorted(t for r in result.records if (t := r.ttft_s) is not None)
                tpots = sorted(t for r in result.records if (t := r.tpot_s) is not None)
                out["ttft_p99_ms"] = 1000 * ttfts[math.ceil(0.99 * len(ttfts)) - 1]
                out["tpot_p99_ms"] = 1000 * tpots[math.ceil(0.99 * len(tpots)) - 1]
                out["broken"] = float(sum(1 for r in result.records if r.outcome == "broken"))
                out["streams"] = float(len(result.records))
                say("  windows (s from the step: TTFT p99 ms): " + ", ".join(
                    f"{s:.0f}:{'-' if p is None else f'{p * 1000:.0f}'}" for s, p in wins
                ))  # fmt: skip
                # give the lend back before the next round: no load, short dwell
                deadline = time.monotonic() + 240
                while store.open_leases() and time.monotonic() < deadline:
                    time.sleep(TICK_S)
            finally:
                stop_ticking.set()
                for job in rec.slurm.jobs(tag=TRITON_TAG):
                    rec.slurm.cancel(job.job_id)
                bridge.close()
    finally:
        slurm(spec, "scancel", *jobs, check=False)
        time.sleep(5)
    return out


def wait_serving(rec: Reconciler, timeout_s: float = 180.0) -> None:
    """Tick until the reserved node's baseline serves smol."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rec.run_once(datetime.now(UTC))
        obs = rec.last_observation
        if obs is not None and any(MODEL in s.models for s in obs.servers if s.ready):
            return
        time.sleep(TICK_S)
    raise RuntimeError(f"the baseline did not serve smol within {timeout_s:.0f} s")


@dataclass(frozen=True)
class Prepared:
    """The scenario's configuration (its repository copy), smol's measured profile and
    objectives, and the rate one replica carries within them by the token model."""

    config: BridgeConfig
    repo: Path
    profile: TokenProfile
    slo_ttft_s: float
    slo_tpot_s: float
    one_replica_rate: float

    def without_lending(self) -> BridgeConfig:
        """The same with lending off: the separate fleet of one replica."""
        c = self.config
        return c.model_copy(update={"policy": c.policy.model_copy(update={"max_lent_nodes": 0})})


def prepare(spec: LabSpec, pace_ms: int, say: Callable[[str], None]) -> Prepared:
    """The repository copy and the configuration, and smol's profile measured through a
    baseline (lending off meanwhile) and written beside it. The caller removes `repo`."""
    repo = repository(pace_ms)
    base = lab_config(spec)
    config = base.model_copy(
        update={
            "triton": base.triton.model_copy(update={"model_repository": repo}),
            "policy": base.policy.model_copy(
                update={"return_dwell_s": 20.0, "scale_in_cooldown_s": 30.0}
            ),
        }
    )
    facts = read_published(repo / MODEL)
    if not (facts.slo_ttft_p99_ms and facts.slo_tpot_p99_ms):
        raise RuntimeError(f"{repo / MODEL}: smol has no token SLOs")
    probe = config.model_copy(
        update={"policy": config.policy.model_copy(update={"max_lent_nodes": 0})}
    )
    say(f"measuring smol's token profile (paced {pace_ms} ms a token) through a baseline")
    with single_instance(probe.daemon.lock_file):
        bridge = build(probe, slurm_env=spec.env())
        rec = bridge.reconciler
        try:
            wait_serving(rec)
            measured = measure_profile(config.routing.listen, 2)
        finally:
            for job in rec.slurm.jobs(tag=TRITON_TAG):
                rec.slurm.cancel(job.job_id)
            bridge.close()
    profile = measured.profile
    write_profile(repo / MODEL, "1", profile, points=len(measured.points))
    ttft, tpot = facts.slo_ttft_p99_ms / 1000.0, facts.slo_tpot_p99_ms / 1000.0
    return Prepared(config, repo, profile, ttft, tpot, one_replica_rate(profile, ttft, tpot))


def describe(p: Prepared, pace_ms: int) -> str:
    prof = p.profile
    return (
        f"smol's profile (paced {pace_ms} ms): first token after "
        f"{prof.prefill_overhead_s * 1000:.0f} ms + {prof.prefill_s_per_token * 1000:.2f} "
        f"ms/prompt token, TPOT {'/'.join(f'{t * 1000:.0f}' for t in prof.tpot_s)} ms at 1/2 "
        f"streams; one replica carries {p.one_replica_rate:.2f} streams/s within TTFT "
        f"{p.slo_ttft_s:g} s / TPOT {p.slo_tpot_s * 1000:g} ms"
    )
