"""No test module or conftest imports a test module or a conftest: what tests share lives in
helper modules (tests/unit/helpers.py, tests/db/helpers.py, tests/lab/fixtures.py, ...), so
a test file is collected once, as itself, and pytest alone decides which conftest applies."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported(text: str, path: Path) -> list[str]:
    """The dotted modules the file `path` (holding `text`) imports, relative ones resolved."""
    package = ["tests", *path.parent.relative_to(TESTS).parts]
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            out.append(module)
            out += [f"{module}.{alias.name}" for alias in node.names]  # `from . import x`
    return out


def _test_modules(text: str, path: Path) -> list[str]:
    return sorted(
        {
            m
            for m in _imported(text, path)
            if m.split(".")[0] == "tests"
            and any(p.startswith("test_") or p == "conftest" for p in m.split("."))
        }
    )


def test_no_test_file_imports_a_test_module_or_a_conftest() -> None:
    files = [p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts]
    assert len(files) > 100  # the suite itself, not an empty folder
    offenders = {
        str(p.relative_to(TESTS.parent)): bad
        for p in files
        if (bad := _test_modules(p.read_text(), p))
    }
    assert offenders == {}


def test_the_check_sees_absolute_relative_and_package_imports() -> None:
    text = (
        "from .test_planner import job\n"
        "from tests.lab.conftest import bridge\n"
        "from . import test_rollouts\n"
        "import tests.db.test_schema\n"
        "from .helpers import load_bench\n"
        "from tests.lab.helpers import until\n"
    )
    assert _test_modules(text, TESTS / "unit" / "test_x.py") == [
        "tests.db.test_schema",
        "tests.lab.conftest",
        "tests.lab.conftest.bridge",
        "tests.unit.test_planner",
        "tests.unit.test_planner.job",
        "tests.unit.test_rollouts",
    ]
