"""Small helpers shared by unit tests: loading a bench script as a module, checking that
an HTML report loads nothing from outside itself, writing an API tokens file."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from bridge.paths import project_root


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as a module (bench/ is scripts, not a package)."""
    path = project_root() / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def assert_refs_stay_inside(page: str) -> None:
    """No src/href/url() outside the page, no script, link or import, no http(s) address
    except XML namespaces."""
    for value in re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page):
        assert value.startswith("#"), f"reference out of the page: {value!r}"
    assert re.findall(r"url\(\s*(?!['\"]?#)", page) == []
    assert "<script" not in page.lower() and "@import" not in page and "<link" not in page
    without_ns = re.sub(r"""\sxmlns(?::\w+)?\s*=\s*"[^"]*\"""", "", page)
    assert "http://" not in without_ns and "https://" not in without_ns


def write_tokens(path: Path, tokens: dict[str, tuple[str, str]]) -> Path:
    """A tokens file (mode 0600) of name -> (roles, token)."""
    path.write_text("".join(f"{n} {roles} {tok}\n" for n, (roles, tok) in tokens.items()))
    path.chmod(0o600)
    return path
