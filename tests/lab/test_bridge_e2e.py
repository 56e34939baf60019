"""The bridge at work on the lab, end to end: real Slurm, real Triton, real nginx, traffic
from the load generator through nginx.

A load step on `busy` makes p99 breach; the reconciler lends the elastic node (its
elastic job is requeued by Slurm), Triton starts there as a Slurm job and enters routing;
when the load falls to a trickle the lease is returned (out of routing, drained,
unloaded, cancelled) with no failed request, and the node is back with Slurm.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.showcase import Scenario
from bridge.lab.spec import LabSpec
from bridge.leases.store import LeaseStore, create_schema, make_engine
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


def test_load_step_lends_the_elastic_node_and_returns_it_without_a_failed_request(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    res = Scenario(lab, rec, endpoint).run(wait_requeued=False)
    assert res.heavy is not None and res.light is not None
    print(
        f"heavy: {res.heavy.total.ok} ok, p99 {res.heavy.total.latency.p99_ms} ms; "
        f"light: {res.light.total.ok} ok"
    )
    assert res.lease_node == lab.pool_nodes("elastic")[0].name
    assert res.lease_states == [
        "requested",
        "submitted",
        "starting",
        "serving",
        "draining",
        "releasing",
        "returned",
    ]
    assert res.victim_restarts == 1  # Slurm requeued the elastic job
    assert res.training_untouched  # no training job killed or requeued
    # No request failed, during the load step or during the return.
    assert res.heavy.total.errors == {} and res.heavy.total.dropped == 0
    assert res.light.total.errors == {} and res.light.total.dropped == 0
    # The node is back with Slurm: no fence, no Triton job left on it.
    assert not [r for r in rec.slurm.reservations() if r.name.startswith("stb-lease-")]
    assert not [
        j
        for j in rec.slurm.jobs(tag="stb:triton")
        if res.lease_node in j.nodes and j.state == "RUNNING"
    ]
