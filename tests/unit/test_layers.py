"""The import-linter `layers` contract names every package and loose module of `bridge`
(and the ledger, `accounting`): a new package cannot float free of the layering."""

from __future__ import annotations

import tomllib

from bridge.paths import project_root


def _layered() -> set[str]:
    doc = tomllib.loads((project_root() / "pyproject.toml").read_text())
    (layers,) = [
        c["layers"] for c in doc["tool"]["importlinter"]["contracts"] if c["type"] == "layers"
    ]
    return {m.strip() for layer in layers for m in layer.replace(":", "|").split("|")}


def _top_level() -> set[str]:
    root = project_root() / "bridge"
    names = {f"bridge.{p.stem}" for p in root.glob("*.py") if p.stem != "__init__"}
    names |= {f"bridge.{p.parent.name}" for p in root.glob("*/__init__.py")}
    return names | {"accounting"}


def test_every_package_and_loose_module_is_in_a_layer() -> None:
    missing = _top_level() - _layered()
    assert not missing, f"not in the layers contract (pyproject.toml): {sorted(missing)}"


def test_the_layers_name_nothing_that_is_gone() -> None:
    gone = _layered() - _top_level()
    assert not gone, f"the layers contract names modules that do not exist: {sorted(gone)}"
