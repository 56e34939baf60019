"""Publishing into a model repository on disk (no Triton here; the lab tests load and
serve): validation against Triton's ModelConfig protobuf and the bridge's metadata, bad
names, atomic versions, rollback and retire, and concurrent publishes serialized."""

from __future__ import annotations

import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from bridge.models.publish import PublishError, publish, retire, rollback, zero_inputs
from bridge.models.repo import ModelRepository
from bridge.triton.repository import ModelConfigError, check_name, parse_config
from tests.unit.helpers import model_dir

ROOT = Path(__file__).resolve().parents[2]
GOOD = (ROOT / "triton_repo" / "echo" / "config.pbtxt").read_text().replace('name: "echo"\n', "")


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
        if "__pycache__" not in p.parts
    }


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    root = tmp_path / "models"
    shutil.copytree(ROOT / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    return ModelRepository(root)


@pytest.mark.parametrize(
    "name", ["", "../etc", "a/b", ".hidden", "-x", "x" * 65, "stb", "Staging", "a.b", "a b"]
)
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ModelConfigError, match="model name"):
        check_name(name)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("max_batch_size: 64", "max_batch_size: sixty"), "not a Triton"),
        (lambda t: t.replace('backend: "python"', 'backend: "python"\nwidth: 3'), "not a Triton"),
        (lambda t: t.replace('backend: "python"\n', ""), "neither a backend nor a platform"),
        (lambda t: t.replace('"stb.team"', '"owner"'), "stb.team"),
        (lambda t: t.replace('string_value: "50"', 'string_value: "fast"'), "must be a number"),
        (lambda t: t + 'parameters: { key: "stb.min_replicas" value: { string_value: "5" } }\n',
         "replica bounds"),
        (lambda t: 'name: "other"\n' + t, "differs from the published name"),
    ],
)  # fmt: skip
def test_a_bad_config_is_refused_and_the_repository_is_unchanged(
    repo: ModelRepository, tmp_path: Path, edit: object, message: str
) -> None:
    before = tree(repo.root.parent)
    src = model_dir(tmp_path, edit(GOOD))  # type: ignore[operator]
    with pytest.raises(ModelConfigError, match=message):
        publish(repo, src, "echo", [])
    after = tree(repo.root.parent)
    assert after == {**before, **{k: v for k, v in after.items() if k.startswith("src")}}


def test_publish_writes_the_next_version_and_keeps_the_configs(
    repo: ModelRepository, tmp_path: Path
) -> None:
    src = model_dir(tmp_path, files={"model.py": "# v2\n", "weights.txt": "1 2 3\n"})
    out = publish(repo, src, "echo", [])
    assert (out.version, out.previous, out.meta.team) == (2, 1, "team-platform")
    assert repo.versions("echo") == [1, 2]
    assert (repo.root / "echo" / "2" / "weights.txt").read_text() == "1 2 3\n"
    assert repo.config_text("echo") == 'name: "echo"\n' + GOOD
    assert not [p for p in (repo.root / "echo").iterdir() if p.name.startswith(".")]
    # Rollback: version 2 goes to the archive, version 1's config comes back.
    old = (ROOT / "triton_repo" / "echo" / "config.pbtxt").read_text()
    assert rollback(repo, "echo", [], "bad numbers")[:2] == (2, 1)
    assert repo.versions("echo") == [1] and repo.config_text("echo") == old
    with pytest.raises(PublishError, match="nothing to roll back to"):
        rollback(repo, "echo", [], "again")
    # An explicit version below the served one is refused; a new model starts at 1.
    publish(repo, src, "echo", [], version=5)
    with pytest.raises(PublishError, match="below the served version 5"):
        publish(repo, src, "echo", [], version=3)
    assert publish(repo, model_dir(tmp_path), "tiny", []).version == 1
    retire(repo, "tiny", [], "test")
    assert "tiny" not in repo.models() and (repo.archive / "tiny" / "retired").is_dir()


def _publish_one(args: tuple[str, str]) -> int:
    root, src = args
    return publish(ModelRepository(Path(root)), Path(src), "echo", []).version


def test_concurrent_publishes_are_serialized(repo: ModelRepository, tmp_path: Path) -> None:
    src = model_dir(tmp_path)
    with ProcessPoolExecutor(4) as pool:
        versions = list(pool.map(_publish_one, [(str(repo.root), str(src))] * 8))
    assert sorted(versions) == list(range(2, 10))
    assert repo.versions("echo") == list(range(1, 10))
    assert not [p for p in (repo.root / "echo").iterdir() if p.name.startswith(".")]
    configs = sorted(p.name for p in (repo.archive / "echo" / "configs").iterdir())
    assert configs == sorted(f"{v}.pbtxt" for v in range(1, 10))


def test_zero_inputs_follow_the_config() -> None:
    cfg = parse_config(GOOD, "echo")  # max_batch_size 64, INPUT0 FP32 [-1]
    arrays = zero_inputs(cfg)
    assert list(arrays) == ["INPUT0"]
    assert arrays["INPUT0"].shape == (1, 1) and str(arrays["INPUT0"].dtype) == "float32"
