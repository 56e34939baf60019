"""Gradual rollouts without the lab: the persisted rollout (a real SQLite database), the
routing split (the rendered nginx text), and the daemon's driver carrying rollouts to
promotion and to rollback over a real model repository in tmp_path, with a small fake of
Triton that serves the versions the repository's config names (the lab test,
tests/lab/test_rollout_lab.py, proves the same on real Slurm, Triton and nginx)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Session

from bridge.config import BridgeConfig
from bridge.daemon.actuator import _serves_split
from bridge.daemon.observation import Observation, TritonServer
from bridge.daemon.observe import unloading_only
from bridge.daemon.report import TickReport
from bridge.daemon.rollouts import RolloutDriver, share
from bridge.leases.rollouts import Rollout, RolloutError, RolloutStore
from bridge.leases.store import create_schema, make_engine
from bridge.models import checks, history, rollout
from bridge.models.publish import PublishError
from bridge.models.repo import ModelRepository
from bridge.paths import project_root
from bridge.routing.errors import InvalidRoute
from bridge.routing.nginx import render
from bridge.routing.table import RoutingTable, Split
from bridge.triton.protocol import RepositoryModel, ServerMetadata
from bridge.triton.repository import parse_config
from tests.unit.planner_literals import job

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> RolloutStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    return RolloutStore(engine)


# ---- the store ----------------------------------------------------------------------


def test_one_open_rollout_per_model_and_only_the_lifecycle_moves(store: RolloutStore) -> None:
    row = store.start("busy", 1, 2, "10%,50%", 60, T0, who="alice", why="faster")
    assert (row.state, row.step, row.step_started_at) == ("pending", 0, None)
    with pytest.raises(RolloutError, match="busy has a rollout open"):
        store.start("busy", 2, 3, "10%", 60, T0)
    store.start("echo", 1, 2, "10%", 60, T0)  # another model: its own rollout
    assert row.id is not None
    with pytest.raises(RolloutError, match="pending -> promoted"):
        store.move(row.id, "promoted", T0, "too soon")
    moved = store.move(row.id, "running", T0 + timedelta(seconds=5), "loaded", step=0)
    assert moved.step_started_at == T0 + timedelta(seconds=5)
    same = store.move(row.id, "running", T0 + timedelta(seconds=9), "held", step=0)
    assert same.step_started_at == T0 + timedelta(seconds=5)  # the step's clock runs on
    nxt = store.move(row.id, "running", T0 + timedelta(seconds=70), "50%", step=1,
                     figures={"new": {"requests": 300}})  # fmt: skip
    assert (nxt.step, nxt.step_started_at) == (1, T0 + timedelta(seconds=70))
    store.move(row.id, "rolling_back", T0 + timedelta(seconds=80), "p99")
    store.move(row.id, "rolled_back", T0 + timedelta(seconds=81), "p99")
    events = store.events(row.id)
    assert [(e.from_state, e.to_state, e.step) for e in events] == [
        ("", "pending", 0), ("pending", "running", 0), ("running", "running", 0),
        ("running", "running", 1), ("running", "rolling_back", 1),
        ("rolling_back", "rolled_back", 1),
    ]  # fmt: skip
    assert events[3].figures == {"new": {"requests": 300}}
    assert store.start("busy", 1, 3, "10%", 60, T0).state == "pending"  # the last one ended
    assert [r.model for r in store.open_rollouts()] == ["echo", "busy"]
    with pytest.raises(RolloutError, match="must be above"):
        store.start("tiny", 2, 2, "10%", 60, T0)


def test_the_database_refuses_a_second_open_rollout_written_past_the_check(
    store: RolloutStore,
) -> None:
    store.start("busy", 1, 2, "10%", 60, T0)
    with pytest.raises(IntegrityError), Session(store._engine) as session:
        session.add(
            Rollout(
                model="busy",
                old_version=1,
                new_version=3,
                plan="10%",
                hold_s=60,
                state="running",
                created_at=T0,
                updated_at=T0,
            )
        )
        session.commit()


# ---- the split ----------------------------------------------------------------------


def test_the_split_rewrites_unversioned_infer_only() -> None:
    table = RoutingTable.build(
        {"busy": ["127.0.0.1:8000"], "echo": ["127.0.0.1:8000"], "idle": []},
        splits=[Split("busy", 1, 2, 12.5), Split("idle", 3, 4, 50)],
    )
    text = render(table)
    assert 'split_clients "${request_id}" $stb_split_0 {\n    12.5% 2;\n    * 1;\n}' in text
    assert (
        "location = /v2/models/busy/infer { rewrite ^ /v2/models/busy/versions/$stb_split_0/"
        "infer break; proxy_pass http://stb_busy; }"
    ) in text
    assert "/v2/models/echo/versions" not in text  # echo is not split
    assert "location = /v2/models/idle/infer" not in text  # no replica: the 503 answers
    assert "* 1;" in render(RoutingTable.build({"busy": ["127.0.0.1:8000"]},
                                               splits=[Split("busy", 1, 2, 0)]))  # fmt: skip
    all_new = render(RoutingTable.build({"busy": ["127.0.0.1:8000"]},
                                        splits=[Split("busy", 1, 2, 100)]))  # fmt: skip
    assert "* 2;" in all_new and "% 2;" not in all_new
    plain = RoutingTable.build({"busy": ["127.0.0.1:8000"]})
    assert "splits" not in plain.canonical()  # tables without a split hash as before
    assert table.version != RoutingTable.build(dict(table.routes)).version


@pytest.mark.parametrize(
    ("split", "why"),
    [
        (lambda: Split("busy", 1, 1, 10), "both version 1"),
        (lambda: Split("busy", 0, 2, 10), "no positive integer"),
        (lambda: Split("busy", 1, 2, 101), "not within 0-100"),
        (lambda: Split("bu sy", 1, 2, 10), "invalid model name"),
    ],
)
def test_a_bad_split_is_refused(split: Any, why: str) -> None:
    with pytest.raises(InvalidRoute, match=why):
        split()


def test_a_replica_takes_a_split_only_with_the_versions_it_sends() -> None:
    at = Split("busy", 1, 2, 10)
    assert _serves_split(("1", "2"), at) and not _serves_split(("1",), at)
    assert _serves_split(("1",), Split("busy", 1, 2, 0))
    assert _serves_split(("2",), Split("busy", 1, 2, 100))
    assert not _serves_split(("1",), Split("busy", 1, 2, 100))


def test_a_server_only_loading_or_unloading_a_version_still_serves() -> None:
    def idx(*states: str) -> list[RepositoryModel]:
        return [RepositoryModel("busy", str(i), s, "") for i, s in enumerate(states, 1)]

    assert unloading_only(idx("UNLOADING", "READY"))
    assert unloading_only(idx("LOADING", "READY"))  # a placement's load: minutes, for an LLM
    assert unloading_only(idx("LOADING", "READY", "UNLOADING"))
    assert not unloading_only(idx("UNLOADING"))
    assert not unloading_only(idx("LOADING"))  # its start: nothing to serve yet
    assert not unloading_only(idx("READY"))  # not ready, and not for a load
    assert not unloading_only(idx("READY", "UNAVAILABLE"))  # not ready for another reason
    # an unloaded version is listed UNAVAILABLE: the old version after a rollout's move
    assert unloading_only(idx("UNAVAILABLE", "READY", "UNLOADING"))
    assert unloading_only(idx("READY", "LOADING", "UNAVAILABLE"))


# ---- the driver ---------------------------------------------------------------------


@dataclass
class RepoTriton:
    """A Triton server over the repository: `load_model` serves the versions its config
    names (its `version_policy`, else the latest), as Triton does; the metrics page holds
    the counters the test sets per version."""

    repo: ModelRepository
    address: str = "127.0.0.1:8000"
    loaded: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: version -> (success, failure, p99 ms)
    figures: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    fail_infer_of: str = ""
    #: version -> what OUTPUT0 answers (default 0.0)
    answers: dict[str, float] = field(default_factory=dict)
    loads: int = 0

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("triton", "2.51.0", ())

    def repository_index(self) -> tuple[RepositoryModel, ...]:
        return tuple(
            RepositoryModel(m, v, "READY", "") for m, vs in self.loaded.items() for v in vs
        )

    def load_model(self, name: str) -> None:
        self.loads += 1
        cfg = parse_config(self.repo.config_text(name) or "", name)
        if cfg.HasField("version_policy") and cfg.version_policy.HasField("specific"):
            versions = tuple(str(v) for v in cfg.version_policy.specific.versions)
        else:
            versions = (str(self.repo.latest(name)),)
        self.loaded[name] = versions

    def unload_model(self, name: str) -> None:
        self.loaded.pop(name, None)

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return version in self.loaded.get(name, ())

    def model_statistics(self, name: str = "") -> tuple[Any, ...]:
        return ()

    def metrics_text(self) -> str:
        lines = []
        for v, (ok, bad, p99) in sorted(self.figures.items()):
            labels = f'model="busy",version="{v}"'
            lines += [
                f"nv_inference_request_success{{{labels}}} {ok}",
                f'nv_inference_request_failure{{{labels},reason="BACKEND"}} {bad}',
                f'nv_inference_request_summary_us{{{labels},quantile="0.99"}} {p99 * 1000}',
            ]
        return "\n".join(lines) + "\n"

    def infer(self, name: str, inputs: Mapping[str, Any], version: str = "") -> dict[str, Any]:
        if version == self.fail_infer_of:
            raise PublishError("broken")
        return {"OUTPUT0": np.array([self.answers.get(version, 0.0)], dtype=np.float32)}

    def close(self) -> None:
        pass


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    root = tmp_path / "models"
    shutil.copytree(project_root() / "triton_repo", root,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return ModelRepository(root)


def _obs(triton: RepoTriton) -> Observation:
    srv = TritonServer(
        job("100", on="n5"), "n5", triton.address, True, tuple(triton.loaded), {}, {},
        {m: vs for m, vs in triton.loaded.items()},
    )  # fmt: skip
    return Observation(T0.timestamp(), {}, (), frozenset(), (srv,), {})


def _drive(
    driver: RolloutDriver, triton: RepoTriton, at: datetime, routed: list[list[Split]]
) -> TickReport:
    report = TickReport(at)
    driver.tick(_obs(triton), lambda m: 100.0, at, report,
                lambda: routed.append(driver.splits()))  # fmt: skip
    return report


def _setup(
    tmp_path: Path,
    repo: ModelRepository,
    store: RolloutStore,
    plan: str,
    checks_file: Path | None = None,
) -> tuple[RolloutDriver, RepoTriton, Rollout]:
    triton = RepoTriton(repo)
    triton.load_model("busy")
    config = BridgeConfig().model_copy(
        update={"rollout": BridgeConfig().rollout.model_copy(update={"min_requests": 50})}
    )
    driver = RolloutDriver(config, store, lambda address: triton, repo)  # type: ignore[arg-type, return-value]
    src = tmp_path / "busy-next"
    shutil.copytree(repo.root / "busy", src, ignore=shutil.ignore_patterns("__pycache__"))
    row = rollout.start(
        repo, store, src, "busy", plan, 60, now=T0, who="alice", checks_file=checks_file
    )
    return driver, triton, row


def test_a_good_version_goes_through_every_step_and_is_promoted(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    driver, triton, row = _setup(tmp_path, repo, store, "10%:30s,50%:30s")
    assert repo.versions("busy") == [1, 2] and triton.loaded == {"busy": ("1",)}
    assert "specific: { versions: [1] }" in (repo.config_text("busy") or "")
    routed: list[list[Split]] = []
    at = T0 + timedelta(seconds=1)
    _drive(driver, triton, at, routed)  # pending: routed all to 1, then both loaded
    assert routed == [[Split("busy", 1, 2, 0.0)]] and triton.loaded["busy"] == ("1", "2")
    assert store.of_model("busy")[0].state == "pending"
    _drive(driver, triton, at, routed)  # seen holding both: the first step begins
    assert share(store.of_model("busy")[0]) == 10.0
    triton.figures = {"1": (1000, 0, 20.0), "2": (0, 0, 20.0)}
    for k, (new_ok, expect) in enumerate([(40, (0, "hold")), (120, (0, "hold"))]):
        triton.figures["2"] = (new_ok, 0, 21.0)
        _drive(driver, triton, at + timedelta(seconds=10 * (k + 1)), routed)
        assert store.of_model("busy")[0].step == expect[0]
        assert driver.last[row.id or 0].verdict == expect[1]  # too few, then the hold
    triton.figures["2"] = (160, 0, 21.0)
    _drive(driver, triton, at + timedelta(seconds=31), routed)
    assert (store.of_model("busy")[0].step, share(store.of_model("busy")[0])) == (1, 50.0)
    triton.figures = {"1": (1200, 0, 20.0), "2": (160, 0, 22.0)}  # from the advance
    _drive(driver, triton, at + timedelta(seconds=40), routed)
    assert driver.last[row.id or 0].why.startswith("0 of 50 requests")  # none since
    triton.figures = {"1": (2200, 0, 20.0), "2": (700, 0, 22.0)}
    _drive(driver, triton, at + timedelta(seconds=62), routed)
    assert share(store.of_model("busy")[0]) == 100.0
    triton.figures = {"1": (2200, 0, 20.0), "2": (800, 0, 22.0)}
    _drive(driver, triton, at + timedelta(seconds=64), routed)  # the last step: 100%
    last = store.of_model("busy")[0]
    assert last.state == "promoted" and last.reason.startswith("promoted: ")
    assert routed[-1] == [Split("busy", 1, 2, 100.0)]  # all to 2 before 1 unloaded
    assert triton.loaded["busy"] == ("2",)
    assert repo.config_text("busy") == repo.config_of("busy", 2)
    assert driver.splits() == []
    actions = [(e.action, e.version, e.serving) for e in history.read(repo.archive).entries]
    assert actions == [("canary", 2, 1), ("promote", 2, 2)]
    # each move in the audit trail once, written with it
    trail = [(e.action, e.detail.split(": ")[0]) for e in driver.audit.store.walk()]
    rid = row.id
    assert trail == [
        ("rollout.step", f"rollout {rid} pending -> running step 0"),
        ("rollout.step", f"rollout {rid} running -> running step 1"),
        ("rollout.step", f"rollout {rid} running -> running step 2"),
        ("rollout.promote", f"rollout {rid} running -> promoting"),
        ("rollout.end", f"rollout {rid} promoting -> promoted"),
    ]


def test_a_version_that_fails_more_is_rolled_back_and_the_old_serves_alone(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    driver, triton, _ = _setup(tmp_path, repo, store, "10%:5m")
    routed: list[list[Split]] = []
    _drive(driver, triton, T0, routed)
    _drive(driver, triton, T0, routed)
    triton.figures = {"1": (5000, 2, 20.0), "2": (0, 0, 20.0)}
    _drive(driver, triton, T0 + timedelta(seconds=5), routed)  # the baseline of the step
    triton.figures = {"1": (5900, 2, 20.0), "2": (90, 10, 20.0)}
    report = _drive(driver, triton, T0 + timedelta(seconds=10), routed)
    assert not report.errors
    last = store.of_model("busy")[0]
    assert last.state == "rolled_back" and last.step == 0
    assert last.reason.startswith("rolled back at 10%: fails 10.00% of 100 requests"), last.reason
    assert routed[-1] == [Split("busy", 1, 2, 0.0)]  # all to 1 before 2 unloaded
    assert triton.loaded["busy"] == ("1",) and repo.versions("busy") == [1]
    assert repo.config_text("busy") == repo.config_of("busy", 1)
    entry = history.read(repo.archive).entries[-1]
    assert (entry.action, entry.version, entry.serving) == ("rollback", 2, 1)
    assert "fails 10.00%" in entry.why


def test_a_new_version_that_does_not_answer_is_rolled_back_before_any_split(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    driver, triton, _ = _setup(tmp_path, repo, store, "10%")
    triton.fail_infer_of = "2"
    routed: list[list[Split]] = []
    report = _drive(driver, triton, T0, routed)
    assert not report.errors
    last = store.of_model("busy")[0]
    assert last.state == "rolled_back" and "did not load and answer" in last.reason
    assert all(sp.percent == 0.0 for splits in routed for sp in splits)
    assert triton.loaded["busy"] == ("1",) and repo.versions("busy") == [1]


def test_a_rollout_is_refused_with_nothing_written(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    src = tmp_path / "busy-next"
    shutil.copytree(repo.root / "busy", src, ignore=shutil.ignore_patterns("__pycache__"))
    before = repo.config_text("busy")
    with pytest.raises(PublishError, match="step 2 '5%': shares must rise"):
        rollout.start(repo, store, src, "busy", "10%,5%", 60)
    cfg = src / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\nversion_policy: { latest: { num_versions: 2 } }\n")
    with pytest.raises(PublishError, match="sets its own version_policy"):
        rollout.start(repo, store, src, "busy", "10%", 60)
    shutil.copytree(repo.root / "echo", tmp_path / "new", ignore=shutil.ignore_patterns("__*"))
    shutil.rmtree(repo.root / "echo")
    with pytest.raises(PublishError, match="no version serving"):
        rollout.start(repo, store, tmp_path / "new", "echo", "10%", 60)
    assert repo.versions("busy") == [1] and repo.config_text("busy") == before
    assert store.open_rollouts() == [] and history.read(repo.archive).entries == ()
    cfg.write_text(before or "")
    rollout.start(repo, store, src, "busy", "10%", 60)
    with pytest.raises(PublishError, match="has a rollout open"):
        rollout.start(repo, store, src, "busy", "10%", 60)
    assert repo.versions("busy") == [1, 2]


BUSY_CHECK = {"inputs": {"INPUT0": {"shape": [3], "data": [1, 2, 3]}}}


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ("{", "not JSON"),
        ({"requests": []}, "1 to 1000 requests, got 0"),
        ({"requests": [{"inputs": {}}]}, r"request 1: inputs \[\], the config declares"),
        ({"requests": [{"inputs": {"INPUT0": {"shape": [2], "data": [1, 2, 3]}}}]},
         "request 1 input INPUT0: shape \\[2\\] holds 2 values, data 3"),
        ({"requests": [BUSY_CHECK | {"outputs": {"OUT": {"data": [6]}}}]},
         "outputs must name some of the config's"),
        ({"rtol": -1, "requests": [BUSY_CHECK]}, "rtol must be a number >= 0"),
        ({"requests": [{"inputs": {"INPUT0": {"shape": [1], "data": ["x"]}}}]},
         "request 1 input INPUT0: could not convert"),
    ],
)  # fmt: skip
def test_bad_checks_are_refused_naming_the_request(doc: Any, why: str) -> None:
    cfg = parse_config((project_root() / "triton_repo/busy/config.pbtxt").read_text(), "busy")
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(PublishError, match=why):
        checks.load(text, cfg, "checks.json")


def test_recorded_requests_that_answer_otherwise_roll_the_version_back_before_any_split(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    doc = {"requests": [BUSY_CHECK | {"outputs": {"OUTPUT0": {"data": [6]}}}, BUSY_CHECK]}
    (tmp_path / "checks.json").write_text(json.dumps(doc))
    driver, triton, _ = _setup(tmp_path, repo, store, "10%", tmp_path / "checks.json")
    assert repo.checks_of("busy", 2) == json.dumps(doc)
    triton.answers = {"1": 6.0, "2": 6.0}  # both answer 6: the expected, and the old's
    routed: list[list[Split]] = []
    _drive(driver, triton, T0, routed)
    _drive(driver, triton, T0, routed)
    assert store.of_model("busy")[0].state == "running"

    store.move(store.of_model("busy")[0].id or 0, "rolling_back", T0, "test")
    _drive(driver, triton, T0, routed)
    src = tmp_path / "busy-next"
    triton.load_model("busy")
    row = rollout.start(repo, store, src, "busy", "10%", 60, checks_file=tmp_path / "checks.json")
    triton.answers = {"1": 6.0, "2": 6.5}
    _drive(driver, triton, T0, routed)
    last = store.of_model("busy")[0]
    assert last.id == row.id and last.state == "rolled_back", last
    assert "recorded request 1: OUTPUT0 differs by up to 0.5 from the expected" in last.reason
    assert all(sp.percent == 0.0 for splits in routed[-2:] for sp in splits)
    assert triton.loaded["busy"] == ("1",)


def test_without_expected_outputs_the_new_version_must_answer_as_the_old(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    (tmp_path / "checks.json").write_text(json.dumps({"requests": [BUSY_CHECK]}))
    driver, triton, _ = _setup(tmp_path, repo, store, "10%", tmp_path / "checks.json")
    triton.answers = {"1": 6.0, "2": 7.0}
    _drive(driver, triton, T0, [])
    last = store.of_model("busy")[0]
    assert last.state == "rolled_back"
    assert "OUTPUT0 differs by up to 1 from version 1's answer" in last.reason, last.reason


class _Unstorable(RolloutStore):
    def start(self, *args: Any, **kwargs: Any) -> Rollout:
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))


def test_a_rollout_the_database_will_not_store_leaves_the_repository_as_it_was(
    tmp_path: Path, repo: ModelRepository, store: RolloutStore
) -> None:
    src = tmp_path / "busy-next"
    shutil.copytree(repo.root / "busy", src, ignore=shutil.ignore_patterns("__pycache__"))
    before = repo.config_text("busy")
    broken = _Unstorable(store._engine)
    with pytest.raises(PublishError, match="the rollout could not be stored"):
        rollout.start(repo, broken, src, "busy", "10%", 60)
    assert repo.versions("busy") == [1] and repo.config_text("busy") == before
    assert history.read(repo.archive).entries == ()
