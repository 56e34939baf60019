"""The simulator's report formats (`bridge.sim.render`) on a small real comparison: every
policy over 2.4 simulated hours of a 32-node fleet with bursty synthetic arrivals, so the
lending policies lend. Tables have a row per policy, JSON is `as_dict` with no infinity,
the HTML page is self-contained, escaped and reproducible; headless Chromium (when there
is one) shows its charts."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image
from rich.console import Console

from bridge.page import WORKLOAD_COLOURS
from bridge.sim import render
from bridge.sim.policies import POLICIES, Scenario, compare, size
from bridge.sim.result import USES, Decision, SimReport
from bridge.sim.workload import synthetic_jobs, synthetic_series
from tests.unit.helpers import assert_refs_stay_inside

HORIZON_S = 0.1 * 86400
NODES = 32
#: keys of each policy's JSON object that the formats document
RESULT_KEYS = {
    "policy", "description", "pools", "models", "gpu_hours", "queues", "preemptions",
    "gpu_hours_lost", "lends", "returns", "decisions", "series", "series_step_s",
    "requests", "within_share", "minutes_share",
}  # fmt: skip


@pytest.fixture(scope="module")
def report() -> SimReport:
    models = {"m0": 150.0, "m1": 75.0}
    arrivals = synthetic_series(models, HORIZON_S, bursts_per_day=40, seed=1)
    scenario = Scenario(
        nodes=NODES,
        gpus_per_node=8,
        arrivals=arrivals,
        jobs=[],
        models={m: (100.0, 20.0) for m in models},
        horizon_s=HORIZON_S,
        about={"seed": 1, "note": "test <scenario> & co"},
    )
    capacity = (NODES - size(scenario).peak_nodes) * 8
    jobs = synthetic_jobs(HORIZON_S, capacity, 0.85, seed=1)
    return compare(dataclasses.replace(scenario, jobs=jobs))


@pytest.fixture(scope="module")
def page(report: SimReport) -> str:
    return render.to_html(report)


def _text(report: SimReport) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    for table in render.tables(report):
        console.print(table)
    return buf.getvalue()


def test_the_tables_have_a_row_per_policy_and_the_ratios(report: SimReport) -> None:
    assert [r.policy for r in report.results] == list(POLICIES)
    tables = render.tables(report)
    assert len(tables) == 4
    service, queues, pools, ratios = tables
    assert all(t.row_count == len(POLICIES) for t in (service, queues, ratios))
    # a row per policy and pool it has
    assert pools.row_count == sum(len(r.gpu_hours) for r in report.results)
    text = _text(report)
    for policy in POLICIES:
        assert text.count(policy) >= 3
    assert "Against separate-peak" in text
    assert re.search(r"separate-peak\s+│\s+1\.00x\s+│\s+1\.00x\s+│\s+\+0\.0%", text)
    assert "inf " in text and " / train " in text and " / el " in text
    assert f"{NODES} nodes x 8 GPUs" in text


def test_no_ratio_table_without_the_baseline(report: SimReport) -> None:
    others = SimReport(report.scenario, [r for r in report.results if r.policy != "separate-peak"])
    assert render.ratio_grid(others) is None
    assert len(render.tables(others)) == 3
    alone = SimReport(report.scenario, report.results[:1])
    assert render.ratio_grid(alone) is None


def test_the_numbers_add_up(report: SimReport) -> None:
    for r in report.results:
        hours = render.gpu_hours_by_use(r)
        assert set(hours) == {"training", "elastic", "inference", "idle"}
        every = sum(h for uses in r.gpu_hours.values() for h in uses.values())
        assert math.isclose(sum(hours.values()), every)
        # the whole fleet's GPU-hours: nodes x GPUs x horizon
        assert math.isclose(every, NODES * 8 * HORIZON_S / 3600, rel_tol=1e-6)
        assert 0 < render.utilisation(r) <= 1
        # replicas serve with part of the GPUs they hold
        assert 0 < r.inference_used_gpu_hours <= hours["inference"] + 1e-9
    # the pool table's rows are the result's own GPU-hours, pool by pool
    grid = render.pool_grid(report)
    for policy, pool, *cells in grid.rows:
        r = next(x for x in report.results if x.policy == policy)
        for use, cell in zip(USES, cells, strict=False):
            assert cell == f"{r.gpu_hours[pool][use]:,.0f}"
    bridge = next(r for r in report.results if r.policy == "bridge")
    assert bridge.lends > 0  # the bursts make the bridge lend


def test_nodes_text() -> None:
    pools = {"elastic": 5, "training": 44, "loan": 12, "inference": 3}
    assert render.nodes_text(pools) == "inf 3 / loan 12 / train 44 / el 5"
    assert render.nodes_text({"inference": 2, "loan": 0, "training": 9}) == "inf 2 / train 9"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0.0s"),
        (4.24, "4.2s"),
        (45.4, "45s"),
        (300.0, "5m"),
        (725.0, "12m 05s"),
        (2 * 3600 + 31 * 60 + 10, "2h 31m"),
        (3 * 86400 + 4 * 3600, "3d 04h"),
        (math.inf, "-"),
    ],
)
def test_human_durations(seconds: float, text: str) -> None:
    assert render.human(seconds) == text


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, int | float) and not isinstance(value, bool) else []


def test_json_is_as_dict_sorted_and_finite(report: SimReport) -> None:
    text = render.to_json(report)
    data = json.loads(text)
    assert text == json.dumps(report.as_dict(), sort_keys=True, indent=2) + "\n"
    assert [r["policy"] for r in data["results"]] == list(POLICIES)
    for r in data["results"]:
        assert set(r) >= RESULT_KEYS
        assert set(r["queues"]) == {"training", "elastic"}
        assert {"wait_mean_s", "wait_p95_s", "completion_mean_s"} <= set(r["queues"]["training"])
    assert all(math.isfinite(n) for n in _numbers(data))
    assert data["scenario"]["nodes"] == NODES and data["scenario"]["seed"] == 1


def test_json_writes_infinity_and_nan_as_null(report: SimReport) -> None:
    broken = copy.deepcopy(report.results[0])
    broken.gpu_hours_lost = math.inf
    broken.series["worst_p99_over_slo"][0] = math.nan
    text = render.to_json(SimReport({"x": -math.inf}, [broken]))
    data = json.loads(text)  # strict JSON: no Infinity or NaN tokens
    assert "Infinity" not in text and "NaN" not in text
    assert data["scenario"]["x"] is None
    assert data["results"][0]["gpu_hours_lost"] is None
    assert data["results"][0]["series"]["worst_p99_over_slo"][0] is None


def test_html_is_self_contained_with_every_chart(report: SimReport, page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert 'http-equiv="Content-Security-Policy" content="default-src \'none\';' in page
    charts = 2 + len(report.results)  # SLO shares, queue waits, one timeline per policy
    assert page.count("<svg") == charts and page.count("</svg>") == charts
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert "<metadata" not in page and "dc:date" not in page
    assert_refs_stay_inside(page)
    for policy in POLICIES:
        assert f"<td>{policy}</td>" in page
        assert f"<h3>{policy} over time</h3>" in page
        assert f"<summary>{policy}: " in page
    assert page.count("<details>") == len(POLICIES)
    assert "Against separate-peak" in page
    assert "test &lt;scenario&gt; &amp; co" in page and "<scenario>" not in page
    bridge = next(r for r in report.results if r.policy == "bridge")
    assert f"lend     {bridge.decisions[0].node}" in page


def test_html_escapes_text_and_lists_at_most_200_decisions(report: SimReport) -> None:
    odd = copy.deepcopy(report.results[0])
    odd.policy = "x<y>"
    odd.description = "<script>alert(1)</script> & co"
    odd.series = {}  # a run shorter than one sample: the timeline says so
    odd.decisions = [
        Decision(60.0 * i, "lend", f"n{i:05d}", ("m0",), "p99 <high> & rising") for i in range(250)
    ]
    page = render.to_html(SimReport({"nodes": 1}, [odd]))
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "<td>x&lt;y&gt;</td>" in page and "x<y>" not in page
    assert page.count("p99 &lt;high&gt; &amp; rising") == render.MAX_DECISIONS
    assert "... and 50 more" in page
    assert "0d 03:19:00  lend     n00199" in page and "n00200" not in page
    assert page.count("<svg") == 3


def test_html_is_reproducible(report: SimReport) -> None:
    one = SimReport(report.scenario, report.results[-1:])
    assert render.to_html(one) == render.to_html(one)


CHROMIUM = shutil.which("chromium")
#: pixels of a colour a drawn chart shows at least (its areas and bars are thousands)
MIN_PIXELS = 1500


def _rgb(colour: str) -> npt.NDArray[np.int_]:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")
def test_chromium_shows_the_charts(page: str, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    path = tmp_path / "sim.html"
    path.write_text(page, encoding="utf-8")
    shot = tmp_path / "shot.png"
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-dev-shm-usage", "--no-first-run",
        "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1400,4000", f"--screenshot={shot}", path.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert shot.exists(), f"no screenshot (rc {done.returncode}): {done.stderr[-2000:]}"
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    inked = (img < 230).any(axis=2).mean()
    assert inked > 0.03, f"the page looks blank ({inked:.1%} of pixels not white)"
    for use in ("training", "elastic", "inference", "idle"):
        close = (np.abs(img - _rgb(WORKLOAD_COLOURS[use])) <= 24).all(axis=2)
        assert close.sum() >= MIN_PIXELS, f"{use} not drawn ({close.sum()} px)"
