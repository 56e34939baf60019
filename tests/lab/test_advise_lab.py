"""Advisory mode on the lab: under a load step on `busy` through nginx, `stb daemon
--advise`'s pass records a lend and changes nothing in Slurm, Triton or routing; then the
same step with the active reconciler lends, and the advised lend is the active one.

The scenario (the demo's, which test_sim_vs_lab compares, shortened): training on the
training nodes, an elastic job on the elastic node, the baseline Triton up on the reserved
node (started by the active reconciler: the advisory starts nothing); then a step of 60
req/s on busy for at most 30 s (its one 20 ms instance serves 50/s) through the fixture's
nginx. Both passes tick on a grid t0 + k x tick_s from the step's start t0, as the demo's
passes do.

- Phase A, advisory (wired by `service.build_advisory`, as `stb daemon --advise` wires it,
  with the fixture's routing files in its configuration, so routing published by mistake
  would land in the very files compared): it must advise a lend. The load stops, and the
  advisory goes on ticking for a few passes (its shadow lease starts and serves). squeue's
  jobs of this test and every Triton job (id, state, nodes), sinfo's nodes (state,
  reason), Slurm's reservations, every Triton server's repository index and both routing
  files (nginx upstreams, http_sd) must be the same as before the step, byte for byte for
  the files. `stb advise report`
  on its record then replays the window (the lab's nodes, sacct) with and without
  lending.
- Phase B, active: the reconciler (a fresh observer: its last reading predates phase A;
  a fresh baseline Triton, whose p99 window holds none of phase A's slow requests, as
  phase A's held none) under the same step; it must lend, and the lend is returned
  before the test ends (an operator's hold on the lendable pools, so that no other lend
  follows).
- The advised lend and the active one: same node, pool and models, and the same tick of
  the step within 2 ticks (both see the step in the first ticks; the load generator takes
  a moment to reach its rate, and the answered rate the capacity model reads lags by up
  to a tick). Ticks, not seconds: the tolerance is in the control loop's own steps.

A second test runs `stb daemon --advise` itself: its log and /healthz say it is advisory,
and with no baseline on the reserved node it advises one and submits nothing.

Traffic goes only to 127.0.0.1 (the fixture's nginx), bounded by count and time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from bridge.advise import service as advise_service
from bridge.audit.asks import hold_pool, release_pool
from bridge.cli import app
from bridge.config import BridgeConfig, load_config
from bridge.daemon.clients import TritonClients
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.leases.advice import AdviceStore
from bridge.leases.store import make_engine
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import Schedule, poisson
from bridge.paths import project_root
from bridge.policy import Lend
from bridge.routing.publisher import RoutingPublisher
from bridge.triton.catalog import site_models

from .helpers import (
    Sender,
    cancel_triton_jobs,
    sbatch,
    squeue_state,
    tick_until,
    tick_until_baseline,
)

pytestmark = pytest.mark.lab

MODEL = "busy"
HEAVY_RATE = 60.0  # req/s: 1.2 x what busy's one 20 ms instance serves
HEAVY_S = 30.0  # the longest a phase's step lasts: the lend comes in its first ticks
TOLERANCE_TICKS = 2
#: the advisory's passes after its step (its shadow lease starts and serves meanwhile)
AFTER_TICKS = 5


def _step() -> Schedule:
    offsets = poisson(HEAVY_RATE, HEAVY_S, seed=21).offsets
    return Schedule(tuple(offsets), HEAVY_S, f"{HEAVY_RATE:g}/s for {HEAVY_S:g}s")


def _world(
    lab: LabSpec, clients: TritonClients, servers: list[str], mine: list[str]
) -> dict[str, Any]:
    """What the advisory must not change: the state and nodes of this test's jobs and of
    every Triton job (a new one included), the nodes' states and reasons (no drain),
    Slurm's reservations, each Triton server's repository index."""
    jobs = [
        line
        for line in slurm(lab, "squeue", "-h", "-o", "%i|%j|%T|%N").splitlines()
        if line.split("|")[0] in mine or line.split("|")[1].startswith("stb-triton")
    ]
    nodes = slurm(lab, "sinfo", "-h", "-N", "-o", "%N|%P|%T|%E").splitlines()
    reservations = slurm(lab, "scontrol", "show", "reservation", "-o", check=False)
    index = {
        address: sorted((m.name, m.version, m.state) for m in clients(address).repository_index())
        for address in servers
    }
    return {
        "jobs": sorted(jobs),
        "nodes": sorted(nodes),
        "reservations": reservations.strip(),
        "triton": index,
    }


def _files(publisher: RoutingPublisher) -> dict[str, bytes]:
    return {
        str(path): Path(path).read_bytes()
        for path in (publisher.nginx_conf_path, publisher.sd_path)
    }


def _step_ticks(
    tick: float,
    run_once: Callable[[datetime], Any],
    lend_of: Callable[[Any], Lend | None],
    endpoint: str,
    log: list[str],
    ticks_after: int = 2,
) -> tuple[int, float, Lend, Sender]:
    """Start the step and tick on the grid t0 + k x tick until a pass lends, then
    `ticks_after` more; the lend's tick k, its time after t0, the lend, the sender."""
    sender = Sender(endpoint, _step(), MODEL)
    # a pass at t0 itself, just before the load starts: the first tick of the step then
    # reads the same window (t0, t0 + tick] in both phases
    log += [f"   0.0s k=0 {line}" for line in run_once(datetime.now(UTC)).lines()]
    t0 = time.time()
    sender.start()
    found: tuple[int, float, Lend] | None = None
    k = 0
    while True:
        k += 1
        time.sleep(max(0.0, t0 + k * tick - time.time()))
        now = datetime.now(UTC)
        report = run_once(now)
        at = now.timestamp() - t0
        log += [f"{at:6.1f}s k={k} {line}" for line in report.lines()]
        lend = lend_of(report)
        if lend is not None and found is None:
            found = (k, at, lend)
        if found is not None and k >= found[0] + ticks_after:
            return (*found, sender)
        assert at < HEAVY_S, "no lend in the step:\n" + "\n".join(log)


def _warm(
    run_once: Callable[[datetime], Any], latest: Callable[[], Any], tick: float, log: list[str]
) -> None:
    """Passes every tick until busy has a rate (a fresh observer's second pass: counter
    deltas), as both phases start from."""
    deadline = time.monotonic() + 30
    while (s := latest()) is None or s.request_rate is None:
        log += [f"  <0s  {line}" for line in run_once(datetime.now(UTC)).lines()]
        assert time.monotonic() < deadline, "busy's rate was never read"
        time.sleep(tick)


def _first_lend(report: Any) -> Lend | None:
    return next((a for a in report.actions if isinstance(a, Lend)), None)


def test_the_advisory_records_the_active_lend_and_changes_nothing(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    config = rec.config
    tick = config.tick_s
    publisher = rec.actuator.router
    assert isinstance(publisher, RoutingPublisher)
    gpus = f"--gres=gpu:{lab.gpus_per_node}"
    training = [
        sbatch(lab, "-p", "train", "-A", "team-vision", "-w", n.name, gpus, "--wrap", "sleep 900")
        for n in lab.pool_nodes("train")
    ]
    elastic = sbatch(
        lab, "-p", "elastic", "-A", "team-nlp", "--exclusive", gpus, "--requeue",
        "--wrap", "sleep 900",
    )  # fmt: skip
    clients = TritonClients(triton.api_key(lab))
    log: list[str] = []
    senders: list[Sender] = []
    advisory = None
    try:
        # The baseline up and in routing (the active reconciler starts it), the batch work
        # running.
        tick_until_baseline(rec, lab, log)
        tick_until(
            rec,
            lambda: all(squeue_state(lab, j)[0] == "RUNNING" for j in [*training, elastic]),
            120,
            log,
        )
        assert rec.last_observation is not None
        servers = [s.address for s in rec.last_observation.servers if s.ready]

        # ---- phase A: the advisory -----------------------------------------------
        routing = config.routing.model_copy(
            update={
                "nginx_conf": Path(publisher.nginx_conf_path),
                "http_sd_file": Path(publisher.sd_path),
                "managed_nginx_prefix": None,
            }
        )
        adv_config: BridgeConfig = config.model_copy(
            update={"database_url": f"sqlite:///{tmp_path / 'advice.db'}", "routing": routing}
        )
        advisory = advise_service.build_advisory(adv_config, slurm_env=lab.env())
        adv = advisory.advisor
        began = datetime.now(UTC).replace(microsecond=0)

        _warm(adv.run_once, lambda: _latest(adv.last_observation), tick, log)
        mine = [*training, elastic]
        before = _world(lab, clients, servers, mine)
        files = _files(publisher)
        k_adv, at_adv, advised, sender = _step_ticks(tick, adv.run_once, _first_lend, endpoint, log)
        senders.append(sender)
        sender.stop()

        # ---- then: the advisory ticks on while its shadow lease starts and serves -----
        # (it acts on nothing, so the reconciler sees none of phase A)
        for _ in range(AFTER_TICKS):
            time.sleep(tick)
            log += [f"  after {line}" for line in adv.run_once(datetime.now(UTC)).lines()]
        after = _world(lab, clients, servers, mine)
        assert after == before, f"the advisory changed the world:\n{before}\n{after}"
        assert _files(publisher) == files, "the advisory changed routing"
        store = AdviceStore(make_engine(adv_config.database_url))
        epoch = datetime.fromtimestamp(0, UTC)
        (row,) = [a for a in store.advice_between(epoch, datetime.now(UTC)) if a.kind == "lend"]
        assert (row.node, row.pool, row.models) == (
            advised.node, advised.pool, list(advised.models),
        )  # fmt: skip
        assert row.figures["models"][MODEL]["rate"] > 0
        assert store.samples_between(epoch, datetime.now(UTC))
        # `stb advise report` on this record: the window replayed through the simulator
        # on the lab's nodes and sacct, with and without lending
        doc = json.loads(_report(lab, adv_config, began, "json"))
        assert doc["replay_error"] is None, doc["replay_error"]
        replayed = doc["replay"]["results"]
        assert replayed["no lending"]["lends"] == 0 and replayed["lending"]["lends"] >= 1
        report_table = _report(lab, adv_config, began, "table")

        # ---- phase B: the active reconciler under the same step --------------------
        # It starts as calm as phase A did: Triton's p99 summary keeps phase A's slow
        # requests for a minute, so the baseline is restarted (the reconciler starts a
        # fresh one in seconds) rather than waited out. A fresh observer (its last
        # reading predates phase A); two passes, so that the step's first tick has
        # counter deltas, as the advisory's had.
        low = config.policy.low_watermark * site_models(config).scaled[MODEL].slo_p99_ms

        def calm(s: Any) -> bool:
            return (
                s is not None
                and s.request_rate is not None
                and s.request_rate < 1
                and (s.p99_ms is None or s.p99_ms < low)
            )

        rec.observer.close()
        # Phase A is over: its clients, this test's, the reconciler's and nginx's idle
        # upstream connections let go of the baseline first, as the bridge does before it
        # stops a server (bridge/daemon/clients.py): an open keep-alive connection makes
        # tritonserver wait out its whole exit timeout (20 s in the lab) before it exits.
        advisory.close()
        advisory = None
        clients.close()
        reconciler_clients = rec.actuator.triton_for
        assert isinstance(reconciler_clients, TritonClients)
        reconciler_clients.close()
        publisher.control.reload()  # the old workers close their idle upstream connections
        cancel_triton_jobs(lab)
        rec.observer = Observer(rec.slurm, config, rec.actuator.triton_for)
        tick_until_baseline(rec, lab, log)
        _warm(rec.run_once, lambda: rec.observer.latest(MODEL), tick, log)
        assert calm(rec.observer.latest(MODEL))
        assert not list(rec.store.open_leases()), "the reconciler lent before the step"

        k_act, at_act, active, sender = _step_ticks(tick, rec.run_once, _first_lend, endpoint, log)
        senders.append(sender)
        sender.stop()
        (lease,) = rec.store.open_leases()
        assert lease.id is not None and lease.node == active.node
        # the lease back, and no other lend (the rate's forecast still climbs from the
        # step): the operator's hold on every lendable pool (`stb drain`), then lifted
        assert rec.requests is not None
        lendable = [n for n, p in config.pools.items() if p.lend_mode != "reserved"]
        for pool in lendable:
            hold_pool(rec.requests, pool, "the test is over", who="test")
        tick_until(rec, lambda: not list(rec.store.open_leases()), 90, log)
        assert rec.store.get(lease.id).state == LeaseState.RETURNED
        for pool in lendable:
            release_pool(rec.requests, pool, who="test")

        print(
            f"\nadvised lend: {advised.node} ({advised.pool}) for {','.join(advised.models)} "
            f"at k={k_adv} ({at_adv:.1f}s after the step): {advised.reason}\n"
            f"active lend:  {active.node} ({active.pool}) for {','.join(active.models)} "
            f"at k={k_act} ({at_act:.1f}s after the step): {active.reason}\n"
            f"tolerance: {TOLERANCE_TICKS} ticks of {tick:g}s; shadow lease states at the "
            f"end of phase A: {adv.book.states()}"
        )
        print(report_table)
        print("\n".join(log))
        assert (advised.node, advised.pool, advised.models) == (
            active.node, active.pool, active.models,
        )  # fmt: skip
        assert advised.node == lab.pool_nodes("elastic")[0].name
        assert abs(k_adv - k_act) <= TOLERANCE_TICKS
    finally:
        for s in senders:
            s.stop()
        if advisory is not None:
            advisory.close()
        clients.close()
        slurm(lab, "scancel", elastic, *training, check=False)


def _report(lab: LabSpec, config: BridgeConfig, since: datetime, fmt: str) -> str:
    """`stb advise report` over [since, now) on the advisory's database, with the lab's
    configuration and the test's policy (as environment overrides)."""
    p = config.policy
    env = lab.env() | {
        "STB_DATABASE_URL": config.database_url,
        "STB_POLICY__BREACH_EVALUATIONS": str(p.breach_evaluations),
        "STB_POLICY__RETURN_DWELL_S": str(p.return_dwell_s),
        "STB_POLICY__SCALE_OUT_COOLDOWN_S": str(p.scale_out_cooldown_s),
        "STB_POLICY__SCALE_IN_COOLDOWN_S": str(p.scale_in_cooldown_s),
        "STB_POLICY__MAX_LENT_NODES": str(p.max_lent_nodes),
    }
    toml = project_root() / "deploy" / "lab" / "bridge.toml"
    window = f"{since:%Y-%m-%dT%H:%M:%S}..now"
    argv = ["advise", "report", "--window", window, "-c", str(toml), "--format", fmt]
    result = CliRunner().invoke(app, argv, env=env)
    assert result.exit_code == 0, result.output
    return result.output


def _latest(obs: Any) -> Any:
    if obs is None:
        return None
    history = obs.history.get(MODEL, ())
    return history[-1] if history else None


def test_stb_daemon_advise_says_so_and_starts_nothing(
    lab: LabSpec, daemon_config: Path, tmp_path: Path
) -> None:
    cfg = load_config(daemon_config)
    env = os.environ | lab.env() | {"STB_HOME": str(project_root())}
    stb = str(Path(sys.executable).with_name("stb"))
    reserved = lab.pool_nodes("infer")[0].name

    def triton_jobs() -> set[str]:
        lines = slurm(lab, "squeue", "-h", "-o", "%i|%j|%N").splitlines()
        return {line for line in lines if line.split("|")[1].startswith("stb-triton")}

    before = triton_jobs()
    has_baseline = any(line.endswith(f"|{reserved}") for line in before)
    with open(tmp_path / "advise.log", "wb") as log:
        proc = subprocess.Popen(
            [stb, "daemon", "--advise", "-c", str(daemon_config)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            body: dict[str, Any] = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    body = httpx.get(f"http://{cfg.daemon.exporter_listen}/healthz").json()
                except (httpx.HTTPError, json.JSONDecodeError):
                    body = {}
                if body.get("healthy") and body.get("role") == "advisory":
                    break
                time.sleep(0.5)
            time.sleep(3 * cfg.tick_s)  # a few more passes
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    text = (tmp_path / "advise.log").read_text()
    print(text)
    assert body.get("role") == "advisory" and body.get("healthy"), text
    assert "ADVISORY mode, acts on nothing" in text
    after = triton_jobs()
    assert after <= before, f"new Triton jobs: {after - before}"  # nothing submitted
    store = AdviceStore(make_engine(cfg.database_url))
    epoch, now = datetime.fromtimestamp(0, UTC), datetime.now(UTC)
    assert store.samples_between(epoch, now)
    advice = [(a.kind, a.node) for a in store.advice_between(epoch, now)]
    if not has_baseline:  # the daemon would submit it; the advisory records it, once
        assert advice.count(("baseline", reserved)) == 1
    assert not (tmp_path / "nginx" / "run" / "nginx.pid").exists()  # no nginx started
