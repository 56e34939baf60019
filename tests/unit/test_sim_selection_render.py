"""The selection report's formats (`bridge.sim.selection_render`, and `stb simulate
--format markdown|html|json`): every dimension, beside its definition, for every set-up;
the trade-off table and chart; the recommendation, its reasons and flips; the criteria
with their reasons; text escaped; and a short end-to-end run on synthetic inputs."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
from markupsafe import escape
from rich.console import Console
from typer.testing import CliRunner

from bridge.cli import app
from bridge.sim import render, selection_render
from bridge.sim.criteria import REASONS
from bridge.sim.measures import DEFINITIONS
from bridge.sim.result import SimReport, Tradeoff
from bridge.sim.selection import Selection, select
from tests.unit.helpers import assert_refs_stay_inside
from tests.unit.sim_literals import policy_result

SETUPS = ("separate-peak", "separate-6", "separate-mean", "idle-loan", "bridge")


@pytest.fixture(scope="module")
def report() -> SimReport:
    results = [
        policy_result(
            "separate-peak", {"inference": 10, "training": 6, "elastic": 4}, within=0.999
        ),
        policy_result("separate-6", {"inference": 6, "training": 6, "elastic": 8}, within=0.97),
        policy_result("separate-mean", {"inference": 4, "training": 6, "elastic": 10}, within=0.6),
        policy_result(
            "idle-loan",
            {"inference": 4, "loan": 6, "training": 6, "elastic": 4},
            within=0.998,
            replicas=[4.0, 9.0, 6.0],
            lends=30,
            preemptions=12,
            lost=3.0,
            gpu_hours={"elastic": {"elastic": 100.0}},
        ),
        policy_result(
            "bridge",
            {"inference": 4, "training": 6, "elastic": 10},
            within=0.998,
            replicas=[4.0, 8.0, 5.0],
            waits=(10.0, 20.0),
            lends=20,
        ),
    ]
    results[-1].description = "the <bridge> & co"  # escaped on the page
    trade = Tradeoff(
        bridge=[
            policy_result(
                "bridge@1", {"inference": 1, "elastic": 13}, within=0.97, replicas=[1.0, 9.0]
            ),
            policy_result(
                "bridge@7", {"inference": 7, "elastic": 7}, within=0.9989, replicas=[7.0, 9.0]
            ),
        ],
        separate=[
            policy_result("separate-7", {"inference": 7}, within=0.98),
            policy_result("separate-8", {"inference": 8}, within=0.991),
        ],
        target=0.99,
    )
    scenario = {"horizon_s": 86400.0, "gpus_per_node": 8, "nodes": 20, "jobs": 40}
    return SimReport(scenario, results, trade)


@pytest.fixture(scope="module")
def selection(report: SimReport) -> Selection:
    return select(report)


#: the rows a report without an LLM shows (the TTFT/TPOT rows are left out)
SHOWN = tuple(r for r in selection_render.ROWS if r[0] not in selection_render.TOKEN_ROWS)


def _markdown_rows(text: str, title: str) -> list[list[str]]:
    """The cells of the markdown table under "### title" (header first)."""
    lines = text.split(f"### {title}\n", 1)[1].lstrip("\n").splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        if not line.startswith("|:---"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_markdown_has_every_dimension_for_every_set_up(
    report: SimReport, selection: Selection
) -> None:
    text = selection_render.to_markdown(report, selection)
    rows = _markdown_rows(text, "Shared or separate: the set-ups side by side")
    assert rows[0] == ["dimension", "definition", *SETUPS]
    labels = ["nodes needed to meet the SLO", *(label for _, label, _ in SHOWN)]
    assert [r[0] for r in rows[1:]] == labels
    for row, (key, _, cell) in zip(rows[2:], SHOWN, strict=True):
        assert row[1] == DEFINITIONS[key]  # each number beside its definition
        assert row[2:] == [cell(d) for d in selection.setups]
        assert all(c for c in row[2:])
    # separate pools need 8 nodes, the bridge's reserved pool 4 (its own run meets 99%)
    assert rows[1][2:] == ["8", "8", "8", "10", "4"]
    # the trade-off: a row per size run, bridge or separate
    trade = _markdown_rows(
        text, "Trade-off: reserved inference nodes, SLO attainment and job queueing"
    )
    assert [r[0] for r in trade[1:]] == ["1", "4", "6", "7", "8", "10"]
    assert trade[1][1] == "97.000%" and trade[1][-2] == "-"  # bridge@1; no separate pool of 1
    assert trade[5][1] == "-" and trade[5][-2] == "99.100%"  # the search's separate pool of 8
    rec = selection.recommendation
    assert f"## Recommended: {rec.choice} (a shared fleet)" in text
    for reason in rec.reasons:
        assert selection_render._md(reason) in text
    assert selection.flips and all(selection_render._md(f.text) in text for f in selection.flips)
    for reason in REASONS.values():
        assert reason in text
    checks = _markdown_rows(text, "Checks of the shared set-ups")
    assert [r[0] for r in checks[1:]] == ["idle-loan", "bridge", "bridge@1", "bridge@7"]
    assert "## The comparison" in text and "### Job queues and lending" in text
    assert "the \\<bridge\\> & co" in text  # no HTML in a markdown paragraph


def test_the_page_has_the_selection_section_with_its_chart(
    report: SimReport, selection: Selection
) -> None:
    page = selection_render.to_html(report, selection)
    assert page.startswith("<!DOCTYPE html>")
    assert_refs_stay_inside(page)
    section = page.split("<h2>Selection: shared or separate?</h2>", 1)[1].split(
        "<h2>Comparison", 1
    )[0]
    assert "<h3>Trade-off: reserved inference nodes</h3>" in section
    assert section.count("<svg") == 1
    assert page.count("<svg") == 1 + 2 + len(report.results)
    assert (
        f"<strong>Recommended: {selection.recommendation.choice} (a shared fleet)</strong>"
        in section
    )
    for setup in SETUPS:
        assert f'<th class="num">{setup}</th>' in section
    for key, label, _ in SHOWN:
        # escaped as the page's templates escape (markupsafe: ' as &#39;)
        assert f"<td>{escape(label)}</td><td>{escape(DEFINITIONS[key])}</td>" in section
    for flip in selection.flips:
        assert f"<li>{escape(flip.text)}</li>" in section
    assert "the &lt;bridge&gt; &amp; co" in section and "<bridge>" not in page
    assert selection_render.to_html(report, selection) == page  # the same bytes


def test_the_terminal_tables(report: SimReport, selection: Selection) -> None:
    buf = io.StringIO()
    selection_render.print_tables(selection, Console(file=buf, width=250, color_system=None))
    text = buf.getvalue()
    assert text.startswith("Recommended: ") and "Would flip:" in text
    for setup in SETUPS:
        assert setup in text
    assert "fault-domain exposure" in text and "lends a day" in text


def test_json_has_the_selection_and_the_tradeoff(report: SimReport, selection: Selection) -> None:
    data = json.loads(render.to_json(report, selection))
    assert data["selection"] == json.loads(json.dumps(selection.as_dict()))
    assert [r["policy"] for r in data["tradeoff"]["bridge"]] == ["bridge@1", "bridge@7"]
    assert [d["name"] for d in data["selection"]["setups"]] == list(SETUPS)
    assert data["selection"]["needed"]["bridge"] == 4
    assert "selection" not in json.loads(render.to_json(report))


# -- end to end -----------------------------------------------------------------------------

RUN = CliRunner()
SMALL = [
    "simulate", "--days", "0.05", "--nodes", "16", "--models", "2", "--mean-rps", "150",
    "--arrivals", "synthetic", "--jobs", "synthetic",
]  # fmt: skip


def test_stb_simulate_markdown_end_to_end() -> None:
    res = RUN.invoke(
        app, [*SMALL, "--format", "markdown", "--separate-nodes", "2", "--tradeoff", "1,3"]
    )
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert text.startswith(
        "# Selection: shared or separate fleet (Simulated fleet: 16 nodes x 8 GPUs"
    )
    assert re.search(r"^## Recommended: \S+ \((a shared fleet|separate fleets)\)$", text, re.M)
    rows = _markdown_rows(text, "Shared or separate: the set-ups side by side")
    assert rows[0][2:] == ["separate-peak", "separate-mean", "separate-2", "idle-loan", "bridge"]
    assert len(rows) == 2 + len(SHOWN)
    trade = _markdown_rows(
        text, "Trade-off: reserved inference nodes, SLO attainment and job queueing"
    )
    sizes = [int(r[0]) for r in trade[1:]]
    assert {1, 3} <= set(sizes)
    assert "## Would flip" in text and "### Criteria" in text and "## The comparison" in text


def test_stb_simulate_json_has_the_selection(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = [*SMALL, "--policies", "separate-peak,bridge", "--tradeoff", "none", "--format", "json"]
    res = RUN.invoke(
        app, [*args, "-o", str(out), "--slo-target", "0.95", "--criteria", "max_exposure=0.9"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert "tradeoff" not in data  # --tradeoff none
    assert data["selection"]["criteria"]["target"] == 0.95
    assert data["selection"]["criteria"]["max_exposure"] == 0.9
    assert data["selection"]["points"] == []
    assert all(
        math.isfinite(v)
        for d in data["selection"]["setups"]
        for v in d.values()
        if isinstance(v, float)
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tradeoff", "lots"],
            "trade-off size 'lots': give auto, none, or node counts from 1 to 14",
        ),
        (["--criteria", "lends=3"], "criterion 'lends=3': give name=value"),
        (["--slo-target", "1.5"], "target 1.5: give a share of requests in (0, 1]"),
        (["--separate-nodes", "40"], "separate-40: give a separate pool of 1 to 16 nodes"),
        (["--policies", "separate-x"], "unknown policy 'separate-x'; choose from"),
    ],
)
def test_bad_selection_options_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out.md"
    res = RUN.invoke(app, [*SMALL, "--format", "markdown", "-o", str(out), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not out.exists()
