"""The layering and the linters, checked with every test run: import-linter's contracts
(the policy imports no adapter; accounting does not import the daemon), ruff and mypy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.paths import project_root

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [["lint-imports"], ["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["import-linter", "ruff", "ruff-format", "mypy"],
)
def test_static_check_passes(argv: list[str]) -> None:
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=project_root(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
