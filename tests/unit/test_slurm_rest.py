"""The slurmrestd backend's parsing and classification on answers recorded from the lab's
slurmrestd (Slurm 22.05.8, OpenAPI v0.0.38; tests/data/slurm/rest-*-22.05.json, the
checkout's path rewritten to /srv/stb), served to `SlurmRest` through httpx's
MockTransport; its token handling on an injected clock; the #SBATCH reader on literal
scripts. The backend against the real slurmrestd is tests/lab/test_slurm_adapter.py.

How they were recorded: on the lab, n2 drained ("stb: lease 7 drain for triton"), a
MAINT reservation stb-lease-9 on n1, a running job (82, 2 GPUs on n1), a job requeued
once (83), a held array (84, 2-4%2) and a held 4-GPU job (85); then each endpoint asked
once. The `down-*` answers come from a slurmrestd whose slurm.conf named a dead
slurmctld port. `rest-openapi-paths` keeps the paths of `/openapi` (its 500 KB of schemas
left out)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.paths import triton_sbatch
from bridge.slurm import (
    CommandRejected,
    ControllerUnreachable,
    JobSpec,
    UnparseableOutput,
    rest_parse,
)
from bridge.slurm.rest import (
    RestSettings,
    SlurmRest,
    TokenSource,
    script_directives,
    submission,
)
from bridge.slurm.sacct import parse_sacct_json
from bridge.slurm.scontrol import parse_token
from bridge.slurm.select import open_backend
from bridge.slurm.squeue import parse_squeue_json

DATA = Path(__file__).parent.parent / "data" / "slurm"
#: when the recording was made (between the reservation's start and end)
RECORDED = datetime.fromtimestamp(1796119910, UTC)


def _read(name: str) -> str:
    return (DATA / f"rest-{name}-22.05.json").read_text()


def _jwt(exp: int | None) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    payload = {"iat": 1, "sun": "root"} | ({"exp": exp} if exp is not None else {})
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(payload)}.c2lnbmF0dXJl"


FAR = _jwt(4102444800)  # 2100-01-01


# --- parsers on recorded answers ----------------------------------------------------


def test_recorded_nodes() -> None:
    nodes = {n.name: n for n in rest_parse.parse_nodes(_read("nodes"))}
    assert list(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n1"].state == "mixed" and nodes["n1"].gpus_alloc == 2
    assert nodes["n1"].flags == {"MAINTENANCE", "RESERVED"}
    assert nodes["n2"].flags == {"DRAIN"} and nodes["n2"].state == "idle"
    assert nodes["n2"].reason == "stb: lease 7 drain for triton"
    assert nodes["n2"].fenced_by_bridge and nodes["n2"].gpus_alloc == 0
    assert nodes["n3"].partitions == ("elastic", "infer")
    assert all(n.gpus == 4 and n.gpu_type == "h100" for n in nodes.values())
    assert nodes["n4"].addr == "127.0.1.4"


def test_recorded_partitions() -> None:
    parts = {p.name: p for p in rest_parse.parse_partitions(_read("partitions"))}
    assert parts["infer"].nodes == ("n3", "n4") and parts["infer"].priority_tier == 10
    assert parts["infer"].allow_accounts == ("bridge",)
    assert parts["train"].allow_accounts is None and parts["train"].preempt_mode == "OFF"
    assert parts["elastic"].default and not parts["train"].default
    assert (parts["elastic"].preempt_mode, parts["elastic"].grace_time_s) == ("REQUEUE", 5)


def test_recorded_reservation_is_active_within_its_span() -> None:
    (resv,) = rest_parse.parse_reservations(_read("reservations"), RECORDED)
    assert (resv.name, resv.nodes, resv.users, resv.state) == (
        "stb-lease-9",
        ("n1",),
        ("root",),
        "ACTIVE",
    )
    assert {"MAINT", "IGNORE_JOBS"} <= resv.flags
    assert resv.start is not None and resv.end is not None
    assert resv.end - resv.start == timedelta(minutes=10)
    (later,) = rest_parse.parse_reservations(_read("reservations"), resv.end)
    assert later.state == "INACTIVE"


def test_recorded_jobs_read_as_squeue_json() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(_read("jobs"))}
    running = jobs["82"]
    assert (running.state, running.nodes, running.gpus, running.tags) == (
        "RUNNING",
        ("n1",),
        2,
        ("stb:test",),
    )
    assert jobs["83"].restarts == 1 and jobs["83"].state == "PENDING"
    assert jobs["84_[2-4%2]"].reason == "JobHeldUser"
    assert jobs["85"].gpus == 4 and jobs["85"].start_time is None
    # UNLIMITED (time_limit null): no end, though Slurm says the start plus a year
    assert running.end_time is None
    assert jobs["81"].end_time == datetime.fromtimestamp(1796119693, tz=UTC)  # 10 min limit
    assert jobs["83"].end_time is None  # pending


def test_recorded_accounting_reads_as_sacct_json() -> None:
    recs = {r.job_id: r for r in parse_sacct_json(_read("slurmdb-jobs"))}
    requeued = recs["83"]
    assert requeued.state == "REQUEUED" and requeued.gpus == 1 and requeued.gpu_type == "h100"
    assert requeued.comment == "stb:workload=training" and requeued.elapsed_s == 3
    assert recs["82"].state == "RUNNING" and recs["82"].end is None and recs["82"].gpus == 2
    assert parse_sacct_json(_read("slurmdb-empty")) == []  # 9003 "Nothing found" is no error


def test_errors_meta_versions_and_submission() -> None:
    assert rest_parse.errors(_read("nodes"), "x") == []
    assert rest_parse.errors(_read("slurmdb-empty"), "x") == []
    assert rest_parse.errors(_read("submit-rejected"), "x") == [
        "Invalid account or account/partition combination specified"
    ]
    assert rest_parse.errors(_read("down-ping"), "x") == [
        "Unspecified error: slurmctld config is unable to load"
    ]
    assert rest_parse.release(_read("ping")) == "22.05.8"
    assert rest_parse.release(_read("down-ping")) == "22.05.8"  # meta even in an error
    versions = rest_parse.openapi_versions(_read("openapi-paths"))
    assert versions["slurm"] == {"v0.0.36", "v0.0.37", "v0.0.38"}
    assert versions["slurmdb"] == {"v0.0.36", "v0.0.37", "v0.0.38"}
    assert rest_parse.submitted_job_id(_read("submit")) == "82"
    with pytest.raises(UnparseableOutput, match="Authentication failure"):
        rest_parse.errors(_read("no-token"), "GET nodes")


def test_jwt_expiry_and_scontrol_token() -> None:
    assert rest_parse.jwt_expiry(_jwt(1796120085)) == datetime.fromtimestamp(1796120085, UTC)
    assert rest_parse.jwt_expiry(_jwt(None)) is None
    assert rest_parse.jwt_expiry("not-a-jwt") is None
    assert rest_parse.jwt_expiry("a.%%%.c") is None
    assert parse_token(f"SLURM_JWT={FAR}\n") == FAR
    with pytest.raises(UnparseableOutput):
        parse_token("scontrol: error: Invalid user\n")


# --- the backend over recorded answers ---------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def _answer(name: str, status: int = 200) -> httpx.Response:
    text = _read(name)
    kind = "application/json" if text.lstrip().startswith("{") else "text/plain"
    return httpx.Response(status, text=text, headers={"Content-Type": kind})


def _serving(routes: dict[tuple[str, str], httpx.Response], seen: list[httpx.Request]) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/openapi":
            return _answer("openapi-paths")
        return routes.get(
            (request.method, request.url.path), httpx.Response(404, text="Unable find URL")
        )

    return handle


def _backend(
    routes: dict[tuple[str, str], httpx.Response], seen: list[httpx.Request] | None = None
) -> SlurmRest:
    settings = RestSettings(url="http://127.0.0.1:6820", user="root", token=FAR)
    transport = httpx.MockTransport(_serving(routes, seen if seen is not None else []))
    return SlurmRest(
        settings, env={"SLURM_CONF": "/srv/stb/.lab/etc/slurm.conf"}, transport=transport
    )


V = "/slurm/v0.0.38"


def test_reads_carry_the_token_and_parse() -> None:
    seen: list[httpx.Request] = []
    slurm = _backend(
        {("GET", f"{V}/nodes"): _answer("nodes"), ("GET", f"{V}/jobs"): _answer("jobs")}, seen
    )
    assert [n.name for n in slurm.nodes()] == ["n1", "n2", "n3", "n4"]
    assert [j.job_id for j in slurm.jobs(tag="stb:test", states=["running"])] == ["82"]
    assert [r.url.path for r in seen] == ["/openapi", f"{V}/nodes", f"{V}/jobs"]  # asked once
    assert all(r.headers["X-SLURM-USER-NAME"] == "root" for r in seen)
    assert all(r.headers["X-SLURM-USER-TOKEN"] == FAR for r in seen)


def test_controller_down_is_transient_and_a_refusal_quotes_slurm() -> None:
    slurm = _backend(
        {
            ("GET", f"{V}/nodes"): _answer("down-nodes", 500),
            ("GET", f"{V}/jobs"): _answer("down-jobs", 500),
            ("POST", f"{V}/job/submit"): _answer("submit-rejected", 500),
            ("DELETE", f"{V}/job/999999"): _answer("cancel-missing", 500),
            ("DELETE", f"{V}/job/5"): _answer("down-cancel", 500),
        }
    )
    with pytest.raises(ControllerUnreachable, match="Unspecified error") as err:
        slurm.nodes()
    assert err.value.transient
    with pytest.raises(ControllerUnreachable, match="Failed while looking for jobs"):
        slurm.jobs()
    with pytest.raises(CommandRejected, match="Invalid account or account/partition") as rej:
        slurm.submit(JobSpec(partition="infer", account="team-nlp", wrap="true"))
    assert not rej.value.transient
    slurm.cancel("999999")  # a job Slurm no longer knows: done already
    with pytest.raises(ControllerUnreachable, match="Unable to contact slurm controller"):
        slurm.cancel("5")


def test_http_failures_are_classified() -> None:
    slurm = _backend(
        {
            ("GET", f"{V}/nodes"): _answer("no-token", 401),
            ("GET", f"{V}/jobs"): httpx.Response(200, text="<html>proxy</html>"),
            ("GET", f"{V}/partitions"): httpx.Response(503, text="Service Unavailable"),
        }
    )
    with pytest.raises(CommandRejected, match=r"refused the credentials of root.*401"):
        slurm.nodes()
    with pytest.raises(UnparseableOutput, match="proxy"):
        slurm.jobs()
    with pytest.raises(ControllerUnreachable, match="503"):
        slurm.partitions()
    with pytest.raises(CommandRejected, match=r"has no /slurm/v0.0.38/reservations"):
        slurm.reservations()  # not routed here: 404


@pytest.mark.parametrize(
    ("error", "words"),
    [(httpx.ConnectError("Connection refused"), "Connection refused"),
     (httpx.ReadTimeout("timed out"), "did not answer within 30s")],
)  # fmt: skip
def test_no_answer_is_transient(error: Exception, words: str) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise error

    settings = RestSettings(user="root", token=FAR, version="v0.0.38")
    slurm = SlurmRest(settings, transport=httpx.MockTransport(handle))
    with pytest.raises(ControllerUnreachable, match=words):
        slurm.nodes()


def test_a_server_without_v0_0_38_is_refused_by_its_versions() -> None:
    doc = json.loads(_read("openapi-paths"))
    doc["paths"] = {p: v for p, v in doc["paths"].items() if "v0.0.38" not in p}

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=doc)

    settings = RestSettings(user="root", token=FAR)
    slurm = SlurmRest(settings, transport=httpx.MockTransport(handle))
    with pytest.raises(CommandRejected, match=r"serves OpenAPI v0\.0\.36, v0\.0\.37; .*v0\.0\.38"):
        slurm.nodes()


def test_accounting_asks_a_window_relative_to_the_servers_clock() -> None:
    seen: list[httpx.Request] = []
    slurm = _backend({("GET", "/slurmdb/v0.0.38/jobs"): _answer("slurmdb-jobs")}, seen)
    now = datetime.now(UTC)
    recs = slurm.accounting(now - timedelta(hours=1), now + timedelta(minutes=5))
    assert {r.job_id for r in recs} == {"82", "83"}
    params = seen[-1].url.params
    assert params["skip_steps"] == "true"
    start, end = int(params["start_time"].removeprefix("now")), int(params["end_time"][3:])
    assert -3601 <= start <= -3599 and 299 <= end <= 301


def test_submit_sends_directives_spec_and_environment() -> None:
    seen: list[httpx.Request] = []
    slurm = _backend({("POST", f"{V}/job/submit"): _answer("submit")}, seen)
    spec = JobSpec(
        partition="infer",
        account="bridge",
        script=str(triton_sbatch()),
        nodelist=("n3", "n4"),
        gpus_per_node=4,
        exclusive=True,
        requeue=False,
        output="/srv/stb/.lab/log/triton-%j.log",
        env={"STB_MODELS": "busy;echo"},
    )
    assert slurm.submit(spec) == "82"
    body = json.loads(seen[-1].content)
    job = body["job"]
    assert body["script"] == triton_sbatch().read_text()
    assert (job["name"], job["comment"]) == ("stb-triton", "stb:triton")  # from #SBATCH
    assert job["nodelist"] == "n[3-4]" and job["gres"] == "gpu:4"  # the spec wins
    assert job["exclusive"] == "exclusive" and job["no_requeue"] is True
    assert "requeue" not in job
    assert job["environment"]["STB_MODELS"] == "busy;echo"
    assert job["environment"]["SLURM_CONF"] == "/srv/stb/.lab/etc/slurm.conf"
    assert job["standard_output"] == "/srv/stb/.lab/log/triton-%j.log"


# --- #SBATCH lines and the request body -------------------------------------------------


def test_script_directives_read_as_sbatch_does() -> None:
    script = (
        "#!/bin/bash\n"
        "# a comment\n"
        "\n"
        "#SBATCH --job-name=stb-triton\n"
        "#SBATCH --comment stb:triton  # tag\n"
        "#SBATCH -p infer -N 1\n"
        "#SBATCH -Jother\n"
        "#SBATCH --exclusive\n"
        "#SBATCH --no-requeue\n"
        "#SBATCH --signal=B:TERM@30\n"
        "#SBATCH --time=10\n"
        "set -e\n"
        "#SBATCH --account=ignored-after-a-command\n"
    )
    assert script_directives(script) == {
        "name": "other",
        "comment": "stb:triton",
        "partition": "infer",
        "nodes": "1",
        "exclusive": "exclusive",
        "no_requeue": True,
        "signal": "B:TERM@30",
        "time_limit": "10",
    }
    with pytest.raises(ValueError, match="gives -p no value"):
        script_directives("#SBATCH -p\n")
    with pytest.raises(ValueError, match="cannot read the directive"):
        script_directives("#SBATCH stray\n")


def test_submission_lets_the_spec_win_and_keeps_requeue_meaning() -> None:
    script = "#!/bin/sh\n#SBATCH --requeue\n#SBATCH --partition=elastic\n#SBATCH -o a.out\ntrue\n"
    spec = JobSpec(partition="train", account="team-vision", wrap="true", requeue=False)
    job = submission(spec, script, {"PATH": "/bin", "X": "1"}, "/srv/stb")["job"]
    assert job["partition"] == "train" and job["no_requeue"] is True and "requeue" not in job
    assert job["standard_output"] == "a.out" and job["current_working_directory"] == "/srv/stb"
    again = JobSpec(partition="train", account="a", wrap="true", requeue=True, time_limit_min=5)
    job = submission(again, "#!/bin/sh\n#SBATCH --no-requeue\ntrue\n", {"P": "1"}, "/")["job"]
    assert job["requeue"] is True and "no_requeue" not in job and job["time_limit"] == 5
    assert job["environment"] == {"P": "1"}


# --- tokens -------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_minted_tokens_are_renewed_before_they_expire() -> None:
    clock = _Clock()
    asked: list[tuple[str, int]] = []

    def mint(user: str, lifespan_s: int) -> str:
        asked.append((user, lifespan_s))
        return _jwt(int(clock.now.timestamp()) + lifespan_s)

    tokens = TokenSource(RestSettings(user="root", lifespan_s=900), mint, clock)
    first = tokens.get("GET nodes")
    clock.now += timedelta(seconds=599)
    assert tokens.get("GET nodes") == first and tokens.minted == 1
    clock.now += timedelta(seconds=2)  # past two thirds of its 900 s
    second = tokens.get("GET nodes")
    assert second != first and tokens.minted == 2
    assert asked == [("root", 900), ("root", 900)]


def test_a_configured_token_is_refused_once_expired_and_a_failed_mint_says_why() -> None:
    clock = _Clock()
    expires = int(clock.now.timestamp()) + 60

    def never(user: str, lifespan_s: int) -> str:
        raise AssertionError("a configured token is never replaced")

    tokens = TokenSource(RestSettings(user="root", token=_jwt(expires)), never, clock)
    assert tokens.get("x") == _jwt(expires)
    clock.now += timedelta(seconds=60)
    with pytest.raises(CommandRejected, match=r"expired at 2026-12-01T10:01:00.*scontrol token"):
        tokens.get("GET nodes")

    def refuse(user: str, lifespan_s: int) -> str:
        raise CommandRejected("scontrol token", "Invalid user for SlurmUser")

    failing = TokenSource(RestSettings(user="alice"), refuse, clock)
    with pytest.raises(CommandRejected, match=r"no token for alice: Invalid user.*STB_SLURM_REST"):
        failing.get("GET nodes")


# --- settings -------------------------------------------------------------------------------


def test_settings_from_the_environment() -> None:
    s = RestSettings.from_env({"STB_SLURM_REST_USER": "root", "SLURM_JWT": FAR})
    assert (s.url, s.user, s.token, s.lifespan_s, s.version) == (
        "http://127.0.0.1:6820",
        "root",
        FAR,
        1800,
        None,
    )
    s = RestSettings.from_env(
        {
            "STB_SLURM_REST_URL": "https://rest.example:6820",
            "STB_SLURM_REST_USER": "bridge",
            "STB_SLURM_REST_TOKEN": "t.o.k",
            "SLURM_JWT": FAR,
            "STB_SLURM_REST_TOKEN_LIFESPAN_S": "600",
            "STB_SLURM_REST_TIMEOUT_S": "2.5",
            "STB_SLURM_REST_VERSION": "v0.0.38",
        }
    )
    assert (s.url, s.token, s.lifespan_s, s.timeout_s) == (
        "https://rest.example:6820",
        "t.o.k",
        600,
        2.5,
    )
    with pytest.raises(ValueError, match="STB_SLURM_REST_TIMEOUT_S='soon'"):
        RestSettings.from_env({"STB_SLURM_REST_TIMEOUT_S": "soon"})
    with pytest.raises(ValueError, match=r"STB_SLURM_REST_VERSION='v0.0.40'"):
        RestSettings.from_env({"STB_SLURM_REST_VERSION": "v0.0.40"})
    with pytest.raises(ValueError, match="STB_SLURM_BACKEND=rest: STB_SLURM_REST_URL"):
        open_backend("rest", env={"STB_SLURM_REST_URL": "127.0.0.1:6820"})
    backend = open_backend("rest", env={"STB_SLURM_REST_USER": "root", "SLURM_JWT": FAR})
    assert isinstance(backend, SlurmRest) and backend.settings.token == FAR


def test_the_rest_settings_are_no_typo_to_the_config_check() -> None:
    from bridge.config import unknown_env
    from bridge.slurm.rest import ENV_NAMES

    assert unknown_env(dict.fromkeys(ENV_NAMES, "x")) == []
