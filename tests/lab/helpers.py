"""Small helpers the lab tests share: run `stb` and Slurm commands, wait for job states, cancel the
Triton jobs a test's daemons left, a Prometheus server scraping the lab's Triton servers, a
load sender stoppable half-way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bridge.audit.asks import ask_lend
from bridge.config import ModelOverride, load_config
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.load.arrivals import Schedule
from bridge.load.runner import Counters, RunConfig, parse_endpoint, run
from bridge.paths import project_root
from bridge.routing.table import RoutingTable
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import TRITON_TAG

#: one request's input for the lab's `busy` model (four floats)
BUSY_INPUT = {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}


def busy_takes_one_gpu() -> dict[str, object]:
    """A `bridge_update` saying busy's replica takes one GPU (`instance_gpus = 1`), so
    that its lends are partial ones."""
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    return {"models": {**base.models, "busy": ModelOverride(instance_gpus=1)}}


def until(what: str, check: Callable[[], object], timeout_s: float, every: float = 0.05) -> float:
    """Poll `check()` until true; the time.time() it became true (else the test fails,
    naming `what`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return time.time()
        time.sleep(every)
    raise AssertionError(f"not within {timeout_s:g}s: {what}")


def stb(spec: LabSpec, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The `stb` of this environment, run on the lab from the repository's root."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("stb")), *args],
        cwd=project_root(),
        env=os.environ | spec.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sbatch(spec: LabSpec, *args: str) -> str:
    out = slurm(spec, "sbatch", "--parsable", f"--output={spec.log_dir}/test-%j.out", *args)
    return out.strip().split(";")[0]


def squeue_state(spec: LabSpec, job_id: str) -> tuple[str, str]:
    """(state, reason) from squeue; ("", "") when the job left the queue."""
    out = slurm(spec, "squeue", "-h", "-j", job_id, "-o", "%T|%r", check=False).strip()
    if not out:
        return "", ""
    state, _, reason = out.partition("|")
    return state, reason


def wait_state(spec: LabSpec, job_id: str, states: set[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state, _ = squeue_state(spec, job_id)
        if state in states:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never reached {states} in {timeout_s}s (last {state!r})")


#: squeue's states of a job that holds, or will hold, its node and ports
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")


def cancel_triton_jobs(spec: LabSpec, timeout_s: float = 60) -> None:
    """Cancel every live Triton job (the baselines the daemons start outlive them by
    design) and wait until none is left, so the next user of the lab finds its ports free.
    Ended jobs, which squeue lists for MinJobAge (600 s) after they end, are not waited
    for (bridge.lab.pair's `cancel_triton_jobs` waits its whole timeout for them)."""
    cli = SlurmCLI(env=spec.env())
    for job in cli.jobs(tag=TRITON_TAG, states=LIVE_STATES):
        cli.cancel(job.job_id)
    deadline = time.monotonic() + timeout_s
    while cli.jobs(tag=TRITON_TAG, states=LIVE_STATES) and time.monotonic() < deadline:
        time.sleep(0.5)


def sacct_records(spec: LabSpec, job_id: str, *, duplicates: bool = False) -> list[dict[str, Any]]:
    argv = ["sacct", "-j", job_id, "--json"] + (["--duplicates"] if duplicates else [])
    return list(json.loads(slurm(spec, *argv))["jobs"])


def wait_sacct_final(
    spec: LabSpec,
    job_id: str,
    timeout_s: float = 30,
    until: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """The job's final record once slurmdbd has all of it (and `until` holds of it, when
    given). For a job of a few seconds, slurmdbd may hold the completion before the start
    message is merged: the record then reads COMPLETED with no partition and no nodes for
    a moment (seen on 22.05.8), or with partition and nodes but no comments yet (seen once
    in a CI run); the last record seen is in the error when none qualifies."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        recs = sacct_records(spec, job_id)
        last = recs[-1] if recs else last
        if (
            recs
            and recs[-1]["state"]["current"] not in ("RUNNING", "PENDING")
            and recs[-1]["partition"]
            and recs[-1]["nodes"] not in ("", "None assigned")
            and (until is None or until(recs[-1]))
        ):
            return recs[-1]
        time.sleep(0.5)
    shown = {k: last.get(k) for k in ("state", "partition", "nodes", "comment")} if last else None
    raise AssertionError(f"sacct has no final record of job {job_id} after {timeout_s}s: {shown}")


def gpu_count(record: dict[str, Any]) -> int:
    """gres/gpu from a sacct record's allocated TRES (untyped entry only, not summed)."""
    for tres in record["tres"]["allocated"]:
        if tres["type"] == "gres" and tres["name"] == "gpu":
            return int(tres["count"])
    return 0


def scontrol_show(spec: LabSpec, kind: str, *names: str) -> dict[str, dict[str, str]]:
    """`scontrol show <kind> -o` as {name: {field: value}}, keyed by the first field."""
    out = slurm(spec, "scontrol", "show", kind, "-o", *names)
    records = {}
    for line in out.splitlines():
        fields = [f.split("=", 1) for f in line.split() if "=" in f]
        if fields:
            records[fields[0][1]] = dict(fields)
    return records


def tick_until(
    rec: Reconciler, cond: Callable[[], bool], timeout_s: float, log: list[str] | None = None
) -> None:
    """Run the reconciler's pass every second (a pass starting a second after the one
    before began, as the daemon's scheduler runs them) until cond(); fail with its
    timeline."""
    log = [] if log is None else log
    deadline = time.monotonic() + timeout_s
    while True:
        began = time.monotonic()
        report = rec.run_once(datetime.now(UTC))
        log += report.lines()
        if cond():
            return
        assert time.monotonic() < deadline, "\n".join(log)
        time.sleep(max(0.0, began + 1.0 - time.monotonic()))


class RecordingRouter:
    """The bridge's publisher, each table it made effective kept with when."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.tables: list[tuple[float, RoutingTable]] = []

    def publish(self, table: RoutingTable) -> object:
        done = self.router.publish(table)
        self.tables.append((time.monotonic(), table))
        return done

    def routes(self, model: str) -> tuple[str, ...]:
        """The addresses the last table published for `model`."""
        return tuple(dict(self.tables[-1][1].routes).get(model, ()))


def lend_serving(
    rec: Reconciler, lab: LabSpec, models: Sequence[str], log: list[str]
) -> tuple[Any, str]:
    """An operator's lend of the lab's elastic node for `models`, ticked until it serves:
    the lease and its server's address (holding just `models`)."""
    assert rec.requests is not None
    tick_until_baseline(rec, lab, log)
    ask_lend(rec.requests, lab.pool_nodes("elastic")[0].name, list(models))
    store = rec.store
    tick_until(
        rec, lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 90, log
    )
    (lease,) = store.open_leases()
    assert lease.id is not None and lease.models == list(models)
    obs = rec.last_observation
    lent = obs.server_of(lease.slurm_job_id) if obs is not None else None
    assert lent is not None and lent.models == tuple(models), (lent, "\n".join(log))
    return lease, lent.address


def upstreams(endpoint: str, model: str, inputs: Mapping[str, object], n: int = 20) -> set[str]:
    """The upstreams nginx sent `n` requests of `model` to (each answered 200)."""
    seen: set[str] = set()
    for _ in range(n):
        r = httpx.post(f"http://{endpoint}/v2/models/{model}/infer", json={"inputs": [inputs]})
        assert r.status_code == 200, r.text
        seen.add(r.headers.get("X-Stb-Upstream", ""))
    return seen


def tick_until_placed(
    rec: Reconciler,
    job_id: str | None,
    address: str,
    routes: Callable[[str], Sequence[str]],
    holds: str,
    left: str,
    log: list[str],
) -> None:
    """Tick until the server of Triton job `job_id` holds just `holds` READY and is
    routed for it (`routes`: the addresses last published for a model) and not for
    `left`; then on for 3 s more, the load going on over the placed replica."""

    def placed() -> bool:
        seen = rec.last_observation
        server = seen.server_of(job_id) if seen is not None else None
        return (
            server is not None
            and server.models == (holds,)
            and address in routes(holds)
            and address not in routes(left)
        )

    tick_until(rec, placed, 40, log)
    settled = time.monotonic() + 3
    tick_until(rec, lambda: time.monotonic() > settled and placed(), 10, log)


def tick_until_baseline(rec: Reconciler, lab: LabSpec, log: list[str] | None = None) -> None:
    """Tick until the reserved node's baseline Triton server is ready."""
    reserved = lab.pool_nodes("infer")[0].name
    tick_until(
        rec,
        lambda: (
            rec.last_observation is not None
            and any(s.ready and s.node == reserved for s in rec.last_observation.servers)
        ),
        120,
        log,
    )


@contextlib.contextmanager
def prometheus_scraping(targets: Sequence[str], interval_s: float, folder: Path) -> Iterator[str]:
    """A real Prometheus server (Debian's, installed by `stb lab up`) scraping `targets`
    (host:port of metrics pages) every `interval_s`, its data in `folder`; yields its URL
    once it answers, and stops it (SIGTERM, then kill) on the way out."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is installed by `stb lab up`"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    listed = ", ".join(f'"{t}"' for t in targets)
    config.write_text(
        f"global:\n  scrape_interval: {interval_s:g}s\n  evaluation_interval: {interval_s:g}s\n"
        f"scrape_configs:\n  - job_name: triton\n    static_configs:\n"
        f"      - targets: [{listed}]\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    with open(folder / "prometheus.log", "ab") as log:
        proc = subprocess.Popen(
            [
                binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (folder / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not get ready in 30 s"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Sender(threading.Thread):
    """The load generator's runner (open loop, `schedule` on `model` at `endpoint`) on its
    own event loop in a thread, stoppable half-way: `finish` sends nothing more and waits
    for the answers in flight (counted), `stop` cancels them."""

    def __init__(self, endpoint: str, schedule: Schedule, model: str) -> None:
        super().__init__(daemon=True)
        self.schedule = schedule
        self.config = RunConfig(
            endpoints=(parse_endpoint(endpoint),),
            model=model,
            shape=(16,),
            max_requests=20_000,
            max_duration_s=schedule.window_s,
            concurrency_cap=2_000,
            timeout_s=60,
        )
        self.counters = Counters()
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[object] | None = None
        self.started_task = threading.Event()
        self.stop_sending = threading.Event()

    def run(self) -> None:
        try:
            self.task = self.loop.create_task(
                run(self.schedule, self.config, counters=self.counters, stop=self.stop_sending)
            )
            self.started_task.set()
            self.loop.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass
        finally:
            self.started_task.set()
            self.loop.close()

    def finish(self, timeout_s: float = 60) -> None:
        self.stop_sending.set()
        self.join(timeout_s)

    def stop(self) -> None:
        self.started_task.wait(5)
        if self.is_alive() and self.task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(self.task.cancel)
        self.join(15)


@contextlib.contextmanager
def triton_serving(spec: LabSpec, models: str, name: str) -> Iterator[triton.TritonJob]:
    """A Triton job on the first inference node serving `models` (names joined by ',')
    from the lab's repository; cancelled on the way out and waited out, so that it is
    gone before the next module's server binds the node's ports."""
    node = spec.pool_nodes("infer")[0].name
    job_id = triton.submit(spec, node=node, models=models, name=name)
    try:
        yield triton.wait_ready(spec, job_id, timeout_s=120)
    finally:
        slurm(spec, "scancel", job_id, check=False)
        deadline = time.monotonic() + 40
        while triton.job_state(spec, job_id)[0] and time.monotonic() < deadline:
            time.sleep(0.5)
