"""The selection report's numbers and rules (`bridge.sim.selection`), pure: its dimensions
from small literal PolicyResults, the recommendation as each criterion is crossed, and the
flip conditions it computes (each one is where the recommendation really changes, and the
nearest such place)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import pytest

from bridge.sim import criteria as crit
from bridge.sim import measures, rules, sensitivity
from bridge.sim import selection as sel
from bridge.sim.criteria import Criteria
from bridge.sim.measures import Dimensions
from bridge.sim.result import SimReport, Tradeoff
from tests.unit.sim_literals import policy_result

# -- the dimensions -------------------------------------------------------------------------


def test_the_dimensions_of_a_literal_run() -> None:
    hours = {
        "inference": {"inference": 64.0, "idle": 0.0},
        "elastic": {"elastic": 100.0, "inference": 20.0, "fenced": 4.0, "idle": 12.0},
        "training": {"training": 150.0, "idle": 50.0},
    }
    r = policy_result(
        "bridge",
        {"inference": 2, "elastic": 4, "training": 6},
        within=0.99,
        minutes=(200, 190),
        replicas=[2.0, 3.0, 5.0, 5.0, 4.0],
        gpu_hours=hours,
        waits=(30.0, 90.0),
        lends=9,
        preemptions=4,
        lost=5.0,
        used=40.0,
    )
    d = measures.dimensions(r, days=3.0, gpus_per_node=8)
    assert (d.name, d.kind, d.reserved_nodes, d.reserved_gpus) == ("bridge", "shared", 2, 16)
    assert d.peak_serving_nodes == 5
    # at the (first) sample with 5 replicas, 2 are on the reserved nodes
    assert (d.exposure_replicas, d.exposure_share) == (3, 0.6)
    assert math.isclose(d.requests_within, 0.99) and d.minutes_within == 0.95
    assert d.training_wait_mean_s == 30.0 and d.training_wait_p95_s == 60.0
    assert d.elastic_wait_mean_s == 90.0 and d.elastic_wait_p95_s == 270.0
    assert (d.training_finished, d.training_submitted) == (8, 10)
    assert (d.elastic_finished, d.elastic_submitted) == (27, 30)
    assert d.job_wait_mean_s == (10 * 30.0 + 30 * 90.0) / 40
    assert d.lends == 9 and d.lends_per_day == 3.0
    assert d.preemptions == 4 and d.lost_per_day == 5.0 / 3
    assert d.lost_share == 5.0 / 100.0  # of the elastic GPU-hours (use "elastic")
    total = 64 + 136 + 200
    assert math.isclose(d.utilisation, (150 + 100 + 40) / total)
    assert math.isclose(d.allocation, (total - 12 - 4 - 50) / total)


def test_idle_loan_owns_its_loan_pool_and_separate_pools_expose_nothing() -> None:
    loan = policy_result(
        "idle-loan", {"inference": 2, "loan": 3, "elastic": 4}, replicas=[2.0, 5.0, 4.0]
    )
    d = measures.dimensions(loan, 1.0, 4)
    assert (d.reserved_nodes, d.reserved_gpus, d.exposure_replicas) == (5, 20, 3)
    peak = measures.dimensions(
        policy_result("separate-peak", {"inference": 5}, replicas=[5.0] * 3), 1, 4
    )
    assert (peak.kind, peak.exposure_replicas, peak.exposure_share) == ("separate", 0, 0.0)
    # a run shorter than one sample: its reserved pool serves, nothing exposed
    short = measures.dimensions(policy_result("bridge", {"inference": 2}, replicas=[]), 1.0, 4)
    assert (short.peak_serving_nodes, short.exposure_replicas) == (2, 0)
    with pytest.raises(ValueError, match="days"):
        measures.dimensions(loan, 0.0, 4)


# -- the rules --------------------------------------------------------------------------------

BASE = Dimensions(
    name="x",
    kind="separate",
    description="x",
    reserved_nodes=10,
    reserved_gpus=80,
    peak_serving_nodes=10,
    requests_within=0.999,
    minutes_within=0.99,
    training_wait_mean_s=100.0,
    training_wait_p95_s=300.0,
    training_completion_mean_s=7200.0,
    training_finished=8,
    training_submitted=10,
    elastic_wait_mean_s=100.0,
    elastic_wait_p95_s=300.0,
    elastic_completion_mean_s=1800.0,
    elastic_finished=27,
    elastic_submitted=30,
    job_wait_mean_s=100.0,
    preemptions=0,
    gpu_hours_lost=0.0,
    lost_per_day=0.0,
    lost_share=0.0,
    utilisation=0.6,
    allocation=0.7,
    lends=0,
    lends_per_day=0.0,
    exposure_replicas=0,
    exposure_share=0.0,
)
PEAK = replace(BASE, name="separate-peak")
MEAN = replace(
    BASE, name="separate-mean", reserved_nodes=4, requests_within=0.6, job_wait_mean_s=40.0
)
BRIDGE = replace(
    BASE,
    name="bridge",
    kind="shared",
    reserved_nodes=4,
    peak_serving_nodes=10,
    requests_within=0.9985,
    job_wait_mean_s=50.0,
    lends_per_day=100.0,
    lost_share=0.01,
    exposure_replicas=4,
    exposure_share=0.4,
)
#: separate pools run (nodes, requests within SLO): 8 nodes are the fewest meeting 99%
SEPARATE = [(4, 0.6), (7, 0.98), (8, 0.991), (10, 0.999)]


def _choice(
    setups: list[Dimensions], criteria: Criteria, points: tuple[Dimensions, ...] = ()
) -> str:
    return rules.recommend(setups, points, SEPARATE, criteria).choice


def test_the_bridge_is_recommended_when_it_passes_every_check() -> None:
    rec = rules.recommend([PEAK, MEAN, BRIDGE], [], SEPARATE, Criteria())
    assert (rec.choice, rec.kind, rec.reference, rec.rule) == (
        "bridge",
        "shared",
        "separate-peak",
        "shared",
    )
    (v,) = rec.verdicts
    assert v.passed and v.failed == ()
    text = " ".join(rec.reasons)
    assert "99.850% of requests within SLO (target 99.00%)" in text
    assert "100.0 lends a day (at most 288)" in text
    assert "4 of 10 replicas at the peak on lendable nodes, 40%" in text
    assert "50% shorter" in text  # 50 s against separate-peak's 100 s
    assert (
        "4 reserved nodes against the 8 a separate pool needs to meet the target: 50% fewer" in text
    )


def test_the_reference_is_the_fewest_nodes_meeting_the_target() -> None:
    small = replace(PEAK, name="separate-8", reserved_nodes=8, requests_within=0.9915)
    assert rules.reference([PEAK, MEAN, small], 0.99) == small
    # above what separate-8 serves, separate-peak; above all of them, the best served
    assert rules.reference([PEAK, MEAN, small], 0.995) == PEAK
    assert rules.reference([MEAN, small], 0.9999) == small
    assert rules.reference([BRIDGE], 0.99) is None
    assert rules.needed_separate(SEPARATE, 0.99) == 8
    assert rules.needed_separate(SEPARATE, 0.9995) is None


@pytest.mark.parametrize(
    ("field", "passes", "fails"),
    [
        ("target", 0.9985, math.nextafter(0.9985, 1.0)),  # the bridge's requests within SLO
        ("max_lends_per_day", 100.0, math.nextafter(100.0, 0.0)),  # its lends a day
        ("max_lost_share", 0.01, math.nextafter(0.01, 0.0)),  # its lost share
        ("max_exposure", 0.4, math.nextafter(0.4, 0.0)),  # its exposure
        # 0.05 pp below separate-peak's 99.9%: 5% of the 1 pp error budget
        ("budget_slack", 0.05 + 1e-12, 0.05 - 1e-12),
    ],
)
def test_each_limit_keeps_the_bridge_out_once_crossed(
    field: str, passes: float, fails: float
) -> None:
    setups = [PEAK, MEAN, BRIDGE]
    assert _choice(setups, replace(Criteria(), **{field: passes})) == "bridge"
    crossed = replace(Criteria(), **{field: fails})
    rec = rules.recommend(setups, [], SEPARATE, crossed)
    assert (rec.choice, rec.rule) == ("separate-peak", "separate")
    (v,) = rec.verdicts
    assert [c.name for c in v.failed] == [
        {
            "max_lends_per_day": "lends",
            "max_lost_share": "losses",
            "max_exposure": "exposure",
            "budget_slack": "slack",
        }.get(field, field)
    ]
    assert any("bridge is kept out" in r for r in rec.reasons)


def test_the_bridge_needs_one_gain_of_the_two() -> None:
    setups = [PEAK, MEAN, BRIDGE]
    # the wait is 50% shorter and the nodes 50% fewer
    no_wait = Criteria(min_wait_cut=math.nextafter(0.5, 1.0))
    no_nodes = Criteria(min_nodes_saved=math.nextafter(0.5, 1.0))
    assert _choice(setups, no_wait) == "bridge" and _choice(setups, no_nodes) == "bridge"
    both = replace(no_wait, min_nodes_saved=no_nodes.min_nodes_saved)
    rec = rules.recommend(setups, [], SEPARATE, both)
    assert rec.choice == "separate-peak"
    assert [c.name for c in rec.verdicts[0].failed] == ["wait_cut", "nodes_saved"]


def test_the_shortest_wait_of_the_passing_shared_set_ups_wins() -> None:
    at7 = replace(
        BRIDGE, name="bridge@7", reserved_nodes=7, job_wait_mean_s=45.0, exposure_share=0.2
    )
    at2 = replace(
        BRIDGE, name="bridge@2", reserved_nodes=2, job_wait_mean_s=30.0, exposure_share=0.8
    )
    loan = replace(
        BRIDGE, name="idle-loan", reserved_nodes=10, job_wait_mean_s=70.0, lost_share=0.02
    )
    setups = [PEAK, MEAN, loan, BRIDGE]
    rec = rules.recommend(setups, [at2, at7], SEPARATE, Criteria())
    assert rec.choice == "bridge@7"  # bridge@2 is too exposed; bridge@7 waits least of the rest
    assert [v.candidate for v in rec.verdicts] == ["idle-loan", "bridge", "bridge@2", "bridge@7"]
    assert [v.passed for v in rec.verdicts] == [True, True, False, True]
    # a trade-off run of the comparison's own bridge size is the same run: not twice
    same = replace(BRIDGE, name="bridge@4")
    assert [
        v.candidate for v in rules.recommend(setups, [same], SEPARATE, Criteria()).verdicts
    ] == [
        "idle-loan",
        "bridge",
    ]


def test_without_a_separate_set_up_the_best_served_is_recommended() -> None:
    bad = replace(BRIDGE, lends_per_day=1000.0)
    rec = rules.recommend([bad], [], SEPARATE, Criteria())
    assert (rec.choice, rec.rule, rec.reference) == ("bridge", "best-service", None)
    assert rules.recommend([BRIDGE], [], SEPARATE, Criteria()).rule == "shared"  # no gain asked


def test_when_no_separate_set_up_meets_the_target_the_reasons_say_so() -> None:
    rec = rules.recommend([MEAN, replace(BRIDGE, lends_per_day=1000.0)], [], SEPARATE, Criteria())
    assert rec.choice == "separate-mean"
    assert "no separate set-up of the comparison meets the target 99.00%" in rec.reasons[0]
    assert "a separate pool needs 8 nodes to meet it" in rec.reasons[0]


# -- the flips ----------------------------------------------------------------------------------


def test_each_flip_is_where_the_recommendation_changes_and_the_nearest() -> None:
    setups = [PEAK, MEAN, BRIDGE]
    criteria = Criteria()
    now = _choice(setups, criteria)
    flips = sensitivity.flips(setups, [], SEPARATE, criteria)
    found = {(f.knob, f.direction): f for f in flips}
    # computed from the bridge's own numbers
    assert found["target", "above"].value == 0.9985
    assert found["target", "above"].to == "separate-peak"
    assert found["max_lends_per_day", "below"].value == 100.0
    assert found["max_lost_share", "below"].value == 0.01
    assert found["max_exposure", "below"].value == 0.4
    assert math.isclose(found["budget_slack", "below"].value, 0.05)
    # below 60% (separate-mean's share within SLO) separate-mean is the reference, and the
    # bridge saves it no nodes and waits longer than it: separate-mean
    assert found["target", "below"].value == 0.6 and found["target", "below"].to == "separate-mean"
    assert (
        "separate-peak instead of bridge if the most lends a day the operations team "
        "accepts were below 100.0 (now 288.0)" in [f.text for f in flips]
    )
    for f in flips:
        past = replace(criteria, **{f.knob: sensitivity.beyond(f.value, f.direction)})
        assert _choice(setups, past) == f.to != now, f
        current = getattr(criteria, f.knob)
        between = replace(criteria, **{f.knob: (current + f.value) / 2})
        assert _choice(setups, between) == now, f  # nothing flips before it
    # neither gain alone flips it: the other one still holds
    assert ("min_wait_cut", "above") not in found and ("min_nodes_saved", "above") not in found


def test_a_separate_recommendation_flips_to_the_bridge_when_a_limit_loosens() -> None:
    busy = replace(BRIDGE, lends_per_day=400.0)
    flips = {
        (f.knob, f.direction): f
        for f in sensitivity.flips([PEAK, MEAN, busy], [], SEPARATE, Criteria())
    }
    up = flips["max_lends_per_day", "above"]
    assert (up.value, up.to) == (400.0, "bridge")
    assert "bridge instead of separate-peak if the most lends a day" in up.text


# -- criteria and the whole selection --------------------------------------------------------


def test_criteria_parse_and_refuse() -> None:
    k = crit.parse_criteria(" max_lends_per_day=96, max_exposure=0.7 ", Criteria(target=0.999))
    assert (k.target, k.max_lends_per_day, k.max_exposure) == (0.999, 96.0, 0.7)
    assert crit.parse_criteria("") == Criteria()
    for text, message in [
        ("lends=3", "give name=value with a name from"),
        ("max_exposure", "give name=value"),
        ("max_exposure=lots", "'lots' is not a number"),
        ("max_exposure=nan", "not a finite number"),
        ("max_exposure=1.5", "give a share in"),
        ("target=0", "give a share of requests"),
        ("max_lends_per_day=-1", "give a number >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            crit.parse_criteria(text)


def test_select_a_literal_report() -> None:
    results = [
        policy_result(
            "separate-peak", {"inference": 10, "elastic": 4}, within=0.999, replicas=[10.0]
        ),
        policy_result("separate-mean", {"inference": 4, "elastic": 10}, within=0.6, replicas=[4.0]),
        policy_result(
            "bridge",
            {"inference": 4, "elastic": 10},
            within=0.998,
            replicas=[4.0, 8.0],
            waits=(10.0, 20.0),
            lends=20,
        ),
    ]
    trade = Tradeoff(
        bridge=[
            policy_result(
                "bridge@2", {"inference": 2, "elastic": 12}, within=0.97, replicas=[2.0, 9.0]
            ),
            policy_result(
                "bridge@4", {"inference": 4, "elastic": 10}, within=0.998, replicas=[4.0, 8.0]
            ),
        ],
        separate=[
            policy_result("separate-8", {"inference": 8}, within=0.991),
            policy_result("separate-7", {"inference": 7}, within=0.98),
        ],
        target=0.99,
    )
    report = SimReport({"horizon_s": 2 * 86400.0, "gpus_per_node": 8}, results, trade)
    s = sel.select(report)
    assert s.days == 2.0 and [d.name for d in s.setups] == [
        "separate-peak",
        "separate-mean",
        "bridge",
    ]
    assert [d.reserved_nodes for d in s.points] == [2, 4]
    assert [p.nodes for p in s.separate] == [4, 7, 8, 10]
    assert s.needed == {
        "separate-peak": 8, "separate-mean": 8, "bridge": 4, "bridge@2": 4, "bridge@4": 4,
    }  # fmt: skip
    assert s.recommendation.choice == "bridge"
    assert s.setups[2].lends_per_day == 10.0
    data = s.as_dict()
    assert data["recommendation"]["choice"] == "bridge"
    assert data["recommendation"]["verdicts"][0]["passed"] is True
    assert set(data["definitions"]) == set(measures.DEFINITIONS)
    assert {f.name for f in sensitivity.KNOBS} == set(data["criteria"]) == set(crit.REASONS)


def test_the_selection_imports_no_plotting() -> None:
    code = "import sys, bridge.sim.selection; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
