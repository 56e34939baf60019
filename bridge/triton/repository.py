"""The Triton model repository: each model's `config.pbtxt`, parsed with Triton's own
ModelConfig protobuf (shipped with tritonclient), and the bridge's metadata kept in its
`parameters`:

    parameters: { key: "stb.team"         value: { string_value: "team-vision" } }
    parameters: { key: "stb.slo_p99_ms"   value: { string_value: "100" } }
    parameters: { key: "stb.min_replicas" value: { string_value: "1" } }   # optional, 1
    parameters: { key: "stb.max_replicas" value: { string_value: "4" } }   # optional, 4

Read by the ledger's ingest (a served model's team) and by `stb models` (publishing
validates a model with `check_model` before anything is written).

A config is read only when it is a regular file of at most `MAX_CONFIG_BYTES` (it is not
read past that), in UTF-8, nested at most `MAX_CONFIG_DEPTH` messages deep (checked before
the protobuf parser sees it); anything else is a `ModelConfigError` naming the file and
what was wrong.
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
MAX_CONFIG_BYTES = 1024 * 1024
"""The largest config.pbtxt read; real ones are a few KiB."""
MAX_CONFIG_DEPTH = 32
"""The deepest nesting of messages (`{`/`<`) a config may have; Triton's deepest is ~6."""
#: how much of the protobuf parser's complaint an error quotes (it may quote a whole token)
_QUOTED_CHARS = 300
#: what nests in text format: strings and comments (skipped whole) and message brackets
_NESTING_TOKEN = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|#[^\n]*|[{<}>]""")


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
    return parse_config(read_config_text(path), str(path))


def read_config_text(path: Path) -> str:
    """The text of a config.pbtxt: a regular file (a FIFO or device is never opened) of at
    most `MAX_CONFIG_BYTES`, in UTF-8; ModelConfigError naming the file otherwise."""
    try:
        if not path.is_file():
            what = "missing" if not path.exists() else "not a regular file"
            raise ModelConfigError(f"{path}: {what}")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelConfigError(f"{path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"{path}: larger than {MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES); not read further"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def parse_config(text: str, where: str) -> model_config_pb2.ModelConfig:
    _check_nesting(text, where)
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        words = str(exc)
        if len(words) > _QUOTED_CHARS:
            words = f"{words[:_QUOTED_CHARS]}... ({len(words)} chars)"
        raise ModelConfigError(f"{where}: not a Triton ModelConfig: {words}") from exc
    except RecursionError as exc:  # guarded above; kept in case the parser recurses anyway
        raise ModelConfigError(f"{where}: nested too deeply to parse") from exc


def _check_nesting(text: str, where: str) -> None:
    """ModelConfigError when messages nest deeper than `MAX_CONFIG_DEPTH` (brackets inside
    strings and comments do not count)."""
    depth = 0
    for token in _NESTING_TOKEN.finditer(text):
        bracket = token.group()
        if bracket in ("{", "<"):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                line = text.count("\n", 0, token.start()) + 1
                raise ModelConfigError(
                    f"{where}: line {line}: messages nested deeper than {MAX_CONFIG_DEPTH} "
                    "(MAX_CONFIG_DEPTH)"
                )
        elif bracket in ("}", ">"):
            depth = max(depth - 1, 0)


def parameters(model_dir: Path) -> dict[str, str]:
    """The model's string parameters (`parameters { key: ... value { string_value } }`)."""
    cfg = read_config(model_dir)
    return {k: v.string_value for k, v in cfg.parameters.items()}


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        shown = repr(name) if len(name) <= 80 else f"{name[:80]!r}... ({len(name)} chars)"
        raise ModelConfigError(
            f"invalid model name {shown}: 1-64 letters, digits, '_' or '-', starting with "
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
