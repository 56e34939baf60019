"""Slurm parsers on recorded real output (Slurm 22.05.8, the lab; paths rewritten) and on
literal inputs, including the newer OpenAPI shapes (numbers as {"set","number"}, states
as lists) that Slurm 23.02+ prints."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.slurm import UnparseableOutput
from bridge.slurm.parse import (
    NO_VAL,
    JobIdParts,
    format_job_id,
    gpus_from_tres,
    num,
    parse_gres,
    parse_job_id,
    run_end,
    states,
)
from bridge.slurm.sacct import parse_sacct_json
from bridge.slurm.scontrol import (
    parse_nodes,
    parse_partitions,
    parse_reservations,
    scontrol_records,
)
from bridge.slurm.squeue import parse_squeue_json

DATA = Path(__file__).parent.parent / "data" / "slurm"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_recorded_nodes() -> None:
    nodes = {n.name: n for n in parse_nodes(_read("scontrol-nodes-22.05.txt"))}
    assert list(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n1"].state == "mixed" and nodes["n1"].gpus_alloc == 3
    assert nodes["n2"].flags == {"DRAIN"} and nodes["n2"].state == "idle"
    assert nodes["n2"].reason == "stb: lease 7 drain for triton"  # [user@time] stripped
    assert nodes["n2"].fenced_by_bridge
    assert nodes["n3"].partitions == ("elastic", "infer")
    assert all(n.gpus == 4 and n.gpu_type == "h100" for n in nodes.values())
    assert nodes["n4"].addr == "127.0.1.4"


def test_recorded_partitions_and_reservations() -> None:
    parts = {p.name: p for p in parse_partitions(_read("scontrol-partitions-22.05.txt"))}
    assert parts["infer"].nodes == ("n3", "n4")
    assert parts["infer"].allow_accounts == ("bridge",)
    assert parts["train"].allow_accounts is None
    assert parts["elastic"].default and parts["elastic"].grace_time_s == 5
    (resv,) = parse_reservations(_read("scontrol-reservations-22.05.txt"))
    assert resv.name == "stb-lease-9" and resv.nodes == ("n1",)
    assert resv.start == datetime(2026, 11, 29, 14, 20, 1, tzinfo=UTC)
    assert {"MAINT", "IGNORE_JOBS"} <= resv.flags
    assert parse_reservations("No reservations in the system\n") == []


def test_recorded_squeue_with_a_pending_array() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(_read("squeue-22.05.json"))}
    array = jobs["13_[2-4%2]"]
    assert array.state == "PENDING" and array.reason == "JobHeldUser"
    assert parse_job_id(array.job_id) == JobIdParts(13, (2, 3, 4), 2)
    assert jobs["14"].gpus == 2 and jobs["14"].start_time is None  # pending: no start
    assert jobs["14"].tags == ("stb:test",)
    assert jobs["12"].requested_nodes == ("n4",) and jobs["14"].requested_nodes == ()
    triton = jobs["12"]
    assert (triton.state, triton.nodes, triton.gpus, triton.tags) == (
        "COMPLETING",
        ("n4",),
        1,
        ("stb:triton",),
    )


def test_recorded_squeue_end_times() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(_read("squeue-22.05.json"))}
    # a time limit (525600 min) and ended: Slurm's end_time is its real end
    assert jobs["1"].end_time == datetime.fromtimestamp(1795961503, tz=UTC)
    # UNLIMITED (22.05 prints time_limit null): no end, whatever end_time says
    assert jobs["8"].end_time is None and jobs["12"].end_time is None
    # pending: squeue's end_time (6090929897) is an estimate, not an end
    assert jobs["14"].end_time is None and jobs["13_[2-4%2]"].end_time is None


def test_run_end_needs_a_started_job_with_a_limit() -> None:
    end = datetime.fromtimestamp(1795961503, tz=UTC)
    assert run_end(end, 60, pending=False) == end
    assert run_end(end, 60, pending=True) is None
    assert run_end(end, None, pending=False) is None  # UNLIMITED, or unset
    assert run_end(end, NO_VAL, pending=False) is None
    assert run_end(None, 60, pending=False) is None


def test_recorded_sacct_requeued_runs_and_gpu_counts() -> None:
    recs = parse_sacct_json(_read("sacct-requeue-22.05.json"))
    runs = [r for r in recs if r.job_id == "8"]
    assert [r.state for r in runs] == ["PREEMPTED", "CANCELLED"]
    assert runs[0].gpus == 4  # gres/gpu=4 and gres/gpu:h100=4 count once
    assert runs[0].elapsed_s == 23 and runs[0].gpu_seconds == 92
    assert runs[0].key != runs[1].key
    assert all(r.start is None or r.start.tzinfo == UTC for r in recs)
    triton = next(r for r in recs if r.job_id == "7")
    assert (triton.partition, triton.account, triton.comment, triton.gpus) == (
        "infer",
        "bridge",
        "stb:triton",
        1,
    )


def test_recorded_sacct_keeps_the_admin_comment_where_job_submit_tags_the_workload() -> None:
    """Jobs tagged by slurm_plugins/job_submit.lua on the lab: the job's own comment and
    the administrator comment both reach the record, and the ledger reads the tag."""
    from accounting.attribution import tags

    recs = {r.partition: r for r in parse_sacct_json(_read("sacct-admin-comment-22.05.json"))}
    assert recs["infer"].comment == "stb:triton,stb:workload=inference"
    assert recs["train"].comment == "nightly run,stb:workload=training"
    assert recs["elastic"].comment == "stb:workload=elastic"
    assert {p: tags(r.comment)["workload"] for p, r in recs.items()} == {
        "infer": "inference",
        "train": "training",
        "elastic": "elastic",
    }
    raw = {"jobs": [json.loads(_read("sacct-admin-comment-22.05.json"))["jobs"][1]]}
    raw["jobs"][0]["comment"] = {"administrator": None, "job": "stb:workload=inference"}
    (forged,) = parse_sacct_json(json.dumps(raw))
    assert tags(forged.comment)["workload"] == "inference"  # no admin tag: the job's own
    raw["jobs"][0]["comment"]["administrator"] = "stb:workload=training"
    (tagged,) = parse_sacct_json(json.dumps(raw))
    assert tags(tagged.comment)["workload"] == "training"  # the administrator's tag wins
    raw["jobs"][0]["comment"] = "plain text (an older shape)"
    assert parse_sacct_json(json.dumps(raw))[0].comment == "plain text (an older shape)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", JobIdParts(123)),
        ("123_4", JobIdParts(123, (4,))),
        ("20956421_[2-4%25]", JobIdParts(20956421, (2, 3, 4), 25)),
        ("7_[1,3-4]", JobIdParts(7, (1, 3, 4))),
        ("55+1", JobIdParts(55, het_offset=1)),
    ],
)
def test_job_ids(text: str, expected: JobIdParts) -> None:
    assert parse_job_id(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12_", "12_[4-2]", "12;rm -rf /"])
def test_bad_job_ids_quote_the_text(bad: str) -> None:
    with pytest.raises(UnparseableOutput) as err:
        parse_job_id(bad)
    assert repr(bad) in str(err.value)


def test_format_job_id() -> None:
    assert format_job_id(20, 13, 2) == "13_2"
    assert format_job_id(13, 13, None, "2-4", 2) == "13_[2-4%2]"
    assert format_job_id(13, 13, None, "2-4%2", 2) == "13_[2-4%2]"
    assert format_job_id(9, None, None) == "9"


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:h100=2", ("h100", 2)),
        ("cpu=8,gres/gpu:a100=2,gres/gpu:h100=1", ("a100", 3)),  # typed only: summed
        ("cpu=1,mem=8G", (None, 0)),
        ("", (None, 0)),
    ],
)
def test_gpus_from_tres_count_each_gpu_once(tres: str, expected: tuple[str | None, int]) -> None:
    assert gpus_from_tres(tres) == expected


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:h100:4", ("h100", 4)),
        ("gpu:4", (None, 4)),
        ("gpu:h100:2(IDX:0-1)", ("h100", 2)),
        ("gpu:h100:2(IDX:0,2),gpu:a100:1(IDX:3)", ("h100", 3)),
        ("(null)", (None, 0)),
        ("gpu:h100:0(IDX:N/A)", ("h100", 0)),
    ],
)
def test_parse_gres(gres: str, expected: tuple[str | None, int]) -> None:
    assert parse_gres(gres) == expected


def test_newer_openapi_shapes() -> None:
    assert num({"set": True, "infinite": False, "number": 42}) == 42
    assert num({"set": False, "infinite": False, "number": 0}) is None
    assert num({"set": True, "infinite": True, "number": 0}) is None
    assert states(["RUNNING", "COMPLETING"]) == ["RUNNING", "COMPLETING"]
    assert states({"current": ["PREEMPTED"], "reason": "None"}) == ["PREEMPTED"]
    newer = {
        "jobs": [
            {
                "job_id": 41,
                "name": "x",
                "partition": "train",
                "account": "a",
                "user_name": "u",
                "job_state": ["RUNNING"],
                "state_reason": "None",
                "nodes": "n[1-2]",
                "comment": "stb:triton",
                "tres_alloc_str": "cpu=2,gres/gpu=8,gres/gpu:h100=8",
                "array_job_id": {"set": True, "infinite": False, "number": 0},
                "array_task_id": {"set": False, "infinite": False, "number": 0},
                "restart_cnt": 2,
                "submit_time": {"set": True, "number": 1795961502},
                "start_time": {"set": True, "number": 1795961503},
                "end_time": {"set": True, "infinite": False, "number": 1795965103},
                "time_limit": {"set": True, "infinite": False, "number": 60},
            }
        ]
    }
    (job,) = parse_squeue_json(json.dumps(newer))
    assert (job.job_id, job.state, job.nodes, job.gpus, job.restarts) == (
        "41",
        "RUNNING",
        ("n1", "n2"),
        8,
        2,
    )
    assert job.start_time == datetime.fromtimestamp(1795961503, tz=UTC)
    assert job.end_time == datetime.fromtimestamp(1795961503 + 3600, tz=UTC)
    unlimited = {"set": False, "infinite": True, "number": 0}
    newer["jobs"][0]["time_limit"] = unlimited
    (job,) = parse_squeue_json(json.dumps(newer))
    assert job.end_time is None


def test_scontrol_values_with_spaces() -> None:
    (rec,) = scontrol_records(
        "NodeName=n2 OS=Linux 6.1 #1 SMP State=IDLE+DRAIN Reason=disk bad [root@2026-01-01]"
    )
    assert rec["OS"] == "Linux 6.1 #1 SMP" and rec["Reason"] == "disk bad [root@2026-01-01]"


@pytest.mark.parametrize(
    "raw", ["", "not json", '{"jobs": 3}', '{"meta": {}}', '{"jobs": [{"name": "no id"}]}']
)
def test_garbage_json_quotes_the_raw_text(raw: str) -> None:
    with pytest.raises(UnparseableOutput, match="squeue --json"):
        parse_squeue_json(raw)


def test_garbage_scontrol_quotes_the_line() -> None:
    with pytest.raises(UnparseableOutput, match="garbage"):
        scontrol_records("garbage without fields")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of"),
        ({"wrap": "true", "script": "x.sbatch"}, "exactly one of"),
        ({"wrap": "true", "env": {"A=B": "1"}}, "not a valid variable name"),
        ({"wrap": "true", "env": {"A": "1,2"}}, "cannot export"),
    ],
)
def test_bad_job_specs_are_refused(kwargs: dict[str, object], match: str) -> None:
    from bridge.slurm import JobSpec

    with pytest.raises(ValueError, match=match):
        JobSpec(partition="train", account="a", **kwargs)  # type: ignore[arg-type]


def test_backend_selection_names_the_problem() -> None:
    from bridge.slurm.cli import SlurmCLI
    from bridge.slurm.select import open_backend

    assert isinstance(open_backend("cli"), SlurmCLI)
    with pytest.raises(ValueError, match="unknown Slurm backend 'slurmrestd'"):
        open_backend("slurmrestd")
    try:
        import pyslurm  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pyslurm does not import"):
            open_backend("pyslurm")


def test_a_json_document_with_errors_raises_controller_unreachable() -> None:
    """With slurmctld down, squeue --json exits 0 with no jobs and the error only in its
    `errors` list (recorded on the lab): that must not read as "no job runs" (every lease
    would seem gone). sacct's "Nothing found" over a quiet window is no error."""
    from bridge.slurm.errors import ControllerUnreachable

    down = {
        "meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}}},
        "errors": [
            {
                "error": "Unspecified error",
                "description": "Failed while looking for jobs",
                "source": "slurm_load_jobs",
                "error_number": -1,
            }
        ],
        "jobs": [],
    }
    with pytest.raises(ControllerUnreachable, match="Failed while looking for jobs"):
        parse_squeue_json(json.dumps(down))
    assert parse_squeue_json(json.dumps({**down, "errors": []})) == []
    quiet = {
        **down,
        "errors": [
            {
                "error": "Nothing found with query",
                "error_number": 9003,
                "source": "slurmdb_jobs_get",
            }
        ],
    }
    assert parse_sacct_json(json.dumps(quiet)) == []


@pytest.mark.parametrize(
    ("reason", "sent"),
    [("lease 3", "Reason=stb: lease 3"), ("stb:lease=3 lend", "Reason=stb:lease=3 lend")],
)
def test_a_drain_reason_carries_the_bridge_tag_once(
    reason: str, sent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridge.slurm.cli import SlurmCLI

    calls: list[tuple[str, ...]] = []

    def run(*argv: str, **_: object) -> str:
        calls.append(argv)
        return ""

    cli = SlurmCLI()
    monkeypatch.setattr(cli, "_run", run)
    cli.drain("n3", reason)
    assert calls == [("scontrol", "update", "NodeName=n3", "State=DRAIN", sent)]
