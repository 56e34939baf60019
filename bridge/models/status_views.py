"""The parts of a model's status (`bridge.models.status.gather` fills them): its facts,
each version with its live figures and its last hour, the rollouts, the servers, the
replicas, the cost and the weight cache (`bridge.weights.view.CacheView`), and
`ModelStatus.to_json`, the JSON `stb models status --json` and `GET /api/models/status`
give. Plain frozen values, no I/O; the notes said beside the
figures are here so that the table (`bridge.models.status_render`) and the JSON say the
same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from bridge.weights.view import CacheView

#: said beside the live figures, in the table and the JSON
LIVE_NOTE = (
    "live figures are Triton's own: requests since each version was loaded (summed over "
    "the servers) and its p99 over the last 60 s (the highest of the servers); the "
    "daemon's ledger keeps the longer history"
)
#: said beside the last hour's figures, in the table and the JSON
LAST_HOUR_P99_NOTE = (
    "last-hour p99 is the highest of Triton's 60 s p99 windows over the hour (and over the "
    "servers): an upper bound of the hour's p99, not the hour's p99 itself"
)
#: said beside an LLM's live token figures, in the table and the JSON
TOKEN_LIVE_NOTE = (
    "token figures since start are the vLLM-backend histograms and counters on the servers' "
    "pages: cumulative since each server loaded the version (summed over the servers), so "
    "their p99s are since start, not a recent window"
)
#: the note where the bridge's configuration names no Prometheus server
NO_PROMETHEUS = "no Prometheus configured"


@dataclass(frozen=True)
class Facts:
    """What the daemon scales the model by (None: not set; `why` says why not scaled)."""

    team: str | None
    slo_p99_ms: float | None
    min_replicas: int | None
    max_replicas: int | None
    #: field -> where its value came from (repository, toml, default)
    sources: Mapping[str, str]
    scaled: bool
    why: str = ""
    problems: tuple[str, ...] = ()
    #: an LLM's token objectives (ms; None: not set)
    slo_ttft_p99_ms: float | None = None
    slo_tpot_p99_ms: float | None = None


@dataclass(frozen=True)
class Tokens:
    """An LLM version's token figures: TTFT and TPOT p99 (ms) against its token SLOs,
    prompt and output tokens, and (over a window: the last hour) tokens/s. Live: since
    each server loaded it (`TOKEN_LIVE_NOTE`); rates None there."""

    requests: float | None
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    prompt_tokens: float | None
    output_tokens: float | None
    ttft_breach: bool = False
    tpot_breach: bool = False
    prompt_tps: float | None = None
    output_tps: float | None = None


@dataclass(frozen=True)
class Live:
    """One version's figures from the servers' metrics pages (None: no server said)."""

    succeeded: int | None
    failed: int | None
    failure_rate: float | None
    p99_ms: float | None
    #: p99 over the model's SLO
    breach: bool


@dataclass(frozen=True)
class LastHour:
    """One version's last hour from Prometheus, summed over the servers (None: no series).
    Counts are `increase` over the hour: extrapolated, so not always whole numbers."""

    #: successes and failures
    requests: float | None
    succeeded: float | None
    failures: float | None
    failure_rate: float | None
    #: the highest of Triton's 60 s p99 windows in the hour: an upper bound of its p99
    p99_ms: float | None
    #: p99 over the model's SLO
    breach: bool


@dataclass(frozen=True)
class VersionView:
    version: int
    #: serving, canary, pending, promoting, rolling_back, old, rolled_back, superseded,
    #: retired or gone (published once, in neither the repository nor its archive)
    state: str
    #: the state in words: "canary at 10%", "rolled back: p99 over the SLO", ...
    label: str
    #: the canary's share of the model's requests (state canary only)
    percent: float | None = None
    #: why it was rolled back (state rolled_back)
    why: str = ""
    #: its last publish in the journal
    published_at: datetime | None = None
    published_by: str = ""
    #: the servers where it is READY
    served_on: tuple[str, ...] = ()
    live: Live | None = None
    #: its last hour from Prometheus (None: none; `ModelStatus.last_hour_note` says why)
    last_hour: LastHour | None = None
    #: an LLM's token figures since start (servers' pages) and over the last hour
    tokens: Tokens | None = None
    tokens_hour: Tokens | None = None


@dataclass(frozen=True)
class RolloutView:
    id: int
    state: str
    old_version: int
    new_version: int
    #: the step in progress (or last reached), counted from 1, of `steps`
    step: int
    steps: int | None
    #: that step's share of the model's requests to the new version
    percent: float | None
    #: when the step began (or the rollout, before its first step)
    since: datetime
    updated_at: datetime
    #: why it is where it is (the last verdict that moved it)
    reason: str
    who: str
    why: str
    #: the figures the last verdict judged ({} when none)
    figures: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerView:
    address: str
    reachable: bool
    #: the model's versions READY there
    versions: tuple[int, ...] = ()
    #: the model READY there (a version Triton does not number counts too)
    holds: bool = False
    error: str = ""
    #: why its metrics page gave no figures ("" when it did)
    metrics_error: str = ""


@dataclass(frozen=True)
class Replicas:
    #: servers holding the model READY (None: the servers are unknown)
    now: int | None
    #: of them, open leases in state serving that carry the model
    lent: int
    #: leases carrying the model created since UTC midnight
    lends_today: int
    note: str = ""


@dataclass(frozen=True)
class Cost:
    """The model's GPU-hours and cost from the ledger (cost None: no rates)."""

    ledger: bool
    month: str
    today: str
    month_gpu_hours: float = 0.0
    today_gpu_hours: float = 0.0
    currency: str | None = None
    month_cost: Decimal | None = None
    today_cost: Decimal | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelStatus:
    model: str
    at: datetime
    facts: Facts | None
    versions: tuple[VersionView, ...]
    #: the open rollout, and the last one that ended
    rollout: RolloutView | None
    last_rollout: RolloutView | None
    #: None: the servers are unknown (`servers_note` says why)
    servers: tuple[ServerView, ...] | None
    replicas: Replicas
    cost: Cost
    servers_note: str = ""
    notes: tuple[str, ...] = ()
    #: where the versions' `last_hour` came from ("prometheus <url>, 1h window"), or why not
    last_hour_note: str = NO_PROMETHEUS
    #: the node-local weight cache: per version, the nodes with a complete copy and the
    #: staging jobs in flight (`bridge.weights.view`)
    weights: CacheView = field(default_factory=CacheView)

    def to_json(self) -> dict[str, Any]:
        doc = _plain(self)
        assert isinstance(doc, dict)
        doc["weights"] = self.weights.to_json()
        doc["live_note"] = LIVE_NOTE
        doc["last_hour_p99_note"] = LAST_HOUR_P99_NOTE
        if any(v.tokens is not None or v.tokens_hour is not None for v in self.versions):
            doc["token_live_note"] = TOKEN_LIVE_NOTE
        return doc


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
