"""One place for each model fact: `merge_models` makes every model's effective SLO and
replica bounds from the model repository's metadata and the TOML's overrides, and says
where each field came from.

The repository is the source: each model's config.pbtxt carries `stb.slo_p99_ms`,
`stb.min_replicas`, `stb.max_replicas` (checked by `stb models publish`) and its
instance_group (the executions one replica runs); an LLM its token objectives,
`stb.slo_ttft_p99_ms`, `stb.slo_tpot_p99_ms` and optionally `stb.slo_e2e_p99_ms` (ms,
positive); a replica's size in GPUs, the distinct GPUs its instance_group names and
`stb.tensor_parallel_size`, `stb.pipeline_parallel_size` (whole, >= 1; none said: whole
nodes). A model with a TTFT or TPOT objective and no `stb.slo_p99_ms` is scaled by its
tokens (its `slo_p99_ms` is infinite: no request-latency objective). The TOML's
`[models.NAME]` may override any of these per site, field by field; every override is
said (`ModelFacts.notes`: the daemon logs each once, `stb config check` and `stb status`
show it). A model the repository has without `stb.slo_p99_ms` (nor a token objective)
and with no TOML SLO is served but not scaled;
a model whose metadata is refused is not scaled, and the error names the model and the
field.

Pure: literals in, values out. The repository is read by `bridge.triton.repository`
(`read_published`, `PublishedModels`) and merged here; used by the daemon's observer
(each tick, so a newly published model is scaled from the next tick), `stb config check`,
`stb status`, the API, the advisory, the simulator's lab twin and the capacity report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from pydantic import ValidationError

from bridge.config import BridgeConfig, ModelConfig, ModelOverride

Source = Literal["repository", "toml", "default"]
#: the fields of a model's facts, in the order they are shown
FIELDS = ("slo_p99_ms", "min_replicas", "max_replicas", "instances",
          "instance_gpus", "tensor_parallel", "pipeline_parallel",
          "slo_ttft_p99_ms", "slo_tpot_p99_ms", "slo_e2e_p99_ms", "gpu_type")  # fmt: skip
#: what one replica's GPUs are made of (`bridge.policy.gang.gpus_per_replica`)
REPLICA_GPUS = ("instance_gpus", "tensor_parallel", "pipeline_parallel")
#: an LLM's token objectives: any of the first two makes a model scaled without a
#: request SLO (`ModelConfig.has_token_slo`)
TOKEN_SLOS = ("slo_ttft_p99_ms", "slo_tpot_p99_ms")
#: where each field lives in a config.pbtxt
PARAMETERS: Mapping[str, str] = {
    "slo_p99_ms": "stb.slo_p99_ms",
    "min_replicas": "stb.min_replicas",
    "max_replicas": "stb.max_replicas",
    "instances": "instance_group",
    "instance_gpus": "instance_group's gpus",
    "tensor_parallel": "stb.tensor_parallel_size",
    "pipeline_parallel": "stb.pipeline_parallel_size",
    "slo_ttft_p99_ms": "stb.slo_ttft_p99_ms",
    "slo_tpot_p99_ms": "stb.slo_tpot_p99_ms",
    "slo_e2e_p99_ms": "stb.slo_e2e_p99_ms",
    "gpu_type": "stb.gpu_type",
}
#: an error of the whole config.pbtxt (unreadable, not a Triton ModelConfig)
FILE = "config.pbtxt"
#: what a field is when neither the repository nor the TOML says it
DEFAULTS: Mapping[str, int | str | None] = {
    "min_replicas": int(ModelConfig.model_fields["min_replicas"].default),
    "max_replicas": int(ModelConfig.model_fields["max_replicas"].default),
    "instances": None,
    "instance_gpus": None,
    "tensor_parallel": None,
    "pipeline_parallel": None,
    "slo_ttft_p99_ms": None,
    "slo_tpot_p99_ms": None,
    "slo_e2e_p99_ms": None,
    "gpu_type": None,
}


class ModelFactsError(ValueError):
    """Some model's facts are refused; `problems` names each model and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Published:
    """What one model's config.pbtxt says of the bridge's facts (None: it does not say)."""

    team: str | None = None
    slo_p99_ms: float | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    instances: int | None = None
    #: an LLM's token objectives (ms): p99 time to first token, per output token, e2e
    slo_ttft_p99_ms: float | None = None
    slo_tpot_p99_ms: float | None = None
    slo_e2e_p99_ms: float | None = None
    #: the distinct GPUs its KIND_GPU instance groups name (None: a group names none, so
    #: runs on every GPU, or there is no GPU group)
    instance_gpus: int | None = None
    #: one replica's tensor- and pipeline-parallel sizes
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    #: the GRES type one replica's GPUs are of (`stb.gpu_type`: a MIG slice type)
    gpu_type: str | None = None
    #: field (or `FILE`) -> why its value is refused, naming the parameter and value
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelFact:
    """One model's effective facts and where each came from."""

    name: str
    #: what the policy scales it by; None: not scaled (`why` says why)
    model: ModelConfig | None
    #: per field of `FIELDS` that has a value, where it came from
    sources: Mapping[str, Source]
    in_repository: bool
    in_toml: bool
    team: str | None = None
    why: str = ""
    #: each TOML field that overrides (or repeats) the repository's, as a sentence
    overrides: tuple[str, ...] = ()
    #: errors (bad metadata, contradictory bounds), each naming the model and the field
    problems: tuple[str, ...] = ()
    #: what is worth saying but is no error (a TOML entry the repository lacks, ...)
    warnings: tuple[str, ...] = ()
    #: in the repository with a config.pbtxt Triton can read and a valid name
    loadable: bool = False

    def source_of(self, name: str) -> str:
        """Where field `name` came from ("-" when it has no value)."""
        return self.sources.get(name, "-")


@dataclass(frozen=True)
class ModelFacts:
    """Every model the repository or the TOML names, with its effective facts."""

    facts: Mapping[str, ModelFact] = field(default_factory=dict)
    #: the repository read (None: none was: a tool's configuration stands alone)
    repository: str | None = None
    #: said once when the repository could not be read as a whole
    repository_note: str = ""

    @cached_property
    def scaled(self) -> dict[str, ModelConfig]:
        """The models the policy scales, by name."""
        return {n: f.model for n, f in self.facts.items() if f.model is not None}

    @cached_property
    def from_zero(self) -> tuple[str, ...]:
        """The scaled models with `min_replicas` 0 (scale to zero): the baselines do not
        load them, lent replicas alone serve them, and nginx sends their requests to the
        activator while none is ready. A model with no SLO is not scaled, so never lent
        for: it is loaded by the baselines whatever its `min_replicas`."""
        return tuple(n for n, m in self.scaled.items() if m.min_replicas == 0)

    @property
    def names(self) -> tuple[str, ...]:
        """Every model named by the repository or the TOML."""
        return tuple(self.facts)

    @property
    def served(self) -> tuple[str, ...]:
        """The models a Triton server can load: those in the repository whose config.pbtxt
        it can read (every named model when no repository was read)."""
        if self.repository is None:
            return self.names
        return tuple(n for n, f in self.facts.items() if f.loadable)

    @property
    def problems(self) -> list[str]:
        return [p for f in self.facts.values() for p in f.problems]

    def notes(self) -> list[str]:
        """Everything to say about the merge, one sentence each: the repository's own
        problem, then per model its problems, warnings, overrides and why it is not
        scaled (the daemon logs each once)."""
        out = [self.repository_note] if self.repository_note else []
        for f in self.facts.values():
            out += [*f.problems, *f.warnings, *f.overrides]
            if f.model is None and not f.problems:
                out.append(f"model {f.name}: {f.why}")
        return out

    def check(self) -> None:
        """ModelFactsError naming every refused model and field."""
        if self.problems:
            raise ModelFactsError(self.problems)


def _shown(value: float | int | str) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def shown_slo(value: float | None) -> str:
    """An objective in ms as shown to people: "-" when there is none (None, or the
    infinite request SLO of a model scaled by its tokens alone)."""
    return "-" if value is None or not math.isfinite(value) else f"{value:g}"


def merge_models(
    published: Mapping[str, Published] | None,
    toml: Mapping[str, ModelOverride],
    repository: str = "the model repository",
    repository_note: str = "",
) -> ModelFacts:
    """Every model's effective facts: each field from the TOML when it sets it (said as
    an override when the repository also does), else from the repository, else the
    default (`min_replicas` 1, `max_replicas` 4, the others unset). `published` None: no
    repository was read (the models are the TOML's alone, and nothing is said of models
    it lacks). Pure."""
    facts: dict[str, ModelFact] = {}
    for name in sorted({*(published or {}), *toml}):
        pub = published.get(name) if published is not None else None
        facts[name] = _merge_one(name, pub, toml.get(name), published is not None, repository)
    return ModelFacts(
        facts, repository if published is not None else None, repository_note=repository_note
    )


def _merge_one(
    name: str,
    pub: Published | None,
    over: ModelOverride | None,
    read: bool,
    repository: str,
) -> ModelFact:
    values: dict[str, float | int | str | None] = {}
    sources: dict[str, Source] = {}
    overrides: list[str] = []
    problems: list[str] = []
    warnings: list[str] = []
    errors = dict(pub.errors) if pub is not None else {}
    if FILE in errors:
        problems.append(f"model {name}: {errors[FILE]}")
    for f in FIELDS:
        mine = getattr(over, f) if over is not None else None
        theirs = getattr(pub, f) if pub is not None else None
        bad = errors.get(f)
        where = f"{PARAMETERS[f]} in its config.pbtxt"
        if mine is not None:
            values[f], sources[f] = mine, "toml"
            if theirs is not None and theirs != mine:
                overrides.append(
                    f"model {name}: {f} = {_shown(mine)} from the TOML [models.{name}] "
                    f"overrides {where} ({_shown(theirs)})"
                )
            elif theirs is not None:
                overrides.append(
                    f"model {name}: {f} = {_shown(mine)} in the TOML [models.{name}] repeats "
                    f"{where}; the TOML's can go"
                )
            if bad is not None:
                warnings.append(f"model {name}: {bad} (the TOML [models.{name}] overrides it)")
        elif bad is not None:
            problems.append(f"model {name}: {f}: {bad}")
        elif theirs is not None:
            values[f], sources[f] = theirs, "repository"
        elif f in DEFAULTS:
            values[f] = DEFAULTS[f]
            if DEFAULTS[f] is not None:
                sources[f] = "default"
    in_repository = pub is not None
    if read and not in_repository:
        warnings.append(
            f"model {name}: the TOML [models.{name}] names a model {repository} does not "
            "have (a typo, or not yet published?)"
        )
    low, high = values.get("min_replicas"), values.get("max_replicas")
    if not problems and isinstance(low, int) and isinstance(high, int) and high < low:
        problems.append(
            f"model {name}: max_replicas {_shown(high)} ({sources['max_replicas']}) is below "
            f"min_replicas {_shown(low)} ({sources['min_replicas']})"
        )
    model: ModelConfig | None = None
    why = ""
    if problems:
        why = "not scaled: its facts are refused"
    elif values.get("slo_p99_ms") is None and not any(values.get(t) for t in TOKEN_SLOS):
        why = (
            f"served, not scaled: no {PARAMETERS['slo_p99_ms']} (nor a token SLO: "
            f"{PARAMETERS['slo_ttft_p99_ms']}, {PARAMETERS['slo_tpot_p99_ms']}) in its "
            f"config.pbtxt and no slo_p99_ms in the TOML [models.{name}]"
            if in_repository
            else f"not scaled: not in {repository} and the TOML [models.{name}] sets no slo_p99_ms"
        )
    else:
        try:
            given = {k: v for k, v in values.items() if v is not None}
            # token SLOs and no request SLO: no objective on request latency (infinite)
            given.setdefault("slo_p99_ms", math.inf)
            model = ModelConfig.model_validate(given)
        except ValidationError as exc:  # guarded above; a field out of range at its source
            problems.append(f"model {name}: {exc.errors()[0]['msg']}")
            why = "not scaled: its facts are refused"
    return ModelFact(
        name,
        model,
        sources,
        in_repository,
        over is not None,
        pub.team if pub is not None else None,
        why,
        tuple(overrides),
        tuple(problems),
        tuple(warnings),
        in_repository and FILE not in errors,
    )


def toml_models(config: BridgeConfig) -> dict[str, ModelConfig]:
    """The models as the TOML alone says them, for tools that model a site without its
    repository (the simulator's scenarios, benches): `merge_models` with none read."""
    return merge_models(None, config.models).scaled
