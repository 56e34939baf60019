"""Reading the Triton model repository: each model's `config.pbtxt`, parsed with Triton's
own ModelConfig protobuf (shipped with tritonclient), and the bridge's metadata kept in its
`parameters` (`stb.team`, `stb.slo_p99_ms`).

Read by the ledger's ingest (a served model's owning team). Publishing models (validation,
atomic versions) builds on this module.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

TEAM_PARAMETER = "stb.team"


class ModelConfigError(ValueError):
    """A config.pbtxt that Triton's schema refuses; names the file and the problem."""


def read_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    path = model_dir / "config.pbtxt"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelConfigError(f"{path}: {exc.strerror or exc}") from exc
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{path}: {exc}") from exc


def parameters(model_dir: Path) -> dict[str, str]:
    """The model's string parameters (`parameters { key: ... value { string_value } }`)."""
    cfg = read_config(model_dir)
    return {k: v.string_value for k, v in cfg.parameters.items()}


def model_teams(repository: Path) -> dict[str, str]:
    """Model name -> owning team, for every model in the repository that names one.
    Unreadable configs are skipped here (publishing refuses them)."""
    teams: dict[str, str] = {}
    if not repository.is_dir():
        return teams
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        try:
            team = parameters(model_dir).get(TEAM_PARAMETER)
        except ModelConfigError:
            continue
        if team:
            teams[model_dir.name] = team
    return teams
