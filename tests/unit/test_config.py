"""The configuration: defaults, the lab file, unknown keys, bounds, env overrides, CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import ConfigError, ModelConfig, load_config, unknown_env
from bridge.paths import project_root
from bridge.triton.catalog import ModelCatalog


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path


def test_the_lab_file_is_valid() -> None:
    cfg = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    assert cfg.pools["elastic"].lend_mode == "preempt"
    assert cfg.pools["training"].lend_mode == "drain"
    # the lab's models' facts live in their config.pbtxt, not in the TOML
    assert not cfg.models
    facts = ModelCatalog(project_root() / "triton_repo", cfg.models, say=False).facts()
    busy = facts.facts["busy"]
    assert busy.model == ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=3, instances=1)
    assert set(busy.sources.values()) == {"repository"}
    # the LLM (smol) has no request p99 SLO (a stream's length is not a latency)
    assert (
        facts.problems == []
        and [n for n in facts.notes() if not n.startswith("model smol: served, not scaled")] == []
    )


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("tick_s = 0\n", "tick_s", "greater than 0"),
        ("tikc_s = 3\n", "tikc_s", "unknown key"),
        ("[models.busy]\nslo_p99 = 100\n", "models.busy.slo_p99", "unknown key"),
        (
            "[models.busy]\nslo_p99_ms = 100\nmin_replicas = 3\nmax_replicas = 2\n",
            "models.busy",
            "below min_replicas",
        ),
        ("[policy]\nlow_watermark = 1.2\n", "policy", "flap"),
        ('[pools.x]\npartition = "p"\nlend_mode = "steal"\n', "pools.x.lend_mode", "'preempt'"),
        ('[models."bad name"]\nslo_p99_ms = 1\n', "(file)", "letters, digits"),
        ("tick_s = [\n", "(file)", "not valid TOML"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    assert any(f == field and words in msg for f, msg in err.value.problems), err.value.problems


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, 'tick_s = 2\ndatabase_url = "sqlite:///a.db"\n')
    monkeypatch.setenv("STB_DATABASE_URL", "postgresql+psycopg://db/stb")
    monkeypatch.setenv("STB_POLICY__MAX_LENT_NODES", "7")
    cfg = load_config(path)
    assert cfg.database_url == "postgresql+psycopg://db/stb"
    assert cfg.policy.max_lent_nodes == 7
    assert cfg.tick_s == 2


def test_a_bad_environment_value_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STB_TICK_S", "soon")
    with pytest.raises(ConfigError) as err:
        load_config(None)
    assert err.value.problems[0][0] == "tick_s"


def test_unknown_environment_names_are_reported() -> None:
    env = {
        "STB_TICKS": "1",
        "STB_TICK_S": "1",
        "STB_POLICY__X": "1",
        "STB_LAB_DIR": "x",
        "PATH": "/bin",
    }
    assert unknown_env(env) == ["STB_TICKS"]


def test_config_check_command(tmp_path: Path) -> None:
    stb = Path(sys.executable).with_name("stb")
    good = subprocess.run(
        [str(stb), "config", "check", str(project_root() / "deploy" / "lab" / "bridge.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert good.returncode == 0 and "valid" in good.stdout
    bad = subprocess.run(
        [str(stb), "config", "check", str(_write(tmp_path, "[policy]\nmax_lent_nodes = -1\n"))],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200"},
    )
    assert bad.returncode == 1
    assert "policy.max_lent_nodes" in bad.stdout and "greater than or equal to 0" in bad.stdout
