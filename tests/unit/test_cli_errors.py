"""Every `stb` command's failure path prints the exception's words as they are: a table
of commands and arguments that fail (a missing or invalid configuration, bad option
values, missing or unreadable files, a held lock, the launcher's missing-pytriton error
with its `[triton]` and `[lab]`), each run through the real CLI and its printed text
compared with the message of the exception the failing call raises, brackets included.
Paths and values carry brackets (`[lab]`, `[gpu]`) so that markup would show. Also a
few values from input on the success path (`bridge.cli_text`), and every command's help
(typer reads it as markup too)."""

from __future__ import annotations

import contextlib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from accounting.budget import parse_amount
from accounting.rates import parse_price
from accounting.report import Window
from bridge.cli import app
from bridge.config import load_config
from bridge.daemon.launcher import triton_home
from bridge.daemon.service import single_instance
from bridge.http.auth import add_token
from bridge.ledger.cli import parse_time
from bridge.load.arrivals import read_trace
from bridge.models.repo import ModelRepository, check_source
from bridge.models.status import check_known
from bridge.sim.inputs.arrivals import arrivals_from_csv
from bridge.sim.options import PAIRS
from bridge.sim.render import Grid, rich_table

#: wide enough that typer's error panel never wraps a message
RUN = CliRunner(env={"COLUMNS": "1000"})


def _raised(call: Callable[[], object]) -> str:
    """The message of the exception `call` raises."""
    with pytest.raises(Exception) as caught:  # any: its words are the point
        call()
    return str(caught.value)


@dataclass(frozen=True)
class Case:
    """A command that fails: its arguments (`{tmp}`: the test's folder), the message it
    must print (from the exception the failing call raises), its exit code, and where
    the message goes: after `error: ` (the commands' own error line, on stderr), or in
    typer's usage-error panel (`panel`: a bad option value)."""

    args: list[str]
    message: Callable[[Path], str]
    code: int = 1
    panel: bool = False
    #: a context the command runs inside (a lock held by another daemon)
    during: Callable[[Path], contextlib.AbstractContextManager[Any]] | None = None


def _held(tmp: Path) -> contextlib.AbstractContextManager[Any]:
    return single_instance(tmp / "[run]" / "daemon.lock")


def _lock_message(tmp: Path) -> str:
    with single_instance(tmp / "[run]" / "daemon.lock"):
        return _raised(lambda: single_instance(tmp / "[run]" / "daemon.lock").__enter__())


NODES_PAIR = next(p for p in PAIRS if p.option == "--nodes")

CASES: dict[str, Case] = {
    "lab up, no pytriton": Case(
        ["lab", "up", "--dir", "{tmp}/[lab]", "--no-install"], lambda tmp: _raised(triton_home)
    ),
    "lab demo, no config": Case(
        ["lab", "demo", "--dir", "{tmp}/[lab]", "-c", "{tmp}/[gone].toml"],
        lambda tmp: _raised(lambda: load_config(tmp / "[gone].toml")),
    ),
    "status, invalid config": Case(
        ["status", "-c", "{tmp}/[bad].toml"],
        lambda tmp: _raised(lambda: load_config(tmp / "[bad].toml")),
    ),
    "daemon, lock held": Case(["daemon", "-c", "{tmp}/[site].toml"], _lock_message, during=_held),
    "lend, unknown model": Case(
        ["lend", "n1", "--models", "[gpu]", "-c", "{tmp}/[site].toml", "--wait", "0"],
        lambda tmp: "unknown models [gpu]; known: ",
    ),
    "place, unknown model": Case(
        ["place", "1", "[gpu]", "-c", "{tmp}/[site].toml", "--wait", "0"],
        lambda tmp: "unknown models [gpu]; known: ",
    ),
    "drain, unknown pool": Case(
        ["drain", "[gpu]", "-c", "{tmp}/[site].toml"],
        lambda tmp: "no pool '[gpu]'; configured: ",
    ),
    "token, no folder": Case(
        [
            "token",
            "ops",
            "--roles=operator",
            "--file",
            "{tmp}/[x]/tokens",
            "-c",
            "{tmp}/[site].toml",
        ],
        lambda tmp: _raised(lambda: add_token(tmp / "[x]" / "tokens", "ops", {"operator"})),
    ),
    "init, no output folder": Case(
        ["init", "-o", "{tmp}/[x]/bridge.toml", "--partitions", "{tmp}/p", "--nodes", "{tmp}/n"],
        lambda tmp: f"--output {tmp}/[x]/bridge.toml: not a file in an existing directory",
    ),
    "resume, unknown pool": Case(
        ["resume", "[gpu]", "-c", "{tmp}/[site].toml"],
        lambda tmp: "no pool '[gpu]'; configured: ",
    ),
    "budget set, bad amount": Case(
        ["budget", "set", "ml", "[x]", "-c", "{tmp}/[site].toml"],
        lambda tmp: _raised(lambda: parse_amount("[x]")),
    ),
    "budget remove, no budget": Case(
        ["budget", "remove", "[ml]", "-c", "{tmp}/[site].toml"],
        lambda tmp: "team [ml] has no budget",
    ),
    "rates add, bad price": Case(
        [
            "accounting",
            "rates",
            "add",
            "--gpu-type",
            "h100",
            "--price",
            "[x]",
            "--from",
            "2026-01-01",
            "-c",
            "{tmp}/[site].toml",
        ],
        lambda tmp: _raised(lambda: parse_price("[x]")),
    ),
    "report, bad window": Case(
        ["report", "-c", "{tmp}/[site].toml", "--window", "[x]"],
        lambda tmp: _raised(lambda: Window.parse("[x]")),
    ),
    "ingest, bad time": Case(
        ["accounting", "ingest", "-c", "{tmp}/[site].toml", "--since", "[x]"],
        lambda tmp: _raised(lambda: parse_time("[x]", datetime.now(UTC), "--since")),
        code=2,
        panel=True,
    ),
    "advise report, bad window": Case(
        ["advise", "report", "-c", "{tmp}/[site].toml", "--window", "[x]"],
        lambda tmp: _raised(lambda: Window.parse("[x]")),
        code=2,
        panel=True,
    ),
    "models publish, no source folder": Case(
        ["models", "publish", "{tmp}/[src]", "--name", "x", "-c", "{tmp}/[site].toml"],
        lambda tmp: _raised(lambda: check_source(tmp / "[src]")),
    ),
    "accounting close, bad month": Case(
        ["accounting", "close", "[x]", "-c", "{tmp}/[site].toml"],
        lambda tmp: "not a month (YYYY-MM): '[x]'",
    ),
    "models status, unknown model": Case(
        ["models", "status", "[x]", "-c", "{tmp}/[site].toml", "--repository", "{tmp}/repo"],
        lambda tmp: _raised(lambda: check_known("[x]", ModelRepository(tmp / "repo"))),
        code=2,
        panel=True,
    ),
    "config check, invalid": Case(
        ["config", "check", "{tmp}/[bad].toml"],
        lambda tmp: _raised(lambda: load_config(tmp / "[bad].toml")).split("\n", 1)[1],
    ),
    "load, missing trace": Case(
        ["load", "-e", "127.0.0.1:1", "--trace", "{tmp}/[x].csv"],
        lambda tmp: _raised(lambda: read_trace(tmp / "[x].csv")),
        code=2,
    ),
    "simulate, missing arrivals file": Case(
        ["simulate", "--arrivals-file", "{tmp}/[lab]/rates.csv"],
        lambda tmp: _raised(lambda: arrivals_from_csv(tmp / "[lab]" / "rates.csv", step_s=5)),
        code=2,
    ),
    "simulate, invalid config": Case(
        ["simulate", "-c", "{tmp}/[bad].toml"],
        lambda tmp: _raised(lambda: load_config(tmp / "[bad].toml")),
        code=2,
    ),
    "simulate, an option that would go unread": Case(
        ["simulate", "--fleet-nodes", "{tmp}/[lab]/nodes.txt", "--nodes", "4"],
        lambda tmp: (
            f"--nodes is read only {NODES_PAIR.needs}; here --fleet-nodes "
            f"{tmp}/[lab]/nodes.txt, so it would be ignored"
        ),
        code=2,
    ),
}


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a valid configuration (`[site].toml`: SQLite files beside it), an
    invalid one (`[bad].toml`: a bad Triton runtime, an unknown key `[gpu]`), an empty model
    repository; pytriton missing, and `stb lab up` reaching the launcher at once."""
    (tmp_path / "[site].toml").write_text(
        f'database_url = "sqlite:///{tmp_path}/bridge.db"\n'
        f'[accounting]\nledger_url = "sqlite:///{tmp_path}/ledger.db"\n'
        f'[daemon]\nlock_file = "{tmp_path}/[run]/daemon.lock"\n'
    )
    (tmp_path / "[bad].toml").write_text('[triton]\nruntime = "[docker]"\n"[gpu]" = 1\n')
    (tmp_path / "repo").mkdir()
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "pytriton" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr("bridge.lab.lab.up", lambda spec, say, install=True: triton_home())
    return tmp_path


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_failing_command_prints_the_exceptions_words_verbatim(site: Path, case: Case) -> None:
    args = [a.replace("{tmp}", str(site)) for a in case.args]
    message = case.message(site)
    assert "[" in message  # the words markup would eat
    with case.during(site) if case.during else contextlib.nullcontext():
        res = RUN.invoke(app, args)
    assert res.exit_code == case.code, res.output
    if case.panel:
        assert message in res.stderr, res.stderr
    elif case.args[:2] == ["config", "check"]:  # the field lines of `FILE: invalid`
        said = [f"{site}/[bad].toml: invalid", *message.split("\n")]
        assert res.stdout.splitlines()[-len(said) :] == said, res.stdout
    else:
        assert f"error: {message}" in res.stderr, res.output
        assert res.stderr.startswith("error: "), res.stderr


def test_the_launchers_advice_names_the_extra_that_carries_pytriton(site: Path) -> None:
    """The words the console once ate: pyproject's `lab` extra carries nvidia-pytriton."""
    import tomllib

    from bridge.paths import project_root

    extras = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("nvidia-pytriton") for d in extras["lab"])
    res = RUN.invoke(app, ["lab", "up", "--dir", str(site / "lab"), "--no-install"])
    assert res.exit_code == 1
    assert "[triton] runtime = \"wheel\" (pip install 'slurm-triton-bridge[lab]'" in res.stderr


def test_a_value_from_input_prints_as_it_is(site: Path) -> None:
    """The success path: a team, a lab folder and a sim grid cell with brackets."""
    cfg = str(site / "[site].toml")
    set_ = RUN.invoke(app, ["budget", "set", "[ml]", "100", "-c", cfg])
    assert set_.exit_code == 0, set_.output
    assert "budget of [ml]: 100 GPU-hours per month" in set_.stderr
    shown = RUN.invoke(app, ["budget", "status", "-c", cfg])
    assert shown.exit_code == 0 and "│ [ml] " in shown.stdout, shown.output
    lab = RUN.invoke(app, ["lab", "status", "--dir", str(site / "[lab]")])
    assert lab.exit_code == 1 and f"no lab at {site}/[lab];" in lab.stdout
    console = Console(record=True, width=200)
    console.print(rich_table(Grid("[t]", ("[h]", "n"), (("[gpu:1]", "2"),), caption="[c]")))
    text = console.export_text()
    assert all(w in text for w in ("[t]", "[h]", "[gpu:1]", "[c]")), text


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    subs = getattr(command, "commands", None)
    if subs is None:
        return [(path, command)]
    return [leaf for name, sub in subs.items() for leaf in _commands(sub, [*path, name])]


def test_every_commands_help_keeps_its_bracketed_words() -> None:
    """typer reads help text as markup: `[accounting] ledger_url` or `-N[mhd]` written
    plainly would lose its brackets (and the words in them); written `\\[` they stay."""
    root = typer.main.get_command(app)
    lost = []
    for path, command in _commands(root, []):
        shown = RUN.invoke(app, [*path, "--help"])
        assert shown.exit_code == 0, (path, shown.output)
        flat = " ".join(shown.output.replace("│", " ").split())
        helps = [p.help for p in command.params if getattr(p, "help", None)]
        for text in [*helps, command.help or ""]:
            for word in re.findall(r"\[[^\]\s]*\]", text.replace("\\[", "[")):
                if word not in flat:
                    lost.append((" ".join(path), word))
    assert lost == []
