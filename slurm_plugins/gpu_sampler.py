"""GPU use per Slurm job, sampled with NVML: the bridge's Slurm Prolog and Epilog.

slurmd runs the Prolog on each node of a job before it starts and the Epilog after it
ends, as root, with the job's variables (SLURM_JOB_ID, SLURMD_NODENAME, SLURM_JOB_GPUS,
...). A thin shell wrapper (see slurm_plugins/README.md) runs this file with a Python
that has nvidia-ml-py (`pynvml`):

- `gpu_sampler.py prolog`: finds the job's GPUs on this node (SLURM_JOB_GPUS, else
  SLURM_STEP_GPUS, else CUDA_VISIBLE_DEVICES), checks NVML sees them, and starts a
  detached sampler (`gpu_sampler.py sample ...`, its own session) that appends one line
  of utilization and memory per GPU every STB_GPU_SAMPLE_S seconds to a spool file.
- `gpu_sampler.py epilog`: stops that sampler (SIGTERM, SIGKILL after at most
  STB_GPU_EPILOG_WAIT_S seconds) and writes one JSON record for the job on this node:
  {cluster, job_id, node, gpus, samples, mean_util_pct, max_mem_bytes, start, end}.

- after the epilog's record, the **release check**: the job's GPUs must hold no process
  before the node goes back to Slurm (the next job, or a lent node's return, must not
  find the last one's memory there). It asks NVML for the compute and graphics processes
  on each GPU, waits up to STB_GPU_RELEASE_WAIT_S seconds (default 10) for them to go,
  and if any stays drains the node with a reason naming the GPU, the process and its
  memory (`scontrol update NodeName=<node> State=DRAIN Reason="stb: ..."`).
  STB_GPU_RELEASE_CHECK: `drain` (default), `log` (say it, drain nothing) or `off`.

Files live in the spool directory STB_GPU_SPOOL (default /var/spool/stb/gpu-usage):
`job-<id>-<node>.state` and `.samples` while the job runs, `job-<id>-<node>-<start>.json`
after, and `prolog.log`, `epilog.log`, `sampler.log` with one line per job and hook.

A Prolog that fails drains the node, so neither hook may ever fail a job: without NVML
(no driver, no GPU) or without GPUs they log one line and exit 0, and anything
unexpected is caught, logged and still exits 0. Standard library plus pynvml only, so a
site can install it into any Python environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

DEFAULT_SPOOL = "/var/spool/stb/gpu-usage"
#: seconds between samples: NVML's utilization is itself an average over the last
#: 1/6 to 1 s, so 10 s keeps the spool small and still shows a job's shape
DEFAULT_INTERVAL_S = 10.0
#: seconds the epilog waits for the sampler to stop before it kills it
DEFAULT_EPILOG_WAIT_S = 3.0
#: values of a GPU list variable that mean "no GPU"
_NO_GPU = {"", "nodevfiles", "n/a", "none", "(null)", "-1"}


# --- pure parts ----------------------------------------------------------------------


def parse_gpu_list(text: str | None) -> list[str]:
    """GPU ids from a Slurm/CUDA list: "0,1", "0-3", "GPU-<uuid>,MIG-<uuid>".

    Indices stay strings ("0"), so one list holds indices and UUIDs alike; ranges are
    expanded, duplicates dropped, order kept. "", "NoDevFiles" or "N/A" give []."""
    if text is None or text.strip().lower() in _NO_GPU:
        return []
    out: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if item.lower() in _NO_GPU:
            continue
        first, dash, last = item.partition("-")
        if dash and first.isdigit() and last.isdigit():
            ids = [str(i) for i in range(int(first), int(last) + 1)]
        else:
            ids = [item]
        out += [i for i in ids if i not in out]
    return out


def job_gpus(env: Mapping[str, str]) -> list[str]:
    """The job's GPUs on this node: the first of SLURM_JOB_GPUS, SLURM_STEP_GPUS and
    CUDA_VISIBLE_DEVICES that names any (the first two are physical indices)."""
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        gpus = parse_gpu_list(env.get(name))
        if gpus:
            return gpus
    return []


@dataclass(frozen=True)
class JobOnNode:
    """Which job, on which node, of which cluster, holding which GPUs."""

    job_id: str
    node: str
    cluster: str
    gpus: tuple[str, ...]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobOnNode:
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        if not job_id.isdigit():
            raise ValueError(f"SLURM_JOB_ID is {job_id!r}, not a job id")
        node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        return cls(job_id, node, env.get("SLURM_CLUSTER_NAME", ""), tuple(job_gpus(env)))

    @property
    def stem(self) -> str:
        return f"job-{self.job_id}-{self.node}"


def iso(epoch: float) -> str:
    utc = timezone.utc  # noqa: UP017 (datetime.UTC needs Python 3.11; sites may run 3.9)
    return (
        datetime.fromtimestamp(epoch, tz=utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def summarise(
    job: JobOnNode, samples: Sequence[Mapping[str, Any]], start: float, end: float
) -> dict[str, Any]:
    """The job's record from its samples (each {"t": epoch, "gpus": [{"id", "util",
    "mem"}]}): mean utilization over every GPU reading, and the highest memory in use
    on any one GPU (what a smaller GPU would have to hold). None when nothing was read."""
    utils = [float(g["util"]) for s in samples for g in s["gpus"] if g.get("util") is not None]
    mems = [int(g["mem"]) for s in samples for g in s["gpus"] if g.get("mem") is not None]
    return {
        "cluster": job.cluster,
        "job_id": job.job_id,
        "node": job.node,
        "gpus": list(job.gpus),
        "samples": len(samples),
        "mean_util_pct": round(sum(utils) / len(utils), 1) if utils else None,
        "max_mem_bytes": max(mems) if mems else None,
        "start": iso(start),
        "end": iso(end),
    }


def read_samples(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Sample lines of a spool file; a line cut short by a kill is skipped."""
    out = []
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        if isinstance(sample, dict) and isinstance(sample.get("gpus"), list):
            out.append(sample)
    return out


# --- NVML ----------------------------------------------------------------------------


def load_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def open_gpus(nvml: Any, gpus: Sequence[str]) -> list[tuple[str, Any]]:
    """(id, NVML handle) per GPU: an index by index, a GPU-/MIG- UUID by UUID."""
    return [
        (
            g,
            nvml.nvmlDeviceGetHandleByIndex(int(g))
            if g.isdigit()
            else nvml.nvmlDeviceGetHandleByUUID(g),
        )
        for g in gpus
    ]


def take_sample(nvml: Any, handles: Sequence[tuple[str, Any]], now: float) -> dict[str, Any]:
    """One reading of each GPU; a GPU NVML cannot read gets None values."""
    readings = []
    for gpu, handle in handles:
        try:
            util = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            mem = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            util, mem = None, None
        readings.append({"id": gpu, "util": util, "mem": mem})
    return {"t": round(now, 3), "gpus": readings}


# --- spool files and logs -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    spool: Path
    interval_s: float
    epilog_wait_s: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            Path(env.get("STB_GPU_SPOOL") or DEFAULT_SPOOL),
            float(env.get("STB_GPU_SAMPLE_S") or DEFAULT_INTERVAL_S),
            float(env.get("STB_GPU_EPILOG_WAIT_S") or DEFAULT_EPILOG_WAIT_S),
        )


def log_line(spool: Path, hook: str, text: str, now: float | None = None) -> None:
    """Append one line to <spool>/<hook>.log (one write: lines of nodes never mix)."""
    line = f"{iso(time.time() if now is None else now)} {text}\n"
    try:
        spool.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(spool / f"{hook}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        sys.stderr.write(line)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    tmp.replace(path)


# --- the hooks ------------------------------------------------------------------------

Spawn = Callable[[list[str], Mapping[str, str]], int]


def spawn_detached(argv: list[str], env: Mapping[str, str]) -> int:
    """Start argv in its own session, detached from slurmd's pipes; its pid."""
    proc = subprocess.Popen(
        argv,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        cwd="/",
    )
    return proc.pid


def prolog(
    env: Mapping[str, str],
    nvml_loader: Callable[[], Any] = load_nvml,
    spawn: Spawn = spawn_detached,
    now: Callable[[], float] = time.time,
) -> str:
    """Start the sampler for this job's GPUs on this node; the line logged."""
    settings = Settings.from_env(env)
    job = JobOnNode.from_env(env)
    where = f"job {job.job_id} on {job.node}"
    if not job.gpus:
        return f"{where}: no GPUs allocated, nothing sampled"
    try:
        nvml = nvml_loader()
        nvml.nvmlInit()
    except Exception as exc:
        return f"{where}: no NVML ({type(exc).__name__}: {exc}), nothing sampled"
    try:
        names = [str(nvml.nvmlDeviceGetName(h)) for _, h in open_gpus(nvml, job.gpus)]
    except Exception as exc:
        return f"{where}: NVML cannot open GPUs {','.join(job.gpus)} ({exc}), nothing sampled"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    settings.spool.mkdir(parents=True, exist_ok=True, mode=0o755)
    start = now()
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "sample",
        job.job_id,
        job.node,
        ",".join(job.gpus),
    ]
    pid = spawn(argv, env)
    state = {"pid": pid, "start": start, "cluster": job.cluster, "gpus": list(job.gpus)}
    _write_json(settings.spool / f"{job.stem}.state", state)
    return (
        f"{where}: sampling GPUs {','.join(job.gpus)} ({', '.join(names)}) every "
        f"{settings.interval_s:g}s, sampler pid {pid}"
    )


def _is_our_sampler(pid: int, job: JobOnNode) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"sample" in argv and job.job_id.encode() in argv and job.node.encode() in argv


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_sampler(pid: int, job: JobOnNode, wait_s: float) -> str:
    """SIGTERM the job's sampler, SIGKILL it after wait_s: how it ended."""
    if not _is_our_sampler(pid, job):
        return "sampler gone"
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid) or not _is_our_sampler(pid, job):
                return "sampler stopped"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "sampler stopped"
    return f"sampler killed after {wait_s:g}s"


def epilog(env: Mapping[str, str], now: Callable[[], float] = time.time) -> str:
    """Stop this job's sampler and write its record; the line logged."""
    settings = Settings.from_env(env)
    job = JobOnNode.from_env(env)
    where = f"job {job.job_id} on {job.node}"
    state_path = settings.spool / f"{job.stem}.state"
    samples_path = settings.spool / f"{job.stem}.samples"
    try:
        state = json.loads(state_path.read_text())
    except FileNotFoundError:
        return f"{where}: no sampler ran (no GPU or no NVML), nothing recorded"
    stopped = stop_sampler(int(state["pid"]), job, settings.epilog_wait_s)
    job = JobOnNode(
        job.job_id,
        job.node,
        str(state.get("cluster") or job.cluster),
        tuple(state.get("gpus") or job.gpus),
    )
    try:
        samples = read_samples(samples_path.read_text(errors="replace").splitlines())
    except FileNotFoundError:
        samples = []
    start = float(state["start"])
    record = summarise(job, samples, start, now())
    out = settings.spool / f"{job.stem}-{int(start)}.json"
    _write_json(out, record)
    for path in (samples_path, state_path):
        path.unlink(missing_ok=True)
    return (
        f"{where}: {stopped}; {record['samples']} samples of GPUs {','.join(job.gpus)}, "
        f"mean util {record['mean_util_pct']}%, max mem {record['max_mem_bytes']} B -> {out}"
    )


# --- the release check ---------------------------------------------------------------

RELEASE_MODES = ("drain", "log", "off")
DEFAULT_RELEASE_WAIT_S = 10.0


def gpu_holders(nvml: Any, handles: Sequence[tuple[str, Any]]) -> list[str]:
    """Each process NVML lists on the GPUs (compute and graphics), as `GPU <id>: pid
    <pid> (<MiB> MiB)`; its memory "?" where NVML does not say it (some drivers, MIG)."""
    held: list[str] = []
    for gpu, handle in handles:
        seen: set[int] = set()
        for lister in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            procs = getattr(nvml, lister, None)
            if procs is None:
                continue
            for p in procs(handle):
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                mib = "?" if used is None else str(int(used) // 2**20)
                held.append(f"GPU {gpu}: pid {p.pid} ({mib} MiB)")
    return held


def release_check(
    env: Mapping[str, str],
    load: Callable[[], Any] = load_nvml,
    run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """The release check of the job's GPUs on this node (see the module docstring): the
    line logged; "" when there is nothing to say (no GPU, no NVML, the check off)."""
    mode = (env.get("STB_GPU_RELEASE_CHECK") or "drain").strip().lower()
    if mode == "off":
        return ""
    if mode not in RELEASE_MODES:
        return (
            f"release check: STB_GPU_RELEASE_CHECK={mode!r} is none of {', '.join(RELEASE_MODES)}"
        )
    job = JobOnNode.from_env(env)
    if not job.gpus:
        return ""
    try:
        nvml = load()
        nvml.nvmlInit()
    except Exception as exc:
        return f"release check: no NVML ({type(exc).__name__})"
    wait_s = float(env.get("STB_GPU_RELEASE_WAIT_S") or DEFAULT_RELEASE_WAIT_S)
    try:
        handles = open_gpus(nvml, job.gpus)
        deadline = clock() + wait_s
        held = gpu_holders(nvml, handles)
        while held and clock() < deadline:
            sleep(min(0.5, max(0.0, deadline - clock())))
            held = gpu_holders(nvml, handles)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    if not held:
        return f"release check: GPUs {','.join(job.gpus)} free"
    what = "; ".join(held)
    if mode == "log":
        return f"release check: still held after {wait_s:g} s: {what} (not drained: mode log)"
    reason = f"stb: GPU memory held after job {job.job_id}: {what}"[:200]
    argv = ["scontrol", "update", f"NodeName={job.node}", "State=DRAIN", f"Reason={reason}"]
    runner = run or (lambda a: subprocess.run(a, capture_output=True, text=True, timeout=30))
    try:
        done = runner(argv)
    except Exception as exc:
        return f"release check: {what}; drain failed ({type(exc).__name__}: {exc})"
    if done.returncode != 0:
        why = (done.stderr or done.stdout or "").strip()
        return f"release check: {what}; drain failed (exit {done.returncode}: {why})"
    return f"release check: {what}; node {job.node} drained"


class _Stop(Exception):
    """SIGTERM reached the sampler."""


def run_sampler(
    nvml: Any,
    job: JobOnNode,
    settings: Settings,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    max_samples: int | None = None,
) -> tuple[int, str]:
    """Append a sample line every interval until SIGTERM (`_Stop`), until the job's
    state file is gone (its epilog ran, or was lost) or max_samples: (samples, why)."""
    state_path = settings.spool / f"{job.stem}.state"
    samples_path = settings.spool / f"{job.stem}.samples"
    handles = open_gpus(nvml, job.gpus)
    taken = 0
    why = f"took its {max_samples} samples"
    with samples_path.open("a") as out:
        try:
            while max_samples is None or taken < max_samples:
                out.write(json.dumps(take_sample(nvml, handles, now())) + "\n")
                out.flush()
                taken += 1
                sleep(settings.interval_s)
                if not state_path.exists():
                    why = "found its state file gone"
                    break
        except _Stop:
            why = "was stopped by the epilog"
    return taken, why


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


def sample_main(args: Sequence[str], env: Mapping[str, str]) -> str:
    """The detached sampler: `sample <job_id> <node> <gpus>`."""
    job_id, node, gpus = args[:3]
    job = JobOnNode(job_id, node, env.get("SLURM_CLUSTER_NAME", ""), tuple(parse_gpu_list(gpus)))
    settings = Settings.from_env(env)
    signal.signal(signal.SIGTERM, _raise_stop)
    nvml = load_nvml()
    nvml.nvmlInit()
    try:
        taken, why = run_sampler(nvml, job, settings)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return f"job {job.job_id} on {job.node}: the sampler {why} after {taken} samples"


HOOKS = ("prolog", "epilog", "sample")


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run one hook; always 0, whatever happens (a failing Prolog drains the node)."""
    env = dict(os.environ) if env is None else env
    hook = argv[0] if argv else ""
    spool = Path(env.get("STB_GPU_SPOOL") or DEFAULT_SPOOL)
    log = hook if hook in ("prolog", "epilog") else "sampler"
    try:
        if hook == "prolog":
            text = prolog(env)
        elif hook == "epilog":
            text = epilog(env)
            released = release_check(env)
            if released:
                text = f"{text}; {released}"
        elif hook == "sample":
            text = sample_main(argv[1:], env)
        else:
            text = f"unknown hook {hook!r}: use one of {', '.join(HOOKS)}"
    except BaseException as exc:
        job = env.get("SLURM_JOB_ID", "?")
        text = f"job {job}: {hook} failed, ignored ({type(exc).__name__}: {exc})"
    with contextlib.suppress(BaseException):
        log_line(spool, log, text)
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException:
        code = 0
    sys.exit(code)
