"""The observe step on the lab: a snapshot of real Slurm nodes and jobs and a real Triton
server, and a latency history that moves when load arrives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.daemon.observation import snapshot
from bridge.daemon.observe import Observer
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.load.arrivals import poisson
from bridge.load.runner import RunConfig, parse_endpoint, run
from bridge.slurm.cli import SlurmCLI
from bridge.triton.client import TritonHttpClient

pytestmark = pytest.mark.lab

CONFIG = BridgeConfig(
    models={"busy": ModelConfig(slo_p99_ms=100), "echo": ModelConfig(slo_p99_ms=50)},
    policy=PolicyConfig(breach_evaluations=2),
)


@pytest.fixture(scope="module")
def baseline(lab: LabSpec) -> Iterator[triton.TritonJob]:
    job_id = triton.submit(lab, node=lab.pool_nodes("infer")[0].name, name="stb-triton-obs")
    try:
        yield triton.wait_ready(lab, job_id, timeout_s=120)
    finally:
        slurm(lab, "scancel", job_id, check=False)


def test_snapshot_of_the_lab(lab: LabSpec, baseline: triton.TritonJob) -> None:
    clients: dict[str, TritonHttpClient] = {}

    def triton_for(address: str) -> TritonHttpClient:
        if address not in clients:
            clients[address] = TritonHttpClient(address, api_key=triton.api_key(lab))
        return clients[address]

    observer = Observer(SlurmCLI(env=lab.env()), CONFIG, triton_for)
    elastic = lab.pool_nodes("elastic")[0].name
    work = slurm(
        lab,
        "sbatch",
        "--parsable",
        "-p",
        "elastic",
        "-A",
        "team-nlp",
        "--gres=gpu:2",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 120",
    ).strip()
    try:
        deadline = time.monotonic() + 60
        while "RUNNING" not in slurm(lab, "squeue", "-h", "-j", work, "-o", "%T"):
            assert time.monotonic() < deadline, "the elastic job never started"
            time.sleep(0.5)
        obs = observer.observe(time.time())
        snap, servers = snapshot(obs, CONFIG, [], {}), obs.servers
        pools = {n.name: n.pool for n in snap.nodes}
        assert pools == {
            n.name: {"train": "training", "elastic": "elastic", "infer": "inference"}[n.pool]
            for n in lab.nodes
        }
        nodes = {n.name: n for n in snap.nodes}
        assert nodes[baseline.node].has_triton and not nodes[elastic].has_triton
        (job,) = nodes[elastic].jobs
        assert job.job_id == work and job.gpus == 2 and job.started_at is not None
        assert all(n.usable for n in snap.nodes)
        (replica,) = [r for r in snap.replicas if r.node == baseline.node]
        # every model of the repository but the LLM (smol: stb.load_at_start false),
        # which the server's index lists without loading it
        assert set(replica.models) == {"busy", "echo"} and replica.lease_id is None
        index = {m.name: m for m in triton_for(baseline.http_url).repository_index()}
        assert "smol" in index and index["smol"].state != "READY", index.get("smol")
        assert [s.address for s in servers if s.ready] == [baseline.http_url]
        assert len(snap.history["busy"]) == 1  # first sight: no window yet
        assert snap.history["busy"][0].request_rate is None

        config = RunConfig(
            endpoints=(parse_endpoint(baseline.http_url),),
            model="busy",
            shape=(16,),
            max_requests=500,
            max_duration_s=4,
            concurrency_cap=500,
            timeout_s=30,
        )
        asyncio.run(run(poisson(20, 4, seed=3), config, target_rate=20))
        time.sleep(1)
        snap = snapshot(observer.observe(time.time()), CONFIG, [], {})
        latest = snap.history["busy"][-1]
        assert latest.request_rate is not None and latest.request_rate > 5
        assert latest.p99_ms is not None and latest.p99_ms >= 20  # busy serves in 20 ms
        assert snap.history["echo"][-1].request_rate == 0  # idle, but measured
    finally:
        slurm(lab, "scancel", work, check=False)
        for c in clients.values():
            c.close()
