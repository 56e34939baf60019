"""The routing table: which ready Triton replicas serve each model, and which Triton
metrics endpoints exist. A pure, immutable value with no I/O.

Built by the daemon's act step from its snapshot each tick (a replica leaves `routes`
before it is drained, but keeps its metrics target until its job ends, so the daemon and
Prometheus still see its pending requests fall to zero); rendered by
`bridge.routing.nginx` and `bridge.routing.http_sd`; published by
`bridge.routing.publisher`. Construction validates every name that will reach nginx's
configuration, so an invalid table cannot exist. The table also carries the batch route's
gate (`BatchGate`, `[batch]`): whether batch inference may use the replicas this pass.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bridge.routing.errors import InvalidRoute

MODEL_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""Triton model names: letters, digits, `_`, `-`, `.`; not starting with `.` or `-`
(no `..` path games, no option-looking names), at most 128 characters. Nothing here can
close an nginx string, block or directive."""

_HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
BASELINE = "baseline"
"""The `lease` of a metrics target that belongs to a baseline replica (no lease)."""


def validate_model_name(name: str) -> str:
    """`name` if it is a valid Triton model name, else InvalidRoute naming it."""
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
        raise InvalidRoute(
            f"invalid model name {name!r}: Triton model names are 1-128 letters, digits, "
            "'_', '-' or '.', not starting with '.' or '-'"
        )
    return name


def validate_endpoint(endpoint: str) -> str:
    """`endpoint` if it is `host:port` (IPv4, host name or [IPv6]; port 1-65535)."""
    host, sep, port = endpoint.rpartition(":") if isinstance(endpoint, str) else ("", "", "")
    if (
        not sep
        or not _HOST_RE.fullmatch(host)
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
        or port != str(int(port))
    ):
        raise InvalidRoute(f"invalid endpoint {endpoint!r}: expected host:port, port 1-65535")
    return endpoint


@dataclass(frozen=True)
class MetricsTarget:
    """One Triton metrics endpoint and what Prometheus should know about it."""

    endpoint: str
    """host:port of Triton's metrics page (8002, or its slot's: `bridge.triton.ports`)."""
    node: str
    """Slurm node name the Triton job runs on."""
    slurm_job_id: str
    """The Triton job's Slurm id."""
    lease: str
    """The lease id that lent the node, or BASELINE for a replica on a reserved node."""
    models: tuple[str, ...]
    """Models loaded on this replica (sorted, no duplicates)."""

    def __post_init__(self) -> None:
        validate_endpoint(self.endpoint)
        for name, value in (("node", self.node), ("slurm_job_id", self.slurm_job_id)):
            if not value:
                raise InvalidRoute(f"metrics target {self.endpoint}: empty {name}")
        if not self.lease:
            raise InvalidRoute(f"metrics target {self.endpoint}: empty lease (use 'baseline')")
        models = tuple(sorted({validate_model_name(m) for m in self.models}))
        object.__setattr__(self, "models", models)


@dataclass(frozen=True)
class Split:
    """A model's unversioned inference requests split between two of its versions during
    a rollout: `percent` of them to `new`, the rest to `old` (0: all to `old`, 100: all to
    `new`). Requests that name a version are never split."""

    model: str
    old: int
    new: int
    percent: float

    def __post_init__(self) -> None:
        validate_model_name(self.model)
        for v in (self.old, self.new):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRoute(f"split of {self.model}: version {v!r} is no positive integer")
        if self.old == self.new:
            raise InvalidRoute(f"split of {self.model}: old and new are both version {self.old}")
        if not 0 <= self.percent <= 100:
            raise InvalidRoute(f"split of {self.model}: {self.percent!r}% is not within 0-100")


@dataclass(frozen=True)
class BatchGate:
    """The batch route's gate (`/batch/v2/models/<model>/...`: batch inference's requests
    to the same replicas as online ones, `bridge.routing.nginx`): open, the route proxies
    them; closed, nginx answers each 429 with `Retry-After: retry_after_s` and says the
    route is closed for online load. Decided each pass by `bridge.policy.batch`."""

    open: bool
    retry_after_s: int = 30
    """What a closed gate tells clients to wait (seconds) before they try again."""

    def __post_init__(self) -> None:
        if not isinstance(self.open, bool):
            raise InvalidRoute(f"batch gate: open must be true or false: {self.open!r}")
        r = self.retry_after_s
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 86400:
            raise InvalidRoute(f"batch gate: retry_after_s must be 1-86400 seconds: {r!r}")


@dataclass(frozen=True)
class RoutingTable:
    """model -> sorted tuple of ready endpoints, plus the metrics targets.

    Use `RoutingTable.build(...)`; fields are stored sorted, so two tables with the same
    content are equal and have the same `version` whatever order they were built in. A
    model with an empty tuple is known but has no ready replica (nginx answers 503, or,
    for a model of `zero`, sends its requests to the activator, which holds them while a
    replica starts).
    """

    routes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    targets: tuple[MetricsTarget, ...] = ()
    #: rollouts' traffic splits, one per model at most
    splits: tuple[Split, ...] = ()
    #: the models served from zero (`min_replicas` 0): with no ready replica their
    #: requests go to the activator
    zero: tuple[str, ...] = ()
    #: the batch route's gate; None: no batch route (batch paths answer 404)
    batch: BatchGate | None = None
    #: per model, the weight of each of its endpoints (a replica's GPUs: its
    #: executions), nginx's `weight=` in the model's upstream, so that `least_conn`
    #: counts a replica's requests in flight per unit of what it serves
    #: (`bridge.routing.nginx`); model -> ((endpoint, weight), ...), sorted, each weight
    #: over the model's greatest common divisor; a model whose replicas are alike has
    #: none
    weights: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()

    def __post_init__(self) -> None:
        routes = tuple(
            sorted(
                (validate_model_name(model), tuple(sorted({validate_endpoint(e) for e in eps})))
                for model, eps in self.routes
            )
        )
        names = [m for m, _ in routes]
        if len(set(names)) != len(names):
            raise InvalidRoute(f"a model appears twice in the routes: {names}")
        targets = tuple(sorted(self.targets, key=lambda t: t.endpoint))
        endpoints = [t.endpoint for t in targets]
        if len(set(endpoints)) != len(endpoints):
            raise InvalidRoute(f"a metrics endpoint appears twice: {endpoints}")
        splits = tuple(sorted(self.splits, key=lambda sp: sp.model))
        split_models = [sp.model for sp in splits]
        if len(set(split_models)) != len(split_models):
            raise InvalidRoute(f"a model is split twice: {split_models}")
        object.__setattr__(self, "routes", routes)
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "splits", splits)
        zero = tuple(sorted({validate_model_name(m) for m in self.zero}))
        object.__setattr__(self, "zero", zero)
        weights = []
        for model, pairs in self.weights:
            validate_model_name(model)
            of_model: dict[str, int] = {}
            for endpoint, weight in pairs:
                validate_endpoint(endpoint)
                if (
                    isinstance(weight, bool)
                    or not isinstance(weight, int)
                    or not 1 <= weight <= 1000
                ):
                    raise InvalidRoute(
                        f"weight of {endpoint} for {model}: must be an integer 1-1000: {weight!r}"
                    )
                of_model[endpoint] = weight
            # each over their greatest common divisor; replicas alike need none
            common = math.gcd(*of_model.values()) if of_model else 1
            kept = tuple(sorted((e, w // common) for e, w in of_model.items()))
            if len({w for _, w in kept}) > 1:
                weights.append((model, kept))
        object.__setattr__(self, "weights", tuple(sorted(weights)))

    @classmethod
    def build(
        cls,
        routes: Mapping[str, Iterable[str]],
        targets: Iterable[MetricsTarget] = (),
        splits: Iterable[Split] = (),
        zero: Iterable[str] = (),
        batch: BatchGate | None = None,
        weights: Mapping[str, Mapping[str, int]] | None = None,
    ) -> RoutingTable:
        return cls(
            tuple((m, tuple(eps)) for m, eps in routes.items()),
            tuple(targets),
            tuple(splits),
            tuple(zero),
            batch,
            tuple((m, tuple(w.items())) for m, w in (weights or {}).items()),
        )

    def weight(self, model: str, endpoint: str) -> int:
        """`endpoint`'s weight in `model`'s upstream (1 where the table gives it none)."""
        for m, pairs in self.weights:
            if m == model:
                return dict(pairs).get(endpoint, 1)
        return 1

    def split_of(self, model: str) -> Split | None:
        return next((sp for sp in self.splits if sp.model == model), None)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m for m, _ in self.routes)

    def endpoints(self, model: str) -> tuple[str, ...]:
        """Ready endpoints of `model`; () when it has none or is unknown."""
        return dict(self.routes).get(model, ())

    def all_endpoints(self) -> tuple[str, ...]:
        """Every routed endpoint, once, sorted (the replicas health checks may reach)."""
        return tuple(sorted({e for _, eps in self.routes for e in eps}))

    def without_endpoint(self, endpoint: str) -> RoutingTable:
        """This table with `endpoint` removed from every model's routes (the first step of
        a return); metrics targets are kept."""
        routes = tuple((m, tuple(e for e in eps if e != endpoint)) for m, eps in self.routes)
        weights = tuple(
            (m, tuple((e, w) for e, w in pairs if e != endpoint)) for m, pairs in self.weights
        )
        return RoutingTable(routes, self.targets, self.splits, self.zero, self.batch, weights)

    def canonical(self) -> str:
        """A canonical JSON text of the content (sorted keys, no whitespace)."""
        return json.dumps(
            {
                "routes": {m: list(eps) for m, eps in self.routes},
                "targets": [
                    {
                        "endpoint": t.endpoint,
                        "node": t.node,
                        "slurm_job_id": t.slurm_job_id,
                        "lease": t.lease,
                        "models": list(t.models),
                    }
                    for t in self.targets
                ],
                **(
                    {"splits": {sp.model: [sp.old, sp.new, sp.percent] for sp in self.splits}}
                    if self.splits
                    else {}
                ),
                **({"zero": list(self.zero)} if self.zero else {}),
                **(
                    {"weights": {m: dict(pairs) for m, pairs in self.weights}}
                    if self.weights
                    else {}
                ),
                **(
                    {"batch": [self.batch.open, self.batch.retry_after_s]}
                    if self.batch is not None
                    else {}
                ),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @property
    def version(self) -> str:
        """A stable content hash (16 hex digits of SHA-256 of `canonical()`): equal
        tables have equal versions, across processes and runs."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:16]
