"""The Slurm backend on pyslurm, for sites whose libslurm matches the pyslurm wheel
(pyslurm 25.11.x for Slurm 25.11).

Written against pyslurm 25.11.2's sources. It is NOT proven on this project's lab:
pyslurm on the package index is built for Slurm 25.11 only and no Debian suite carries
that release, so `import pyslurm` fails here and the contract suite
(`tests/lab/test_slurm_adapter.py`) skips this backend. At a Slurm 25.11 site the same
suite runs against it unchanged.

Reads and writes to slurmctld go through pyslurm's RPC wrappers. Accounting goes through
`sacct --json` (the CLI backend): pyslurm 25.11's `db.Jobs.load` keys jobs by id and
does not ask slurmdbd for duplicates, so it cannot return each run of a requeued job,
which the ledger needs. pyslurm results are turned back into the strings Slurm prints
and handed to the same tested parsers as the CLI backend, so both backends agree on
meaning (gres counting, states, reasons).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Unpack

import pyslurm  # importing this module is how a site opts in

from bridge.slurm import model, parse, squeue
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.errors import CommandRejected, ControllerUnreachable
from bridge.slurm.hostlist import compress, expand


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a pyslurm call, mapping its RPCError to the adapter's typed errors."""
    try:
        return fn(*args, **kwargs)
    except pyslurm.RPCError as exc:
        message = str(exc)
        low = message.lower()
        if "unable to contact slurm controller" in low or "connection" in low or "timed out" in low:
            raise ControllerUnreachable(f"{what}: {message}") from exc
        raise CommandRejected(what, message) from exc


def _gres_string(gres: Mapping[str, Any] | None) -> str:
    """{"gpu:h100": 4} -> "gpu:h100:4" (the form `parse_gres` reads)."""
    return ",".join(f"{k}:{v}" for k, v in (gres or {}).items())


def _tres_string(tres: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (tres or {}).items())


def _job_gres_tres(tres: Any) -> str:
    """A job's allocated TRES, its GRES part, as Slurm prints it (`gres/gpu=2,gres/gpu:
    h100_1g.10gb=2`, `gres/shard=4`): pyslurm's `Job.allocated_tres` is a
    `TrackableResources` (None when the job holds none) whose `gres` maps each GRES
    (a `GPU` or a `TrackableResource`) to one with `type_and_name` and `count`."""
    if tres is None:
        return ""
    return ",".join(f"{r.type_and_name}={r.count}" for r in tres.gres.values())


def _ts(value: Any) -> datetime | None:
    return parse.timestamp(value) if isinstance(value, int) else None


def _minutes(value: Any) -> int | None:
    """A job's `time_limit` (minutes; pyslurm gives None for UNLIMITED)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class PySlurm:
    """`SlurmProtocol` on pyslurm. `sacct_env` is given to the sacct calls."""

    def __init__(self, sacct_env: Mapping[str, str] | None = None) -> None:
        self._sacct = SlurmCLI(env=sacct_env)

    def version(self) -> str:
        return str(_call("load config", pyslurm.slurmctld.Config.load).version)

    def nodes(self) -> list[model.Node]:
        nodes = []
        for n in _call("load nodes", pyslurm.Nodes.load).values():
            state = str(n.state or "UNKNOWN").split("+")
            gpu_type, gpus = parse.parse_gres(_gres_string(n.configured_gres))
            _, alloc = parse.gpus_from_tres(_tres_string(n.allocated_tres))
            nodes.append(
                model.Node(
                    name=n.name,
                    addr=n.address or n.name,
                    partitions=tuple(n.partitions or ()),
                    state=state[0].rstrip("*").lower(),
                    flags=frozenset(state[1:]),
                    reason=n.reason or "",
                    gpu_type=gpu_type,
                    gpus=gpus,
                    gpus_alloc=alloc,
                    gres=_gres_string(n.configured_gres),
                    alloc_tres=_tres_string(n.allocated_tres),
                )
            )
        return nodes

    def partitions(self) -> list[model.Partition]:
        out = []
        for p in _call("load partitions", pyslurm.Partitions.load).values():
            allowed = tuple(p.allowed_accounts or ())
            out.append(
                model.Partition(
                    name=p.name,
                    nodes=tuple(expand(p.nodes or "")),
                    priority_tier=int(p.priority_tier or 1),
                    preempt_mode=str(p.preempt_mode),
                    allow_accounts=None if allowed in ((), ("ALL",)) else allowed,
                    grace_time_s=int(p.preemption_grace_time or 0),
                    state=str(p.state),
                    default=bool(p.is_default),
                )
            )
        return out

    def jobs(self, **filters: Unpack[model.JobFilter]) -> list[model.Job]:
        jobs = []
        for j in _call("load jobs", pyslurm.Jobs.load).values():
            nodes = tuple(expand(j.allocated_nodes or ""))
            _, per_node = parse.parse_gres(_gres_string(j.gres_per_node))
            pending = str(j.state) == "PENDING"
            jobs.append(
                model.Job(
                    job_id=parse.format_job_id(
                        j.id,
                        j.array_id,
                        j.array_task_id,
                        j.array_tasks_waiting or "",
                        j.array_tasks_parallel,
                    ),
                    name=j.name or "",
                    partition=j.partition or "",
                    account=j.account or "",
                    user=j.user_name or "",
                    state=str(j.state),
                    reason=j.state_reason or "",
                    nodes=nodes,
                    comment=j.comment or "",
                    gpus=per_node * max(1, len(nodes)),
                    restarts=int(j.requeue_count or 0),
                    submit_time=_ts(j.submit_time),
                    start_time=None if pending else _ts(j.start_time),
                    requested_nodes=tuple(expand(j.required_nodes or "")),
                    end_time=parse.run_end(_ts(j.end_time), _minutes(j.time_limit), pending),
                    alloc_tres="" if pending else _job_gres_tres(j.allocated_tres),
                )
            )
        return squeue.filter_jobs(jobs, **filters)

    def submit(self, spec: model.JobSpec) -> str:
        script = (
            f"#!/bin/sh\n{spec.wrap}\n"
            if spec.wrap is not None
            else Path(str(spec.script)).read_text()
        )
        desc = pyslurm.JobSubmitDescription(
            partitions=spec.partition,
            account=spec.account,
            script=script,
            environment=dict(spec.env) or None,
        )
        if spec.name:
            desc.name = spec.name
        if spec.comment:
            desc.comment = spec.comment
        if spec.nodelist:
            desc.required_nodes = compress(spec.nodelist)
        if spec.nodes is not None:
            desc.nodes = spec.nodes
            desc.ntasks = spec.nodes
        if spec.gpus_per_node is not None:
            key = "gpu" if spec.gpu_type is None else f"gpu:{spec.gpu_type}"
            desc.gres_per_node = {key: spec.gpus_per_node}
        if spec.exclusive:
            desc.resource_sharing = "no"
        if spec.requeue is not None:
            desc.is_requeueable = spec.requeue
        if spec.reservation:
            desc.reservations = spec.reservation
        if spec.output:
            desc.standard_output = spec.output
        if spec.time_limit_min is not None:
            desc.time_limit = str(spec.time_limit_min)
        if spec.qos:
            desc.qos = spec.qos
        if spec.nice is not None:
            desc.nice = spec.nice
        if spec.priority is not None:  # (pyslurm takes a number: TOP is NO_VAL - 1)
            top = spec.priority == model.TOP_PRIORITY
            desc.priority = model.TOP_PRIORITY_VALUE if top else spec.priority
        return str(_call("submit", desc.submit))

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        ids = parse.parse_job_id(job_id)
        job = pyslurm.Job(ids.job_id)
        try:
            if signal is None:
                _call("cancel", job.cancel)
            else:
                _call("signal", job.send_signal, signal)
        except CommandRejected as exc:
            if (
                "already completing or completed" not in exc.slurm_message.lower()
                and "invalid job id" not in exc.slurm_message.lower()
            ):
                raise

    def requeue(self, job_id: str) -> None:
        _call("requeue", pyslurm.Job(parse.parse_job_id(job_id).job_id).requeue)

    def drain(self, node: str, reason: str) -> None:
        reason = model.drain_reason(reason)
        _call("drain", pyslurm.Node(node).modify, pyslurm.Node(state="DRAIN", reason=reason))

    def resume(self, node: str) -> None:
        try:
            _call("resume", pyslurm.Node(node).modify, pyslurm.Node(state="RESUME"))
        except CommandRejected as exc:
            if "invalid node state" not in exc.slurm_message.lower():
                raise

    def reservations(self) -> list[model.Reservation]:
        out = []
        for r in _call("load reservations", pyslurm.Reservations.load).values():
            out.append(
                model.Reservation(
                    name=r.name,
                    nodes=tuple(expand(r.nodes or "")),
                    start=_ts(r.start_time),
                    end=_ts(r.end_time),
                    flags=frozenset(str(f) for f in (r.flags or ())),
                    users=tuple(r.users or ()),
                    state="ACTIVE" if r.is_active else "INACTIVE",
                )
            )
        return out

    def create_reservation(self, spec: model.ReservationSpec) -> None:
        names = {"MAINT": "MAINTENANCE", "IGNORE_JOBS": "IGNORE_RUNNING_JOBS"}
        flag_value = pyslurm.ReservationFlags.from_list([names.get(f, f) for f in spec.flags])
        start = datetime.now(UTC)
        resv = pyslurm.Reservation(
            name=spec.name,
            nodes=compress(spec.nodes),
            users=list(spec.users),
            start_time=start,
            end_time=start + timedelta(seconds=max(60, spec.duration_s)),
            flags=flag_value,
        )
        _call("create reservation", resv.create)

    def delete_reservation(self, name: str) -> None:
        if any(r.name == name for r in self.reservations()):
            _call("delete reservation", pyslurm.Reservation(name).delete)

    def accounting(self, since: datetime, until: datetime) -> list[model.AccountingRecord]:
        return self._sacct.accounting(since, until)

    def cluster_name(self) -> str:
        return self._sacct.cluster_name()

    def events(self, since: datetime, until: datetime) -> list[model.SlurmEvent]:
        return self._sacct.events(since, until)
