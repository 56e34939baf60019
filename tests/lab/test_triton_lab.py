"""Triton as a Slurm job on the lab: readiness, inference, the keyed repository API,
graceful exit on scancel, the GPU booking in sacct, and preemption of elastic work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.triton.client import DEFAULT_API_KEY_HEADER

from .helpers import (
    gpu_count,
    sacct_records,
    sbatch,
    scontrol_show,
    squeue_state,
    wait_sacct_final,
    wait_state,
)

pytestmark = pytest.mark.lab


@dataclass(frozen=True)
class Preemption:
    """An elastic job running on an elastic node, and a Triton job submitted there."""

    node: str
    victim: str
    triton_job: str
    submitted_at: float  # time.monotonic()


@pytest.fixture(scope="module", autouse=True)
def preemption(lab: LabSpec) -> Iterator[Preemption]:
    """Started before the module's first test, so that the slow part of the last test runs
    beside the others (they use the reserved node, this the elastic one): slurmctld
    carries out a preemption's GraceTime in its background pass, every 30 s, so the
    Triton job waits 18-33 s for its node."""
    elastic = lab.pool_nodes("elastic")[0].name
    victim = sbatch(
        lab,
        "--partition=elastic",
        "--account=team-nlp",
        "--exclusive",
        f"--gres=gpu:{lab.gpus_per_node}",
        "--requeue",
        "--wrap",
        "sleep 600",
    )
    job_id = ""
    try:
        wait_state(lab, victim, {"RUNNING"}, timeout_s=60)
        t0 = time.monotonic()
        job_id = triton.submit(lab, node=elastic, exclusive=True, name="stb-triton-lent")
        yield Preemption(elastic, victim, job_id, t0)
    finally:
        for job in (job_id, victim):
            if job:
                slurm(lab, "scancel", job, check=False)


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    reserved = lab.pool_nodes("infer")[0].name
    job_id = triton.submit(lab, node=reserved, name="stb-triton-test")
    try:
        yield triton.wait_ready(lab, job_id, timeout_s=120)
    finally:
        slurm(lab, "scancel", job_id, check=False)


def test_triton_runs_on_the_reserved_node_bound_to_its_address(
    lab: LabSpec, served: triton.TritonJob
) -> None:
    assert served.node == lab.pool_nodes("infer")[0].name
    assert served.addr == lab.pool_nodes("infer")[0].addr
    fields = scontrol_show(lab, "job", served.job_id)[served.job_id]
    assert fields["Partition"] == "infer"
    assert fields["Account"] == "bridge"
    assert "stb:triton" in fields["Comment"].split(",")
    client = httpclient.InferenceServerClient(served.http_url)
    assert client.is_server_ready()
    client.close()
    # Bound to the node's own address only: another loopback address gets no answer.
    with pytest.raises(Exception):  # noqa: B017 - any connection error
        httpclient.InferenceServerClient("127.0.1.250:8000", connection_timeout=1).is_server_live()


def test_both_example_models_answer_over_http_and_grpc(served: triton.TritonJob) -> None:
    data = np.arange(8, dtype=np.float32)
    http = httpclient.InferenceServerClient(served.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 8], "FP32")
    inp.set_data_from_numpy(data.reshape(1, -1))
    out = http.infer("echo", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, data.reshape(1, -1))

    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    ginp = grpcclient.InferInput("INPUT0", [8], "FP32")
    ginp.set_data_from_numpy(data)
    start = time.perf_counter()
    total = grpc.infer("busy", [ginp]).as_numpy("OUTPUT0")
    took_ms = (time.perf_counter() - start) * 1000
    assert total[0] == pytest.approx(float(data.sum()))
    assert took_ms >= 20  # busy holds the instance for service_time_ms = 20
    http.close()
    grpc.close()


def test_model_repository_api_needs_the_key(lab: LabSpec, served: triton.TritonJob) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_model_repository_index()
    with pytest.raises(InferenceServerException, match="restricted"):
        client.unload_model("echo")
    assert client.is_model_ready("echo")
    key = {DEFAULT_API_KEY_HEADER: triton.api_key(lab)}
    names = {m["name"] for m in client.get_model_repository_index(headers=key)}
    assert {"echo", "busy"} <= names
    client.unload_model("echo", headers=key)
    deadline = time.monotonic() + 20
    while client.is_model_ready("echo") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not client.is_model_ready("echo")
    client.load_model("echo", headers=key)
    assert client.is_model_ready("echo")
    # A wrong key is refused too.
    with pytest.raises(InferenceServerException, match="restricted"):
        client.load_model("echo", headers={DEFAULT_API_KEY_HEADER: "wrong"})
    client.close()


def test_scancel_stops_triton_gracefully_and_sacct_books_its_gpu(
    lab: LabSpec, served: triton.TritonJob
) -> None:
    slurm(lab, "scancel", served.job_id)
    rec = wait_sacct_final(lab, served.job_id, timeout_s=60)
    assert rec["state"]["current"] == "CANCELLED"
    assert gpu_count(rec) == 1
    assert rec["partition"] == "infer"
    assert "stb:triton" in rec["comment"]["job"].split(",")
    # The job record closes at scancel; the batch step (tritonserver itself, exec'd by
    # the script) ends when Triton has drained and unloaded: exit 0 means graceful.
    deadline = time.monotonic() + 60
    batch: dict[str, object] = {}
    while time.monotonic() < deadline:
        steps = sacct_records(lab, served.job_id)[-1]["steps"]
        batch = next((st for st in steps if st["step"]["name"] == "batch"), {})
        # While Triton drains, the step reads CANCELLED; it turns COMPLETED when it exits.
        if batch and batch["state"] in ("COMPLETED", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        time.sleep(0.5)
    assert batch["state"] == "COMPLETED", batch
    assert batch["exit_code"] == {"status": "SUCCESS", "return_code": 0}, batch
    log = (lab.log_dir / f"triton-{served.job_id}.log").read_text()
    assert "Waiting for in-flight requests to complete" in log
    assert "successfully unloaded 'busy'" in log


def test_triton_on_an_elastic_node_requeues_the_elastic_job_which_runs_again(
    lab: LabSpec, preemption: Preemption
) -> None:
    elastic, victim, job_id = preemption.node, preemption.victim, preemption.triton_job
    try:
        job = triton.wait_ready(lab, job_id, timeout_s=120)
        took = time.monotonic() - preemption.submitted_at
        print(f"Triton ready on {elastic} after preemption in {took:.1f}s")
        assert job.node == elastic
        state, _ = squeue_state(lab, victim)
        assert state == "PENDING"
        fields = scontrol_show(lab, "job", victim)[victim]
        assert fields["Restarts"] == "1"
    finally:
        slurm(lab, "scancel", job_id)
    # Slurm holds a requeued job back for cred_expire + 1 = 31 s on the lab (BeginTime), then
    # runs it.
    wait_state(lab, victim, {"RUNNING"}, timeout_s=240)
    runs = sacct_records(lab, victim, duplicates=True)
    states = [r["state"]["current"] for r in runs]
    assert states[0] == "PREEMPTED" and states[-1] == "RUNNING", states
    assert gpu_count(runs[0]) == lab.gpus_per_node
    slurm(lab, "scancel", victim)
