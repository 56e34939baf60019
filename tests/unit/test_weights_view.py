"""The weight cache in the status commands (`bridge.weights.view`): per model version the
nodes holding a complete copy (the catalogue) and the staging jobs in flight (Slurm's
`stb:staging` jobs, matched to the catalogue by job id, else by their name); `stb
status` and `stb models status` show it, as a table and in their JSON."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from bridge import ops
from bridge.cli import app
from bridge.config import BridgeConfig, DaemonConfig
from bridge.leases.schema import create_schema
from bridge.leases.store import make_engine
from bridge.leases.weights import WeightCopy, WeightStore
from bridge.models.repo import ModelRepository
from bridge.models.status import STAGING_NOT_READ, gather
from bridge.models.status_render import render
from bridge.ops.cli import collect
from bridge.slurm.errors import ControllerUnreachable
from bridge.slurm.model import STAGING_TAG, Job, staged_version
from bridge.triton.catalog import ModelCatalog
from bridge.weights.view import cache_view, read_jobs

from .fakes import FakeSlurm, make_node

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


def _row(node: str, model: str, version: int, state: str, **values: object) -> WeightCopy:
    return WeightCopy(
        node=node, model=model, version=version, path=f"/cache/{model}/{version}",
        state=state, updated_at=T0, **values,
    )  # fmt: skip


def _job(job_id: str, name: str, state: str, nodes: tuple[str, ...] = ()) -> Job:
    return Job(
        job_id, name, "elastic", "bridge", "stb", state, "None", nodes if state == "RUNNING"
        else (), STAGING_TAG, 0, 0, T0 - timedelta(minutes=5),
        T0 - timedelta(minutes=2) if state == "RUNNING" else None, requested_nodes=nodes,
    )  # fmt: skip


ROWS = [
    _row("n3", "weighty", 1, "complete", size_bytes=2_000_000_000, job_id="30"),
    _row("n4", "weighty", 1, "complete", size_bytes=2_000_000_000),
    _row("n6", "weighty", 1, "failed", reason="staging job 33 timeout"),
    _row("n5", "weighty", 1, "staging", job_id="41"),
    _row("n7", "weighty", 1, "staging", job_id="43"),
    _row("n8", "weighty", 1, "staging", job_id="44"),
    _row("n9", "llm", 3, "staging"),  # by hand
    _row("n3", "llm", 2, "evicted", reason="room"),
]
JOBS = [
    _job("41", "stb-staging-weighty-1", "RUNNING", ("n5",)),
    _job("42", "stb-staging-weighty-2", "PENDING", ("n3",)),  # not in the catalogue yet
    _job("43", "stb-staging-weighty-1", "COMPLETED", ("n7",)),  # ended, not yet recorded
    _job("45", "stb-staging", "PENDING", ("n4",)),  # a name with no version: not shown
]


def test_the_view_joins_the_catalogue_and_slurm() -> None:
    view = cache_view(ROWS, JOBS)
    assert [(v.model, v.version) for v in view.versions] == [
        ("llm", 3), ("weighty", 2), ("weighty", 1),
    ]  # fmt: skip
    llm, w2, w1 = view.versions
    assert w1.nodes == ("n3", "n4") and w1.size_bytes == 2_000_000_000
    assert [(s.node, s.job_id, s.state) for s in w1.staging] == [
        ("n5", "41", "RUNNING"),
        ("n7", "43", "COMPLETED, not yet recorded"),
        ("n8", "44", "not queued"),
    ]
    assert w1.staging[0].since == T0 - timedelta(minutes=2)  # running: its start
    assert w1.failed == (("n6", "staging job 33 timeout"),)
    assert [(s.node, s.job_id, s.state, s.since) for s in w2.staging] == [
        ("n3", "42", "PENDING", T0 - timedelta(minutes=5))  # pending: its submit
    ]
    assert w2.nodes == () and llm.staging[0].state == "by hand"
    assert view.lines() == [
        "llm 3: staging on n9 (by hand since 2026-12-04 10:00:00)",
        "weighty 2: staging on n3 (job 42 PENDING since 2026-12-04 09:55:00)",
        "weighty 1: complete on n3, n4 (2.00 GB); staging on n5 (job 41 RUNNING since "
        "2026-12-04 09:58:00), n7 (job 43 COMPLETED, not yet recorded since 2026-12-04 "
        "10:00:00), n8 (job 44 not queued since 2026-12-04 10:00:00); failed on n6 (staging "
        "job 33 timeout)",
    ]
    assert view.of_model("llm").versions == (llm,)
    doc = view.to_json()
    assert doc["versions"][2]["failed"] == [{"node": "n6", "reason": "staging job 33 timeout"}]
    assert doc["versions"][2]["staging"][0]["since"] == "2026-12-04T09:58:00+00:00"
    json.dumps(doc)  # plain JSON


def test_slurm_not_answering_leaves_the_catalogue() -> None:
    slurm = FakeSlurm()
    slurm.fail("jobs", ControllerUnreachable("squeue: slurmctld does not answer"))
    jobs, note = read_jobs(slurm)
    assert jobs is None and "slurmctld does not answer" in note
    view = cache_view(ROWS, jobs, note)
    (w1,) = view.of_model("weighty").versions  # the pending job of version 2 is unknown
    assert {s.state for s in w1.staging} == {"unknown"}
    assert view.lines()[-1] == f"({note})"
    assert cache_view([], []).lines() == ["no copy and no staging job"]
    assert staged_version("stb-staging-a-b-7") == ("a-b", 7)
    assert staged_version("stb-staging-a") is None


def _store(url: str) -> WeightStore:
    engine = make_engine(url)
    create_schema(engine)
    store = WeightStore(engine)
    store.begin("n3", "weighty", 1, "/c/weighty/1", T0, job_id="30")
    store.finish("n3", "weighty", 1, 2_000_000_000, "ab" * 32, T0)
    store.begin("n5", "weighty", 1, "/c/weighty/1", T0, job_id="41")
    return store


def test_stb_status_shows_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = BridgeConfig(
        database_url=f"sqlite:///{tmp_path / 'bridge.db'}",
        daemon=DaemonConfig(exporter_listen="127.0.0.1:9"),
    )
    _store(cfg.database_url)
    slurm = FakeSlurm([make_node("n3", ("elastic",)), make_node("n5", ("elastic",))], JOBS[:2])
    monkeypatch.setattr(ops.cli, "open_backend", lambda: slurm)
    doc = collect(cfg, T0)
    assert [(v["model"], v["version"], v["nodes"]) for v in doc["weights"]["versions"]] == [
        ("weighty", 2, []),
        ("weighty", 1, ["n3"]),
    ]
    assert [s["job_id"] for s in doc["weights"]["versions"][1]["staging"]] == ["41"]
    assert doc["weights"]["note"] == ""

    toml = tmp_path / "bridge.toml"
    toml.write_text(
        f'database_url = "{cfg.database_url}"\n[daemon]\nexporter_listen = "127.0.0.1:9"\n'
    )
    shown = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["status", "-c", str(toml)])
    assert shown.exit_code == 0, shown.output
    assert "weight cache" in shown.output
    assert "n3 (2.00 GB)" in shown.output and "n5 (job 41 RUNNING" in shown.output

    slurm.fail("nodes", ControllerUnreachable("sinfo: slurmctld does not answer"))
    away = collect(cfg, T0)["weights"]
    assert "staging jobs unknown" in away["note"]
    assert away["versions"][0]["staging"][0]["state"] == "unknown"


def test_stb_models_status_shows_the_models_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "models"
    shutil.copytree(ROOT / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    repo = ModelRepository(root)
    url = f"sqlite:///{tmp_path / 'bridge.db'}"
    store = _store(url)
    store.begin("n4", "busy", 1, "/c/busy/1", T0, job_id="50")  # another model's
    facts = ModelCatalog(repo.root, {}, say=False).facts()

    def status(jobs: list[Job] | None) -> dict[str, object]:
        got = gather(
            "echo", repo, facts, database_url=url, ledger_url=None, servers=[], now=T0,
            staging_jobs=jobs,
        )  # fmt: skip
        return got.to_json()["weights"]  # type: ignore[no-any-return]

    assert status([]) == {"versions": [], "note": ""}  # echo has no copy
    store.begin("n3", "echo", 1, "/c/echo/1", T0, job_id="60")
    store.finish("n3", "echo", 1, 1234, "cd" * 32, T0)
    store.begin("n5", "echo", 1, "/c/echo/1", T0, job_id="41")
    jobs = [_job("41", "stb-staging-echo-1", "RUNNING", ("n5",))]
    doc = status(jobs)
    (v1,) = doc["versions"]  # type: ignore[index]
    assert v1["model"] == "echo" and v1["nodes"] == ["n3"] and v1["size_bytes"] == 1234
    assert [(s["node"], s["state"]) for s in v1["staging"]] == [("n5", "RUNNING")]
    # without Slurm's jobs: the catalogue's, and the note says so
    unread = status(None)
    assert unread["note"] == STAGING_NOT_READ  # type: ignore[index]

    got = gather(
        "echo", repo, facts, database_url=url, ledger_url=None, servers=[], now=T0,
        staging_jobs=jobs,
    )  # fmt: skip
    render(got, Console(width=200))
    out = capsys.readouterr().out
    assert "weight cache" in out and "n5 (job 41 RUNNING" in out and "n3 (0.00 GB)" in out
