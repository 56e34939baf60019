"""The documentation stays true: the MkDocs site (`docs/`, `mkdocs.yml`) builds with
`--strict` (no broken link or anchor, every page in the nav) and has every audience's
pages, the generated configuration reference and the included READMEs whole; the README
stays a one-page entry with both of its commands; the architecture page names only paths
that exist and every package under `bridge/`; every `stb` command shown in a code block of
the docs or the README is a real command with options it has."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from bridge.cli import app
from bridge.config import BridgeConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: the pages each audience is promised (the issue's list), as built (`PAGE/index.html`)
AUDIENCE_PAGES = (
    "operators/install",
    "operators/init",
    "operators/configuration",
    "operators/ha",
    "operators/security",
    "operators/upgrades",
    "operators/slurm-releases",
    "models/publishing",
    "models/rollouts",
    "models/slos",
    "models/status",
    "finance/reports",
    "finance/sreport",
    "finance/budgets",
    "simulator",
    "selection",
    "architecture",
    "benchmarks",
)

#: the README's two commands for a fresh machine; `.ci/run` runs the second
DEMO_COMMAND = "./deploy/bootstrap.sh && .venv/bin/stb lab demo"
TEST_COMMAND = "./deploy/bootstrap.sh && .venv/bin/python -m pytest"

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_REPO_PATH = re.compile(r"^(?:bridge|accounting)/[A-Za-z0-9_./-]*$")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = ["build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", *build],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    return out


def test_site_builds_with_every_audience_page(site: Path) -> None:
    missing = [page for page in AUDIENCE_PAGES if not (site / page / "index.html").is_file()]
    assert missing == [], f"pages not in the built site: {missing}"


def test_configuration_reference_lists_every_setting(site: Path) -> None:
    """The reference is generated (docs/hooks/config_reference.py): every field of every
    section is on the built page, under its section's heading."""
    page = (site / "operators" / "configuration" / "index.html").read_text()
    assert "stb:config-reference" not in page, "the reference marker was not replaced"
    absent = []
    for name, field in BridgeConfig.model_fields.items():
        section = field.annotation
        args = getattr(section, "__args__", ())
        if args:  # dict[str, Model]: a table per name
            section = args[-1]
        fields = getattr(section, "model_fields", {name: field})
        absent += [f"{name}.{key}" for key in fields if f"<code>{key}</code>" not in page]
    assert absent == [], f"settings missing from the configuration reference: {absent}"


#: built page -> the README it shows (docs/hooks/include.py)
INCLUDED = {
    "benchmarks": "bench/README.md",
    "faults": "tests/faults/README.md",
    "operators/slurm-plugins": "slurm_plugins/README.md",
}
_LIST_ITEM = re.compile(r"^ *([-*+]|\d+[.)]) +")
_FENCE_LINE = re.compile(r"^ *(```|~~~)")


@pytest.mark.parametrize("page", sorted(INCLUDED))
def test_included_readme_keeps_every_list_item(site: Path, page: str) -> None:
    """A README written for GitHub's lists shows every item as an item on its page, none
    run into a paragraph as text (Python-Markdown's stricter lists)."""
    items, fenced = 0, False
    for line in (ROOT / INCLUDED[page]).read_text().splitlines():
        if _FENCE_LINE.match(line):
            fenced = not fenced
        elif not fenced and _LIST_ITEM.match(line):
            items += 1
    html = (site / page / "index.html").read_text()
    body = html[html.index("<article") : html.index("</article>")]
    assert "stb:include" not in body, f"{page}: the include marker was not replaced"
    assert body.count("<li") == items, f"{page}: {body.count('<li')} list items, README {items}"


def test_readme_is_one_page_with_both_commands() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"
    assert DEMO_COMMAND in lines, f"README.md lacks the line {DEMO_COMMAND!r}"
    assert TEST_COMMAND in lines, f"README.md lacks the line {TEST_COMMAND!r}"
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert ci and all(line in lines for line in ci), f".ci/run's {ci} is not the README's"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert any(link.startswith("docs/") for link in links), "README.md links into no page"
    broken = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert broken == [], f"README.md links to files that do not exist: {broken}"


def _spans(path: Path) -> Iterator[str]:
    yield from _CODE_SPAN.findall(path.read_text())


def test_architecture_page_names_only_paths_that_exist() -> None:
    page = DOCS / "architecture.md"
    named = {span for span in _spans(page) if _REPO_PATH.match(span)}
    assert named, "docs/architecture.md names no bridge/ or accounting/ path"
    gone = sorted(span for span in named if not (ROOT / span).exists())
    assert gone == [], f"docs/architecture.md names paths that do not exist: {gone}"


def test_architecture_page_names_every_bridge_package() -> None:
    named = {span.rstrip("/") for span in _spans(DOCS / "architecture.md")}
    packages = sorted(
        init.parent.relative_to(ROOT).as_posix()
        for init in (ROOT / "bridge").rglob("__init__.py")
        if "__pycache__" not in init.parts and init.parent != ROOT / "bridge"
    )
    assert packages, "no package found under bridge/"
    unnamed = [pkg for pkg in packages if pkg not in named]
    assert unnamed == [], f"packages not on docs/architecture.md: {unnamed}"


def _doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_paths_in_the_docs_exist() -> None:
    """Every `bridge/...` or `accounting/...` path any page or the README writes in
    backticks exists: a module moved without its docs fails here, naming the page."""
    gone = [
        f"{path.relative_to(ROOT)}: {span}"
        for path in _doc_files()
        for span in sorted(set(_spans(path)))
        if _REPO_PATH.match(span) and not (ROOT / span).exists()
    ]
    assert gone == [], "paths in the docs that do not exist:\n" + "\n".join(gone)


def _stb_examples(path: Path) -> Iterator[list[str]]:
    """The argument lists after `.venv/bin/stb` on each command line of a code block."""
    for block in _FENCE.findall(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            starts = [i for i, word in enumerate(words) if word.endswith(".venv/bin/stb")]
            if starts:
                yield [word.strip("[]") for word in words[starts[0] + 1 :]]


def _problem(root: Any, args: list[str]) -> str | None:
    """Why `stb ARGS` would not parse, or None. Duck-typed on click's command objects
    (typer ships its own copy of click): a group has `commands`, an option `opts`."""
    command, path = root, ["stb"]
    # a group's subcommands through get_command: stb's own group loads them when named
    while args and hasattr(command, "get_command"):
        sub = command.get_command(None, args[0])
        if sub is None:
            break
        command = sub
        path.append(args.pop(0))
    if hasattr(command, "commands") and not getattr(command, "invoke_without_command", False):
        return f"`{' '.join(path)}` needs a subcommand, got {args[:1]}"
    options = {
        opt: param
        for param in command.params
        if param.param_type_name == "option"
        for opt in (*param.opts, *param.secondary_opts)
    }
    words = iter(args)
    for word in words:
        if not re.match(r"^--?[A-Za-z]", word):
            continue  # an argument, or a value such as -2h
        option = options.get(word.split("=", 1)[0])
        if option is None:
            return f"`{' '.join(path)}` has no option {word}"
        if not option.is_flag and "=" not in word:
            next(words, None)  # its value
    return None


def test_stb_examples_are_real_commands() -> None:
    root = get_command(app)
    seen = 0
    problems = []
    for path in _doc_files():
        for args in _stb_examples(path):
            seen += 1
            problem = _problem(root, list(args))
            if problem:
                problems.append(f"{path.relative_to(ROOT)}: stb {' '.join(args)}: {problem}")
    assert seen > 50, f"only {seen} stb examples found in the docs"
    assert problems == [], "stb examples that would not run:\n" + "\n".join(problems)
