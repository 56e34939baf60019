"""The ledger's tables as the write paths' statements name them (SQLAlchemy Core tables of
`accounting.schema`'s models), and `batched`, which cuts records and key lists into chunks
(the ingest's chunks, the IN lists of its queries). Shared by the ingest
(`accounting.ingest` and the modules it drives), the GPU usage records and the tests."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from accounting.schema import LedgerRow, NodeSpan, Period, ServingSample, SourceRecord

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
SOURCES = SourceRecord.__table__  # type: ignore[attr-defined]
SPANS = NodeSpan.__table__  # type: ignore[attr-defined]
SAMPLES = ServingSample.__table__  # type: ignore[attr-defined]
PERIODS = Period.__table__  # type: ignore[attr-defined]

T = TypeVar("T")


def batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    """`items` in lists of `n` (the last one shorter)."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
