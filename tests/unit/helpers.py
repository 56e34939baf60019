"""Small helpers shared by unit tests: loading a bench script as a module, checking that
an HTML report loads nothing from outside itself, writing an API tokens file, writing
ledger rows directly, a model's source directory to publish."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

from sqlalchemy import Engine, insert

from accounting.attribution import Entry
from accounting.rollup import DayDelta
from accounting.tables import LEDGER
from bridge.db import write_transaction
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


def insert_entries(engine: Engine, entries: list[Entry], source: str = "test") -> None:
    """Ledger rows and their daily roll-up, as an ingest writes them."""
    days = DayDelta()
    with write_transaction(engine) as conn:
        for e in entries:
            row = {f: getattr(e, f) for f in Entry.__slots__ if f != "user"}  # type: ignore[attr-defined]
            conn.execute(
                insert(LEDGER),
                row | {"user_name": e.user, "day": e.bucket.date(),
                       "month": e.bucket.strftime("%Y-%m"), "source": source},
            )  # fmt: skip
            cell = (e.bucket.date(), e.cluster, e.pool, e.partition, e.workload, e.account,
                    e.team, e.model, e.gpu_type, e.qos, e.lease)  # fmt: skip
            days.add_cells([(cell, e.gpu_ms)])
        days.apply(conn)


#: the lab's `echo` model's config.pbtxt without its name line
ECHO_CONFIG = (
    (project_root() / "triton_repo" / "echo" / "config.pbtxt")
    .read_text()
    .replace('name: "echo"\n', "")
)


def model_dir(tmp: Path, config: str = ECHO_CONFIG, files: dict[str, str] | None = None) -> Path:
    """A model's source directory (tmp/src, made anew): its config.pbtxt and files (by
    default a one-line model.py)."""
    d = tmp / "src"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    for name, text in (files or {"model.py": "# a model\n"}).items():
        (d / name).write_text(text)
    return d
