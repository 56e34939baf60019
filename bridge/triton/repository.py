"""The Triton model repository: each model's `config.pbtxt`, parsed with Triton's own
ModelConfig protobuf (shipped with tritonclient), and the bridge's metadata kept in its
`parameters`:

    parameters: { key: "stb.team"         value: { string_value: "team-vision" } }
    parameters: { key: "stb.slo_p99_ms"   value: { string_value: "100" } }
    parameters: { key: "stb.min_replicas" value: { string_value: "1" } }   # optional, 1
    parameters: { key: "stb.max_replicas" value: { string_value: "4" } }   # optional, 4

and, for an LLM, its token objectives in ms (either of the first two stands in for
`stb.slo_p99_ms`): `stb.slo_ttft_p99_ms`, `stb.slo_tpot_p99_ms`, `stb.slo_e2e_p99_ms`;
for a model split over GPUs, one replica's parallel sizes (whole, >= 1):
`stb.tensor_parallel_size`, `stb.pipeline_parallel_size`; for a model served on a MIG
slice (or a GPU type), the GRES type its GPUs are of: `stb.gpu_type` (`h100_1g.10gb`).

Read by the ledger's ingest (a served model's team), by `stb models` (publishing
validates a model with `check_model` before anything is written) and, for the SLO, bounds,
instances and replica size the policy scales a model by, by `PublishedModels` (every
model's `Published` facts, read again only when its config.pbtxt changed), which
`bridge.modelfacts.merge_models` merges with the TOML's overrides. The instances are the
instance_group's: the sum of the counts when every group runs on CPU or names its GPUs
(a group on every GPU of its node leaves them unset: the capacity model's default); the
instance GPUs are the distinct GPUs its GPU groups name (`instance_group_of`).

A config is read only when it is a regular file of at most `MAX_CONFIG_BYTES` (it is not
read past that), in UTF-8, nested at most `MAX_CONFIG_DEPTH` messages deep (checked before
the protobuf parser sees it); anything else is a `ModelConfigError` naming the file and
what was wrong.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bridge.config import GRES_TYPE
from bridge.modelfacts import FILE, PARAMETERS, Published

TEAM_PARAMETER = "stb.team"
SLO_PARAMETER = "stb.slo_p99_ms"
MIN_PARAMETER = "stb.min_replicas"
MAX_PARAMETER = "stb.max_replicas"
#: an LLM's token objectives, ms (`bridge.modelfacts.TOKEN_SLOS`), field -> parameter
TOKEN_PARAMETERS = {
    "slo_ttft_p99_ms": "stb.slo_ttft_p99_ms",
    "slo_tpot_p99_ms": "stb.slo_tpot_p99_ms",
    "slo_e2e_p99_ms": "stb.slo_e2e_p99_ms",
}
#: one replica's parallel sizes, whole and >= 1, field -> parameter
PARALLEL_PARAMETERS = {f: PARAMETERS[f] for f in ("tensor_parallel", "pipeline_parallel")}
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
    facts = published_of(cfg)
    if not facts.team:
        raise ModelConfigError(f"{where}: parameter {TEAM_PARAMETER} (the owning team) is missing")
    for key in (
        "slo_p99_ms",
        "min_replicas",
        "max_replicas",
        *TOKEN_PARAMETERS,
        *PARALLEL_PARAMETERS,
    ):
        if key in facts.errors:
            raise ModelConfigError(f"{where}: {facts.errors[key]}")
    tokens = facts.slo_ttft_p99_ms is not None or facts.slo_tpot_p99_ms is not None
    if facts.slo_p99_ms is None and not tokens:
        raise ModelConfigError(
            f"{where}: parameter {SLO_PARAMETER} is missing (or, for an LLM, "
            f"{TOKEN_PARAMETERS['slo_ttft_p99_ms']} / {TOKEN_PARAMETERS['slo_tpot_p99_ms']})"
        )
    low = 1 if facts.min_replicas is None else facts.min_replicas
    high = 4 if facts.max_replicas is None else facts.max_replicas
    if low > high:
        raise ModelConfigError(
            f"{where}: replica bounds must be 0 <= {MIN_PARAMETER} <= {MAX_PARAMETER} and "
            f"{MAX_PARAMETER} >= 1, got {low}..{high}"
        )
    slo = math.inf if facts.slo_p99_ms is None else facts.slo_p99_ms  # tokens alone
    return ModelMeta(facts.team, slo, low, high)


def published_of(cfg: model_config_pb2.ModelConfig) -> Published:
    """The bridge's facts of a parsed config: each `stb.*` parameter read on its own, a
    bad one kept in `errors` under its field (naming the parameter and the value), and
    the instances of its instance_group and the GPUs they name."""
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    errors: dict[str, str] = {}
    team = params.get(TEAM_PARAMETER, "").strip() or None
    slo = _parsed(params, SLO_PARAMETER, float, errors, "slo_p99_ms")
    if slo is not None and not (math.isfinite(slo) and slo > 0):
        errors["slo_p99_ms"] = f"{SLO_PARAMETER} must be > 0 ms, got {slo:g}"
        slo = None
    low = _parsed(params, MIN_PARAMETER, int, errors, "min_replicas")
    if low is not None and low < 0:
        errors["min_replicas"] = f"replica bounds: {MIN_PARAMETER} must be >= 0, got {low:g}"
        low = None
    high = _parsed(params, MAX_PARAMETER, int, errors, "max_replicas")
    if high is not None and high < 1:
        errors["max_replicas"] = f"replica bounds: {MAX_PARAMETER} must be >= 1, got {high:g}"
        high = None
    tokens: dict[str, float | None] = {}
    for field, key in TOKEN_PARAMETERS.items():
        value = _parsed(params, key, float, errors, field)
        if value is not None and not (math.isfinite(value) and value > 0):
            errors[field] = f"{key} must be > 0 ms, got {value:g}"
            value = None
        tokens[field] = value
    parallel: dict[str, int | None] = {}
    for field, key in PARALLEL_PARAMETERS.items():
        size = _parsed(params, key, int, errors, field)
        if size is not None and size < 1:
            errors[field] = f"{key} must be >= 1, got {size:g}"
            size = None
        parallel[field] = None if size is None else int(size)
    gpu_type = params.get(PARAMETERS["gpu_type"], "").strip() or None
    if gpu_type is not None and not GRES_TYPE.match(gpu_type):
        errors["gpu_type"] = (
            f"{PARAMETERS['gpu_type']} must be a GRES type name such as h100_1g.10gb "
            f"(letters, digits, '.', '_', '-', '+'), got {gpu_type!r}"
        )
        gpu_type = None
    instances, instance_gpus = instance_group_of(cfg)
    return Published(
        team,
        slo,
        None if low is None else int(low),
        None if high is None else int(high),
        instances,
        errors=errors,
        instance_gpus=instance_gpus,
        tensor_parallel=parallel["tensor_parallel"],
        pipeline_parallel=parallel["pipeline_parallel"],
        gpu_type=gpu_type,
        **tokens,
    )


def instance_group_of(cfg: model_config_pb2.ModelConfig) -> tuple[int | None, int | None]:
    """What one replica's instance groups say: (instances, instance GPUs).

    Instances: the executions of the model one replica runs, the groups' counts (a count
    of 0 is Triton's 1, a group naming GPUs has its count on each), when every group is
    on CPU (or KIND_MODEL) or names its GPUs; None when a group runs on every GPU of its
    node or there is no group (Triton's default: one per GPU), which the capacity model
    reads as sharing the node's GPUs.

    Instance GPUs: the distinct GPU indices the GPU groups (KIND_GPU, and KIND_AUTO
    naming GPUs, which Triton makes a GPU group) name in their `gpus` lists; None when a
    GPU group names none (Triton puts its instances on every GPU) or there is no GPU
    group (CPU ones hold no GPU)."""
    group = model_config_pb2.ModelInstanceGroup
    total = 0
    gpus: set[int] = set()
    every_gpu = False
    for g in cfg.instance_group:
        count = g.count if g.count > 0 else 1
        if g.kind in (group.KIND_CPU, group.KIND_MODEL):
            total += count
        elif g.kind in (group.KIND_GPU, group.KIND_AUTO) and g.gpus:
            total += count * len(g.gpus)
            gpus.update(g.gpus)
        else:
            every_gpu = True
    if every_gpu:
        return None, None
    return total or None, len(gpus) or None


def read_published(model_dir: Path) -> Published:
    """`published_of` a model folder's config.pbtxt; a file that cannot be read or parsed,
    or a folder name that is no model name, is `errors[FILE]`."""
    try:
        check_name(model_dir.name)
        return published_of(read_config(model_dir))
    except ModelConfigError as exc:
        return Published(errors={FILE: str(exc)})


class PublishedModels:
    """Every model of a repository with its `Published` facts, each config.pbtxt parsed
    again only when it changed (its mtime, size or inode). Reading is cheap enough for
    every tick: a folder listing and one `stat` a model. Safe to share between threads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, tuple[tuple[int, int, int], Published]] = {}
        self._lock = threading.Lock()
        #: how many config.pbtxt files were parsed (the cache's misses)
        self.parsed = 0

    def read(self) -> dict[str, Published] | None:
        """Model name -> facts, for every non-hidden folder that holds a config.pbtxt;
        None when the repository is no folder."""
        try:
            entries = sorted(p for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return None
        out: dict[str, Published] = {}
        with self._lock:
            for model_dir in entries:
                if model_dir.name.startswith("."):
                    continue
                try:
                    st = (model_dir / "config.pbtxt").stat()
                except OSError:
                    continue  # no config: not a model (a folder being written, say)
                key = (st.st_mtime_ns, st.st_size, st.st_ino)
                hit = self._cache.get(model_dir.name)
                if hit is None or hit[0] != key:
                    hit = (key, read_published(model_dir))
                    self._cache[model_dir.name] = hit
                    self.parsed += 1
                out[model_dir.name] = hit[1]
            for gone in set(self._cache) - set(out):
                del self._cache[gone]
        return out


def _parsed(
    params: dict[str, str],
    key: str,
    kind: type[int] | type[float],
    errors: dict[str, str],
    field: str,
) -> float | None:
    """The parameter as a number; None when absent or blank, or (kept in `errors`) bad."""
    raw = params.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        whole = " (a whole one)" if kind is int else ""
        errors[field] = f"parameter {key} must be a number{whole}, got {raw!r}"
        return None


def model_teams(repository: Path) -> dict[str, str]:
    """Model name -> owning team (`Published.team`), for every model in the repository
    that names one. Unreadable configs are skipped here (publishing refuses them)."""
    models = PublishedModels(repository).read() or {}
    return {name: p.team for name, p in models.items() if p.team}
