"""The simulator's twin of a lab scenario (pure: no lab): the lab's nodes, jobs and load as
the simulator sees them, the traced run, and the comparison of two decision sequences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bridge.config import BridgeConfig, load_config
from bridge.lab.spec import LabSpec
from bridge.paths import project_root
from bridge.policy import Lend, Return, StartBaseline
from bridge.sim import labcheck
from bridge.sim.engine import Engine, Setup, Timing
from bridge.sim.result import Decision


@pytest.fixture
def spec(tmp_path: Path) -> LabSpec:
    return LabSpec(lab_dir=tmp_path)


@pytest.fixture
def config() -> BridgeConfig:
    """deploy/lab/bridge.toml with the lab tests' short policy (tests/lab/conftest.py)."""
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    return base.model_copy(
        update={
            "policy": base.policy.model_copy(
                update={
                    "breach_evaluations": 2,
                    "return_dwell_s": 6,
                    "scale_out_cooldown_s": 0,
                    "scale_in_cooldown_s": 6,
                    "max_lent_nodes": 1,
                }
            )
        }
    )


# ---- the lab's fleet, jobs and load ---------------------------------------------------


def test_lab_nodes_keep_their_names_pools_and_gpus(spec: LabSpec, config: BridgeConfig) -> None:
    nodes = labcheck.sim_nodes(spec, config)
    assert [(n.index, n.name, n.pool, n.partition, n.gpus) for n in nodes] == [
        (0, "n1", "training", "training", 4),
        (1, "n2", "training", "training", 4),
        # n3 is in the infer partition too: the lendable pool wins, as in observe.pool_of
        (2, "n3", "elastic", "elastic", 4),
        (3, "n4", "inference", None, 4),
    ]
    assert labcheck.node_pools(spec, config) == {
        "n1": "training",
        "n2": "training",
        "n3": "elastic",
        "n4": "inference",
    }


def test_a_larger_lab_maps_every_node(tmp_path: Path, config: BridgeConfig) -> None:
    spec = LabSpec(lab_dir=tmp_path, train_nodes=3, elastic_nodes=2, infer_nodes=2, gpus_per_node=8)
    nodes = labcheck.sim_nodes(spec, config)
    assert [n.pool for n in nodes] == ["training"] * 3 + ["elastic"] * 2 + ["inference"] * 2
    assert {n.gpus for n in nodes} == {8}


def test_a_node_in_no_configured_pool_is_an_error(spec: LabSpec, config: BridgeConfig) -> None:
    pools = {k: v for k, v in config.pools.items() if k != "training"}
    partial = config.model_copy(update={"pools": pools})
    with pytest.raises(ValueError, match="lab node n1"):
        labcheck.node_pools(spec, partial)


def test_showcase_jobs_fill_every_batch_node(spec: LabSpec) -> None:
    jobs = labcheck.showcase_jobs(spec, training_ids=["7", "8"], elastic_id="9")
    assert [(j.job_id, j.kind, j.submit_s, j.duration_s, j.gpus) for j in jobs] == [
        ("7", "training", 0.0, 1800.0, 4),
        ("8", "training", 0.0, 1800.0, 4),
        ("9", "elastic", 0.0, 1800.0, 4),
    ]
    assert [j.job_id for j in labcheck.showcase_jobs(spec)] == ["train-n1", "train-n2", "elastic"]
    with pytest.raises(ValueError, match="1 training job ids for 2"):
        labcheck.showcase_jobs(spec, training_ids=["7"])


def test_arrivals_count_the_schedule_per_step() -> None:
    series = labcheck.arrivals_from_offsets(
        {"busy": [0.0, 0.5, 1.9, 2.0, 5.9, 6.0, 7.5]}, ["busy", "echo"], 2.0, 6.0
    )
    assert series.step_s == 2.0
    # [0,2): 3, [2,4): 1, [4,6): 1; 6.0 and 7.5 are past the horizon
    np.testing.assert_allclose(series.rates["busy"], [1.5, 0.5, 0.5])
    np.testing.assert_allclose(series.rates["echo"], [0.0, 0.0, 0.0])


def test_arrivals_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="not configured: other"):
        labcheck.arrivals_from_offsets({"other": [1.0]}, ["busy"], 2.0, 10.0)
    with pytest.raises(ValueError, match="step_s"):
        labcheck.arrivals_from_offsets({}, ["busy"], 0.0, 10.0)
    with pytest.raises(ValueError, match="horizon_s"):
        labcheck.arrivals_from_offsets({}, ["busy"], 2.0, float("nan"))


def test_service_times_come_from_the_model_repository() -> None:
    service, instances = labcheck.model_service(["busy", "echo"])
    assert service == {"busy": pytest.approx(0.020), "echo": pytest.approx(0.001)}
    assert instances == 1


def test_service_time_and_instances_of_another_repository(tmp_path: Path) -> None:
    model = tmp_path / "slow"
    model.mkdir()
    (model / "config.pbtxt").write_text(
        'name: "slow"\nbackend: "python"\n'
        "instance_group [ { count: 3 kind: KIND_CPU } ]\n"
        'parameters: { key: "service_time_ms" value: { string_value: "45" } }\n'
    )
    service, instances = labcheck.model_service(["slow"], tmp_path)
    assert service == {"slow": pytest.approx(0.045)} and instances == 3


def test_lab_setup_mirrors_the_lab(spec: LabSpec, config: BridgeConfig) -> None:
    models = list(labcheck.lab_models(config))
    arrivals = labcheck.arrivals_from_offsets({"busy": [0.1]}, models, 2.0, 10.0)
    setup = labcheck.lab_setup(spec, config, labcheck.showcase_jobs(spec), arrivals, 10.0)
    assert setup.config is config
    # the models the reconciler scales: the repository's facts (no TOML entry)
    assert setup.models is not None and setup.models["busy"].max_replicas == 3
    assert setup.replica_servers == 1 and setup.service_cv2 == 0.0
    assert [n.name for n in setup.nodes] == ["n1", "n2", "n3", "n4"]
    assert setup.service_s["busy"] == pytest.approx(0.020)
    assert setup.horizon_s == 10.0 and len(setup.jobs) == 3


# ---- the traced run -------------------------------------------------------------------


def _step_setup(spec: LabSpec, config: BridgeConfig) -> Setup:
    """60 req/s on busy for 50 s, then 4 req/s: the lab test's load step, regular."""
    heavy = np.arange(0.0, 50.0, 1 / 60)
    light = np.arange(50.0, 200.0, 1 / 4)
    offsets = {"busy": [*heavy, *light]}
    models = list(labcheck.lab_models(config))
    arrivals = labcheck.arrivals_from_offsets(offsets, models, config.tick_s, 200.0)
    return labcheck.lab_setup(spec, config, labcheck.showcase_jobs(spec), arrivals, 200.0)


def test_the_traced_run_lends_the_elastic_node_and_returns_it(
    spec: LabSpec, config: BridgeConfig
) -> None:
    trace = labcheck.simulate(_step_setup(spec, config))
    decisions = trace.result.decisions
    assert [(d.kind, d.node, d.models) for d in decisions] == [
        ("lend", "n3", ("busy",)),
        ("return", "n3", ("busy",)),
    ]
    # the first tick that sees 60 req/s: one instance of 20 ms cannot carry it (capacity)
    assert decisions[0].at_s == 2.0
    states = [(t.lease, t.node, t.state) for t in trace.transitions]
    assert states == [
        (1, "n3", s)
        for s in ("submitted", "starting", "serving", "draining", "releasing", "returned")
    ]
    at = {t.state: t.at_s for t in trace.transitions}
    timing = Timing()
    # the Triton job runs after the preemption delay, each state seen at the next tick
    assert at["starting"] == 2.0 * -(-(decisions[0].at_s + timing.preempt_start_s) // 2.0)
    assert at["serving"] == at["starting"] + 2.0
    assert at["draining"] == decisions[1].at_s
    assert len(trace.samples["busy"]) == trace.result.ticks == 100
    assert trace.samples["busy"][0].at_s == 2.0


def test_replayed_timing_puts_each_state_on_the_labs_tick(
    spec: LabSpec, config: BridgeConfig
) -> None:
    T = labcheck.Transition
    lab = [
        T(4.0, 1, "n3", "requested"),
        T(4.0, 1, "n3", "submitted"),
        T(24.0, 1, "n3", "starting"),
        T(28.0, 1, "n3", "serving"),
        T(110.0, 1, "n3", "draining"),
        T(112.0, 1, "n3", "releasing"),
        T(116.0, 1, "n3", "returned"),
        T(130.0, 2, "n1", "submitted"),  # another lease: not this one's delays
    ]
    timing = labcheck.replayed_timing(lab, 2.0)
    assert (timing.preempt_start_s, timing.triton_ready_s, timing.cancel_s) == (19.0, 4.0, 3.0)
    assert timing.slurm_start_s == Timing().slurm_start_s
    assert labcheck.replayed_timing(lab, 2.0, preempted=False).slurm_start_s == 19.0
    # a lease that never served keeps the base's later delays
    partial = labcheck.replayed_timing(lab[:3], 2.0)
    assert partial.preempt_start_s == 19.0 and partial.triton_ready_s == Timing().triton_ready_s

    setup = _step_setup(spec, config)
    setup.timing = timing
    at = {t.state: t.at_s for t in labcheck.simulate(setup).transitions}
    assert (at["submitted"], at["starting"], at["serving"]) == (2.0, 22.0, 26.0)
    assert at["returned"] - at["releasing"] == 4.0


def test_tracing_changes_no_decision(spec: LabSpec, config: BridgeConfig) -> None:
    traced = labcheck.simulate(_step_setup(spec, config)).result.decisions
    plain = Engine(_step_setup(spec, config)).run().decisions
    assert traced == plain


# ---- the comparison -------------------------------------------------------------------


def _leases(lease_id: int) -> tuple[str, list[str]]:
    return {7: ("n3", ["busy"])}[lease_id]


def test_decision_of_each_action() -> None:
    lend = labcheck.decision_of(Lend("n3", "elastic", "preempt", ("busy",), "p99"), 4.0, _leases)
    assert lend == Decision(4.0, "lend", "n3", ("busy",), "p99")
    ret = labcheck.decision_of(Return(7, "calm"), 120.0, _leases)
    assert ret == Decision(120.0, "return", "n3", ("busy",), "calm")
    base = labcheck.decision_of(StartBaseline("n4", "none"), -3.0, _leases)
    assert base == Decision(-3.0, "baseline", "n4", (), "none")
    with pytest.raises(TypeError):
        labcheck.decision_of("lend", 0.0, _leases)  # type: ignore[arg-type]


POOLS = {"n1": "training", "n3": "elastic", "n4": "inference"}
TOL = labcheck.Tolerance(default_s=5.0, per_kind={"return": 18.0})


def _d(
    at: float, kind: str = "lend", node: str = "n3", models: tuple[str, ...] = ("busy",)
) -> Decision:
    return Decision(at, kind, node, models, "")


def test_the_same_decisions_agree_within_the_tolerance() -> None:
    rows = labcheck.compare_decisions(
        [_d(4.0), _d(122.0, "return")], [_d(6.0), _d(106.0, "return")], POOLS, TOL
    )
    assert [(r.index, r.delta_s, r.ok, r.lab_pool, r.sim_pool) for r in rows] == [
        (1, 2.0, True, "elastic", "elastic"),
        (2, -16.0, True, "elastic", "elastic"),
    ]
    assert TOL.of("return") == 18.0 and TOL.of("lend") == 5.0


def test_each_kind_of_difference_is_named() -> None:
    rows = labcheck.compare_decisions(
        [_d(4.0), _d(10.0), _d(20.0, "return"), _d(30.0)],
        [_d(10.0), _d(10.0, node="n1", models=("busy", "echo")), _d(20.0)],
        POOLS,
        TOL,
    )
    assert [r.difference for r in rows] == [
        "sim 6.0s later (tolerance 5s)",
        "node n3 vs n1; pool elastic vs training; models busy vs busy,echo",
        "kind return vs lend",
        "only on the lab",
    ]
    assert rows[3].sim is None and rows[3].delta_s is None and not rows[3].ok
    only_sim = labcheck.compare_decisions([], [_d(4.0)], POOLS, TOL)
    assert only_sim[0].difference == "only in the simulator"


def test_the_tables_show_both_sides() -> None:
    rows = labcheck.compare_decisions([_d(4.0)], [_d(4.0), _d(9.0, "return")], POOLS, TOL)
    text = labcheck.format_decisions(rows)
    lines = text.splitlines()
    assert len(lines) == 4 and "lab t" in lines[0] and "difference" in lines[0]
    assert "n3(elastic)" in lines[2] and lines[2].endswith("same")
    assert lines[3].endswith("only in the simulator")

    T = labcheck.Transition
    lab = [T(4.0, 1, "n3", "requested"), T(4.0, 1, "n3", "submitted"), T(40.0, 1, "n3", "starting")]
    sim = [T(4.0, 1, "n3", "submitted"), T(38.0, 1, "n3", "starting")]
    states = labcheck.format_transitions(lab, sim).splitlines()
    assert [line.split()[2] for line in states[2:]] == ["requested", "submitted", "starting"]
    assert states[2].split()[-2:] == ["-", "-"] and states[4].split()[-1] == "-2.0"

    S = labcheck.Sample
    samples = labcheck.format_samples(
        [S(2.01, 631.0, 351.0, 38.8, 29.0)],
        [S(2.0, 520.0, 270.0, 62.5, 25.0), S(4.0, None, None, 0.0, 0.0)],
        2.0,
    ).splitlines()
    assert samples[2].split() == ["2.0", "631", "351", "38.8", "29", "520", "270", "62.5", "25"]
    assert samples[3].split() == ["4.0", "-", "-", "0.0", "0"]
