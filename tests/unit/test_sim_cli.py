"""`stb simulate` through typer's test runner, on tiny fleets and horizons (a few simulated
hours of 16 nodes): the table, JSON and HTML formats, the scenario it reports, the
bridge configuration it takes, and bad input: one line naming the problem, exit code 2,
no output file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.paths import project_root
from bridge.sim.build import ALIBABA_TRACE, AZURE_TRACE, default_trace, model_rates
from bridge.sim.policies import POLICIES

RUN = CliRunner()
SMALL = ["simulate", "--days", "0.05", "--nodes", "16", "--models", "2", "--mean-rps", "150"]
SYNTHETIC = ["--arrivals", "synthetic", "--jobs", "synthetic"]
#: the public traces, named: the defaults are the generators
PUBLIC = ["--arrivals", "azure", "--jobs", "alibaba"]
TRACES = all(
    (path := default_trace(name)) is not None and path.is_file()
    for name in (AZURE_TRACE, ALIBABA_TRACE)
)


def test_model_rates_fall_like_zipf() -> None:
    assert model_rates(4, 150.0) == {"m0": 150.0, "m1": 75.0, "m2": 50.0, "m3": 37.5}


@pytest.mark.skipif(not TRACES, reason="no shared/traces beside the checkout")
def test_table_from_the_public_traces() -> None:
    res = RUN.invoke(app, [*SMALL, *PUBLIC])
    assert res.exit_code == 0, res.output
    for policy in POLICIES:
        assert policy in res.stdout
    assert "Against separate-peak" in res.stdout
    assert "azure arrivals, alibaba jobs at 85% load, seed 0" in res.stdout


@pytest.mark.skipif(not TRACES, reason="no shared/traces beside the checkout")
def test_json_names_the_traces_not_their_paths() -> None:
    res = RUN.invoke(app, [*SMALL, *PUBLIC, "--format", "json", "--policies", "bridge"])
    assert res.exit_code == 0, res.output
    scenario = json.loads(res.stdout)["scenario"]
    assert scenario["arrivals"]["trace"] == AZURE_TRACE
    assert scenario["batch_jobs"]["trace"] == ALIBABA_TRACE
    assert str(project_root()) not in res.stdout and str(project_root().parent) not in res.stdout


def test_json_to_stdout_describes_the_scenario() -> None:
    args = [*SMALL, *SYNTHETIC, "--format", "json", "--seed", "3", "--load", "0.5"]
    res = RUN.invoke(app, [*args, "--policies", "bridge, separate-peak,bridge"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [r["policy"] for r in data["results"]] == ["bridge", "separate-peak"]
    s = data["scenario"]
    assert (s["seed"], s["days"], s["load"]) == (3, 0.05, 0.5)
    assert (s["nodes"], s["gpus_per_node"]) == (16, 8)
    assert s["arrivals"]["source"] == "synthetic" and s["arrivals"]["bursts_per_day"] == 4.0
    assert s["arrivals"]["mean_rps"] == {"m0": 150.0, "m1": 75.0}
    assert s["batch_jobs"]["source"] == "synthetic" and s["batch_jobs"]["elastic_share"] == 0.4
    # the job load is a share of the GPUs outside the peak inference pool
    assert s["batch_jobs"]["capacity_gpus"] == (16 - s["inference_nodes_peak"]) * 8
    assert s["models"]["m1"] == {"slo_p99_ms": 100.0, "service_ms": 20.0}
    assert s["tick_s"] == 5.0


def test_config_gives_the_policy_and_tick(tmp_path: Path) -> None:
    cfg = tmp_path / "bridge.toml"
    cfg.write_text("tick_s = 2.0\n[policy]\nhigh_watermark = 1.2\n")
    out = tmp_path / "sim.json"
    args = [*SMALL, *SYNTHETIC, "--config", str(cfg), "--format", "json", "-o", str(out)]
    res = RUN.invoke(app, [*args, "--policies", "bridge"])
    assert res.exit_code == 0, res.output
    scenario = json.loads(out.read_text())["scenario"]
    assert scenario["tick_s"] == 2.0 and scenario["config"] == "bridge.toml"
    assert res.stdout == ""  # the file has it; "wrote ..." goes to stderr
    assert f"wrote {out}" in res.output


def test_html_is_written_whole(tmp_path: Path) -> None:
    out = tmp_path / "sim.html"
    res = RUN.invoke(app, [*SMALL, *SYNTHETIC, "--format", "html", "--output", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    # the selection's trade-off chart, the SLO and wait charts, a timeline per policy
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1 + 2 + len(POLICIES)
    for policy in POLICIES:
        assert f"<td>{policy}</td>" in page
    assert [p.name for p in tmp_path.iterdir()] == ["sim.html"]  # no temp file left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "bridge,nope"], "--policies: unknown policy 'nope'; choose from"),
        (["--policies", " , "], "--policies is empty"),
        (["--days", "-1"], "--days must be a number > 0, got -1"),
        (["--days", "nan"], "--days must be a number > 0"),
        (["--nodes", "0"], "--nodes must be at least 1"),
        (["--service-ms", "150"], "--service-ms 150 is not below --slo-ms 100"),
        (["--load", "0"], "--load must be a number > 0"),
        (["--arrivals", "poisson"], "--arrivals 'poisson': choose from azure, synthetic"),
        (["--format", "pdf"], "--format 'pdf': choose from table, json, html"),
        (["--nodes", "2"], "leaving 1 for training and elastic (at least 2)"),
        (["--mean-rps", "50000"], "give the fleet more nodes or the models less load"),
        (["--arrivals", "azure", "--arrivals-trace", "{tmp}/gone.csv"], "gone.csv not found"),
        (["--jobs", "alibaba", "--jobs-trace", "{tmp}/gone.csv"], "gone.csv not found"),
        (["--arrivals", "azure", "--arrivals-trace", "{tmp}/bad.csv"], "column 'TIMESTAMP'"),
        (["--jobs", "alibaba", "--jobs-trace", "{tmp}/bad.csv"], "no column num_gpu"),
        (["--config", "{tmp}/gone.toml"], "no such file"),
    ],
)
def test_bad_input_exits_2_naming_it_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    out = tmp_path / "out.json"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = RUN.invoke(app, [*SMALL, *SYNTHETIC, "--format", "json", "-o", str(out), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not out.exists() and res.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "html"], "--format html needs --output FILE"),
        (["-o", "{tmp}/no-dir/sim.json"], "--output: no directory"),
        (["-o", "{tmp}"], "is a directory"),
    ],
)
def test_bad_output_exits_2_before_simulating(
    tmp_path: Path, args: list[str], message: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = RUN.invoke(app, [*SMALL, *SYNTHETIC, *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert list(tmp_path.iterdir()) == []


def test_without_a_traces_folder_the_named_traces_say_what_to_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The product ships no traces: from a clone alone the public traces, once named, name
    the missing file and the ways out; the defaults (the generators) need nothing
    (test_sim_cli_site.py runs them from a fresh folder)."""
    monkeypatch.delenv("STB_TRACES_DIR", raising=False)
    res = RUN.invoke(app, [*SMALL, "--arrivals", "azure"])
    assert res.exit_code == 2
    assert AZURE_TRACE in res.output and "STB_TRACES_DIR" in res.output
    res = RUN.invoke(app, [*SMALL, "--jobs", "alibaba"])
    assert res.exit_code == 2 and ALIBABA_TRACE in res.output
    assert RUN.invoke(app, [*SMALL, "--policies", "bridge"]).exit_code == 0
