"""The node-local weight cache on the lab, end to end with real Slurm, Triton and nginx:
weighty's 200 MB of weights sit behind a throttled origin (nginx, 20 MB/s a connection);
a Triton job on the elastic node with an empty cache loads them from the origin (about
10 s); a staging Slurm job (low priority, tagged stb:staging) copies the version into the
node's cache meanwhile; the next Triton job there reads the verified local copy (its log
and the model both say local) several times faster; a corrupted copy is refused by the
job (its log says why) and the model loads from the origin again. Then the daemon's
path: a staging job recorded in the catalogue is read back as complete by the daemon's
staging step, and a lend of the model on that node reads the local copy: the lease's
move to serving says so and the load is timed as a local one."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from bridge.audit.asks import ask_lend, ask_return
from bridge.config import TritonJobConfig, WeightsConfig
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab import weights as labweights
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.leases.weights import WeightStore
from bridge.lifecycle import LeaseState
from bridge.paths import project_root
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.staging import staging_job, submit_staging
from bridge.weights import manifest as mf
from bridge.weights.overlay import sources
from bridge.weights.stage import version_dir

from .helpers import sbatch, squeue_state, tick_until, tick_until_baseline, until, wait_state

pytestmark = pytest.mark.lab

SIZE = 200 * 10**6
RATE = 20 * 10**6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def origin(lab: LabSpec, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    work = tmp_path_factory.mktemp("weights")
    labweights.build_origin(work / "origin", SIZE)
    url = f"http://127.0.0.1:{_free_port()}"
    proc = labweights.start_origin(
        work / "nginx", work / "origin", int(url.rsplit(":", 1)[1]), RATE
    )
    try:
        yield url, work
    finally:
        proc.stop()


def _serve(lab: LabSpec, repo: Path, cache: Path, node: str) -> tuple[str, float, np.ndarray, str]:
    """A Triton job of weighty on `node`: (job id, seconds from submit to ready, the
    model's answer [source, load_s, bytes], the job's log)."""
    cfg = triton.job_config(lab).model_copy(update={"model_repository": repo})
    t0 = time.monotonic()
    job_id = triton.submit(lab, node=node, models=labweights.MODEL, config=cfg, weights_cache=cache)
    try:
        job = triton.wait_ready(lab, job_id, timeout_s=60)
        took = time.monotonic() - t0
        client = httpclient.InferenceServerClient(job.http_url)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        answer = client.infer(labweights.MODEL, [inp]).as_numpy("OUTPUT0")[0]
        client.close()  # an open connection would hold Triton's exit for its timeout
    finally:
        slurm(lab, "scancel", job_id)
        wait_state(lab, job_id, {""}, 60)
    log = (lab.log_dir / f"triton-{job_id}.log").read_text(errors="replace")
    return job_id, took, answer, log


def test_a_staged_copy_serves_fast_and_a_corrupt_one_is_refused(
    lab: LabSpec, origin: tuple[str, Path]
) -> None:
    url, work = origin
    node = lab.pool_nodes("elastic")[0].name
    repo = labweights.build_repository(work / "repo", url)
    cache = work / "cache"
    cache.mkdir()

    # 1. cold: nothing cached; a staging job copies the version while Triton loads
    cfg = WeightsConfig(cache_root=cache, bandwidth_bytes_s=0)
    cold_t0 = time.monotonic()
    cold_job = triton.submit(
        lab, node=node, models=labweights.MODEL,
        config=triton.job_config(lab).model_copy(update={"model_repository": repo}),
        weights_cache=cache,
    )  # fmt: skip
    cold_log = lab.log_dir / f"triton-{cold_job}.log"
    until("the cold job chose its source", lambda: "stb-weights: model=" in (
        cold_log.read_text(errors="replace") if cold_log.exists() else ""), 30)  # fmt: skip
    spec = staging_job(cfg, node=node, model=labweights.MODEL, version=1, source=url,
                       account="bridge", partition="scavenger", log_dir=lab.log_dir)  # fmt: skip
    stage_job = submit_staging(SlurmCLI(env=lab.env()), spec)
    squeue = slurm(lab, "squeue", "-h", "-j", stage_job, "-o", "%j|%k|%y|%a", check=False)
    try:
        cold = triton.wait_ready(lab, cold_job, timeout_s=60)
        cold_s = time.monotonic() - cold_t0
        client = httpclient.InferenceServerClient(cold.http_url)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        cold_answer = client.infer(labweights.MODEL, [inp]).as_numpy("OUTPUT0")[0]
        client.close()
    finally:
        slurm(lab, "scancel", cold_job)
    wait_state(lab, stage_job, {""}, 60)
    wait_state(lab, cold_job, {""}, 60)
    assert sources(cold_log.read_text()) == {labweights.MODEL: (1, "shared")}
    assert cold_answer[0] == 0.0 and cold_answer[2] == SIZE  # from the origin, all of it
    assert cold_answer[1] >= 0.8 * SIZE / RATE  # throttled: ~10 s
    if squeue:  # seen queued or running: the name, the nice value and the account
        name, comment, nice, account = squeue.strip().split("|")
        assert (name, comment, int(nice), account) == (
            "stb-staging-weighty-1",
            "stb:staging",
            10000,
            "bridge",
        )
    stage_log = (lab.log_dir / f"stage-{stage_job}.log").read_text()
    assert "stb-weights: staged model=weighty version=1" in stage_log, stage_log
    assert "copied=yes" in stage_log
    copy = cache / labweights.MODEL / "1"
    assert mf.verify(copy, labweights.MODEL, 1).ok
    assert mf.read(copy).source == url

    # 2. warm: the verified local copy
    _, warm_s, warm_answer, warm_log = _serve(lab, repo, cache, node)
    assert sources(warm_log) == {labweights.MODEL: (1, "local")}, warm_log
    assert "unchanged since verified at" in warm_log  # the staging job's stamp: no re-read
    assert warm_answer[0] == 1.0 and warm_answer[2] == SIZE
    assert warm_answer[1] < 2.0, warm_answer  # the model's own load
    assert warm_s < cold_s / 2, (warm_s, cold_s)

    # 3. a corrupted copy (same size, one byte flipped) is refused: the origin again
    # (and its mtime set back: only the ctime, which no user sets, says it was written)
    blob = copy / labweights.WEIGHTS
    before = blob.stat()
    with open(blob, "r+b") as f:
        f.seek(SIZE // 2)
        byte = f.read(1)
        f.seek(SIZE // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert blob.stat().st_mtime_ns == before.st_mtime_ns
    _, bad_s, bad_answer, bad_log = _serve(lab, repo, cache, node)
    assert sources(bad_log) == {labweights.MODEL: (1, "shared")}, bad_log
    assert "sha256" in bad_log and "the manifest says" in bad_log
    assert bad_answer[0] == 0.0 and bad_answer[2] == SIZE
    print(
        f"\nweights lab: {SIZE / 1e6:.0f} MB at {RATE / 1e6:.0f} MB/s: submit->ready cold "
        f"{cold_s:.1f} s (model load {cold_answer[1]:.1f} s), local {warm_s:.1f} s (model "
        f"load {warm_answer[1]:.2f} s), corrupt copy refused {bad_s:.1f} s"
    )


def _restarts(lab: LabSpec, job_id: str) -> int:
    out = slurm(lab, "scontrol", "show", "job", "-o", job_id, check=False)
    m = re.search(r"\bRestarts=(\d+)", out)
    return int(m.group(1)) if m else -1


def _started_after(lab: LabSpec, job_id: str, t0: float) -> float:
    """Seconds from `t0` to the job's RUNNING, polled every 0.1 s (at most 60 s)."""
    until(f"job {job_id} running", lambda: squeue_state(lab, job_id)[0] == "RUNNING", 60, 0.1)
    return time.monotonic() - t0


def test_a_staging_job_yields_to_an_elastic_job_that_wants_its_node(
    lab: LabSpec, origin: tuple[str, Path]
) -> None:
    """A staging job in the scavenger partition (the lowest PriorityTier, preempted with
    no grace) on the elastic node: an elastic job asking for the whole node starts as
    soon as it would on an idle node, and the staging job is requeued (not failed), to
    start over later. Baseline: the same elastic job on the idle node."""
    url, work = origin
    node = lab.pool_nodes("elastic")[0].name
    account = lab.accounts[0]

    def whole_node_job() -> tuple[str, float]:
        t0 = time.monotonic()
        job = sbatch(lab, "--partition=elastic", f"--account={account}", f"--nodelist={node}",
                     "--exclusive", "--job-name=wants-the-node", "--wrap=sleep 3")  # fmt: skip
        return job, _started_after(lab, job, t0)

    alone, alone_s = whole_node_job()
    wait_state(lab, alone, {""}, 60)

    # staging throttled to 4 MB/s: 200 MB would hold the node's core for about 50 s
    cfg = WeightsConfig(cache_root=work / "cache-yield", bandwidth_bytes_s=4 * 10**6)
    spec = staging_job(cfg, node=node, model=labweights.MODEL, version=1, source=url,
                       account="bridge", partition="scavenger", log_dir=lab.log_dir)  # fmt: skip
    stage_job = submit_staging(SlurmCLI(env=lab.env()), spec)
    jobs = [stage_job]
    try:
        _started_after(lab, stage_job, time.monotonic())
        stage_log = lab.log_dir / f"stage-{stage_job}.log"
        until("the staging job copying", lambda: stage_log.exists() and "stb-staging: job"
              in stage_log.read_text(errors="replace"), 30)  # fmt: skip
        beside, beside_s = whole_node_job()
        jobs.append(beside)
        assert squeue_state(lab, stage_job)[0] != "RUNNING"  # it gave the node up
        assert _restarts(lab, stage_job) == 1  # requeued, not failed
        assert beside_s < alone_s + 5, (alone_s, beside_s)  # no wait for the staging job
        # requeued, it waits in the queue to start over once the node is free (Slurm
        # holds a requeued job's start for a while: not waited for here)
        assert squeue_state(lab, stage_job)[0] in ("PENDING", "RUNNING")
    finally:
        slurm(lab, "scancel", *jobs, check=False)
        for job in jobs:
            wait_state(lab, job, {""}, 60)
    print(
        f"\nweights lab, yield: whole-node elastic job started {alone_s:.1f} s after submit "
        f"on the idle node, {beside_s:.1f} s with a staging job running there (requeued)"
    )


# ---- the daemon's path -----------------------------------------------------------------


@pytest.fixture
def triton_config(lab: LabSpec, origin: tuple[str, Path]) -> TritonJobConfig:
    """The bridge serves weighty's Triton-facing repository (its weights at the origin,
    loaded only where placed or lent: `stb.load_at_start` false) and the lab's echo (what
    the baseline loads)."""
    url, work = origin
    repo = work / "daemon-repo"
    if not repo.exists():
        labweights.build_repository(repo, url)
        shutil.copytree(project_root() / "triton_repo" / "echo", repo / "echo")
    return triton.job_config(lab).model_copy(update={"model_repository": repo})


@pytest.fixture
def bridge_update(origin: tuple[str, Path]) -> dict[str, object]:
    url, work = origin
    cache = work / "daemon-cache"
    cache.mkdir(exist_ok=True)
    return {
        "weights": WeightsConfig(
            cache_root=cache, source=url, bandwidth_bytes_s=0, partition="scavenger",
            plan_every_s=1,
        )
    }  # fmt: skip


def test_the_daemon_reads_a_staging_back_and_lends_onto_the_local_copy(
    lab: LabSpec, bridge: tuple[Reconciler, str], origin: tuple[str, Path]
) -> None:
    rec, _ = bridge
    assert rec.stager is not None and rec.requests is not None
    cfg = rec.config.weights
    assert cfg.cache_root is not None and cfg.source is not None
    node = lab.pool_nodes("elastic")[0].name
    log: list[str] = []
    tick_until_baseline(rec, lab, log)  # the baseline reads weighty from the origin
    # what `stb weights stage weighty 1 --job <node>` does: the job, and its catalogue row
    spec = staging_job(cfg, node=node, model=labweights.MODEL, version=1, source=cfg.source,
                       account="bridge", partition="scavenger", log_dir=lab.log_dir)  # fmt: skip
    job = submit_staging(SlurmCLI(env=lab.env()), spec)
    catalogue = WeightStore.beside(rec.store)
    path = str(version_dir(cfg.cache_root, labweights.MODEL, 1))
    catalogue.begin(node, labweights.MODEL, 1, path, datetime.now(UTC), job)

    def copy_state() -> str:
        return next((c.state for c in catalogue.copies(node)), "")

    tick_until(rec, lambda: copy_state() != "staging", 90, log)
    assert copy_state() == "complete", "\n".join(log)
    (row,) = catalogue.copies(node)
    assert row.size_bytes == mf.read(Path(path)).total_bytes >= SIZE
    tick_until(rec, lambda: rec.stager is not None and bool(rec.stager.cached()), 10, log)
    assert rec.stager.cached() == {node: frozenset({labweights.MODEL})}

    ask_lend(rec.requests, node, [labweights.MODEL])
    store = rec.store
    tick_until(
        rec, lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 90, log
    )
    (lease,) = store.open_leases()
    assert lease.id is not None
    served = next(e for e in store.history(lease.id) if e.to_state == LeaseState.SERVING)
    assert f"weights: {labweights.MODEL}=local" in served.reason, "\n".join(log)
    began = next(e.at for e in store.history(lease.id) if e.to_state == LeaseState.STARTING)
    took = (served.at - began).total_seconds()
    assert rec.loads.local_load_s == {labweights.MODEL: took}
    assert labweights.MODEL not in rec.loads.load_s  # the baseline's start is no lend
    print(f"\nweights lab, daemon: staged on {node}, lent: starting -> serving {took:.1f} s local")
    ask_return(rec.requests, lease.id)
    tick_until(rec, lambda: not store.open_leases(), 90, log)
