"""The bridge at work on the lab, end to end: real Slurm, real Triton, real nginx, traffic
from the load generator through nginx.

A load step on `busy` makes p99 breach; the reconciler lends the elastic node (its
elastic job is requeued by Slurm), Triton starts there as a Slurm job and enters routing;
when the load falls to a trickle the lease is returned (out of routing, drained,
unloaded, cancelled) with no failed request, and the node is back with Slurm.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler, TickReport
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.leases.states import LeaseState
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.load.arrivals import poisson
from bridge.load.report import Report, summarize
from bridge.load.runner import RunConfig, parse_endpoint, run
from bridge.paths import project_root
from bridge.routing import nginx
from bridge.routing.nginxctl import NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.slurm.cli import SlurmCLI
from bridge.triton.client import TritonHttpClient

pytestmark = pytest.mark.lab
TICK_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Load(threading.Thread):
    """`stb load`'s runner in a thread: Poisson at `rate` for `duration` s via nginx."""

    def __init__(self, endpoint: str, rate: float, duration: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.config = RunConfig(
            endpoints=(parse_endpoint(endpoint),),
            model="busy",
            shape=(16,),
            max_requests=20_000,
            max_duration_s=duration,
            concurrency_cap=2_000,
            timeout_s=30,
        )
        self.schedule = poisson(rate, duration, seed)
        self.rate = rate
        self.report: Report | None = None

    def run(self) -> None:
        self.report = summarize(asyncio.run(run(self.schedule, self.config, target_rate=self.rate)))


@pytest.fixture
def bridge(lab: LabSpec, tmp_path: Path) -> Iterator[tuple[Reconciler, str]]:
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    port = _free_port()
    config = base.model_copy(
        update={
            "database_url": f"sqlite:///{tmp_path / 'bridge.db'}",
            "triton": triton.job_config(lab),
            "policy": base.policy.model_copy(
                update={
                    "breach_evaluations": 2,
                    "calm_evaluations": 3,
                    "scale_out_cooldown_s": 0,
                    "scale_in_cooldown_s": 6,
                    "max_lent_nodes": 1,
                }
            ),
        }
    )
    engine = make_engine(config.database_url)
    create_schema(engine)
    clients: dict[str, TritonHttpClient] = {}

    def triton_for(address: str) -> TritonHttpClient:
        if address not in clients:
            clients[address] = TritonHttpClient(address, api_key=triton.api_key(lab))
        return clients[address]

    proc = NginxProcess(tmp_path / "nginx")
    proc.start()
    publisher = RoutingPublisher(
        proc.routing_conf,
        tmp_path / "http_sd.json",
        proc.control,
        settings=nginx.NginxSettings(listen=f"127.0.0.1:{port}"),
    )
    cli = SlurmCLI(env=lab.env())
    rec = Reconciler(
        config, cli, LeaseStore(engine), Observer(cli, config, triton_for), triton_for, publisher
    )
    try:
        yield rec, f"127.0.0.1:{port}"
    finally:
        proc.stop()
        for c in clients.values():
            c.close()
        for job in cli.jobs(tag="stb:triton"):
            cli.cancel(job.job_id)
        for resv in cli.reservations():
            if resv.name.startswith("stb-lease-"):
                cli.delete_reservation(resv.name)


def _tick_until(
    rec: Reconciler, what: str, done: object, timeout_s: float, timeline: list[str], t0: float
) -> TickReport:
    deadline = time.monotonic() + timeout_s
    while True:
        report = rec.run_once(datetime.now(UTC))
        for line in [*report.events, *(f"error: {e}" for e in report.errors)]:
            timeline.append(f"{time.monotonic() - t0:6.1f}s {line}")
        if callable(done) and done():
            return report
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s:\n" + "\n".join(timeline)
        time.sleep(TICK_S)


def test_load_step_lends_the_elastic_node_and_returns_it_without_a_failed_request(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    elastic = lab.pool_nodes("elastic")[0].name
    victim = slurm(
        lab,
        "sbatch",
        "--parsable",
        "-p",
        "elastic",
        "-A",
        "team-nlp",
        "--exclusive",
        f"--gres=gpu:{lab.gpus_per_node}",
        "--requeue",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 900",
    ).strip()
    # Training runs on every training node, so the elastic node is the cheapest to take.
    training = [
        slurm(
            lab,
            "sbatch",
            "--parsable",
            "-p",
            "train",
            "-A",
            "team-vision",
            "-w",
            n.name,
            f"--gres=gpu:{lab.gpus_per_node}",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 900",
        ).strip()
        for n in lab.pool_nodes("train")
    ]
    timeline: list[str] = []
    t0 = time.monotonic()
    store = rec.store
    try:
        # 1. The baseline on the reserved node, started by the reconciler, in routing.
        _tick_until(
            rec,
            "baseline serving",
            lambda: any(
                s.ready
                for s in rec.observer.triton_servers(
                    rec.observer.last_nodes, rec.observer.last_jobs
                )
            ),
            90,
            timeline,
            t0,
        )
        # 2. A load step above one replica's capacity (busy: 50/s): p99 breaches.
        heavy = Load(endpoint, rate=70, duration=70, seed=11)
        heavy.start()
        _tick_until(
            rec,
            "a lease serving",
            lambda: any(lease.state == LeaseState.SERVING for lease in store.open_leases()),
            100,
            timeline,
            t0,
        )
        (lease,) = store.open_leases()
        assert (lease.node, lease.pool, lease.models) == (elastic, "elastic", ["busy"])
        restarts = slurm(lab, "scontrol", "show", "job", victim)
        assert "Restarts=1" in restarts  # Slurm requeued the elastic job
        heavy.join(timeout=120)
        assert heavy.report is not None
        # 3. Load falls to a trickle: the lease is returned with no failed request.
        light = Load(endpoint, rate=4, duration=60, seed=12)
        light.start()
        _tick_until(rec, "the lease returned", lambda: not store.open_leases(), 90, timeline, t0)
        light.join(timeout=120)
        assert light.report is not None
        states = [e.to_state for e in store.history(lease.id or 0)]
        print("\n".join(timeline))
        print(
            f"heavy: {heavy.report.total.ok} ok, {heavy.report.total.errors} errors, p99 "
            f"{heavy.report.total.latency.p99_ms} ms; light: {light.report.total.ok} ok, "
            f"errors {light.report.total.errors}"
        )
        assert [s.value for s in states] == [
            "requested",
            "submitted",
            "starting",
            "serving",
            "draining",
            "releasing",
            "returned",
        ]
        assert light.report.total.errors == {} and light.report.total.dropped == 0
        assert heavy.report.total.errors == {}
        # The node is back with Slurm: no fence, no Triton job left on it.
        assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
        assert not [
            j
            for j in rec.slurm.jobs(tag="stb:triton")
            if elastic in j.nodes and j.state == "RUNNING"
        ]
        # No training job was touched.
        for job_id in training:
            assert "JobState=RUNNING" in slurm(lab, "scontrol", "show", "job", job_id)
    finally:
        slurm(lab, "scancel", victim, *training, check=False)
