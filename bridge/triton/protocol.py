"""What the daemon needs from one Triton Inference Server instance: a narrow Protocol.

Implemented by `bridge.triton.client.TritonHttpClient`; the daemon's observe step (health,
metrics page), the act step (model load and unload), the reconciler (repository index,
readiness) and accounting (per-model statistics) call it. Tests may satisfy it with a fake
for pure logic only; the real implementation is proven against the lab's Triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy.typing as npt

#: a tensor as the inference API takes and returns it
Array = npt.NDArray[Any]


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """`GET /v2`: the server's name, version (e.g. "2.51.0") and protocol extensions."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RepositoryModel:
    """One entry of the repository index. `version` and `state` are "" when Triton omits
    them (a model it has never loaded); `state` is Triton's word (READY, UNLOADING,
    UNAVAILABLE, LOADING); `reason` explains an UNAVAILABLE model."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """Cumulative per-(model, version) statistics since the model was loaded.

    Counts are requests (`success_count`, `failure_count`), inferences (`inference_count`,
    batched requests count once per item) and executions (`execution_count`). Durations are
    cumulative nanoseconds, as Triton reports them. `last_inference_ms` is unix ms (0: never).
    Accounting splits a serving job's GPU-hours among models by compute time.
    """

    name: str
    version: str
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success_count: int
    success_ns: int
    failure_count: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int

    @property
    def compute_ns(self) -> int:
        return self.compute_input_ns + self.compute_infer_ns + self.compute_output_ns


@runtime_checkable
class TritonInstance(Protocol):
    """One Triton server, addressed by `address` ("host:port" of its HTTP endpoint).

    Contract:
    - Every call is synchronous and bounded by the implementation's timeouts. Failures
      surface as one of two errors: `TritonUnreachable` (transient: no answer, connection
      refused or reset, timeout, 502/503/504; the caller retries on a later tick) or
      `TritonRejected` (permanent: the server answered and refused; its message is quoted;
      retrying the same call gets the same answer, so the caller stops and alerts).
    - Probes (`is_live`, `is_ready`, `is_model_ready`) answer False when the server answers
      "no"; they raise `TritonUnreachable` when it does not answer, so "starting" and
      "not ready" stay distinguishable.
    - `load_model` and `unload_model` are idempotent on the end state: loading a loaded,
      unchanged model and unloading an unloaded or unknown model both succeed, so a retry
      after a crash or a `TritonUnreachable` is harmless. They need the restricted-API key;
      without it, or with a wrong one, they raise `TritonRejected` (HTTP 403).
    - `load_model` returns when the model is loaded (Triton answers after loading);
      `unload_model` returns when Triton has accepted the unload: the model stays ready
      until its in-flight requests finish, so callers that need it gone poll
      `is_model_ready`.
    - Reads have no side effects. Counters (`model_statistics`, the metrics page) are
      cumulative since the model was loaded: they restart from zero when the server restarts
      or the model is reloaded; the signal code handles that, callers need not.
    - `metrics_text` returns the Prometheus page as Triton served it, unparsed; a page that
      does not parse is the parser's business (it yields "no data").
    - An instance object is used by one thread at a time.
    """

    @property
    def address(self) -> str: ...

    def is_live(self) -> bool: ...

    def is_ready(self) -> bool: ...

    def server_metadata(self) -> ServerMetadata: ...

    def repository_index(self) -> tuple[RepositoryModel, ...]: ...

    def load_model(self, name: str) -> None: ...

    def unload_model(self, name: str) -> None: ...

    def is_model_ready(self, name: str, version: str = "") -> bool: ...

    def model_statistics(self, name: str = "") -> tuple[ModelStatistics, ...]: ...

    def metrics_text(self) -> str: ...

    def infer(self, name: str, inputs: Mapping[str, Array], version: str = "") -> dict[str, Array]:
        """One inference; returns every output by name."""
        ...

    def close(self) -> None: ...
