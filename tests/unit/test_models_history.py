"""The model repository's journal (`bridge.models.history`): publish, a failed publish
(rolled back), rollback and retire each leave one entry with who, when, which version,
what serves after and why; `stb models history` shows them, per model or all, as a table
or JSON; a line cut by a crash is skipped and said, never failing the rest."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.models import history
from bridge.models.publish import PublishError, Server, publish, retire, rollback
from bridge.models.repo import ModelRepository
from tests.unit.fakes import FakeTriton, FakeTritonInstance
from tests.unit.helpers import model_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    root = tmp_path / "models"
    shutil.copytree(ROOT / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    return ModelRepository(root)


class Answering(FakeTritonInstance):
    """A fake server that answers every inference with echo's output."""

    def infer(self, name: str, inputs: Mapping[str, Any], version: str = "") -> dict[str, Any]:
        super().infer(name, inputs, version)
        return {"OUTPUT0": np.zeros(16, dtype=np.float32)}


def _server(address: str, **settings: object) -> Server:
    triton = FakeTriton()
    server = triton.server(address, models={"echo": "READY"}, **settings)
    return Server(address, Answering(triton, server), baseline=True)


def test_every_change_is_journalled_with_who_and_why(
    repo: ModelRepository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    before = datetime.now(UTC).replace(microsecond=0)
    good = _server("127.0.1.4:8000")
    publish(repo, model_dir(tmp_path), "echo", [good], why="retrained on november")
    # a version whose load fails is rolled back, and the journal says so and why
    bad = _server("127.0.1.4:8000", reject={"load": "failed to load 'echo' version 3"})
    with pytest.raises(PublishError, match="rolled back to version 2"):
        publish(repo, model_dir(tmp_path), "echo", [bad], why="try fp16")
    rollback(repo, "echo", [], "bad numbers", who="oncall")
    publish(repo, model_dir(tmp_path), "tiny", [])
    retire(repo, "tiny", [], "superseded")

    entries = history.read(repo.archive).entries
    assert [(e.model, e.action, e.version, e.serving) for e in entries] == [
        ("echo", "publish", 2, 2),
        ("echo", "publish-failed", 3, 2),
        ("echo", "rollback", 2, 1),
        ("tiny", "publish", 1, 1),
        ("tiny", "retire", 1, None),
    ]
    assert all(e.at >= before and e.at.tzinfo is not None for e in entries)
    assert entries[0].who.endswith("(Slurm job 4711)") and entries[2].who == "oncall"
    assert entries[0].why == "retrained on november"
    assert entries[0].servers == ("127.0.1.4:8000",)
    assert entries[1].why.startswith("try fp16; TritonRejected")
    assert "failed to load 'echo' version 3" in entries[1].why
    assert (entries[2].why, entries[4].why) == ("bad numbers", "superseded")
    assert [e.action for e in history.read(repo.archive, "tiny").entries] == ["publish", "retire"]


def test_a_refused_publish_leaves_no_entry(repo: ModelRepository, tmp_path: Path) -> None:
    src = model_dir(tmp_path, config="name: 1\n")
    with pytest.raises(Exception, match="config"):
        publish(repo, src, "echo", [])
    assert history.read(repo.archive).entries == ()


def test_a_cut_line_is_skipped_and_counted(repo: ModelRepository, tmp_path: Path) -> None:
    publish(repo, model_dir(tmp_path), "echo", [])
    path = repo.archive / history.FILE
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"action": "publish", "at": "2026-1')  # a crash mid-write
    publish(repo, model_dir(tmp_path), "echo", [])  # appends after the cut line
    journal = history.read(repo.archive, "echo")
    assert [e.version for e in journal.entries] == [2, 3] and journal.skipped == 1
    path.write_bytes(whole + b"[1, 2]\n" + whole)
    journal = history.read(repo.archive, "echo")
    assert [e.version for e in journal.entries] == [2, 2] and journal.skipped == 1


def test_the_cli_shows_the_history(repo: ModelRepository, tmp_path: Path) -> None:
    publish(repo, model_dir(tmp_path), "echo", [], why="first retrain", who="alice")
    rollback(repo, "echo", [], "regression in eval", who="bob")
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["models", "history", "echo", "--repository", str(repo.root)]
    shown = runner.invoke(app, [*args, "-c", str(ROOT / "deploy" / "lab" / "bridge.toml")])
    assert shown.exit_code == 0, shown.output
    assert "first retrain" in shown.output and "regression in eval" in shown.output
    assert "alice" in shown.output and "rollback" in shown.output
    done = runner.invoke(app, [*args, "--json", "-c", str(ROOT / "deploy" / "lab" / "bridge.toml")])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert [(e["action"], e["version"], e["who"]) for e in doc["entries"]] == [
        ("publish", 2, "alice"),
        ("rollback", 2, "bob"),
    ]
    bad = runner.invoke(app, ["models", "history", "../x", "--repository", str(repo.root)])
    assert bad.exit_code == 1 and "not a plain folder name" in bad.output
