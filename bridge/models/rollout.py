"""A gradual rollout's repository and Triton steps: `start` (the publish with a step plan),
then, carried out by the daemon's rollout driver (`bridge.daemon.rollouts`), `activate`,
`promote` and `abandon`. Each holds the repository's publish lock, journals what it did
(`bridge.models.history`) and is idempotent, so a driver that died half-way through one
does it again.

Triton keeps one config per model and serves the versions its `version_policy` names, so
the versions beside each other are set by the config Triton reads:
- `start`: the new version is written (its own config kept in the archive), and Triton
  reads the new config pinned to the old version (`specific [old]`): nothing loads the new
  version yet, not even a server that starts now;
- `activate`: pinned to both (`specific [old, new]`), loaded on every server holding the
  model, the new version checked to answer on each (and, with `--checks`, to answer the
  recorded requests as expected: `bridge.models.checks`); the split (routing) decides which
  unversioned request reaches which;
- `promote`: the new version's own config (its own policy, by default the latest), loaded:
  the old version is unloaded;
- `abandon`: the new version set aside in the archive, the old version's config back,
  loaded: the new version is unloaded.
The new config's parameters apply to the old version too while both serve (Triton has
one config per model): a rollout compares two versions' files under the new config.
The driver moves routing before each of the last two (all traffic to the version that
stays), so no request is sent to a version while it unloads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from bridge.leases.rollouts import Rollout, RolloutError, RolloutStore, busy
from bridge.models import checks, history
from bridge.models.publish import (
    PublishError,
    Server,
    check_answers,
    holders_of,
    journal,
    own_config_text,
    read_model,
)
from bridge.models.repo import ModelRepository
from bridge.policy.rollout import PlanError, parse_plan
from bridge.triton.repository import parse_config


def pinned(text: str, versions: Sequence[int]) -> str:
    """`text` (a config without a version policy) serving exactly `versions`."""
    listed = ", ".join(str(v) for v in sorted(versions))
    return f"{text.rstrip()}\nversion_policy: {{ specific: {{ versions: [{listed}] }} }}\n"


def start(
    repo: ModelRepository,
    store: RolloutStore,
    src: Path,
    name: str,
    plan: str,
    hold_s: float,
    *,
    now: datetime | None = None,
    why: str = "",
    who: str | None = None,
    checks_file: Path | None = None,
) -> Rollout:
    """Write the new version beside the served one and open its rollout (pending); the
    daemon does the rest. Refused, with nothing written, for a bad model or plan, a model
    with no version serving yet, a config with its own `version_policy`, or a model with a
    rollout open."""
    text, cfg, _ = read_model(src, name)
    try:
        parse_plan(plan, hold_s)
    except PlanError as exc:
        raise PublishError(f"--canary {plan!r}: {exc}") from exc
    where = src / "config.pbtxt"
    checks_text = None
    if checks_file is not None:
        try:
            checks_text = checks_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PublishError(f"--checks {checks_file}: {exc}") from exc
        checks.load(checks_text, cfg, str(checks_file))
    if cfg.HasField("version_policy"):
        raise PublishError(
            f"{where}: sets its own version_policy; a gradual rollout sets it (both versions "
            "while it runs): remove it, or publish without --canary"
        )
    who = who or history.actor()
    with repo.lock():
        old = repo.latest(name)
        if old is None:
            raise PublishError(
                f"{name} has no version serving: publish its first version without --canary"
            )
        if (open_ := store.open_of(name)) is not None:
            raise PublishError(busy(open_))
        new = old + 1
        own = own_config_text(text, cfg, name)
        if checks_text is not None:
            repo.save_checks(name, new, checks_text)
        change = repo.commit(name, repo.stage(name, src), new, own, pinned(own, [old]))
        try:
            row = store.start(name, old, new, plan, hold_s, now or history.now(), who=who, why=why)
        except (RolloutError, SQLAlchemyError) as exc:  # nothing stays half-written
            repo.revert(change, f"the rollout could not be stored: {exc}")
            raise PublishError(f"{name}: the rollout could not be stored: {exc}") from exc
        journal(repo, name, "canary", new, old, who, f"{plan}; {why}" if why else plan, [])
    return row


def activate(
    repo: ModelRepository, row: Rollout, servers: Sequence[Server], say: Callable[[str], None]
) -> list[str]:
    """Both versions loaded where the model is held, the new one answering on each.
    PublishError (or TritonError) if not: the driver then abandons the rollout."""
    name = row.model
    with repo.lock():
        own = _own_config(repo, name, row.new_version)
        repo.serve_config(name, pinned(own, [row.old_version, row.new_version]))
        holders = holders_of(servers, name)
        cfg = parse_config(own, f"{name} version {row.new_version}")
        text = repo.checks_of(name, row.new_version)
        recorded = checks.load(text, cfg, "the recorded checks") if text is not None else None
        for s in holders:
            s.client.load_model(name)
            check_answers(s, name, row.new_version, cfg)
            check_answers(s, name, row.old_version, cfg)
            if recorded is not None:
                checks.run(recorded, s, name, row.new_version, row.old_version)
            say(f"{name} versions {row.old_version} and {row.new_version} on {s.address}")
        return [s.address for s in holders]


def promote(repo: ModelRepository, row: Rollout, servers: Sequence[Server], why: str) -> list[str]:
    """The new version serves alone, with its own config; journalled as `promote`."""
    name = row.model
    with repo.lock():
        own = _own_config(repo, name, row.new_version)
        repo.serve_config(name, own)
        holders = holders_of(servers, name)
        cfg = parse_config(own, f"{name} version {row.new_version}")
        for s in holders:
            s.client.load_model(name)
            check_answers(s, name, row.new_version, cfg)
        journal(repo, name, "promote", row.new_version, row.new_version, row.who, why, holders)
        return [s.address for s in holders]


def abandon(repo: ModelRepository, row: Rollout, servers: Sequence[Server], why: str) -> list[str]:
    """The new version leaves (set aside with `why`); the old serves alone, with its own
    config; journalled as `rollback`."""
    name = row.model
    with repo.lock():
        if row.new_version in repo.versions(name):
            repo.set_aside(name, row.new_version, why)
        old = repo.config_of(name, row.old_version)
        if old is None:
            raise PublishError(f"{name}: no config of version {row.old_version} in the archive")
        repo.serve_config(name, old)
        holders = holders_of(servers, name)
        for s in holders:
            s.client.load_model(name)
        journal(repo, name, "rollback", row.new_version, row.old_version, "bridge daemon",
                why, holders)  # fmt: skip
        return [s.address for s in holders]


def _own_config(repo: ModelRepository, name: str, version: int) -> str:
    text = repo.config_of(name, version)
    if text is None:
        raise PublishError(f"{name}: no config of version {version} in the archive")
    return text


__all__ = ["abandon", "activate", "pinned", "promote", "start"]
