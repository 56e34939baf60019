"""The Slurm backend on Slurm's command-line tools (22.05 and later).

Runs `scontrol`, `squeue`, `sbatch`, `scancel`, `sacct`, `sacctmgr` as argument lists (no shell),
with a timeout, `TZ=UTC` so every time Slurm prints is UTC, and classifies failures:
the controller or database not answering is `ControllerUnreachable`; any other non-zero
exit is `CommandRejected` quoting Slurm's message. Called by the daemon and the ledger
through `SlurmProtocol`.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Unpack

from bridge.slurm import model, parse, sacct, sacctmgr, scontrol, squeue, sreport
from bridge.slurm.errors import (
    CommandRejected,
    ControllerUnreachable,
    UnparseableOutput,
    from_message,
)
from bridge.slurm.hostlist import compress

#: Phrases that mean "already done" for idempotent writes.
_ALREADY = (
    "job/step already completing or completed",
    "invalid job id specified",
    "reservation request has invalid name",
    "reservation is in use",
    "already",
)


#: what slurmctld answers `State=RESUME` for a node that is neither drained nor down
_NOT_RESUMABLE = ("invalid node state specified", "invalid node state transition")


class SlurmCLI:
    """`SlurmProtocol` on the command line. `env` is added to each command's environment
    (e.g. SLURM_CONF); `timeout_s` bounds each command."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
        self._env = dict(os.environ) | dict(env or {}) | {"TZ": "UTC"}
        self._timeout_s = timeout_s

    def _run(self, *argv: str, env: Mapping[str, str] | None = None) -> str:
        """Run one command; `env` adds to this backend's environment for this call only
        (the backend is shared by the daemon's threads)."""
        command = " ".join(argv[:3])
        try:
            done = subprocess.run(
                list(argv),
                env=self._env | dict(env) if env else self._env,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise ControllerUnreachable(f"{command}: no answer in {self._timeout_s}s") from exc
        except FileNotFoundError as exc:
            raise CommandRejected(command, f"{argv[0]} is not installed") from exc
        if done.returncode != 0:
            message = done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
            raise from_message(command, message)
        return done.stdout

    def _run_idempotent(self, *argv: str) -> None:
        try:
            self._run(*argv)
        except CommandRejected as exc:
            if not any(p in exc.slurm_message.lower() for p in _ALREADY):
                raise

    # --- reads -----------------------------------------------------------------------

    def version(self) -> str:
        out = self._run("sinfo", "--version").split()
        if len(out) != 2:
            raise UnparseableOutput("sinfo --version", " ".join(out))
        return out[1]

    def nodes(self) -> list[model.Node]:
        # --all: a node only in hidden partitions too (scontrol hides it otherwise); its
        # partitions are not listed by `partitions`, so it is in no pool
        return scontrol.parse_nodes(self._run("scontrol", "show", "node", "-o", "--all"))

    def partitions(self) -> list[model.Partition]:
        return scontrol.parse_partitions(self._run("scontrol", "show", "partition", "-o"))

    def jobs(self, **filters: Unpack[model.JobFilter]) -> list[model.Job]:
        jobs = squeue.parse_squeue_json(self._run("squeue", "--all", "--json"))
        return squeue.filter_jobs(jobs, **filters)

    def reservations(self) -> list[model.Reservation]:
        return scontrol.parse_reservations(self._run("scontrol", "show", "reservation", "-o"))

    def accounting(self, since: datetime, until: datetime) -> list[model.AccountingRecord]:
        if since.tzinfo is None or until.tzinfo is None:
            raise ValueError("accounting() needs timezone-aware datetimes")
        if until <= since:
            raise ValueError(f"accounting window is empty: {since} .. {until}")
        fmt = "%Y-%m-%dT%H:%M:%S"
        out = self._run(
            "sacct",
            "--json",
            "--allusers",
            "--duplicates",
            "--allocations",
            "-S",
            since.astimezone(UTC).strftime(fmt),
            "-E",
            until.astimezone(UTC).strftime(fmt),
        )
        return sacct.parse_sacct_json(out)

    def cluster_name(self) -> str:
        name = self.config().get("ClusterName", "")
        if not name:
            raise UnparseableOutput("scontrol show config", "no ClusterName line")
        return name

    def events(self, since: datetime, until: datetime) -> list[model.SlurmEvent]:
        if since.tzinfo is None or until.tzinfo is None:
            raise ValueError("events() needs timezone-aware datetimes")
        if until <= since:
            raise ValueError(f"event window is empty: {since} .. {until}")
        # Every event over the window, cluster and node alike: no Events=, States= or User=
        # (each of the last two keeps node events only), so the registrations and the
        # "slurmctld disconnect" events (TrackSlurmctldDown) are listed too
        # (src/sacctmgr/event_functions.c at slurm-22-05-8-1, l. 173-215, 259-281;
        # as_mysql_cluster.c l. 1169-1171, 1225-1241: start before End, end after Start
        # or open).
        out = self._run(
            "sacctmgr", "-P", "-n", "show", "event",
            f"Start=uts{int(since.timestamp())}", f"End=uts{int(until.timestamp())}",
            "Format=" + ",".join(sacctmgr.EVENT_FIELDS),
            env={"SLURM_TIME_FORMAT": "%s"},
        )  # fmt: skip
        return sacctmgr.parse_sacctmgr_events(out)

    # --- JSON Web Tokens (the REST backend's credentials; not part of SlurmProtocol) -----

    def token(self, username: str, lifespan_s: int) -> str:
        """A JWT for `username` valid for `lifespan_s` seconds (`scontrol token`; needs
        AuthAltTypes=auth/jwt, and root or SlurmUser to mint for another user)."""
        if not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", username):
            raise ValueError(f"user name {username!r} is not a Unix user name")
        if lifespan_s < 1:
            raise ValueError(f"token lifespan {lifespan_s}s is not positive")
        out = self._run("scontrol", "token", f"username={username}", f"lifespan={lifespan_s}")
        return scontrol.parse_token(out)

    # --- association limits and configuration (budgets; not part of SlurmProtocol) -------

    def config(self) -> dict[str, str]:
        """`scontrol show config` as key -> value."""
        return scontrol.parse_show_config(self._run("scontrol", "show", "config"))

    def set_account_gpu_minutes(self, account: str, minutes: int | None) -> None:
        """GrpTRESMins=gres/gpu=<minutes> on the account's association (None: no limit)."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", account):
            raise ValueError(f"account {account!r} is not a Slurm account name")
        value = -1 if minutes is None else minutes
        if value < -1:
            raise ValueError(f"GPU-minutes {minutes} is negative")
        self._run("sacctmgr", "-i", "modify", "account", "where", f"name={account}", "set",
                  f"GrpTRESMins=gres/gpu={value}")  # fmt: skip

    def account_gpu_minutes(self, account: str) -> int | None:
        """The account association's GrpTRESMins for gres/gpu (None: none set)."""
        out = self._run("sacctmgr", "-P", "-n", "show", "assoc", "where", f"account={account}",
                        "format=account,user,grptresmins")  # fmt: skip
        for line in out.splitlines():
            acct, user, mins = [*line.split("|"), "", ""][:3]
            if acct == account and not user:
                for item in mins.split(","):
                    key, _, value = item.partition("=")
                    if key == "gres/gpu" and value.isdigit():
                        return int(value)
                return None
        raise CommandRejected("sacctmgr show assoc", f"no association of account {account!r}")

    # --- sreport (the agreement check's reference; not part of SlurmProtocol) ------------

    def cluster_utilization(self, start: datetime, end: datetime) -> list[sreport.GpuUtilization]:
        """`sreport -T gres/gpu cluster Utilization` over [start, end), in GPU-seconds, one
        line per cluster; none for hours slurmdbd has not rolled up yet."""
        return sreport.parse_sreport_utilization(
            self._run("sreport", *self._sreport_args(start, end), "cluster", "Utilization",
                      *self._sreport_window(start, end))
        )  # fmt: skip

    def account_utilization(self, start: datetime, end: datetime) -> dict[str, int]:
        """`sreport -T gres/gpu cluster AccountUtilizationByUser` over [start, end):
        GPU-seconds per account (each account's own line, which includes its sub-accounts)."""
        return sreport.parse_sreport_accounts(
            self._run("sreport", *self._sreport_args(start, end), "cluster",
                      "AccountUtilizationByUser", *self._sreport_window(start, end))
        )  # fmt: skip

    def reroll(self, start: datetime, end: datetime) -> None:
        """Have slurmdbd roll [start, end) up again now (`sacctmgr roll`, which needs a
        Slurm administrator): the hours of a job record that reached it after their rollup
        are otherwise corrected only at its next hourly pass."""
        self._sreport_args(start, end)  # the same checks of the window
        self._run("sacctmgr", "-i", "roll", *(w.partition("=")[2] for w in
                  self._sreport_window(start, end)))  # fmt: skip

    @staticmethod
    def _sreport_args(start: datetime, end: datetime) -> tuple[str, ...]:
        if start.tzinfo is None or end.tzinfo is None:
            raise ValueError("sreport needs timezone-aware datetimes")
        if end <= start:
            raise ValueError(f"sreport window is empty: {start} .. {end}")
        return ("-P", "-n", "-t", "Seconds", "-T", "gres/gpu")

    @staticmethod
    def _sreport_window(start: datetime, end: datetime) -> tuple[str, str]:
        fmt = "%Y-%m-%dT%H:%M:%S"
        return (
            f"start={start.astimezone(UTC).strftime(fmt)}",
            f"end={end.astimezone(UTC).strftime(fmt)}",
        )

    # --- writes ----------------------------------------------------------------------

    def submit(self, spec: model.JobSpec) -> str:
        argv = [
            "sbatch",
            "--parsable",
            f"--partition={spec.partition}",
            f"--account={spec.account}",
        ]
        optional = (  # each option the spec gives, in this order (None: not given)
            f"--job-name={spec.name}" if spec.name else None,
            f"--comment={spec.comment}" if spec.comment else None,
            f"--nodelist={compress(spec.nodelist)}" if spec.nodelist else None,
            None if spec.nodes is None else f"--nodes={spec.nodes}",
            None if spec.nodes is None else f"--ntasks={spec.nodes}",
            None if spec.gpus_per_node is None else f"--gres={spec.gres}",
            "--exclusive" if spec.exclusive else None,
            None if spec.requeue is None else "--requeue" if spec.requeue else "--no-requeue",
            f"--reservation={spec.reservation}" if spec.reservation else None,
            f"--output={spec.output}" if spec.output else None,
            None if spec.time_limit_min is None else f"--time={spec.time_limit_min}",
            f"--qos={spec.qos}" if spec.qos else None,
            None if spec.nice is None else f"--nice={spec.nice}",
            None if spec.priority is None else f"--priority={spec.priority}",
        )
        argv += [option for option in optional if option is not None]
        argv.append("--export=" + ",".join(["ALL", *(f"{k}={v}" for k, v in spec.env.items())]))
        argv += ["--wrap", spec.wrap] if spec.wrap is not None else [str(spec.script)]
        out = self._run(*argv).strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise UnparseableOutput("sbatch --parsable", out)
        return job_id

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        parse.parse_job_id(job_id)  # refuse anything that is not a job id
        argv = (
            ["scancel", job_id]
            if signal is None
            else ["scancel", "--full", f"--signal={signal}", job_id]
        )
        self._run_idempotent(*argv)

    def requeue(self, job_id: str) -> None:
        parse.parse_job_id(job_id)
        self._run("scontrol", "requeue", job_id)

    def drain(self, node: str, reason: str) -> None:
        reason = model.drain_reason(reason)
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        try:
            self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        except CommandRejected as exc:
            # Resuming a node that is not drained or down is a no-op, not a failure
            # (22.05 and 24.11: "Invalid node state specified"; 26.05: "Invalid node
            # state transition").
            message = exc.slurm_message.lower()
            if not any(m in message for m in _NOT_RESUMABLE):
                raise

    def create_reservation(self, spec: model.ReservationSpec) -> None:
        if not spec.nodes:
            raise ValueError("a reservation needs at least one node")
        minutes = max(1, -(-spec.duration_s // 60))
        self._run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={spec.name}",
            f"Nodes={compress(spec.nodes)}",
            "StartTime=now",
            f"Duration={minutes}",
            f"Users={','.join(spec.users)}",
            f"Flags={','.join(spec.flags)}",
        )

    def delete_reservation(self, name: str) -> None:
        if not any(r.name == name for r in self.reservations()):
            return
        self._run("scontrol", "delete", f"ReservationName={name}")
