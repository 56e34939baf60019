"""The bridge's Slurm plugins inside the lab's real Slurm 22.05: job_submit.lua run by
slurmctld (refusal, requeue, workload tags in sacct) and the GPU sampler's Prolog/Epilog
run by slurmd on every job. The lab's GPUs are fake devices, so NVML is absent here and
the hooks take their "no NVML" path; the sampling path is unit-tested with a fake NVML."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accounting.attribution import tags
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.slurm.sacct import parse_sacct_json

from .helpers import sbatch, scontrol_show, wait_sacct_final

pytestmark = pytest.mark.lab

REFUSAL = "partition infer is reserved for the bridge account"
#: a plain (non-root, non-admin) user for the tests that need one
PLAIN_USER, PLAIN_UID = "nobody", 65534


def _sbatch_raw(
    lab: LabSpec, *args: str, uid: int | None = None
) -> subprocess.CompletedProcess[str]:
    prefix = (
        [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    )
    return subprocess.run(
        [*prefix, "sbatch", "--parsable", "--output=/dev/null", *args],
        env=os.environ | lab.env(),
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/tmp",
    )


@pytest.fixture
def held_jobs(lab: LabSpec) -> Iterator[list[str]]:
    """Job ids a test submits held (they never run); cancelled afterwards."""
    ids: list[str] = []
    yield ids
    if ids:
        slurm(lab, "scancel", *ids, check=False)


@pytest.fixture(scope="module")
def plain_user(lab: LabSpec) -> str:
    """`nobody` as a user of team-nlp in the lab's slurmdbd (idempotent)."""
    assocs = slurm(lab, "sacctmgr", "-n", "-P", "list", "assoc", "format=account,user").split()
    if f"team-nlp|{PLAIN_USER}" not in assocs:
        slurm(
            lab,
            "sacctmgr",
            "-i",
            "add",
            "user",
            PLAIN_USER,
            "account=team-nlp",
            "defaultaccount=team-nlp",
            f"cluster={lab.cluster}",
        )
        time.sleep(1)  # slurmctld learns the association from slurmdbd
    return PLAIN_USER


def test_job_submit_lua_is_the_lab_plugin(lab: LabSpec) -> None:
    config = slurm(lab, "scontrol", "show", "config")
    assert any(
        line.split("=", 1)[-1].strip() == "lua"
        for line in config.splitlines()
        if line.startswith("JobSubmitPlugins")
    )
    assert (
        lab.job_submit_lua.read_text()
        == (Path(__file__).parents[2] / "slurm_plugins" / "job_submit.lua").read_text()
    )


def test_a_team_account_is_refused_on_infer_with_the_reason(lab: LabSpec) -> None:
    done = _sbatch_raw(lab, "--partition=infer", "--account=team-nlp", "--wrap", "true")
    assert done.returncode != 0
    assert f"{REFUSAL} (the Slurm-Triton bridge's inference servers); account team-nlp" in (
        done.stderr
    )
    # No --account: the user's default account (root's is a team) is refused the same way.
    done = _sbatch_raw(lab, "--partition=infer", "--wrap", "true")
    assert done.returncode != 0 and REFUSAL in done.stderr


def test_a_plain_user_is_refused_on_infer_and_cannot_move_a_job_there(
    lab: LabSpec, plain_user: str, held_jobs: list[str]
) -> None:
    done = _sbatch_raw(lab, "--partition=infer", "--wrap", "true", uid=PLAIN_UID)
    assert done.returncode != 0 and f"{REFUSAL} (" in done.stderr and "team-nlp" in done.stderr
    done = _sbatch_raw(lab, "--partition=train", "--hold", "--wrap", "true", uid=PLAIN_UID)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    held_jobs.append(job)
    info = scontrol_show(lab, "job", job)[job]
    # A plain user's job is tagged too: the plugin may write the admin comment.
    assert (info["UserId"], info["AdminComment"]) == (
        f"{plain_user}({PLAIN_UID})",
        "stb:workload=training",
    )
    moved = subprocess.run(
        [
            "setpriv",
            f"--reuid={PLAIN_UID}",
            f"--regid={PLAIN_UID}",
            "--clear-groups",
            "scontrol",
            "update",
            f"job={job}",
            "partition=infer",
        ],
        env=os.environ | lab.env(),
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/tmp",
    )
    assert moved.returncode != 0, moved.stdout
    assert scontrol_show(lab, "job", job)[job]["Partition"] == "train"


def test_elastic_jobs_are_made_requeueable_even_with_no_requeue(
    lab: LabSpec, held_jobs: list[str]
) -> None:
    common = ("--hold", "--no-requeue", "--account=team-research", "--wrap", "true")
    elastic = sbatch(lab, "--partition=elastic", *common)
    train = sbatch(lab, "--partition=train", *common)
    default = sbatch(lab, *common)  # elastic is the default partition
    held_jobs += [elastic, train, default]
    jobs = scontrol_show(lab, "job", elastic) | scontrol_show(lab, "job", train)
    jobs |= scontrol_show(lab, "job", default)
    assert jobs[elastic]["Requeue"] == "1"
    assert jobs[default]["Requeue"] == "1" and jobs[default]["Partition"] == "elastic"
    assert jobs[train]["Requeue"] == "0"  # the control: --no-requeue stands elsewhere


def test_root_moving_a_job_retags_it(lab: LabSpec, held_jobs: list[str]) -> None:
    job = sbatch(
        lab, "--partition=train", "--hold", "--no-requeue", "--account=team-nlp", "--wrap", "true"
    )
    held_jobs.append(job)
    slurm(lab, "scontrol", "update", f"job={job}", "partition=elastic")
    info = scontrol_show(lab, "job", job)[job]
    assert (info["Partition"], info["AdminComment"], info["Requeue"]) == (
        "elastic",
        "stb:workload=elastic",
        "1",
    )


def test_workload_tags_reach_sacct_and_the_ledger_reads_them(lab: LabSpec) -> None:
    jobs = {
        "training": sbatch(
            lab,
            "--partition=train",
            "--gres=gpu:1",
            "--account=team-vision",
            "--comment=nightly run",
            "--wrap",
            "sleep 1",
        ),
        "elastic": sbatch(
            lab, "--partition=elastic", "--account=team-research", "--wrap", "sleep 1"
        ),
        "inference": sbatch(lab, "--partition=infer", "--account=bridge", "--wrap", "sleep 1"),
        # batch inference: an elastic job that asks for it in its own comment
        "batch-inference": sbatch(
            lab,
            "--partition=elastic",
            "--account=team-research",
            "--comment=stb:batch",
            "--wrap",
            "sleep 1",
        ),
    }
    for workload, job in jobs.items():
        rec = wait_sacct_final(
            lab, job, timeout_s=60, until=lambda r: bool(r["comment"]["administrator"])
        )
        assert rec["comment"]["administrator"] == f"stb:workload={workload}", rec["comment"]
        (parsed,) = parse_sacct_json(slurm(lab, "sacct", "-j", job, "--json"))
        assert tags(parsed.comment)["workload"] == workload
    train = parse_sacct_json(slurm(lab, "sacct", "-j", jobs["training"], "--json"))[0]
    assert train.comment == "nightly run,stb:workload=training"
    batch = parse_sacct_json(slurm(lab, "sacct", "-j", jobs["batch-inference"], "--json"))[0]
    assert batch.comment == "stb:batch,stb:workload=batch-inference"


def _log_lines(lab: LabSpec, hook: str, job: str) -> list[str]:
    path = lab.gpu_spool / f"{hook}.log"
    text = path.read_text() if path.exists() else ""
    return [line for line in text.splitlines() if f" job {job} on " in line]


def test_prolog_and_epilog_run_on_every_job_without_failing_it(lab: LabSpec) -> None:
    jobs = [
        sbatch(
            lab, "--partition=train", "--gres=gpu:2", "--account=team-vision", "--wrap", "sleep 1"
        ),
        sbatch(lab, "--partition=elastic", "--account=team-research", "--wrap", "true"),
        sbatch(lab, "--partition=infer", "--gres=gpu:1", "--account=bridge", "--wrap", "true"),
    ]
    for job in jobs:
        rec = wait_sacct_final(lab, job, timeout_s=60)
        assert rec["state"]["current"] == "COMPLETED"
        assert rec["exit_code"]["return_code"] == 0 and rec["exit_code"]["status"] == "SUCCESS"
    deadline = time.monotonic() + 20  # the epilog may still run after sacct has the end
    while time.monotonic() < deadline:
        if all(_log_lines(lab, "epilog", j) for j in jobs):
            break
        time.sleep(0.5)
    for job in jobs:
        prolog, epilog = _log_lines(lab, "prolog", job), _log_lines(lab, "epilog", job)
        assert len(prolog) == 1 and len(epilog) == 1, (prolog, epilog)
        assert "failed" not in prolog[0] + epilog[0]
        assert "no sampler ran" in epilog[0]
    gpu_job = _log_lines(lab, "prolog", jobs[0])[0]
    assert "no NVML (NVMLError_LibraryNotFound" in gpu_job, gpu_job  # fake GPUs: no driver
    assert "no GPUs allocated" in _log_lines(lab, "prolog", jobs[1])[0]
    nodes = scontrol_show(lab, "node")
    assert not [n for n, f in nodes.items() if "DRAIN" in f["State"]]  # no hook failed a node
