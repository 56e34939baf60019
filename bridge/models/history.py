"""The model repository's audit journal: every publish (and every failed publish, rolled
back), gradual rollout (`canary`: published with a step plan; `promote`; an automatic
`rollback` with the verdict), rollback and retire, with who, when, which version and why;
`stb models history` reads it.

One JSON object a line in `<archive>/history.jsonl`, beside the repository and out of
Triton's sight (`ModelRepository.archive`). Entries are appended by `bridge.models.publish`
while it holds the repository's publish lock, so lines never interleave; each is written
with one `write(2)` on an O_APPEND descriptor and fsynced before the command reports
success. A crash can leave at most the last line cut short: the next append starts on a
line of its own, and reading skips a line that is not a whole entry and counts it
(`Journal.skipped`), never failing the whole history.

Who: the user the command runs as, with the Slurm job when it runs inside one (a
training job that publishes its model), e.g. `alice (Slurm job 4711)`.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

Action = Literal["publish", "publish-failed", "canary", "promote", "rollback", "retire"]
ACTIONS: tuple[Action, ...] = (
    "publish", "publish-failed", "canary", "promote", "rollback", "retire"
)  # fmt: skip
FILE = "history.jsonl"


@dataclass(frozen=True)
class Entry:
    """One change of a model, as the journal keeps it."""

    at: datetime
    model: str
    action: Action
    #: the version published, rolled back or (retire) last served; None if there was none
    version: int | None
    #: the version serving after the change (None: none, the model is new or retired)
    serving: int | None
    who: str
    why: str
    #: the servers the change was loaded on or unloaded from
    servers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["at"] = self.at.isoformat()
        out["servers"] = list(self.servers)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Entry:
        """The entry of one journal line; ValueError (or KeyError, TypeError) if it is not
        one."""
        action = raw["action"]
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        at = datetime.fromisoformat(str(raw["at"]))
        servers = raw.get("servers") or []
        if not isinstance(servers, list):
            raise TypeError("servers is not a list")
        return cls(
            at=at if at.tzinfo else at.replace(tzinfo=UTC),
            model=str(raw["model"]),
            action=action,
            version=_opt_int(raw.get("version")),
            serving=_opt_int(raw.get("serving")),
            who=str(raw["who"]),
            why=str(raw.get("why") or ""),
            servers=tuple(str(s) for s in servers),
        )


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not a version: {value!r}")
    return value


def actor(environ: Mapping[str, str] | None = None) -> str:
    """Who is changing the repository: the user, and the Slurm job it runs in, if any."""
    env = os.environ if environ is None else environ
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container)
        user = f"uid {os.getuid()}"
    job = env.get("SLURM_JOB_ID")
    return f"{user} (Slurm job {job})" if job else user


@dataclass(frozen=True)
class Journal:
    """What `read` found: the entries, oldest first, and the lines it could not read."""

    entries: tuple[Entry, ...]
    skipped: int = 0


def append(archive: Path, entry: Entry) -> None:
    """Add one entry (call with the repository's publish lock held)."""
    archive.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry.to_json(), sort_keys=True) + "\n").encode()
    fd = os.open(archive / FILE, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a crash cut the last line: it stays alone, skipped
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(archive: Path, model: str | None = None) -> Journal:
    """The journal's entries (of `model` only, if given), oldest first."""
    path = archive / FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Journal(())
    entries, skipped = [], 0
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            entry = Entry.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            skipped += 1
            continue
        if model is None or entry.model == model:
            entries.append(entry)
    return Journal(tuple(entries), skipped)


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
