"""An LLM's measured token profile, kept with the model in the repository: what the token
capacity model (`bridge.policy.tokens`) sizes its replicas by.

`<repository>/<model>/stb_profile.json` holds one profile per model version (Triton reads
only config.pbtxt and the numeric version folders of a model's folder, so the file is
never served):

    {"model": "smol", "versions": {"1": {"sequences": 2, "prefill_s_per_token": 0.0042,
     "prefill_overhead_s": 0.11, "tpot_s": [0.016, 0.022], "prefix_hit": 0.0,
     "measured_at": "2026-12-03T16:40:00+00:00", "points": 24}}}

`stb models profile MODEL` measures a version and writes its entry (`write_profile`, the
file replaced whole: a reader never sees half of it); a new version is measured again.
The daemon reads the newest version's profile of each model every tick (`Profiles`: one
`stat` a model, the file parsed again only when it changed). A file that cannot be read
is said once by name and field, and the model is sized without a profile (by its
measured TTFT and TPOT alone) rather than by a guess.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bridge.paths import write_whole
from bridge.policy.tokens import TokenProfile

PROFILE_FILE = "stb_profile.json"
_FIELDS = ("sequences", "prefill_s_per_token", "prefill_overhead_s", "tpot_s", "prefix_hit")


class ProfileError(ValueError):
    """A profile file or entry is refused; the message names the file and the field."""


@dataclass(frozen=True)
class MeasuredProfile:
    """One version's profile, when it was measured and from how many requests."""

    version: str
    profile: TokenProfile
    measured_at: str
    points: int


def _entry(path: Path, version: str, raw: Any) -> MeasuredProfile:
    where = f"{path}: version {version}"
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: not an object")
    missing = [f for f in _FIELDS if f not in raw]
    if missing:
        raise ProfileError(f"{where}: missing {', '.join(missing)}")
    try:
        tpot = raw["tpot_s"]
        if not isinstance(tpot, list):
            raise ValueError(f"tpot_s must be a list of seconds, got {tpot!r}")
        profile = TokenProfile(
            sequences=raw["sequences"],
            prefill_s_per_token=float(raw["prefill_s_per_token"]),
            prefill_overhead_s=float(raw["prefill_overhead_s"]),
            tpot_s=tuple(float(t) for t in tpot),
            prefix_hit=float(raw["prefix_hit"]),
            tpot_spread=float(raw.get("tpot_spread", 1.0)),
        )
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: {exc}") from exc
    points = raw.get("points", 0)
    if not isinstance(points, int) or points < 0:
        raise ProfileError(f"{where}: points must be a whole number >= 0, got {points!r}")
    return MeasuredProfile(version, profile, str(raw.get("measured_at", "")), points)


def read_profiles(model_dir: Path) -> dict[str, MeasuredProfile]:
    """Every version's profile in the model folder's file ({} when there is none)."""
    path = model_dir / PROFILE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ProfileError(f"{path}: cannot be read: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON: {exc}") from exc
    versions = doc.get("versions") if isinstance(doc, dict) else None
    if not isinstance(versions, dict):
        raise ProfileError(f"{path}: no 'versions' object")
    out: dict[str, MeasuredProfile] = {}
    for version, raw in versions.items():
        if not str(version).isdigit():
            raise ProfileError(f"{path}: version {version!r} is not a version number")
        out[str(version)] = _entry(path, str(version), raw)
    return out


def newest(profiles: dict[str, MeasuredProfile]) -> MeasuredProfile | None:
    """The profile of the highest version measured."""
    return profiles[max(profiles, key=int)] if profiles else None


def write_profile(
    model_dir: Path, version: str, profile: TokenProfile, points: int, at: datetime | None = None
) -> Path:
    """Set one version's profile in the model folder's file (the others kept); the file is
    replaced whole. Refuses a folder that is no model (no config.pbtxt) or a version the
    model does not have."""
    if not (model_dir / "config.pbtxt").is_file():
        raise ProfileError(f"{model_dir}: not a model folder (no config.pbtxt)")
    if not str(version).isdigit() or not (model_dir / str(version)).is_dir():
        raise ProfileError(f"{model_dir.name}: no version {version!r} in the repository")
    current = read_profiles(model_dir)
    doc: dict[str, Any] = {"model": model_dir.name, "versions": {}}
    for v, m in sorted({**current, str(version): None}.items(), key=lambda kv: int(kv[0])):
        if m is None:
            stamp = (at or datetime.now(UTC)).isoformat(timespec="seconds")
            doc["versions"][v] = _as_json(profile, stamp, points)
        else:
            doc["versions"][v] = _as_json(m.profile, m.measured_at, m.points)
    path = model_dir / PROFILE_FILE
    write_whole(path, json.dumps(doc, indent=1) + "\n")
    return path


def _as_json(profile: TokenProfile, measured_at: str, points: int) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(profile, f) for f in (*_FIELDS, "tpot_spread")}
    out["tpot_s"] = [round(t, 6) for t in profile.tpot_s]
    out.update(measured_at=measured_at, points=points)
    return {
        k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in out.items()
    }


class Profiles:
    """The newest profile of each model of a repository, each file parsed again only when
    it changed (mtime, size, inode). `problems` keeps each refused file's message (the
    daemon logs each once). Safe to share between threads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, tuple[tuple[int, int, int], MeasuredProfile | None]] = {}
        self._lock = threading.Lock()
        self.problems: dict[str, str] = {}

    def read(self, models: list[str] | tuple[str, ...]) -> dict[str, TokenProfile]:
        """Model -> its newest version's profile, for those of `models` that have one."""
        out: dict[str, TokenProfile] = {}
        with self._lock:
            for name in models:
                path = self.root / name / PROFILE_FILE
                try:
                    st = path.stat()
                except OSError:
                    self._cache.pop(name, None)
                    self.problems.pop(name, None)
                    continue
                key = (st.st_mtime_ns, st.st_size, st.st_ino)
                hit = self._cache.get(name)
                if hit is None or hit[0] != key:
                    try:
                        hit = (key, newest(read_profiles(path.parent)))
                        self.problems.pop(name, None)
                    except ProfileError as exc:
                        hit = (key, None)
                        self.problems[name] = str(exc)
                    self._cache[name] = hit
                if hit[1] is not None:
                    out[name] = hit[1].profile
        return out
