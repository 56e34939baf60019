"""Smoke test of bench/simulate.py: its decide part on a tiny fleet builds the three cases,
times them beside the baseline, and its own check (each case gave the action it was built
for) passes."""

from __future__ import annotations

import pytest

from tests.unit.helpers import load_bench


@pytest.mark.timeout(60)
def test_bench_simulate_decide_small_run_checks_ok(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--part", "decide", "--nodes", "50", "--instances", "5", "--models", "20"]
    rc = load_bench("simulate").main([*argv, "--repeat", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "check: ok" in out
    assert "build: config" in out and "snapshot views" in out
    for case, action in (("quiet", "no action"), ("breach", "Lend "), ("calm", "Return lease")):
        (line,) = [ln for ln in out.splitlines() if ln.startswith(case + " ")]
        # decide median and p95, the baseline's median and p95, the ratio, the actions
        assert line.count(" ms") == 4 and "x  " + action in line, line


@pytest.mark.timeout(120)
def test_bench_simulate_sim_part_prints_both_policies(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("simulate")
    if not (bench.TRACES / "azure_llm_conv_2023.csv").is_file():
        pytest.skip("the shared traces are not next to the checkout")
    rc = bench.main(["--part", "sim", "--sim-nodes", "256", "--sim-days", "0.02"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [ln.split() for ln in out.splitlines() if ln.lstrip().startswith("256")]
    assert [r[3] for r in rows] == ["separate-peak", "bridge"], out
    assert rows[0][-1] == "1.00x" and float(rows[1][-1].rstrip("x")) > 0
    assert float(rows[1][5]) > 0  # simulated days per wall second
    assert out.splitlines()[-1].startswith("RESULT sim_256_baseline_days_per_s=")


@pytest.mark.timeout(120)
def test_bench_simulate_speed_part_checks_the_proof_changes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_bench("simulate")
    if not (bench.TRACES / "azure_llm_conv_2023.csv").is_file():
        pytest.skip("the shared traces are not next to the checkout")
    argv = ["--part", "speed", "--speed", "256:0.05", "--speed-baseline-days", "0.02"]
    rc = bench.main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    (row,) = [ln.split() for ln in out.splitlines() if ln.lstrip().startswith("256")]
    assert row[5] == "met" and row[-1] == "yes", out  # within 60 s; the same result
    last = out.splitlines()[-1]
    assert last.startswith("RESULT speed_256_0.05d_wall_s=")
    assert "speed_256_0.05d_same_result=yes" in last
