"""The Triton job's JobSpec and the tags that tie a Slurm job to its lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import TritonJobConfig
from bridge.daemon.launcher import LauncherError, start_models, triton_job
from bridge.slurm.model import lease_of, lease_tag


def test_lease_tags_round_trip_and_foreign_tags_are_ignored() -> None:
    assert lease_of(("stb:triton", lease_tag((7, 1795961640)))) == (7, 1795961640)
    assert lease_of(("stb:triton", "stb:baseline")) is None
    assert lease_of(("stb:lease=7",)) is None  # no creation time: not ours
    assert lease_of(("stb:lease=x.1",)) is None


def test_a_lent_node_is_taken_whole_and_tagged(tmp_path: Path) -> None:
    key = tmp_path / "api.key"
    key.write_text("the-secret-key\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    cfg = TritonJobConfig(key_file=key, log_dir=tmp_path)
    spec = triton_job(
        cfg, node="n3", models=["busy", "echo"], lease=(3, 100), exclusive=True, gpus=4
    )
    assert spec.exclusive and spec.gpus_per_node == 4 and spec.nodelist == ("n3",)
    assert spec.comment == "stb:triton,stb:lease=3.100"
    assert spec.env["STB_MODELS"] == "busy;echo"  # no commas through sbatch --export
    assert spec.requeue is False and spec.name == "stb-triton-lease-3"
    base = triton_job(cfg, node="n4")
    # every model but the LLM, which sets stb.load_at_start false (triton_repo/smol)
    assert base.comment == "stb:triton,stb:baseline" and base.env["STB_MODELS"] == "busy;echo"
    # the job's environment names the key's file and the shim, never the key
    assert spec.env["STB_KEY_SHIM"] == str(tmp_path / "libstbkey.so")
    assert not any("the-secret-key" in v for v in spec.env.values())


def test_a_missing_key_shim_is_named(tmp_path: Path) -> None:
    key = tmp_path / "api.key"
    key.write_text("k\n")
    with pytest.raises(LauncherError, match=r"no key shim at .*libstbkey\.so"):
        triton_job(TritonJobConfig(key_file=key), node="n4")


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match=r"api\.key"):
        triton_job(TritonJobConfig(key_file=tmp_path / "api.key"), node="n4")


def _model(repo: Path, name: str, load_at_start: str | None = None) -> None:
    (repo / name).mkdir(parents=True)
    param = (
        f'parameters: {{ key: "stb.load_at_start" value: {{ string_value: "{load_at_start}" }} }}'
        if load_at_start is not None
        else ""
    )
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{param}\n')


def test_a_server_for_every_model_leaves_out_those_loaded_only_when_named(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    _model(repo, "echo")
    _model(repo, "busy", "true")
    assert start_models(repo) is None  # nobody opts out: Triton's '*', as always
    _model(repo, "llm", "False")
    (repo / ".hidden").mkdir()
    (repo / "no_config").mkdir()
    _model(repo, "broken")
    (repo / "broken" / "config.pbtxt").write_text("not { a config")
    # a config Triton will refuse stays in: its load then says what is wrong
    assert start_models(repo) == ["broken", "busy", "echo"]
    assert start_models(tmp_path / "missing") is None
    key = tmp_path / "api.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    cfg = TritonJobConfig(key_file=key, model_repository=repo)
    assert triton_job(cfg, node="n4").env["STB_MODELS"] == "broken;busy;echo"
    assert triton_job(cfg, node="n4", models=["llm"]).env["STB_MODELS"] == "llm"


@pytest.mark.parametrize(
    ("models", "error"),
    [
        ((("llm", "maybe"),), r"llm/config\.pbtxt: stb\.load_at_start must be .*'maybe'"),
        ((("llm", "false"),), r"every model of .* sets stb\.load_at_start false or min_replicas 0"),
    ],
)
def test_a_bad_or_empty_start_list_is_named(
    tmp_path: Path, models: tuple[tuple[str, str], ...], error: str
) -> None:
    for name, value in models:
        _model(tmp_path, name, value)
    with pytest.raises(LauncherError, match=error):
        start_models(tmp_path)
