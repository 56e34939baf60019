"""The Slurm plugins' logic, without Slurm: the GPU sampler's pure parts and its hooks
with a fake NVML module (no GPU here, so the real NVML path is not proven by these),
the rendered Prolog/Epilog wrappers run by a real shell, and job_submit.lua run by a
real Lua 5.1 interpreter against a fake `slurm` table (skipped where lua5.1 is missing;
tests/lab/test_slurm_plugins_lab.py runs it inside slurmctld)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.lab import render
from bridge.lab.spec import LabSpec
from bridge.paths import slurm_plugins_dir
from slurm_plugins import gpu_sampler as gs

# --- GPU lists -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("0-3", ["0", "1", "2", "3"]),
        ("1,0-2", ["1", "0", "2"]),
        ("GPU-6c3e0f5a-1b2c-4d5e-8f90-1234567890ab", ["GPU-6c3e0f5a-1b2c-4d5e-8f90-1234567890ab"]),
        (
            "MIG-a1b2c3d4-0000-1111-2222-333344445555,0",
            ["MIG-a1b2c3d4-0000-1111-2222-333344445555", "0"],
        ),
        ("", []),
        (None, []),
        ("NoDevFiles", []),
        ("N/A", []),
        ("0,,1,", ["0", "1"]),
    ],
)
def test_parse_gpu_list(text: str | None, expected: list[str]) -> None:
    assert gs.parse_gpu_list(text) == expected


def test_job_gpus_prefers_the_job_list_then_step_then_cuda() -> None:
    env = {"SLURM_JOB_GPUS": "2,3", "SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gs.job_gpus(env) == ["2", "3"]
    assert gs.job_gpus({"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}) == ["1"]
    assert gs.job_gpus({"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["0", "1"]
    assert gs.job_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []


def test_job_on_node_needs_a_job_id() -> None:
    job = gs.JobOnNode.from_env(
        {
            "SLURM_JOB_ID": "42",
            "SLURMD_NODENAME": "n3",
            "SLURM_CLUSTER_NAME": "c",
            "SLURM_JOB_GPUS": "1",
        }
    )
    assert (job.job_id, job.node, job.cluster, job.gpus, job.stem) == (
        "42",
        "n3",
        "c",
        ("1",),
        "job-42-n3",
    )
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        gs.JobOnNode.from_env({"SLURMD_NODENAME": "n1"})


# --- the record --------------------------------------------------------------------------

JOB = gs.JobOnNode("7", "n1", "stblab", ("0", "1"))


def _sample(t: float, *readings: tuple[int | None, int | None]) -> dict[str, Any]:
    return {
        "t": t,
        "gpus": [{"id": str(i), "util": u, "mem": m} for i, (u, m) in enumerate(readings)],
    }


def test_summarise_means_utilization_and_takes_the_peak_memory_of_one_gpu() -> None:
    samples = [
        _sample(100.0, (10, 1_000), (30, 5_000)),
        _sample(110.0, (50, 2_000), (None, None)),  # GPU 1 unreadable once
    ]
    rec = gs.summarise(JOB, samples, start=100.0, end=125.0)
    assert rec == {
        "cluster": "stblab",
        "job_id": "7",
        "node": "n1",
        "gpus": ["0", "1"],
        "samples": 2,
        "mean_util_pct": 30.0,
        "max_mem_bytes": 5_000,
        "start": "1970-01-01T00:01:40Z",
        "end": "1970-01-01T00:02:05Z",
    }


def test_summarise_of_nothing_says_none_not_zero() -> None:
    rec = gs.summarise(JOB, [], start=0.0, end=1.0)
    assert (rec["samples"], rec["mean_util_pct"], rec["max_mem_bytes"]) == (0, None, None)


def test_read_samples_skips_a_line_cut_short() -> None:
    good = json.dumps(_sample(1.0, (5, 6)))
    assert gs.read_samples([good, '{"t": 2.0, "gpus": [{"id"', "", "[]"]) == [json.loads(good)]


# --- the hooks with a fake NVML ------------------------------------------------------------


class FakeNVML:
    """The slice of pynvml the sampler calls; GPUs by index, utilization rising."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: int = 2) -> None:
        self.gpus = gpus
        self.calls = 0
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i >= self.gpus:
            raise self.NVMLError(f"no GPU {i}")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        raise self.NVMLError(f"no GPU {uuid}")

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(gpu=10 * self.calls, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * 1_000_000, total=10**11)

    #: GPU index -> processes on it, as NVML lists them (the release check)
    procs: dict[int, list[SimpleNamespace]]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return list(getattr(self, "procs", {}).get(h, []))

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return []


def _env(spool: Path, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "n1",
        "SLURM_CLUSTER_NAME": "stblab",
        "STB_GPU_SPOOL": str(spool),
        "STB_GPU_SAMPLE_S": "0.01",
        "STB_GPU_EPILOG_WAIT_S": "1",
        **extra,
    }


def test_prolog_starts_a_sampler_for_the_jobs_gpus(tmp_path: Path) -> None:
    nvml = FakeNVML()
    started: list[list[str]] = []

    def spawn(argv: list[str], env: Any) -> int:
        started.append(argv)
        assert env["STB_GPU_SPOOL"] == str(tmp_path)
        return 4242

    line = gs.prolog(_env(tmp_path, SLURM_JOB_GPUS="0,1"), lambda: nvml, spawn, now=lambda: 1000.0)
    assert "job 7 on n1: sampling GPUs 0,1 (NVIDIA H200, NVIDIA H200)" in line
    assert started == [
        [sys.executable, str(Path(gs.__file__).resolve()), "sample", "7", "n1", "0,1"]
    ]
    state = json.loads((tmp_path / "job-7-n1.state").read_text())
    assert state == {"pid": 4242, "start": 1000.0, "cluster": "stblab", "gpus": ["0", "1"]}
    assert nvml.inits == nvml.shutdowns == 1


def test_prolog_without_nvml_or_gpus_logs_why_and_starts_nothing(tmp_path: Path) -> None:
    def no_nvml() -> Any:
        raise ImportError("No module named 'pynvml'")

    def never(argv: list[str], env: Any) -> int:
        raise AssertionError("no sampler may start")

    line = gs.prolog(_env(tmp_path, SLURM_JOB_GPUS="0"), no_nvml, never)
    assert line == "job 7 on n1: no NVML (ImportError: No module named 'pynvml'), nothing sampled"
    assert gs.prolog(_env(tmp_path), lambda: FakeNVML(), never).endswith(
        "no GPUs allocated, nothing sampled"
    )
    line = gs.prolog(_env(tmp_path, SLURM_JOB_GPUS="5"), lambda: FakeNVML(), never)
    assert "NVML cannot open GPUs 5" in line
    assert not list(tmp_path.glob("*.state"))


def test_sampler_then_epilog_write_one_record(tmp_path: Path) -> None:
    settings = gs.Settings.from_env(_env(tmp_path))
    (tmp_path / "job-7-n1.state").write_text(
        json.dumps({"pid": os.getpid(), "start": 1000.0, "cluster": "stblab", "gpus": ["0", "1"]})
    )
    clock = iter(range(1000, 2000, 10))
    taken = gs.run_sampler(
        FakeNVML(),
        JOB,
        settings,
        now=lambda: float(next(clock)),
        sleep=lambda s: None,
        max_samples=3,
    )
    assert taken == (3, "took its 3 samples")
    with (tmp_path / "job-7-n1.samples").open("a") as f:
        f.write('{"t": 1030.0, "gpus": [{"id": "0"')  # a line cut by SIGKILL
    line = gs.epilog(_env(tmp_path), now=lambda: 1040.0)
    # The pid in the state file is this test's: not a sampler, so it is left alone.
    assert line.startswith("job 7 on n1: sampler gone; 3 samples of GPUs 0,1, mean util 35.0%")
    rec = json.loads((tmp_path / "job-7-n1-1000.json").read_text())
    assert rec["samples"] == 3 and rec["max_mem_bytes"] == 2_000_000
    assert rec["start"] == "1970-01-01T00:16:40Z" and rec["end"] == "1970-01-01T00:17:20Z"
    assert not (tmp_path / "job-7-n1.state").exists()
    assert not (tmp_path / "job-7-n1.samples").exists()


def test_sampler_stops_when_its_state_file_is_gone(tmp_path: Path) -> None:
    settings = gs.Settings.from_env(_env(tmp_path))
    taken = gs.run_sampler(FakeNVML(), JOB, settings, sleep=lambda s: None, max_samples=50)
    assert taken == (1, "found its state file gone")


def test_epilog_without_a_sampler_records_nothing(tmp_path: Path) -> None:
    assert gs.epilog(_env(tmp_path)) == (
        "job 7 on n1: no sampler ran (no GPU or no NVML), nothing recorded"
    )
    assert not list(tmp_path.glob("*.json"))


def _fake_sampler(ignore_term: bool) -> subprocess.Popen[bytes]:
    """A process whose argv looks like the job's sampler (`... sample 7 n1 0,1`)."""
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "sample", "7", "n1", "0,1"], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


@pytest.mark.parametrize("ignore_term", [False, True])
def test_epilog_stops_the_sampler_within_its_wait(tmp_path: Path, ignore_term: bool) -> None:
    proc = _fake_sampler(ignore_term)
    try:
        t0 = time.monotonic()
        how = gs.stop_sampler(proc.pid, JOB, wait_s=1.0)
        proc.wait(timeout=5)
        assert time.monotonic() - t0 < 3
        if ignore_term:
            assert how == "sampler killed after 1s" and proc.returncode == -signal.SIGKILL
        else:
            assert how == "sampler stopped" and proc.returncode == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


FAKE_PYNVML = """
from types import SimpleNamespace
calls = [0]
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetHandleByIndex(i): return int(i)
def nvmlDeviceGetName(h): return "Fake GPU"
def nvmlDeviceGetUtilizationRates(h):
    calls[0] += 1
    return SimpleNamespace(gpu=50, memory=0)
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(used=(h + 1) * 1000, total=10**9)
"""


def test_prolog_detaches_a_real_sampler_process_that_the_epilog_stops(tmp_path: Path) -> None:
    """The process plumbing for real (spawn, own session, SIGTERM, record) with a fake
    pynvml module on PYTHONPATH in place of NVML."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    spool = tmp_path / "spool"
    env = _env(spool, SLURM_JOB_GPUS="0,1", STB_GPU_SAMPLE_S="0.05", PYTHONPATH=str(fake))
    script = str(Path(gs.__file__).resolve())
    run = subprocess.run([sys.executable, script, "prolog"], env=env, timeout=30)
    assert run.returncode == 0
    assert "sampling GPUs 0,1 (Fake GPU, Fake GPU)" in (spool / "prolog.log").read_text()
    pid = json.loads((spool / "job-7-n1.state").read_text())["pid"]
    assert os.getsid(pid) == pid  # its own session: slurmd's kill of the hook spares it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = spool / "job-7-n1.samples"
        if samples.exists() and len(samples.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    run = subprocess.run([sys.executable, script, "epilog"], env=env, timeout=30)
    assert run.returncode == 0
    assert "sampler stopped;" in (spool / "epilog.log").read_text()
    (record,) = spool.glob("job-7-n1-*.json")
    rec = json.loads(record.read_text())
    assert rec["samples"] >= 3 and rec["mean_util_pct"] == 50.0 and rec["max_mem_bytes"] == 2000
    assert rec["gpus"] == ["0", "1"] and rec["cluster"] == "stblab"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "was stopped by the epilog" not in (
        (spool / "sampler.log").read_text() if (spool / "sampler.log").exists() else ""
    ):
        time.sleep(0.05)
    log = (spool / "sampler.log").read_text()
    assert "job 7 on n1: the sampler was stopped by the epilog after " in log


def test_hooks_never_fail_and_always_log(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    assert gs.main(["prolog"], {"STB_GPU_SPOOL": str(spool)}) == 0  # no SLURM_JOB_ID
    assert gs.main(["epilog"], {"STB_GPU_SPOOL": str(spool), "SLURM_JOB_ID": "x"}) == 0
    assert gs.main(["bogus"], {"STB_GPU_SPOOL": str(spool)}) == 0
    assert gs.main(["prolog"], {"STB_GPU_SPOOL": str(spool), "STB_GPU_SAMPLE_S": "soon"}) == 0
    prolog_log = (spool / "prolog.log").read_text().splitlines()
    assert len(prolog_log) == 2 and all("prolog failed, ignored" in x for x in prolog_log)
    assert "epilog failed, ignored (ValueError" in (spool / "epilog.log").read_text()
    assert "unknown hook 'bogus'" in (spool / "sampler.log").read_text()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert gs.main(["prolog"], {"STB_GPU_SPOOL": str(blocked / "spool")}) == 0  # cannot log


# --- the lab's wrappers and slurm.conf --------------------------------------------------------


def test_slurm_conf_enables_the_plugins(tmp_path: Path) -> None:
    spec = LabSpec(lab_dir=tmp_path)
    conf = render.slurm_conf(spec).splitlines()
    assert "JobSubmitPlugins=lua" in conf
    assert f"Prolog={tmp_path}/etc/stb-prolog" in conf
    assert f"Epilog={tmp_path}/etc/stb-epilog" in conf
    assert "EnforcePartLimits=ALL" in conf
    assert render.job_submit_lua() == (slurm_plugins_dir() / "job_submit.lua").read_text()


def _run_hook(spec: LabSpec, hook: str, python: str, env: dict[str, str]) -> int:
    script = spec.etc / f"stb-{hook}"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render.hook_script(spec, hook, python))
    script.chmod(0o755)
    return subprocess.run([str(script)], env=env, timeout=30).returncode


def test_rendered_hooks_run_the_sampler_and_exit_zero_whatever_happens(tmp_path: Path) -> None:
    spec = LabSpec(lab_dir=tmp_path)
    env = {"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "n2"}  # slurmd gives no PATH
    assert _run_hook(spec, "prolog", sys.executable, env) == 0
    assert _run_hook(spec, "epilog", sys.executable, env) == 0
    assert "job 9 on n2: no GPUs allocated" in (spec.gpu_spool / "prolog.log").read_text()
    assert "job 9 on n2: no sampler ran" in (spec.gpu_spool / "epilog.log").read_text()
    assert _run_hook(spec, "prolog", "/nonexistent/python", env) == 0
    with pytest.raises(ValueError, match="hook"):
        render.hook_script(spec, "sample", sys.executable)


# --- job_submit.lua in a real Lua 5.1, with a fake `slurm` table ------------------------------

LUA = shutil.which("lua5.1")
HARNESS = r"""
NO_VAL16 = 65534
user_msgs = {}
slurm = {
  SUCCESS = 0, ERROR = -1, ESLURM_INVALID_ACCOUNT = 2045, NO_VAL16 = NO_VAL16,
  log_info = function(...) end,
  log_user = function(fmt, ...) table.insert(user_msgs, string.format(fmt, ...)) end,
}
dofile(SCRIPT)
if SETUP then SETUP() end
local parts = {
  elastic = { name = "elastic", flag_default = 1 },
  train = { name = "train", flag_default = 0 },
  infer = { name = "infer", flag_default = 0 },
}
local function show(rc, d)
  print(string.format("rc=%s requeue=%s admin_comment=%s msg=%s", tostring(rc),
    tostring(d.requeue), tostring(d.admin_comment), tostring(user_msgs[#user_msgs])))
  user_msgs = {}
end
for _, case in ipairs(CASES) do
  local d = case.desc
  if d.requeue == nil then d.requeue = NO_VAL16 end
  if case.rec then
    show(slurm_job_modify(d, case.rec, parts, case.uid or 0), d)
  else
    show(slurm_job_submit(d, parts, case.uid or 0), d)
  end
end
"""


def _lua(cases: str, tmp_path: Path, setup: str = "") -> list[str]:
    """Each case's outcome, with `setup` (Lua statements) run after the script loads."""
    assert LUA is not None
    script = slurm_plugins_dir() / "job_submit.lua"
    harness = tmp_path / "harness.lua"
    head = f"SCRIPT = {json.dumps(str(script))}\nCASES = {{ {cases} }}\n"
    if setup:
        head += f"function SETUP() {setup} end\n"
    harness.write_text(head + HARNESS)
    done = subprocess.run([LUA, str(harness)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


needs_lua = pytest.mark.skipif(LUA is None, reason="lua5.1 is not installed (apt install lua5.1)")


@needs_lua
def test_lua_submit_rules(tmp_path: Path) -> None:
    out = _lua(
        """
        { desc = { partition = "infer", account = "team-nlp" } },
        { desc = { partition = "infer", default_account = "team-vision" } },
        { desc = { partition = "infer", account = "bridge" } },
        { desc = { partition = "elastic", account = "team-nlp", requeue = 0 } },
        { desc = { account = "team-nlp" } },
        { desc = { partition = "train,elastic", account = "team-nlp" } },
        { desc = { partition = "train", account = "a", admin_comment = "ticket=12" } },
        { desc = { partition = "train", account = "a", admin_comment = "stb:workload=inference" } },
        { desc = { partition = "debug", account = "a" } },
        """,
        tmp_path,
    )
    refused = (
        "rc=2045 requeue=65534 admin_comment=nil msg=partition infer is reserved for the "
        "bridge account (the Slurm-Triton bridge's inference servers); account {} may not "
        "use it: submit to another partition (e.g. train or elastic)"
    )
    assert out == [
        refused.format("team-nlp"),
        refused.format("team-vision"),
        "rc=0 requeue=65534 admin_comment=stb:workload=inference msg=nil",
        "rc=0 requeue=1 admin_comment=stb:workload=elastic msg=nil",
        "rc=0 requeue=1 admin_comment=stb:workload=elastic msg=nil",  # the default partition
        "rc=0 requeue=1 admin_comment=stb:workload=training msg=nil",  # first partition tags
        "rc=0 requeue=65534 admin_comment=ticket=12,stb:workload=training msg=nil",
        "rc=0 requeue=65534 admin_comment=stb:workload=inference msg=nil",  # an admin's tag
        "rc=0 requeue=65534 admin_comment=nil msg=nil",  # a partition the map does not name
    ]


@needs_lua
def test_lua_modify_rules(tmp_path: Path) -> None:
    out = _lua(
        """
        { desc = { partition = "infer" }, uid = 1000,
          rec = { job_id = 1, partition = "train", account = "team-nlp" } },
        { desc = { partition = "infer" }, uid = 0,
          rec = { job_id = 1, partition = "train", account = "team-nlp" } },
        { desc = { account = "team-nlp" }, uid = 0,
          rec = { job_id = 2, partition = "infer", account = "bridge" } },
        { desc = { partition = "infer" }, uid = 0,
          rec = { job_id = 3, partition = "elastic", account = "bridge" } },
        { desc = { partition = "elastic" }, uid = 0,
          rec = { job_id = 4, partition = "train", account = "a",
                  admin_comment = "x=1,stb:workload=training" } },
        { desc = { partition = "elastic" }, uid = 1000,
          rec = { job_id = 5, partition = "train", account = "a",
                  admin_comment = "stb:workload=training" } },
        { desc = { requeue = 0 }, uid = 1000,
          rec = { job_id = 6, partition = "elastic", account = "a" } },
        { desc = { time_limit = 10 }, uid = 1000,
          rec = { job_id = 7, partition = "elastic", account = "a" } },
        """,
        tmp_path,
    )
    assert out == [
        "rc=2045 requeue=65534 admin_comment=nil msg=nil",  # a user's job into infer
        "rc=2045 requeue=65534 admin_comment=nil msg=nil",  # nor by root
        "rc=2045 requeue=65534 admin_comment=nil msg=nil",  # nor an infer job to a team
        "rc=0 requeue=65534 admin_comment=stb:workload=inference msg=nil",
        "rc=0 requeue=1 admin_comment=x=1,stb:workload=elastic msg=nil",  # root re-tags
        "rc=0 requeue=1 admin_comment=nil msg=nil",  # a user's move keeps the tag
        "rc=0 requeue=1 admin_comment=nil msg=nil",  # Requeue=0 on elastic is undone
        "rc=0 requeue=65534 admin_comment=nil msg=nil",  # other updates pass untouched
    ]


@needs_lua
def test_lua_batch_inference_mark(tmp_path: Path) -> None:
    """`--comment=stb:batch` on an elastic partition books the job as batch-inference (an
    elastic job still: requeueable); the mark is ignored elsewhere, must be a whole item,
    and an administrator's own tag still wins; a root move keeps reading the mark."""
    out = _lua(
        """
        { desc = { partition = "elastic", account = "a", comment = "stb:batch" } },
        { desc = { partition = "elastic", account = "a", comment = "run 7, stb:batch",
                   requeue = 0 } },
        { desc = { account = "a", comment = "x;stb:batch" } },
        { desc = { partition = "train", account = "a", comment = "stb:batch" } },
        { desc = { partition = "train,elastic", account = "a", comment = "stb:batch" } },
        { desc = { partition = "elastic", account = "a", comment = "stb:batchy" } },
        { desc = { partition = "elastic", account = "a", comment = "stb:batch",
                   admin_comment = "stb:workload=elastic" } },
        { desc = { partition = "elastic" }, uid = 0,
          rec = { job_id = 8, partition = "train", account = "a", comment = "stb:batch",
                  admin_comment = "stb:workload=training" } },
        { desc = { partition = "train" }, uid = 0,
          rec = { job_id = 9, partition = "elastic", account = "a", comment = "stb:batch",
                  admin_comment = "stb:workload=batch-inference" } },
        """,
        tmp_path,
    )
    assert out == [
        "rc=0 requeue=1 admin_comment=stb:workload=batch-inference msg=nil",
        "rc=0 requeue=1 admin_comment=stb:workload=batch-inference msg=nil",
        "rc=0 requeue=1 admin_comment=stb:workload=batch-inference msg=nil",  # default
        "rc=0 requeue=65534 admin_comment=stb:workload=training msg=nil",  # not elastic
        "rc=0 requeue=1 admin_comment=stb:workload=training msg=nil",  # first partition
        "rc=0 requeue=1 admin_comment=stb:workload=elastic msg=nil",  # not the mark
        "rc=0 requeue=1 admin_comment=stb:workload=elastic msg=nil",  # an admin's tag
        "rc=0 requeue=1 admin_comment=stb:workload=batch-inference msg=nil",  # root's move
        "rc=0 requeue=65534 admin_comment=stb:workload=training msg=nil",
    ]


@needs_lua
def test_lua_batch_inference_partition(tmp_path: Path) -> None:
    """A partition the site maps to batch-inference tags every job so and holds only
    requeueable jobs, like an elastic one."""
    out = _lua(
        """
        { desc = { partition = "elastic", account = "a", requeue = 0 } },
        { desc = { partition = "train" }, uid = 1000,
          rec = { job_id = 1, partition = "elastic", account = "a" } },
        { desc = { requeue = 0 }, uid = 1000,
          rec = { job_id = 2, partition = "elastic", account = "a" } },
        """,
        tmp_path,
        setup='WORKLOAD_OF_PARTITION.elastic = "batch-inference"',
    )
    assert out == [
        "rc=0 requeue=1 admin_comment=stb:workload=batch-inference msg=nil",
        "rc=0 requeue=65534 admin_comment=nil msg=nil",  # moved to train: no requeue
        "rc=0 requeue=1 admin_comment=nil msg=nil",  # Requeue=0 is undone
    ]


@needs_lua
def test_lua_script_compiles() -> None:
    luac = shutil.which("luac5.1")
    if luac is None:
        pytest.skip("luac5.1 is not installed")
    script = slurm_plugins_dir() / "job_submit.lua"
    done = subprocess.run([luac, "-p", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- the release check: no process may hold the job's GPUs when the node goes back ------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _release(tmp_path: Path, nvml: FakeNVML, ran: list[list[str]], **env: str) -> str:
    clock = Clock()

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    return gs.release_check(
        _env(tmp_path, SLURM_JOB_GPUS="0,1", STB_GPU_RELEASE_WAIT_S="3", **env),
        lambda: nvml,
        run,
        clock.sleep,
        clock,
    )


def test_release_check_drains_a_node_whose_gpu_stays_held(tmp_path: Path) -> None:
    nvml = FakeNVML()
    nvml.procs = {1: [SimpleNamespace(pid=4242, usedGpuMemory=3 * 2**30)]}
    ran: list[list[str]] = []
    line = _release(tmp_path, nvml, ran)
    assert line == "release check: GPU 1: pid 4242 (3072 MiB); node n1 drained"
    assert ran == [
        [
            "scontrol", "update", "NodeName=n1", "State=DRAIN",
            "Reason=stb: GPU memory held after job 7: GPU 1: pid 4242 (3072 MiB)",
        ]
    ]  # fmt: skip
    assert nvml.inits == nvml.shutdowns == 1


def test_release_check_waits_for_a_process_that_leaves(tmp_path: Path) -> None:
    nvml = FakeNVML()
    leaving = [SimpleNamespace(pid=1, usedGpuMemory=None)]
    nvml.procs = {0: leaving}
    calls = {"n": 0}
    listed = nvml.nvmlDeviceGetComputeRunningProcesses

    def going(h: int) -> list[SimpleNamespace]:
        calls["n"] += 1
        return listed(h) if calls["n"] <= 2 else []  # gone at the second look at GPU 0

    nvml.nvmlDeviceGetComputeRunningProcesses = going  # type: ignore[method-assign]
    ran: list[list[str]] = []
    assert _release(tmp_path, nvml, ran) == "release check: GPUs 0,1 free"
    assert ran == []


def test_release_check_modes_and_nothing_to_check(tmp_path: Path) -> None:
    nvml = FakeNVML()
    nvml.procs = {0: [SimpleNamespace(pid=9, usedGpuMemory=None)]}
    ran: list[list[str]] = []
    logged = _release(tmp_path, nvml, ran, STB_GPU_RELEASE_CHECK="log")
    assert (
        logged
        == "release check: still held after 3 s: GPU 0: pid 9 (? MiB) (not drained: mode log)"
    )
    assert _release(tmp_path, nvml, ran, STB_GPU_RELEASE_CHECK="off") == ""
    assert "is none of drain, log, off" in _release(
        tmp_path, nvml, ran, STB_GPU_RELEASE_CHECK="sometimes"
    )
    assert ran == []
    no_gpu = gs.release_check(_env(tmp_path), lambda: nvml, None)
    assert no_gpu == ""

    def no_nvml() -> Any:
        raise ImportError("pynvml")

    assert gs.release_check(_env(tmp_path, SLURM_JOB_GPUS="0"), no_nvml) == (
        "release check: no NVML (ImportError)"
    )


def test_release_check_says_when_the_drain_fails(tmp_path: Path) -> None:
    nvml = FakeNVML()
    nvml.procs = {0: [SimpleNamespace(pid=9, usedGpuMemory=2**20)]}

    def refused(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "Invalid user id")

    clock = Clock()
    line = gs.release_check(
        _env(tmp_path, SLURM_JOB_GPUS="0", STB_GPU_RELEASE_WAIT_S="0"),
        lambda: nvml,
        refused,
        clock.sleep,
        clock,
    )
    assert line == "release check: GPU 0: pid 9 (1 MiB); drain failed (exit 1: Invalid user id)"
