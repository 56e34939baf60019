"""Time buckets and exact integer splitting: the arithmetic under every ledger row.

Pure functions, no I/O. The ledger counts GPU-milliseconds in integers (`gpu_ms`), so sums
are exact on every database and "a job split across buckets sums to its whole" holds to the
millisecond; whenever an amount is shared out (GPUs among a job's nodes, a serving job's
time among its models), `largest_remainder` keeps the parts summing to the whole.

Hour buckets are UTC hours; month boundaries are hour boundaries, so splitting at hours
also splits at months.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta

HOUR = timedelta(hours=1)
MS_PER_HOUR = 3_600_000


def utc(t: datetime) -> datetime:
    """`t` as an aware UTC datetime; a naive time is refused (it is ambiguous)."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"naive datetime {t.isoformat()}: times must carry a zone")
    return t.astimezone(UTC)


def floor_hour(t: datetime) -> datetime:
    t = utc(t)
    return t.replace(minute=0, second=0, microsecond=0)


def month_of(t: datetime) -> str:
    """'YYYY-MM' of a UTC time: the accounting period it belongs to."""
    return utc(t).strftime("%Y-%m")


def day_of(t: datetime) -> date:
    return utc(t).date()


def hours(start: datetime, end: datetime) -> Iterator[datetime]:
    """The hour buckets that [start, end) touches, in order."""
    h = floor_hour(start)
    end = utc(end)
    while h < end:
        yield h
        h += HOUR


def split_ms(start: datetime, end: datetime) -> list[tuple[datetime, int]]:
    """[start, end) as (hour bucket, milliseconds in it); the parts sum to the whole
    interval's milliseconds (times are truncated to whole milliseconds first)."""
    s, e = _ms(utc(start)), _ms(utc(end))
    if e <= s:
        return []
    out = []
    for h in hours(start, end):
        hs = _ms(h)
        lo, hi = max(s, hs), min(e, hs + MS_PER_HOUR)
        if hi > lo:
            out.append((h, hi - lo))
    return out


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def _ms(t: datetime) -> int:
    """Milliseconds since the epoch, exactly (no float rounding)."""
    return (t - _EPOCH) // _MS


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """`total` shared in proportion to `weights` as integers summing exactly to `total`
    (Hamilton's method; ties go to the earlier weight). All-zero weights share nothing:
    every part is 0, and the caller books the whole as unattributed."""
    if total < 0:
        raise ValueError(f"cannot share a negative amount ({total})")
    if any(w < 0 for w in weights):
        raise ValueError(f"negative weight in {list(weights)}")
    wsum = float(sum(weights))
    if not weights or wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    parts = [int(x) for x in exact]
    short = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[:short]:
        parts[i] += 1
    return parts


def even_split(total: int, n: int) -> list[int]:
    """`total` over `n` equal parts, the remainder one each to the first parts."""
    if n <= 0:
        return []
    q, r = divmod(total, n)
    return [q + (1 if i < r else 0) for i in range(n)]
