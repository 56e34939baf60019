"""The model catalog: every model's effective facts, read from the Triton model repository
(`PublishedModels`: each config.pbtxt parsed again only when it changed) and merged with
the TOML's `[models]` overrides by the one merge, `bridge.modelfacts.merge_models`.

The daemon's observer asks it each tick (a model published since the last tick is in the
next one's facts, and so scaled, with no restart); each override, warning, problem and
unscaled model is logged once. `site_models` is the one-shot read for the commands and
tools (`stb config check`, `stb status`, `stb lend`, the advisory report, the lab twin).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from bridge.config import BridgeConfig, ModelOverride
from bridge.modelfacts import ModelFacts, Published, merge_models
from bridge.triton.repository import PublishedModels

log = logging.getLogger(__name__)


class ModelCatalog:
    """The repository at `root` merged with `overrides`; `facts()` reads it again."""

    def __init__(
        self, root: Path, overrides: Mapping[str, ModelOverride], *, say: bool = True
    ) -> None:
        self.root = root
        self._overrides = dict(overrides)
        self._published = PublishedModels(root)
        self._say = say
        self._said: set[str] = set()
        self._lock = threading.Lock()
        self._last: tuple[dict[str, Published] | None, ModelFacts] | None = None

    @classmethod
    def of(cls, config: BridgeConfig, *, say: bool = True) -> ModelCatalog:
        return cls(config.triton.model_repository, config.models, say=say)

    def facts(self) -> ModelFacts:
        """The effective facts now (merged again only when a config.pbtxt changed)."""
        published = self._published.read()
        with self._lock:
            if self._last is not None and _same(self._last[0], published):
                return self._last[1]
            note = (
                ""
                if published is not None
                else f"the model repository {self.root} is not a folder: the models are the "
                "TOML's [models] alone"
            )
            facts = merge_models(
                published, self._overrides, f"the model repository {self.root}", note
            )
            self._last = (published, facts)
            if self._say:
                self._log(facts)
            return facts

    def _log(self, facts: ModelFacts) -> None:
        loud = {facts.repository_note, *facts.problems}
        for fact in facts.facts.values():
            loud.update(fact.warnings)
        for line in facts.notes():
            if line in self._said:
                continue
            self._said.add(line)
            (log.warning if line in loud else log.info)("%s", line)


def _same(a: Mapping[str, Published] | None, b: Mapping[str, Published] | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def site_models(config: BridgeConfig) -> ModelFacts:
    """The effective facts of `config`'s models, its repository read once (nothing
    logged): for the commands and tools that show or replay the daemon's view."""
    return ModelCatalog.of(config, say=False).facts()
