"""The Slurm backend on slurmrestd's REST API, with JWT authentication.

Speaks the OpenAPI plugins of Slurm 22.05: `/slurm/v0.0.38/...` and `/slurmdb/v0.0.38/...`
(proven on the lab, 22.05.8). It asks `/openapi` once which versions the server offers and
uses v0.0.38 (`STB_SLURM_REST_VERSION` pins it); a server without it is refused with the
versions it has. Older plugins (v0.0.36/37) have other shapes, and newer ones (v0.0.39+,
Slurm 23.02 and later) other paths and shapes: none of them is spoken here.

Called through `SlurmProtocol` by the daemon and the ledger (`STB_SLURM_BACKEND=rest`,
`bridge.slurm.select`). Every call is one HTTP request (httpx, a timeout each), classified
as the CLI backend classifies a command: slurmrestd not answering, or answering that
slurmctld or slurmdbd does not, is `ControllerUnreachable`; Slurm refusing is
`CommandRejected` quoting Slurm's `errors`; an answer that is not the JSON expected is
`UnparseableOutput` quoting it.
"""

from __future__ import annotations

import math
import os
import pwd
import shlex
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Unpack
from urllib.parse import quote

import httpx

from bridge.slurm import model, parse, rest_parse, sacct, squeue
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.errors import (
    CommandRejected,
    ControllerUnreachable,
    SlurmError,
    UnparseableOutput,
    from_message,
)
from bridge.slurm.hostlist import compress

#: The OpenAPI versions this backend speaks, best first (`/slurm/<v>/`, `/slurmdb/<v>/`).
SUPPORTED_VERSIONS = ("v0.0.38",)

#: The settings, by environment variable (see `RestSettings.from_env`).
ENV_URL = "STB_SLURM_REST_URL"
ENV_USER = "STB_SLURM_REST_USER"
ENV_TOKEN = "STB_SLURM_REST_TOKEN"
ENV_LIFESPAN = "STB_SLURM_REST_TOKEN_LIFESPAN_S"
ENV_TIMEOUT = "STB_SLURM_REST_TIMEOUT_S"
ENV_VERSION = "STB_SLURM_REST_VERSION"
ENV_NAMES = (ENV_URL, ENV_USER, ENV_TOKEN, ENV_LIFESPAN, ENV_TIMEOUT, ENV_VERSION)


class UnsupportedApi(CommandRejected):
    """slurmrestd serves none of the OpenAPI versions this backend speaks (a permanent
    error: its message names the versions it has)."""


def _login_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


@dataclass(frozen=True)
class RestSettings:
    """Where slurmrestd is and whose tokens to send."""

    #: slurmrestd's address; 6820 is Slurm's documented port (the lab's, on loopback)
    url: str = "http://127.0.0.1:6820"
    #: the Slurm user the requests act as (X-SLURM-USER-NAME); jobs run as this user
    user: str = field(default_factory=_login_name)
    #: a token from configuration (`scontrol token` run elsewhere); None: the backend
    #: mints its own with `scontrol token`, and again before each expires
    token: str | None = None
    #: seconds a minted token lives: 30 minutes bounds a leaked token's use, and the
    #: backend mints about one a 20 minutes (it renews once a third of it is left)
    lifespan_s: int = 1800
    #: seconds per request: above slurmrestd's own wait on slurmctld (MessageTimeout,
    #: 10 s by default), so a slow controller answers before the client gives up
    timeout_s: float = 30.0
    #: pin the OpenAPI version (e.g. "v0.0.38"); None: the best one `/openapi` offers
    version: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"{ENV_URL}={self.url!r} is not an http:// or https:// URL")
        if not self.user:
            raise ValueError(f"{ENV_USER} is empty")
        if self.lifespan_s < 60:
            raise ValueError(f"{ENV_LIFESPAN}={self.lifespan_s}: at least 60 seconds")
        if self.timeout_s <= 0:
            raise ValueError(f"{ENV_TIMEOUT}={self.timeout_s}: must be positive")
        if self.version is not None and self.version not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"{ENV_VERSION}={self.version!r}: this backend speaks "
                f"{', '.join(SUPPORTED_VERSIONS)}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RestSettings:
        """`STB_SLURM_REST_URL`, `_USER`, `_TOKEN` (else Slurm's own `SLURM_JWT`),
        `_TOKEN_LIFESPAN_S`, `_TIMEOUT_S`, `_VERSION`; each unset one keeps its default."""
        values: dict[str, Any] = {}
        for name, key in ((ENV_URL, "url"), (ENV_USER, "user"), (ENV_VERSION, "version")):
            if env.get(name):
                values[key] = env[name].strip()
        token = env.get(ENV_TOKEN) or env.get("SLURM_JWT")
        if token:
            values["token"] = token.strip()
        numbers: tuple[tuple[str, str, type[int] | type[float]], ...] = (
            (ENV_LIFESPAN, "lifespan_s", int),
            (ENV_TIMEOUT, "timeout_s", float),
        )
        for name, key, kind in numbers:
            if env.get(name):
                try:
                    values[key] = kind(env[name])
                except ValueError as exc:
                    raise ValueError(f"{name}={env[name]!r} is not a number") from exc
        return cls(**values)


class TokenSource:
    """The token each request carries: the configured one, refused once expired (nothing
    here can renew it), or one from `mint(user, lifespan_s)` (`scontrol token`), minted
    again once less than a third of its life is left. Shared by the daemon's threads;
    `clock` is injected so tests move time instead of waiting."""

    def __init__(
        self,
        settings: RestSettings,
        mint: Callable[[str, int], str],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._settings = settings
        self._mint = mint
        self._clock = clock
        self._lock = threading.Lock()
        self._value: str | None = None
        self._renew_at = datetime.min.replace(tzinfo=UTC)
        self._expires = rest_parse.jwt_expiry(settings.token) if settings.token else None
        #: tokens minted so far
        self.minted = 0

    def get(self, what: str) -> str:
        now = self._clock()
        user = self._settings.user
        with self._lock:
            if self._settings.token is not None:
                if self._expires is not None and now >= self._expires:
                    raise CommandRejected(
                        what,
                        f"the JWT for {user} from {ENV_TOKEN} (or SLURM_JWT) expired at "
                        f"{self._expires.isoformat()}; mint another (`scontrol token "
                        f"username={user} lifespan=<seconds>`), or unset it and the backend "
                        "mints its own where scontrol runs as root, SlurmUser or that user",
                    )
                return self._settings.token
            if self._value is None or now >= self._renew_at:
                try:
                    value = self._mint(user, self._settings.lifespan_s)
                except CommandRejected as exc:
                    raise CommandRejected(
                        what,
                        f"no token for {user}: {exc.slurm_message} (set {ENV_TOKEN}, or run "
                        "where `scontrol token` may mint one: AuthAltTypes=auth/jwt, as "
                        "root, SlurmUser or that user)",
                    ) from exc
                expires = rest_parse.jwt_expiry(value)
                life = (expires - now) if expires else timedelta(seconds=self._settings.lifespan_s)
                self._value, self._renew_at = value, now + life * 2 / 3
                self.minted += 1
            return self._value


#: `#SBATCH` long options whose slurmrestd field has another name (jobs.c of v0.0.38
#: takes sbatch's options by these names)
_LONG_ALIASES = {
    "job-name": "name",
    "output": "standard_output",
    "error": "standard_error",
    "input": "standard_input",
    "time": "time_limit",
    "time-min": "time_minimum",
    "chdir": "current_working_directory",
    "begin": "begin_time",
    "exclude": "exclude_nodes",
    "mem": "memory_per_node",
    "constraint": "constraints",
    "license": "licenses",
}
#: `#SBATCH` short options and their slurmrestd fields
_SHORT = {
    "A": "account", "a": "array", "b": "begin_time", "C": "constraints", "c": "cpus_per_task",
    "D": "current_working_directory", "d": "dependency", "e": "standard_error", "G": "gpus",
    "H": "hold", "i": "standard_input", "J": "name", "k": "no_kill", "L": "licenses",
    "N": "nodes", "n": "ntasks", "o": "standard_output", "p": "partition", "q": "qos",
    "t": "time_limit", "w": "nodelist", "x": "exclude_nodes",
}  # fmt: skip


def script_directives(script: str) -> dict[str, Any]:
    """The `#SBATCH` options of a batch script as slurmrestd job fields. sbatch reads them
    itself, slurmrestd does not: it runs the script as given. Like sbatch, only the lines
    before the first command count; `--opt=value`, `--opt value`, `-X value`, and a
    bare flag (true) are read, a `#` after them starts a comment."""
    fields: dict[str, Any] = {}
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        if not stripped.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(stripped[len("#SBATCH") :], comments=True)
        except ValueError as exc:
            raise ValueError(f"cannot read the directive {stripped!r}: {exc}") from exc
        i = 0
        while i < len(words):
            word = words[i]
            if word.startswith("--"):
                name, eq, value = word[2:].partition("=")
                key = _LONG_ALIASES.get(name, name.replace("-", "_"))
                if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, eq, i = words[i + 1], "=", i + 1
                fields[key] = value if eq else ("exclusive" if key == "exclusive" else True)
            elif word.startswith("-") and len(word) >= 2 and word[1] in _SHORT:
                key = _SHORT[word[1]]
                if len(word) > 2:
                    fields[key] = word[2:].removeprefix("=")
                elif key in ("hold", "no_kill"):
                    fields[key] = True
                elif i + 1 < len(words):
                    fields[key], i = words[i + 1], i + 1
                else:
                    raise ValueError(f"the directive {stripped!r} gives {word} no value")
            else:
                raise ValueError(f"cannot read the directive {stripped!r} (at {word!r})")
            i += 1
    return fields


def submission(
    spec: model.JobSpec, script: str, environment: Mapping[str, str], cwd: str
) -> dict[str, Any]:
    """The body of `POST /slurm/v0.0.38/job/submit` for `spec`: the script's `#SBATCH`
    options, then the spec's (which win, as sbatch's command line wins over the
    script's), the job's environment (what `sbatch --export=ALL,<spec.env>` would send:
    slurmrestd requires it) and working directory."""
    job = script_directives(script)
    job.update(partition=spec.partition, account=spec.account)
    if spec.name:
        job["name"] = spec.name
    if spec.comment:
        job["comment"] = spec.comment
    if spec.nodelist:
        job["nodelist"] = compress(spec.nodelist)
    if spec.nodes is not None:  # one task a node, as sbatch --nodes=n --ntasks=n
        job["nodes"] = str(spec.nodes)
        job["ntasks"] = spec.nodes
    if spec.gpus_per_node is not None:
        job["gres"] = spec.gres
    if spec.exclusive:
        job["exclusive"] = "exclusive"
    if spec.requeue is not None:
        # slurmrestd sets the option whatever the value: {"requeue": false} would requeue
        job.pop("requeue", None)
        job.pop("no_requeue", None)
        job["requeue" if spec.requeue else "no_requeue"] = True
    if spec.reservation:
        job["reservation"] = spec.reservation
    if spec.output:
        job["standard_output"] = spec.output
    if spec.time_limit_min is not None:
        job["time_limit"] = spec.time_limit_min
    if spec.qos:
        job["qos"] = spec.qos
    if spec.nice is not None:
        job["nice"] = spec.nice
    if spec.priority is not None:  # (slurmrestd reads "TOP" as sbatch does)
        job["priority"] = spec.priority
    job.setdefault("current_working_directory", cwd)
    job["environment"] = dict(environment) | spec.env
    return {"script": script, "job": job}


def _relative(when: datetime, now: datetime, rounding: Any) -> str:
    """`when` as slurmrestd's `now[+-]seconds`: the server reads absolute times in its
    own time zone, which a client cannot know; an offset from its clock is the same
    instant in any zone (off by the request's transit, well under a second)."""
    offset = int(rounding((when - now).total_seconds()))
    return "now" if offset == 0 else f"now{offset:+d}"


class SlurmRest:
    """`SlurmProtocol` on slurmrestd (OpenAPI v0.0.38), authenticated by JWT.

    Over REST: `version` (the release in any answer's `meta`), `nodes`, `partitions`,
    `jobs` (the same document as `squeue --json`), `reservations`, `accounting` (the same
    document as `sacct --json`: every run of a requeued job, all users, steps left out),
    `submit` (the script's `#SBATCH` lines read here, since slurmrestd ignores them) and
    `cancel` (with or without a signal: `scancel --full` as the CLI backend sends it).

    slurmrestd 22.05 has no endpoint for the rest, so these calls go to the CLI backend
    (`SlurmCLI`, with munge, on this host), explicitly and only these:
    - `requeue`: v0.0.38 has no requeue (a job update cannot requeue);
    - `drain`, `resume`: v0.0.38 cannot update nodes (GET only);
    - `create_reservation`, `delete_reservation`: v0.0.38 reads reservations only;
    - `events`: neither plugin serves `sacctmgr show event` (nor sreport's rollups, which
      only the CLI backend's `cluster_utilization` reads).

    Tokens: `settings.token` is sent as it is, and refused with a clear error once it
    expired; without one the backend mints one with `scontrol token` and mints again
    before it expires. slurmrestd 22.05 answers a token slurmctld refuses (a bad
    signature) as it answers a controller that is down: HTTP 500, "Unspecified error";
    both count as `ControllerUnreachable`, which is why the expiry is checked here.
    """

    def __init__(
        self,
        settings: RestSettings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings or RestSettings.from_env(os.environ | dict(env or {}))
        #: what jobs get as their environment and the CLI fallbacks add to theirs
        self._env = dict(os.environ) | dict(env or {})
        self._cli = SlurmCLI(env=env, timeout_s=self.settings.timeout_s)
        self.tokens = TokenSource(self.settings, self._cli.token)
        self._http = httpx.Client(
            base_url=self.settings.url.rstrip("/"),
            timeout=self.settings.timeout_s,
            transport=transport,
        )
        self._lock = threading.Lock()
        self._api: str | None = self.settings.version

    def close(self) -> None:
        self._http.close()

    # --- HTTP --------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        what: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        headers = {
            "X-SLURM-USER-NAME": self.settings.user,
            "X-SLURM-USER-TOKEN": self.tokens.get(what),
        }
        try:
            return self._http.request(method, path, params=params, json=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise ControllerUnreachable(
                f"{what}: slurmrestd at {self.settings.url} did not answer within "
                f"{self.settings.timeout_s:g}s"
            ) from exc
        except httpx.TransportError as exc:
            raise ControllerUnreachable(
                f"{what}: slurmrestd at {self.settings.url}: {exc or type(exc).__name__}"
            ) from exc

    def _checked(self, resp: httpx.Response, path: str, what: str) -> str:
        """The answer to a request `_send` sent to `path`: its JSON text once it carries
        no error, else the typed error."""
        text = resp.text
        code = resp.status_code
        if code in (401, 403):
            raise self._refused(what, resp)
        if code == 404:
            raise CommandRejected(
                what, f"slurmrestd at {self.settings.url} has no {path} ({text.strip()[:200]})"
            )
        if code in (502, 503, 504) and not text.lstrip().startswith("{"):
            raise ControllerUnreachable(f"{what}: HTTP {code} from {self.settings.url}")
        problems = rest_parse.errors(text, what)
        if problems:
            raise _classify(what, "; ".join(problems))
        if code >= 400:
            raise CommandRejected(what, f"HTTP {code}: {text.strip()[:500]}")
        return text

    def _refused(self, what: str, resp: httpx.Response) -> CommandRejected:
        """slurmrestd's answer to credentials it refuses (HTTP 401 or 403)."""
        return CommandRejected(
            what,
            f"slurmrestd refused the credentials of {self.settings.user} "
            f"(HTTP {resp.status_code}: {resp.text.strip()[:200]})",
        )

    def api_version(self) -> str:
        """The OpenAPI version spoken (e.g. "v0.0.38"), asked of `/openapi` once (a
        server's plugins do not change while it runs); `UnsupportedApi` when it has none
        this backend speaks."""
        with self._lock:
            if self._api is not None:
                return self._api
            resp = self._send("GET", "/openapi", "GET /openapi")
            if resp.status_code in (401, 403):
                raise self._refused("GET /openapi", resp)
            if resp.status_code >= 400:
                raise UnparseableOutput(f"GET /openapi (HTTP {resp.status_code})", resp.text)
            offered = rest_parse.openapi_versions(resp.text)
            both = offered["slurm"] & offered["slurmdb"]
            usable = [v for v in SUPPORTED_VERSIONS if v in both]
            if not usable:
                have = ", ".join(sorted(offered["slurm"])) or "none"
                raise UnsupportedApi(
                    "GET /openapi",
                    f"slurmrestd at {self.settings.url} serves OpenAPI {have}; this backend "
                    f"speaks {', '.join(SUPPORTED_VERSIONS)} (Slurm 22.05): use "
                    "STB_SLURM_BACKEND=cli",
                )
            self._api = usable[0]
            return self._api

    def _get(self, kind: str, what: str, params: Mapping[str, str] | None = None) -> str:
        path = f"/{'slurmdb' if kind.startswith('db:') else 'slurm'}/{self.api_version()}/"
        path += kind.removeprefix("db:")
        return self._checked(self._send("GET", path, what, params=params), path, what)

    # --- reads -------------------------------------------------------------------------

    def version(self) -> str:
        # slurmrestd's `meta` says its release in every answer, errors or not
        resp = self._send("GET", f"/slurm/{self.api_version()}/ping", "GET ping")
        return rest_parse.release(resp.text)

    def nodes(self) -> list[model.Node]:
        return rest_parse.parse_nodes(self._get("nodes", "GET nodes"))

    def partitions(self) -> list[model.Partition]:
        return rest_parse.parse_partitions(self._get("partitions", "GET partitions"))

    def jobs(self, **filters: Unpack[model.JobFilter]) -> list[model.Job]:
        jobs = squeue.parse_squeue_json(self._get("jobs", "GET jobs"))
        return squeue.filter_jobs(jobs, **filters)

    def reservations(self) -> list[model.Reservation]:
        text = self._get("reservations", "GET reservations")
        return rest_parse.parse_reservations(text, datetime.now(UTC))

    def accounting(self, since: datetime, until: datetime) -> list[model.AccountingRecord]:
        if since.tzinfo is None or until.tzinfo is None:
            raise ValueError("accounting() needs timezone-aware datetimes")
        if until <= since:
            raise ValueError(f"accounting window is empty: {since} .. {until}")
        now = datetime.now(UTC)
        params = {
            "start_time": _relative(since, now, math.floor),
            "end_time": _relative(until, now, math.ceil),
            "skip_steps": "true",
        }
        return sacct.parse_sacct_json(self._get("db:jobs", "GET slurmdb jobs", params))

    def cluster_name(self) -> str:
        return self._cli.cluster_name()  # v0.0.38 serves no configuration

    def events(self, since: datetime, until: datetime) -> list[model.SlurmEvent]:
        return self._cli.events(since, until)  # no REST endpoint (class docstring)

    # --- writes ------------------------------------------------------------------------

    def submit(self, spec: model.JobSpec) -> str:
        if spec.wrap is not None:
            script = f"#!/bin/sh\n# This script was created by the bridge (--wrap).\n{spec.wrap}\n"
        else:
            try:
                script = Path(str(spec.script)).read_text()
            except OSError as exc:
                raise CommandRejected("submit", f"cannot read {spec.script}: {exc}") from exc
        try:
            body = submission(spec, script, self._env, os.getcwd())
        except ValueError as exc:
            raise CommandRejected("submit", f"{spec.script}: {exc}") from exc
        path = f"/slurm/{self.api_version()}/job/submit"
        resp = self._send("POST", path, "submit", body=body)
        return rest_parse.submitted_job_id(self._checked(resp, path, "submit"))

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        parse.parse_job_id(job_id)  # refuse anything that is not a job id
        path = f"/slurm/{self.api_version()}/job/{quote(job_id, safe='')}"
        params = {"signal": signal} if signal is not None else None
        what = f"cancel {job_id}"
        try:
            self._checked(self._send("DELETE", path, what, params=params), path, what)
        except CommandRejected as exc:
            # a finished job is a success already (ESLURM_ALREADY_DONE); one purged
            # after MinJobAge is gone: both are done
            if "invalid job id specified" not in exc.slurm_message.lower():
                raise

    def requeue(self, job_id: str) -> None:
        self._cli.requeue(job_id)  # no REST endpoint (class docstring)

    def drain(self, node: str, reason: str) -> None:
        self._cli.drain(node, reason)  # no REST endpoint (class docstring)

    def resume(self, node: str) -> None:
        self._cli.resume(node)  # no REST endpoint (class docstring)

    def create_reservation(self, spec: model.ReservationSpec) -> None:
        self._cli.create_reservation(spec)  # no REST endpoint (class docstring)

    def delete_reservation(self, name: str) -> None:
        if any(r.name == name for r in self.reservations()):
            self._cli.delete_reservation(name)  # no REST endpoint (class docstring)


def _classify(what: str, message: str) -> SlurmError:
    """The typed error for the `errors` of an answer: "Unspecified error" is what
    slurmrestd 22.05 says when slurmctld does not answer a read (errno -1), so it is
    transient; otherwise Slurm's words decide, as for the CLI backend."""
    if "unspecified error" in message.lower():
        return ControllerUnreachable(
            f"{what}: {message} (slurmrestd's words when slurmctld or slurmdbd does not "
            "answer, or refuses the token)"
        )
    return from_message(what, message)
