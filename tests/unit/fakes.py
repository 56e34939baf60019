"""In-memory fakes of Slurm, Triton and routing for unit tests of the control loop's logic
(`bridge.daemon.reconciler`, `bridge.daemon.service`).

They implement the `SlurmProtocol` and `TritonInstance` methods the daemon calls, record
every call (with the calling thread) and raise the adapters' own typed errors on demand.
They are fast aids for the loop's logic only: the adapters themselves are proven against
the lab's real Slurm and Triton (tests/lab).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Unpack

from bridge.config import BridgeConfig, LeaseConfig, ModelConfig, TritonJobConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.routing.table import RoutingTable
from bridge.slurm.model import (
    BASELINE_TAG,
    TRITON_TAG,
    AccountingRecord,
    Job,
    JobFilter,
    JobSpec,
    Node,
    Reservation,
    ReservationSpec,
    SlurmEvent,
)
from bridge.slurm.squeue import filter_jobs
from bridge.triton.errors import TritonRejected, TritonUnreachable
from bridge.triton.ports import HTTP_PORT
from bridge.triton.protocol import RepositoryModel, ServerMetadata

#: Slurm's writes (what a tick must not do on a stale view)
SLURM_WRITES = frozenset(
    {
        "submit",
        "cancel",
        "requeue",
        "drain",
        "resume",
        "create_reservation",
        "delete_reservation",
    }
)

T0 = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """T0 plus `seconds`: the injected clock of the reconciler tests."""
    return T0 + timedelta(seconds=seconds)


def make_node(
    name: str,
    partitions: tuple[str, ...],
    *,
    addr: str | None = None,
    state: str = "idle",
    flags: Iterable[str] = (),
    reason: str = "",
    gpus: int = 4,
) -> Node:
    addr = addr or f"10.0.0.{name.lstrip('n')}"
    return Node(name, addr, partitions, state, frozenset(flags), reason, "a100", gpus, 0)


# ---- Slurm ----------------------------------------------------------------------------


@dataclass
class _Failure:
    exc: BaseException
    #: calls left that raise (None: every call until cleared)
    times: int | None


class FakeSlurm:
    """Nodes, jobs and reservations in memory. `submit` assigns ids (100, 101, ...) and
    starts the job at once (`start_state`); `cancel` removes it (unless
    `cancel_removes` is False: a job that ignores the cancel). `fail(op, exc)` makes the
    named operation raise (e.g. `ControllerUnreachable`, `CommandRejected`)."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        jobs: Iterable[Job] = (),
        reservations: Iterable[str] = (),
    ) -> None:
        self.nodes_: dict[str, Node] = {n.name: n for n in nodes}
        self.jobs_: dict[str, Job] = {j.job_id: j for j in jobs}
        self.reservations_: dict[str, Reservation] = {
            name: Reservation(name, (), None, None, frozenset(), ("root",), "ACTIVE")
            for name in reservations
        }
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.specs: list[JobSpec] = []
        self.threads: set[int] = set()
        self.start_state = "RUNNING"
        self.cancel_removes = True
        self._next_id = 100
        self._failures: dict[str, _Failure] = {}
        self._lock = threading.Lock()

    # ---- test controls ----------------------------------------------------------

    def fail(self, op: str, exc: BaseException, times: int | None = None) -> None:
        self._failures[op] = _Failure(exc, times)

    def heal(self, op: str | None = None) -> None:
        if op is None:
            self._failures.clear()
        else:
            self._failures.pop(op, None)

    def ops(self, name: str) -> list[tuple[Any, ...]]:
        return [args for op, args in self.calls if op == name]

    @property
    def writes(self) -> list[tuple[str, tuple[Any, ...]]]:
        return [(op, args) for op, args in self.calls if op in SLURM_WRITES]

    def set_job(self, job_id: str, **changes: Any) -> None:
        self.jobs_[job_id] = replace(self.jobs_[job_id], **changes)

    def end_job(self, job_id: str) -> None:
        self.jobs_.pop(job_id, None)

    def add_job(self, job: Job) -> None:
        self.jobs_[job.job_id] = job

    def remove_node(self, name: str) -> None:
        self.nodes_.pop(name, None)

    def _enter(self, op: str, *args: Any) -> None:
        with self._lock:
            self.threads.add(threading.get_ident())
            self.calls.append((op, args))
            failure = self._failures.get(op)
            if failure is None:
                return
            if failure.times is not None:
                failure.times -= 1
                if failure.times <= 0:
                    del self._failures[op]
            raise failure.exc

    # ---- SlurmProtocol (what the daemon calls) ----------------------------------

    def version(self) -> str:
        self._enter("version")
        return "22.05.8"

    def nodes(self) -> list[Node]:
        self._enter("nodes")
        return list(self.nodes_.values())

    def jobs(self, **filters: Unpack[JobFilter]) -> list[Job]:
        self._enter("jobs")
        return filter_jobs(list(self.jobs_.values()), **filters)

    def reservations(self) -> list[Reservation]:
        self._enter("reservations")
        return list(self.reservations_.values())

    def submit(self, spec: JobSpec) -> str:
        self._enter("submit", spec)
        with self._lock:
            job_id = str(self._next_id)
            self._next_id += 1
            self.specs.append(spec)
        running = self.start_state == "RUNNING"
        self.jobs_[job_id] = Job(
            job_id,
            spec.name or "",
            spec.partition,
            spec.account,
            "root",
            self.start_state,
            "None" if running else "Resources",
            spec.nodelist if running else (),
            spec.comment or "",
            spec.gpus_per_node or 1,
            0,
            None,
            None,
            requested_nodes=spec.nodelist,
        )
        return job_id

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        self._enter("cancel", job_id)
        if self.cancel_removes and signal is None:
            self.jobs_.pop(job_id, None)

    def requeue(self, job_id: str) -> None:
        self._enter("requeue", job_id)

    def drain(self, node: str, reason: str) -> None:
        self._enter("drain", node, reason)
        n = self.nodes_[node]
        self.nodes_[node] = replace(n, flags=n.flags | {"DRAIN"}, reason=f"stb:{reason}")

    def resume(self, node: str) -> None:
        self._enter("resume", node)
        n = self.nodes_.get(node)
        if n is not None:
            self.nodes_[node] = replace(n, flags=n.flags - {"DRAIN"}, reason="")

    def create_reservation(self, spec: ReservationSpec) -> None:
        self._enter("create_reservation", spec.name, spec.nodes, spec.duration_s)
        self.reservations_[spec.name] = Reservation(
            spec.name, spec.nodes, None, None, frozenset(spec.flags), spec.users, "ACTIVE"
        )

    def delete_reservation(self, name: str) -> None:
        self._enter("delete_reservation", name)
        self.reservations_.pop(name, None)


# ---- Triton ---------------------------------------------------------------------------


@dataclass
class FakeServer:
    """What one Triton address answers. `unreachable`: every call raises
    `TritonUnreachable`; `reject[op]`: that call raises `TritonRejected` with the text."""

    address: str
    ready: bool = True
    #: model -> Triton state (READY, UNAVAILABLE, LOADING)
    models: dict[str, str] = field(default_factory=dict)
    #: model -> Triton's reason for an UNAVAILABLE model
    reasons: dict[str, str] = field(default_factory=dict)
    #: model -> requests in flight (the metrics page's pending gauge)
    pending: dict[str, float] = field(default_factory=dict)
    unreachable: bool = False
    reject: dict[str, str] = field(default_factory=dict)
    unloads: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    #: set: each load waits for it to be set (the model LOADING meanwhile, as Triton shows
    #: a load under way), then ends READY, or is refused if `reject["load"]` is set by then
    #: (UNAVAILABLE with that reason); None: loads end at once
    load_gate: threading.Event | None = None
    #: the models asked loaded, in order (a load asked twice is listed twice)
    loads: list[str] = field(default_factory=list)


class FakeTritonInstance:
    """A `TritonInstance` over a `FakeServer` (what `triton_for(address)` returns)."""

    def __init__(self, owner: FakeTriton, server: FakeServer) -> None:
        self._owner = owner
        self._server = server
        self.closed = False

    @property
    def address(self) -> str:
        return self._server.address

    def _enter(self, op: str) -> FakeServer:
        s = self._server
        with self._owner.lock:
            self._owner.threads.add(threading.get_ident())
            s.calls.append(op)
        if s.unreachable:
            raise TritonUnreachable(s.address, op, "connection refused")
        if op in s.reject:
            raise TritonRejected(s.address, op, s.reject[op], 400)
        return s

    def is_live(self) -> bool:
        self._enter("live")
        return True

    def is_ready(self) -> bool:
        return self._enter("ready").ready

    def server_metadata(self) -> ServerMetadata:
        self._enter("metadata")
        return ServerMetadata("triton", "2.51.0", ())

    def repository_index(self) -> tuple[RepositoryModel, ...]:
        s = self._enter("index")
        return tuple(
            RepositoryModel(name, "1", state, s.reasons.get(name, ""))
            for name, state in sorted(s.models.items())
        )

    def load_model(self, name: str) -> None:
        s = self._enter("load")
        with self._owner.lock:
            s.loads.append(name)
        gate = s.load_gate
        if gate is not None:
            s.models[name] = "LOADING"
            if not gate.wait(timeout=30):  # a test that forgot to set it: no hang
                raise TritonUnreachable(s.address, f"load {name!r}", "timed out")
            if "load" in s.reject:
                s.models[name] = "UNAVAILABLE"
                s.reasons[name] = s.reject["load"]
                raise TritonRejected(s.address, "load", s.reject["load"], 400)
        s.models[name] = "READY"

    def unload_model(self, name: str) -> None:
        s = self._enter("unload")
        s.unloads.append(name)
        s.models.pop(name, None)

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return self._enter("model_ready").models.get(name) == "READY"

    def model_statistics(self, name: str = "") -> tuple[Any, ...]:
        self._enter("statistics")
        return ()

    def metrics_text(self) -> str:
        s = self._enter("metrics")
        lines = ["# TYPE nv_inference_pending_request_count gauge"]
        for model, n in sorted(s.pending.items()):
            lines.append(f'nv_inference_pending_request_count{{model="{model}",version="1"}} {n}')
        return "\n".join(lines) + "\n"

    def infer(self, name: str, inputs: Mapping[str, Any], version: str = "") -> dict[str, Any]:
        self._enter("infer")
        return {}

    def close(self) -> None:
        self.closed = True


class FakeTriton:
    """The daemon's `triton_for`: address -> a client of that address's `FakeServer`. An
    address with no server configured is unreachable (nothing listening)."""

    def __init__(self) -> None:
        self.servers: dict[str, FakeServer] = {}
        self.forgotten: list[str] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def server(self, address: str, **settings: Any) -> FakeServer:
        s = self.servers.get(address)
        if s is None:
            s = self.servers[address] = FakeServer(address)
        for name, value in settings.items():
            setattr(s, name, value)
        return s

    def __call__(self, address: str) -> FakeTritonInstance:
        server = self.servers.get(address) or FakeServer(address, unreachable=True)
        return FakeTritonInstance(self, server)

    def forget(self, address: str) -> None:
        self.forgotten.append(address)


def address_of(node: Node) -> str:
    return f"{node.addr}:{HTTP_PORT}"


# ---- routing --------------------------------------------------------------------------


class FakeRouter:
    """Records each published table; `fail_with` makes every publish raise it."""

    def __init__(self) -> None:
        self.tables: list[RoutingTable] = []
        self.fail_with: BaseException | None = None

    def publish(self, table: RoutingTable) -> object:
        if self.fail_with is not None:
            raise self.fail_with
        self.tables.append(table)
        return table

    def endpoints(self, model: str) -> tuple[str, ...]:
        """The last published table's endpoints of `model`."""
        return dict(self.tables[-1].routes).get(model, ())


# ---- a small cluster ------------------------------------------------------------------

#: n1 is a reserved inference node (it runs the baseline), n3 an elastic node (preempt),
#: n5 a training node (drain)
N1 = make_node("n1", ("infer",))
N3 = make_node("n3", ("elastic", "infer"))
N5 = make_node("n5", ("train",))
BASELINE_JOB = Job(
    "10",
    "stb-triton-baseline",
    "infer",
    "bridge",
    "root",
    "RUNNING",
    "None",
    ("n1",),
    f"{TRITON_TAG},{BASELINE_TAG}",
    1,
    0,
    None,
    None,
)


@dataclass
class Harness:
    """A reconciler on the fakes and a real lease store (SQLite file under tmp_path)."""

    config: BridgeConfig
    slurm: FakeSlurm
    triton: FakeTriton
    router: FakeRouter
    store: LeaseStore
    requests: RequestQueue
    metrics: BridgeMetrics
    reconciler: Reconciler
    db_path: Path

    def tick(self, seconds: float) -> Any:
        return self.reconciler.run_once(at(seconds))

    def lease(self, lease_id: int = 1) -> Any:
        return self.store.get(lease_id)

    def restarted(self) -> Reconciler:
        """A new reconciler on the same store, fakes and router: the daemon restarted (it
        remembers nothing but what the store and the world say)."""
        return Reconciler(
            self.config,
            self.slurm,
            self.store,
            Observer(self.slurm, self.config, self.triton),
            self.triton,
            self.router,
            self.metrics,
            self.requests,
            self.triton.forget,
        )


def make_config(
    tmp_path: Path,
    *,
    tick_s: float = 5,
    models: dict[str, ModelConfig] | None = None,
    **leases: float,
) -> BridgeConfig:
    key = tmp_path / "triton.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")  # the key shim's place (never loaded here)
    return BridgeConfig(
        tick_s=tick_s,
        database_url=f"sqlite:///{tmp_path / 'db' / 'bridge.db'}",
        models=models or {"busy": ModelConfig(slo_p99_ms=100), "calm": ModelConfig(slo_p99_ms=200)},
        # no model repository: the models are the TOML's alone (not the checkout's)
        triton=TritonJobConfig(key_file=key, model_repository=tmp_path / "no-repository"),
        leases=LeaseConfig(**leases),
    )


def make_harness(
    tmp_path: Path,
    *,
    tick_s: float = 5,
    models: dict[str, ModelConfig] | None = None,
    **leases: float,
) -> Harness:
    config = make_config(tmp_path, tick_s=tick_s, models=models, **leases)
    engine = make_engine(config.database_url)
    create_schema(engine)
    slurm = FakeSlurm([N1, N3, N5], [BASELINE_JOB])
    triton = FakeTriton()
    triton.server(address_of(N1), models={"busy": "READY", "calm": "READY"})
    router = FakeRouter()
    store = LeaseStore(engine)
    requests = RequestQueue(engine)
    metrics = BridgeMetrics(clock=lambda: 1_000.0)
    reconciler = Reconciler(
        config,
        slurm,
        store,
        Observer(slurm, config, triton),
        triton,
        router,
        metrics,
        requests,
        triton.forget,
    )
    return Harness(
        config,
        slurm,
        triton,
        router,
        store,
        requests,
        metrics,
        reconciler,
        tmp_path / "db" / "bridge.db",
    )


class EventSlurm:
    """The reads `ingest_window` makes: nodes, sacct, slurmdbd's events."""

    def __init__(
        self, nodes: list[Node], records: list[AccountingRecord], events: list[SlurmEvent]
    ) -> None:
        self._nodes, self._records, self._events = nodes, records, events

    def nodes(self) -> list[Node]:
        return self._nodes

    def cluster_name(self) -> str:
        return "stblab"

    def accounting(self, since: datetime, until: datetime) -> list[AccountingRecord]:
        return [
            r for r in self._records
            if r.start and r.start < until and (r.end is None or r.end > since)
        ]  # fmt: skip

    def events(self, since: datetime, until: datetime) -> list[SlurmEvent]:
        return self._events
