"""The Triton model repository: each model's `config.pbtxt`, parsed with Triton's own
ModelConfig protobuf (shipped with tritonclient), and the bridge's metadata kept in its
`parameters`:

    parameters: { key: "stb.team"         value: { string_value: "team-vision" } }
    parameters: { key: "stb.slo_p99_ms"   value: { string_value: "100" } }
    parameters: { key: "stb.min_replicas" value: { string_value: "1" } }   # optional, 1
    parameters: { key: "stb.max_replicas" value: { string_value: "4" } }   # optional, 4

Read by the ledger's ingest (a served model's team) and by `stb models` (publishing
validates a model with `check_model` before anything is written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

TEAM_PARAMETER = "stb.team"
SLO_PARAMETER = "stb.slo_p99_ms"
MIN_PARAMETER = "stb.min_replicas"
MAX_PARAMETER = "stb.max_replicas"
#: model names: what Triton, nginx routing and a file name all accept; no dots, so no
#: path games ("..") and no hidden entries
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
#: names the repository uses for itself, or that read as something else
RESERVED_NAMES = frozenset({"stb", "staging", "retired", "config", "models", "v2", "metrics"})


class ModelConfigError(ValueError):
    """A model Triton's schema or the bridge's rules refuse; names the file and problem."""


@dataclass(frozen=True)
class ModelMeta:
    """The bridge's metadata of a model, from its config.pbtxt parameters."""

    team: str
    slo_p99_ms: float
    min_replicas: int = 1
    max_replicas: int = 4


def read_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    path = model_dir / "config.pbtxt"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelConfigError(f"{path}: {exc.strerror or exc}") from exc
    return parse_config(text, str(path))


def parse_config(text: str, where: str) -> model_config_pb2.ModelConfig:
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{where}: not a Triton ModelConfig: {exc}") from exc


def parameters(model_dir: Path) -> dict[str, str]:
    """The model's string parameters (`parameters { key: ... value { string_value } }`)."""
    cfg = read_config(model_dir)
    return {k: v.string_value for k, v in cfg.parameters.items()}


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise ModelConfigError(
            f"invalid model name {name!r}: 1-64 letters, digits, '_' or '-', starting with "
            "a letter or digit (no '/', '.', or '..')"
        )
    if name.lower() in RESERVED_NAMES:
        raise ModelConfigError(f"model name {name!r} is reserved")
    return name


def check_model(cfg: model_config_pb2.ModelConfig, name: str, where: str) -> ModelMeta:
    """The metadata of a model about to be published as `name`; ModelConfigError naming
    the first problem otherwise."""
    check_name(name)
    if cfg.name and cfg.name != name:
        raise ModelConfigError(
            f"{where}: name {cfg.name!r} differs from the published name {name!r}"
        )
    if not cfg.backend and not cfg.platform:
        raise ModelConfigError(f"{where}: names neither a backend nor a platform")
    if not cfg.input or not cfg.output:
        raise ModelConfigError(f"{where}: a model needs at least one input and one output")
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    team = params.get(TEAM_PARAMETER, "").strip()
    if not team:
        raise ModelConfigError(f"{where}: parameter {TEAM_PARAMETER} (the owning team) is missing")
    slo = _number(params, SLO_PARAMETER, where, float, required=True)
    low = int(_number(params, MIN_PARAMETER, where, int, default=1))
    high = int(_number(params, MAX_PARAMETER, where, int, default=4))
    if slo <= 0:
        raise ModelConfigError(f"{where}: {SLO_PARAMETER} must be > 0 ms, got {slo:g}")
    if low < 0 or high < 1 or low > high:
        raise ModelConfigError(
            f"{where}: replica bounds must be 0 <= {MIN_PARAMETER} <= {MAX_PARAMETER} and "
            f"{MAX_PARAMETER} >= 1, got {low}..{high}"
        )
    return ModelMeta(team, float(slo), low, high)


def _number(
    params: dict[str, str],
    key: str,
    where: str,
    kind: type[int] | type[float],
    *,
    required: bool = False,
    default: float = 0,
) -> float:
    raw = params.get(key)
    if raw is None or raw.strip() == "":
        if required:
            raise ModelConfigError(f"{where}: parameter {key} is missing")
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ModelConfigError(f"{where}: parameter {key} must be a number, got {raw!r}") from None


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
