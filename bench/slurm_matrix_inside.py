"""The part of the Slurm release matrix that runs inside one Debian root (started by
`bench/slurm_matrix.py` in the root's own network namespace, with the root's venv).

`stb lab up` on a fresh lab directory; pytest on the given test files (JUnit XML to
`--out`), with `STB_LAB_KEEP=1` so the lab stays up for the recording; with `--record`, a
small scenario whose `squeue --json` and `sacct --json` are written as
`squeue-matrix-<rel>.json` and `sacct-matrix-<rel>.json` (rel: the release's major.minor);
`stb lab down` in any case. `summary.json` in `--out` says the Slurm release, the Python,
pytest's exit status, the recorded files and any error; the last line printed is
`RESULT key=value ...` of the same (the outer bench's log of the suite ends with it).

Scenario (the shapes the parsers read): a running training job with 2 GPUs and a comment;
a held array `2-4%2` (pending, then released and run); a Triton-tagged job of the bridge's
account on the reserved node (job_submit.lua adds the admin comment's workload tag); an
elastic job requeued while it runs (two runs in sacct); a training job with its own comment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SRV = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SRV))

from bridge.lab import lab as lab_mod  # noqa: E402
from bridge.lab.slurmctl import slurm  # noqa: E402
from bridge.lab.spec import LabSpec  # noqa: E402
from bridge.slurm.sacct import parse_sacct_json  # noqa: E402


def say(msg: str) -> None:
    print(f"lab: {msg}", flush=True)


def release() -> str:
    out = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip() or "?"


def sbatch(spec: LabSpec, *args: str) -> str:
    out = slurm(spec, "sbatch", "--parsable", f"--output={spec.log_dir}/matrix-%j.out", *args)
    return out.strip().split(";")[0]


def state(spec: LabSpec, job: str) -> set[str]:
    out = slurm(spec, "squeue", "-h", "-j", job, "-o", "%T", check=False)
    return set(out.split())


def wait(what: str, cond: Any, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not happen within {timeout_s}s")


def scrub(text: str) -> str:
    """The recorded JSON holds /srv/stb paths already (the checkout's place in the root);
    the machine's host name (SlurmctldHost, NodeHostname) becomes `stbhost`."""
    host = socket.gethostname().split(".")[0]
    return re.sub(rf'(?<=["@ ]){re.escape(host)}(?=["\s.,:])', "stbhost", text)


def record(spec: LabSpec, out: Path, rel: str) -> list[str]:
    train = spec.pool_nodes("train")[0].name
    reserved = spec.pool_nodes("infer")[0].name
    running = sbatch(
        spec,
        "--partition=train",
        "--account=team-vision",
        "--gres=gpu:2",
        f"-w{train}",
        "--comment=stb:test",
        "--wrap",
        "sleep 120",
    )
    array = sbatch(
        spec,
        "--partition=train",
        "--account=team-nlp",
        "--array=2-4%2",
        "-H",
        "--gres=gpu:1",
        "--wrap",
        "sleep 3",
    )
    triton = sbatch(
        spec,
        "--partition=infer",
        "--account=bridge",
        "--gres=gpu:1",
        f"-w{reserved}",
        "--comment=stb:triton",
        "--job-name=stb-triton-matrix",
        "--wrap",
        "sleep 120",
    )
    elastic = sbatch(
        spec,
        "--partition=elastic",
        "--account=team-research",
        "--gres=gpu:3",
        "--requeue",
        "--wrap",
        "sleep 120",
    )
    for job in (running, triton, elastic):
        wait(f"job {job} runs", lambda j=job: state(spec, j) == {"RUNNING"})
    time.sleep(2)
    slurm(spec, "scontrol", "requeue", elastic)
    wait("the requeued job is pending", lambda: state(spec, elastic) == {"PENDING"})
    squeue = slurm(spec, "squeue", "--all", "--json")
    name = f"squeue-matrix-{rel}.json"
    (out / name).write_text(scrub(squeue))
    slurm(spec, "scontrol", "release", array)
    nightly = sbatch(
        spec,
        "--partition=train",
        "--account=team-nlp",
        "--gres=gpu:1",
        "--comment=nightly run",
        "--wrap",
        "sleep 2",
    )
    wait("the array's tasks end", lambda: not state(spec, array), timeout_s=120)
    wait("the nightly job ends", lambda: not state(spec, nightly))
    slurm(spec, "scancel", running, triton, elastic)
    jobs = (running, array, triton, elastic, nightly)
    wait("every job ends", lambda: not any(state(spec, j) for j in jobs))
    ids = ",".join(jobs)

    def final() -> bool:
        """Every run recorded (the array's 3 tasks, the elastic job's 2 runs: 8) and
        ended: none running or pending."""
        runs = parse_sacct_json(slurm(spec, "sacct", "--json", "--duplicates", "-j", ids))
        return len(runs) >= 8 and not any(r.state in ("RUNNING", "PENDING") for r in runs)

    try:
        wait("sacct has every run", final)
    finally:  # written in any case: what sacct says is the record (or the clue)
        sacct = slurm(spec, "sacct", "--json", "--allusers", "--duplicates", "-j", ids)
        (out / f"sacct-matrix-{rel}.json").write_text(scrub(sacct))
    return [name, f"sacct-matrix-{rel}.json"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tests", required=True)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "slurm": release(),
        "recorded": [],
        "error": "",
    }
    spec = LabSpec(lab_dir=SRV / ".lab")
    subprocess.run(["rm", "-rf", str(spec.lab_dir)], check=True)  # a fresh lab each run
    os.chdir(SRV)
    try:
        t0 = time.monotonic()
        lab_mod.up(spec, say=say)
        summary["lab_up_s"] = round(time.monotonic() - t0, 1)
        tests = [t for t in args.tests.split(",") if t]
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={out / 'junit.xml'}",
            *tests,
        ]
        t0 = time.monotonic()
        done = subprocess.run(argv, env=os.environ | {"STB_LAB_KEEP": "1"})
        summary["pytest_rc"] = done.returncode
        summary["pytest_s"] = round(time.monotonic() - t0, 1)
        if args.record:
            rel = ".".join(summary["slurm"].split(".")[:2])
            summary["recorded"] = record(spec, out, rel)
    except Exception as exc:
        traceback.print_exc()
        summary["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        try:
            lab_mod.down(spec, say=say)
        except Exception as exc:
            summary["error"] = summary["error"] or f"lab down: {exc}"
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    ok = not summary["error"] and summary.get("pytest_rc") == 0
    print(
        f"RESULT ok={str(ok).lower()} slurm={summary['slurm']} python={summary['python']} "
        f"lab_up_s={summary.get('lab_up_s', '-')} pytest_rc={summary.get('pytest_rc', '-')} "
        f"pytest_s={summary.get('pytest_s', '-')} recorded={len(summary['recorded'])}",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
