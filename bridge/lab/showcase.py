"""The bridge at work on the lab, as one scenario: the README's main command
(`stb lab demo`) and the end-to-end test both run it.

Training runs on every training node and an elastic job on the elastic node. A load step
on `busy` (through nginx) makes p99 breach; the reconciler lends the elastic node (Slurm
requeues the elastic job), Triton starts there and enters routing, p99 recovers; load
falls to a trickle, the lease is returned with no failed request, and (if asked) the
requeued elastic job runs again. Every step goes on a timeline.

The reconciler's passes run on a fixed grid, as the daemon's scheduler and the simulator
run them: from the step's start t0, a pass at t0 + k x TICK_S (one that overran a whole
tick goes back onto the grid). `on_pass` sees each pass (the reconciler, the pass's time
and its report): tests/lab/test_sim_vs_lab.py compares the run with its simulated twin
from what it records there and from `ScenarioResult.offsets`, the load's own schedule.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bridge.daemon.reconciler import Reconciler
from bridge.daemon.report import TickReport
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lab.stepfigures import StepFigures, step_figures
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import poisson
from bridge.load.report import Report, summarize
from bridge.load.runner import RequestRecord, RunConfig, parse_endpoint, run

TICK_S = 2.0

#: what `Scenario` calls after each pass: the reconciler, the pass's time, its report
OnPass = Callable[[Reconciler, datetime, TickReport], None]


class ScenarioError(RuntimeError):
    """A step did not happen in time; the message carries the timeline so far."""


class Load(threading.Thread):
    """The load generator's runner in a thread: Poisson at `rate` for `duration` s, or
    until `stop_sending` is set."""

    def __init__(self, endpoint: str, rate: float, duration: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.config = RunConfig(
            endpoints=(parse_endpoint(endpoint),),
            model="busy",
            shape=(16,),
            max_requests=20_000,
            max_duration_s=duration,
            concurrency_cap=2_000,
            timeout_s=60,
        )
        self.schedule = poisson(rate, duration, seed)
        self.rate = rate
        self.report: Report | None = None
        #: every request's record, and the wall time (epoch s) its times count from
        self.records: list[RequestRecord] = []
        self.started_at: float | None = None
        #: set to stop sending (what is in flight is still answered and recorded)
        self.stop_sending = threading.Event()

    def run(self) -> None:
        self.started_at = time.time()
        result = asyncio.run(
            run(self.schedule, self.config, target_rate=self.rate, stop=self.stop_sending)
        )
        self.records = list(result.records)
        self.report = summarize(result)


@dataclass
class ScenarioResult:
    timeline: list[str] = field(default_factory=list)
    lease_id: int | None = None
    lease_node: str = ""
    lease_states: list[str] = field(default_factory=list)
    heavy: Report | None = None
    light: Report | None = None
    #: the load step's requests, and when it began (epoch s): latency over time
    heavy_records: list[RequestRecord] = field(default_factory=list)
    step_at: float | None = None
    #: t0, the passes' grid from the step on (epoch s, just before the step's sender
    #: started: a pass at t0 + k x TICK_S)
    tick_origin: float | None = None
    #: every request the load generator scheduled on busy, step and trickle, as seconds
    #: from `tick_origin`, up to when the trickle stopped sending
    offsets: list[float] = field(default_factory=list)
    #: when the first lease was decided and began serving (epoch s)
    lend_at: float | None = None
    serving_at: float | None = None
    victim: str = ""
    victim_restarts: int = 0
    victim_ran_again: bool | None = None
    training_jobs: list[str] = field(default_factory=list)
    training_untouched: bool = False

    def step_figures(self, slo_ms: float) -> StepFigures | None:
        """How the step was met (`bridge.lab.stepfigures`): from the step's requests and
        the first lease; None before both are known."""
        if self.step_at is None or self.lend_at is None or self.serving_at is None:
            return None
        return step_figures(
            self.heavy_records,
            lend_s=self.lend_at - self.step_at,
            serving_s=self.serving_at - self.step_at,
            slo_ms=slo_ms,
        )


class Scenario:
    def __init__(
        self,
        lab: LabSpec,
        rec: Reconciler,
        endpoint: str,
        say: Callable[[str], None] = print,
        on_pass: OnPass | None = None,
    ) -> None:
        self.lab, self.rec, self.endpoint, self.say = lab, rec, endpoint, say
        self.on_pass = on_pass
        self.result = ScenarioResult()
        self.t0 = time.monotonic()
        self._last_p99_note = -1e9
        # the passes' grid: origin (epoch s) and the last pass's k (the first pass at once)
        self._grid_origin = time.time()
        self._k = -1

    def _restart_grid(self) -> float:
        """The grid from now (the next pass one tick later); its origin (epoch s)."""
        self._grid_origin, self._k = time.time(), 0
        return self._grid_origin

    def _wait_for_grid(self) -> None:
        """Sleep until the next pass's grid time; a pass that overran a whole tick goes
        back onto the grid (the daemon's scheduler skips the missed ticks likewise)."""
        self._k += 1
        late = time.time() - (self._grid_origin + self._k * TICK_S)
        if late > TICK_S:
            self._k += int(late // TICK_S)
        time.sleep(max(0.0, self._grid_origin + self._k * TICK_S - time.time()))

    def note(self, line: str) -> None:
        entry = f"{time.monotonic() - self.t0:6.1f}s  {line}"
        self.result.timeline.append(entry)
        self.say(entry)

    def tick_until(self, what: str, done: Callable[[], bool], timeout_s: float) -> None:
        """Run the reconciler's pass on the grid until `done()`, at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._wait_for_grid()
            now = datetime.now(UTC)
            report = self.rec.run_once(now)
            for line in report.lines():
                self.note(line)
            self._note_p99()
            if self.on_pass is not None:
                self.on_pass(self.rec, now, report)
            if done():
                return
            if time.monotonic() > deadline:
                raise ScenarioError(
                    f"{what} did not happen within {timeout_s:.0f}s:\n"
                    + "\n".join(self.result.timeline)
                )

    def _note_p99(self) -> None:
        """Every 10 s, the p99 the bridge sees for busy (Triton's 60 s window) and the
        tick's own mean latency: how the breach builds and recovers."""
        now = time.monotonic()
        sample = self.rec.observer.latest("busy")
        if sample is None or now - self._last_p99_note < 10:
            return
        self._last_p99_note = now
        p99 = "-" if sample.p99_ms is None else f"{sample.p99_ms:.0f} ms"
        mean = "-" if sample.mean_ms is None else f"{sample.mean_ms:.0f} ms"
        rate = "-" if sample.request_rate is None else f"{sample.request_rate:.0f}/s"
        self.note(f"busy: p99 {p99} (60 s window), mean {mean} this tick, {rate}")

    def _sbatch(self, *args: str) -> str:
        return slurm(self.lab, "sbatch", "--parsable", "-o", "/dev/null", *args).strip()

    def _running(self, jobs: list[str]) -> bool:
        """Every one of `jobs` running (squeue)."""
        out = slurm(self.lab, "squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T", check=False)
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(j) == "RUNNING" for j in jobs)

    def run(self, wait_requeued: bool = False) -> ScenarioResult:
        lab, res, store = self.lab, self.result, self.rec.store
        gpus = f"--gres=gpu:{lab.gpus_per_node}"
        res.training_jobs = [
            self._sbatch(
                "-p", "train", "-A", "team-vision", "-w", n.name, gpus, "--wrap", "sleep 1800"
            )
            for n in lab.pool_nodes("train")
        ]
        res.victim = self._sbatch(
            "-p",
            "elastic",
            "-A",
            "team-nlp",
            "--exclusive",
            gpus,
            "--requeue",
            "--wrap",
            "sleep 1800",
        )
        self.note(
            f"training jobs {' '.join(res.training_jobs)} on "
            f"{' '.join(n.name for n in lab.pool_nodes('train'))}; elastic job "
            f"{res.victim} on {lab.pool_nodes('elastic')[0].name}"
        )
        batch = [*res.training_jobs, res.victim]
        try:
            rec = self.rec

            def ready() -> bool:
                """The baseline Triton serving and read twice (so that the step's first
                pass has counter deltas: busy has a rate), every batch job running."""
                seen, sample = rec.last_observation, rec.observer.latest("busy")
                return (
                    seen is not None
                    and any(s.ready for s in seen.servers)
                    and sample is not None
                    and sample.request_rate is not None
                    and self._running(batch)
                )

            self.tick_until("the baseline Triton serving, the batch jobs running", ready, 120)
            self.note(
                "baseline Triton ready; load step: busy at 70 req/s through nginx "
                "(one replica, 20 ms a request, answers under 50/s)"
            )
            heavy = Load(self.endpoint, rate=70, duration=50, seed=11)
            res.tick_origin = origin = self._restart_grid()
            heavy.start()
            self.tick_until(
                "a lease serving",
                lambda: any(lease.state == LeaseState.SERVING for lease in store.open_leases()),
                150,
            )
            lease = store.open_leases()[0]  # the first lend; more may follow under load
            res.lease_id, res.lease_node = lease.id, lease.node
            at = {e.to_state: e.at.timestamp() for e in store.history(lease.id or 0)}
            res.lend_at, res.serving_at = at.get(LeaseState.REQUESTED), at.get(LeaseState.SERVING)
            # The bridge keeps ticking while the load step runs on two replicas.
            self.tick_until("the load step to end", lambda: not heavy.is_alive(), 180)
            res.heavy, res.heavy_records, res.step_at = (
                heavy.report,
                heavy.records,
                heavy.started_at,
            )
            self.note("load falls to 4 req/s")
            # the trickle runs until every lease is back, so the return is under load
            light = Load(self.endpoint, rate=4, duration=300, seed=12)
            light.start()
            self.tick_until("every lease returned", lambda: not store.open_leases(), 200)
            light.stop_sending.set()
            stopped = time.time()
            self.tick_until("the trickle to end", lambda: not light.is_alive(), 120)
            res.light = light.report
            res.offsets = [
                t - origin
                for load in (heavy, light)
                if load.started_at is not None
                for t in (load.started_at + o for o in load.schedule.offsets)
                if t < stopped
            ]
            res.lease_states = [e.to_state.value for e in store.history(lease.id or 0)]
            fields = slurm(lab, "scontrol", "show", "job", res.victim)
            res.victim_restarts = int(fields.split("Restarts=")[1].split()[0])
            res.training_untouched = all(
                "JobState=RUNNING" in slurm(lab, "scontrol", "show", "job", j)
                and "Restarts=0" in slurm(lab, "scontrol", "show", "job", j)
                for j in res.training_jobs
            )
            if wait_requeued:
                self.note(
                    f"waiting for the requeued elastic job {res.victim} to run again "
                    "(Slurm holds a requeued job about two minutes)"
                )
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline:
                    if "JobState=RUNNING" in slurm(lab, "scontrol", "show", "job", res.victim):
                        res.victim_ran_again = True
                        self.note(f"elastic job {res.victim} runs again")
                        break
                    time.sleep(3)
                else:
                    res.victim_ran_again = False
        finally:
            slurm(lab, "scancel", res.victim, *res.training_jobs, check=False)
        return res
