"""`stb simulate`'s option pairs (`bridge.sim.options.PAIRS`) through the real CLI: every
pair of the table, its option given where its deciders leave it unread, is refused with
exit 2, one line naming both options, nothing written and nothing read (the files it
names do not exist); every file that implies its kind, given alone, is honoured: that
kind reads it, and the report says so. Also `settle` on literal options."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bridge.cli import app
from bridge.sim.options import PAIRS, OptionClash, Pair, flags, settle

RUN = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "data"
SITE = DATA / "site"
RANGE = SITE / "prometheus-rate-range.json"
SERVICE = SITE / "prometheus-service.json"
SACCT = SITE / "sacct-site-22.05.json"
#: a file the refused run must not read (it does not exist: reading it would say so)
GONE = "{tmp}/gone"
A, B = "2026-11-30T00:00:00Z", "2026-11-30T01:00:00Z"

#: per pair (its option, its deciders): a command line where the deciders leave it unread
REFUSED: dict[tuple[str, tuple[str, ...]], list[str]] = {
    ("--arrivals-trace", ("--arrivals",)): ["--arrivals", "ramps", "--arrivals-trace", GONE],
    ("--arrivals-file", ("--arrivals",)): ["--arrivals", "synthetic", "--arrivals-file", GONE],
    ("--prometheus-json", ("--arrivals",)): ["--arrivals", "csv", "--prometheus-json", GONE],
    ("--query", ("--arrivals", "--prometheus-url")): [
        "--arrivals", "prometheus", "--prometheus-json", GONE, "--query", "up",
    ],
    ("--prometheus-url", ("--arrivals", "--service-from")): [
        "--arrivals", "ramps", "--service-from", "options", "--prometheus-url", "http://x:9090",
    ],
    ("--prometheus-save", ("--arrivals", "--prometheus-url")): [
        "--arrivals", "prometheus", "--prometheus-json", GONE, "--prometheus-save", GONE,
    ],
    ("--scale", ("--arrivals",)): ["--arrivals", "synthetic", "--scale", "2"],
    ("--max-gap-s", ("--arrivals",)): ["--arrivals", "ramps", "--max-gap-s", "30"],
    ("--models", ("--arrivals",)): ["--arrivals", "csv", "--arrivals-file", GONE, "--models", "2"],
    ("--mean-rps", ("--arrivals",)): [
        "--arrivals", "prometheus", "--prometheus-json", GONE, "--mean-rps", "10",
    ],
    ("--jobs-trace", ("--jobs",)): ["--jobs", "synthetic", "--jobs-trace", GONE],
    ("--sacct-json", ("--jobs",)): ["--jobs", "ledger", "--sacct-json", GONE],
    ("--load", ("--jobs",)): ["--jobs", "sacct", "--sacct-json", GONE, "--load", "0.5"],
    ("--partition-kind", ("--jobs",)): ["--jobs", "alibaba", "--partition-kind", "gpu=training"],
    ("--ledger-url", ("--jobs", "--service-from")): [
        "--jobs", "synthetic", "--service-from", "options", "--ledger-url", "sqlite:///x.db",
    ],
    ("--seed", ("--arrivals", "--jobs")): [
        "--arrivals", "csv", "--arrivals-file", GONE, "--jobs", "sacct", "--sacct-json", GONE,
        "--seed", "3",
    ],
    ("--service-json", ("--service-from",)): ["--service-from", "ledger", "--service-json", GONE],
    ("--fleet-partitions", ("--fleet-nodes",)): ["--fleet-partitions", GONE],
    ("--nodes", ("--fleet-nodes",)): ["--fleet-nodes", GONE, "--nodes", "4"],
    ("--since", ("--until", "--arrivals", "--jobs", "--service-from")): [
        "--arrivals", "synthetic", "--jobs", "synthetic", "--since", A,
    ],
    ("--until", ("--since", "--arrivals", "--jobs", "--service-from")): ["--until", B],
    ("--days", ("--since", "--until")): ["--since", A, "--until", B, "--days", "1"],
    ("--days", ("--arrivals", "--prometheus-json", "--since", "--until")): [
        "--arrivals", "csv", "--arrivals-file", GONE, "--days", "1",
    ],
    ("--reserve", ("--policies", "--tradeoff")): [
        "--policies", "separate-peak,idle-loan", "--tradeoff", "none", "--reserve", "peak",
    ],
    ("--lend-cap", ("--policies", "--tradeoff")): [
        "--policies", "separate-peak", "--tradeoff", "none", "--lend-cap", "share:0.5",
    ],
}  # fmt: skip


def _id(pair: Pair) -> str:
    return f"{pair.option} by {','.join(pair.deciders)}"


def test_every_pair_has_a_refused_case_and_names_real_options() -> None:
    """A pair added to the table without a case here fails; so does a flag the command
    does not have (the table would read it as never given)."""
    assert sorted(REFUSED) == sorted((p.option, p.deciders) for p in PAIRS)
    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    simulate = command.get_command(None, "simulate")  # type: ignore[arg-type]
    options = {o for p in simulate.params for o in p.opts}
    assert flags() <= options, flags() - options


@pytest.mark.parametrize("pair", PAIRS, ids=_id)
def test_an_option_its_deciders_leave_unread_is_refused_naming_both(
    tmp_path: Path, pair: Pair
) -> None:
    out = tmp_path / "out.json"
    args = [a.replace("{tmp}", str(tmp_path)) for a in REFUSED[pair.option, pair.deciders]]
    res = RUN.invoke(app, ["simulate", "--format", "json", "-o", str(out), *args])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith(f"error: {pair.option} is read only {pair.needs}; here "), line
    for decider in pair.deciders:
        assert f" {decider} " in line, (decider, line)
    assert line.endswith("so it would be ignored") and "\n" not in line
    assert res.stdout == "" and list(tmp_path.iterdir()) == []


def _azure(path: Path) -> Path:
    """A tiny Azure LLM trace: a request every 0.1 s to 2 s for ten minutes."""
    t0 = datetime(2023, 11, 16, 18, 0, tzinfo=UTC)
    rows, t, k = ["TIMESTAMP,ContextTokens,GeneratedTokens"], 0.0, 0
    while t < 600:
        when = (t0 + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        rows.append(f"{when},100,10")
        k += 1
        t += 0.1 + (k % 20) * 0.1
    path.write_text("\n".join(rows) + "\n")
    return path


def _alibaba(path: Path) -> Path:
    """A tiny Alibaba GPU pod list: 200 tasks of 1-8 GPUs, each 10 min to 2 h."""
    rows = ["name,num_gpu,qos,creation_time,scheduled_time,deletion_time"]
    for i in range(200):
        start = i * 60
        rows.append(f"p{i},{1 + i % 8},{'BE' if i % 3 else 'LS'},{start},{start},"
                    f"{start + 600 + (i % 12) * 600}")  # fmt: skip
    path.write_text("\n".join(rows) + "\n")
    return path


def _rates(path: Path) -> Path:
    """A site's arrivals as a CSV: two models, an hour at 5 s."""
    t0 = datetime.fromisoformat(A)
    rows = ["time,model,rate"] + [
        f"{(t0 + timedelta(seconds=5 * k)).isoformat()},{m},{r}"
        for k in range(720)
        for m, r in (("busy", 20), ("echo", 40))
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


GENERATED = ["--models", "2", "--mean-rps", "150"]


@pytest.mark.parametrize(
    ("args", "decider", "kind", "read"),
    [
        (
            lambda tmp: [*GENERATED, "--arrivals-trace", str(_azure(tmp / "azure.csv"))],
            "--arrivals", "azure", lambda s: s["arrivals"]["trace"] == "azure.csv",
        ),
        (
            lambda tmp: ["--arrivals-file", str(_rates(tmp / "rates.csv"))],
            "--arrivals", "csv", lambda s: s["arrivals"]["file"] == "rates.csv",
        ),
        (
            lambda tmp: ["--prometheus-json", str(RANGE)],
            "--arrivals", "prometheus", lambda s: s["arrivals"]["file"] == RANGE.name,
        ),
        (
            lambda tmp: [*GENERATED, "--days", "0.02", "--jobs-trace",
                         str(_alibaba(tmp / "alibaba.csv"))],
            "--jobs", "alibaba", lambda s: s["batch_jobs"]["trace"] == "alibaba.csv",
        ),
        (
            lambda tmp: [*GENERATED, "--sacct-json", str(SACCT)],
            "--jobs", "sacct", lambda s: s["batch_jobs"]["files"] == [SACCT.name],
        ),
        (
            lambda tmp: [*GENERATED, "--days", "0.02", "--service-json", str(SERVICE)],
            "--service-from", "prometheus",
            lambda s: s["model_inputs"]["m0"]["service_from"].startswith(
                f"--service-ms (prometheus answer {SERVICE.name}"
            ),
        ),
    ],
    ids=["arrivals-trace", "arrivals-file", "prometheus-json", "jobs-trace", "sacct-json",
         "service-json"],
)  # fmt: skip
def test_a_file_given_alone_chooses_the_kind_that_reads_it(
    tmp_path: Path, args: object, decider: str, kind: str, read: object
) -> None:
    assert callable(args) and callable(read)
    argv = ["simulate", "--policies", "bridge", "--tradeoff", "none", *args(tmp_path)]
    if "--fleet-nodes" not in argv:
        argv += ["--nodes", "16"]
    if "--days" not in argv and not {"--arrivals-file", "--prometheus-json"} & set(argv):
        argv += ["--days", "0.02"]
    res = RUN.invoke(app, [*argv, "--format", "json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["scenario"]
    option = next(a for a in argv if a in {p.option for p in PAIRS if p.implies})
    assert s["implied"] == {decider: option}
    source = {"--arrivals": "arrivals", "--jobs": "batch_jobs"}.get(decider)
    if source is not None:
        assert s[source]["source"] == kind
    assert read(s), s
    if source is not None:  # the table's inputs line says so
        table = RUN.invoke(app, argv)
        assert table.exit_code == 0, table.output
        assert f"{kind} {source.replace('batch_', '')} (implied by {option})" in table.stdout


def test_a_kind_given_is_never_overridden_by_a_file() -> None:
    res = RUN.invoke(app, ["simulate", "--arrivals", "synthetic", "--arrivals-trace", "x.csv"])
    assert res.exit_code == 2
    assert "--arrivals-trace is read only with --arrivals azure; here --arrivals synthetic" in (
        res.output
    )


# -- settle on literal options -------------------------------------------------------------

DEFAULTS: dict[str, object] = {f: None for f in flags()} | {
    "--arrivals": "synthetic",
    "--jobs": "synthetic",
    "--service-from": "options",
    "--policies": "separate-peak,idle-loan,bridge",
    "--tradeoff": "auto",
}


def test_settle_implies_a_kind_only_when_it_was_not_given() -> None:
    values = DEFAULTS | {"--arrivals-trace": Path("a.csv")}
    done = settle(values, {"--arrivals-trace"})
    assert done.values["--arrivals"] == "azure"
    assert done.implied == {"--arrivals": "--arrivals-trace"}
    with pytest.raises(OptionClash, match="here --arrivals synthetic, so it would be ignored"):
        settle(values, {"--arrivals-trace", "--arrivals"})
    assert settle(DEFAULTS, set()).implied == {}


def test_two_files_that_imply_different_kinds_are_refused_naming_the_first() -> None:
    values = DEFAULTS | {"--arrivals-trace": Path("a.csv"), "--arrivals-file": Path("r.csv")}
    with pytest.raises(OptionClash) as caught:
        settle(values, {"--arrivals-trace", "--arrivals-file"})
    assert str(caught.value) == (
        "--arrivals-file is read only with --arrivals csv; here --arrivals azure (implied by "
        "--arrivals-trace), so it would be ignored"
    )


def test_an_option_at_its_value_but_not_given_is_not_refused() -> None:
    """Defaults are never refused: only what the command line gave."""
    values = DEFAULTS | {"--arrivals": "csv", "--models": 4, "--mean-rps": 3000.0, "--seed": 0}
    assert settle(values, {"--arrivals"}).values == values
