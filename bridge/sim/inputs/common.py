"""What every site-data reader shares: `InputError` (bad input, named), times (a zone
always: `parse_time`), reading a text or JSON file, and opening a database that must
already exist. Used by the other modules of `bridge.sim.inputs`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from bridge.db import make_engine
from bridge.paths import write_whole


class InputError(ValueError):
    """Site data the simulator cannot take; the message names where and what."""


def aware(t: datetime, what: str) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise InputError(f"{what}: {t.isoformat()} has no time zone")
    return t.astimezone(UTC)


def iso(t: float | datetime) -> str:
    when = t if isinstance(t, datetime) else datetime.fromtimestamp(t, tz=UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def positive(what: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{what} must be a number > 0, got {value!r}")


def parse_time(text: str, what: str) -> datetime:
    """A time given as ISO 8601 with a zone (`2026-11-29T14:00:00Z`, `...+01:00`) or as
    epoch seconds, as UTC. A time with no zone is refused: read as local time it would
    shift the day's load against the jobs."""
    raw = text.strip()
    try:
        seconds = float(raw)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds):
            raise InputError(f"{what}: {raw!r} is not a time")
        return datetime.fromtimestamp(seconds, tz=UTC)
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise InputError(
            f"{what}: {raw!r} is not a time (ISO 8601 with a zone, or epoch seconds)"
        ) from None
    if t.tzinfo is None:
        raise InputError(f"{what}: {raw!r} has no time zone (add Z for UTC, or +HH:MM)")
    return t.astimezone(UTC)


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path}: not UTF-8 text ({exc})") from None


def read_json(path: Path, what: str) -> Any:
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # the decoder stopped in the last token, or in a string that never ends
        rest = text[exc.pos :].strip()
        ends = exc.msg.startswith("Unterminated string") or len(rest) <= 1
        cut = " (cut short?)" if ends else ""
        why = exc.msg.removesuffix(" starting at")
        raise InputError(
            f"{what} {path}: not JSON: {why} at line {exc.lineno} column {exc.colno}{cut}"
        ) from None


def open_database(url: str, what: str) -> Engine:
    """An engine for a database that must already exist (a SQLite file is never made
    here: a mistyped path would read as an empty history)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InputError(f"{what}: {url!r} is not a database URL ({exc})") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database or ""
        if db in ("", ":memory:"):
            raise InputError(f"{what}: {url} is an in-memory database: it holds no history")
        if not db.startswith("file:") and not Path(db).is_file():
            raise InputError(f"{what}: no database file {db}")
    return make_engine(url)


T = TypeVar("T")


def read_database(url: str, what: str, reading: str, read: Callable[[Engine], T]) -> T:
    """`read(engine)` on the existing database at `url` (`open_database`), the engine
    disposed after; a database error becomes `InputError` naming `what` and what was
    being read (`reading`)."""
    engine = open_database(url, what)
    try:
        return read(engine)
    except SQLAlchemyError as exc:
        msg = str(exc).splitlines()[0]
        raise InputError(f"{what} {shown_db(url)}: cannot read {reading}: {msg}") from None
    finally:
        engine.dispose()


def shown_db(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def write_json(path: Path, doc: object) -> None:
    """`doc` as JSON in `path`, whole or not at all (`bridge.paths.write_whole`);
    `InputError` naming the file when it cannot be written."""
    try:
        write_whole(path, json.dumps(doc), mode=0o644)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
