"""Rates: the price of a GPU-hour by GPU type, optionally narrowed to a pool and/or a QOS,
over a date range [valid_from, valid_to). Money is Decimal end to end.

`add_rate` refuses a rate that overlaps another of the same scope (same GPU type, pool and
QOS) and a second currency; nothing is written then. `RateBook.price` picks the most
specific rate in force on a day: pool and QOS, then pool, then QOS, then the GPU type
alone; no rate at all is a RateError naming what was looked up. A MIG slice's type with
no rate of its own (`h100_1g.10gb`) is priced at its GPU's (`h100`): its GPU-hours are its
fraction of that GPU already.

Rounding (stated in every report): amounts are computed unrounded (GPU-ms x price /
3,600,000 in Decimal) and rounded once, half-even to the currency's cent, per report line;
a total is the rounded sum of the unrounded amounts, so lines may differ from the total by
at most half a cent per line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from sqlalchemy import Engine, insert, select

from accounting.errors import RateError
from accounting.schema import Rate
from bridge.db import write_transaction
from bridge.slurm.slices import is_mig_type, parent_gpu_type

RATES = Rate.__table__  # type: ignore[attr-defined]
CENT = Decimal("0.01")
MS_PER_HOUR = Decimal(3_600_000)
ROUNDING = (
    "amounts are computed unrounded and rounded half-even to 0.01 per line; totals are the "
    "rounded sums of unrounded amounts"
)


@dataclass(frozen=True)
class RateSpec:
    gpu_type: str
    price: Decimal
    valid_from: date
    valid_to: date | None = None
    pool: str | None = None
    qos: str | None = None
    currency: str = "USD"
    note: str = ""

    @property
    def scope(self) -> tuple[str, str | None, str | None]:
        return (self.gpu_type, self.pool, self.qos)

    def describe(self) -> str:
        where = "".join(
            [f" pool={self.pool}" if self.pool else "", f" qos={self.qos}" if self.qos else ""]
        )
        until = self.valid_to.isoformat() if self.valid_to else "open"
        return (
            f"{self.gpu_type}{where} {show_price(self.price)} {self.currency}/GPU-hour "
            f"[{self.valid_from.isoformat()}, {until})"
        )

    def covers(self, day: date) -> bool:
        return self.valid_from <= day and (self.valid_to is None or day < self.valid_to)


def show_price(price: Decimal) -> str:
    """A price as people write it: at least two decimals, no trailing zeros beyond."""
    text = format(price.normalize(), "f")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def parse_price(text: str | Decimal | int | float) -> Decimal:
    """A price as Decimal; floats are taken by their shortest repr (2.5, not 2.4999...)."""
    try:
        value = Decimal(str(text))
    except InvalidOperation as exc:
        raise RateError(f"not a price: {text!r}") from exc
    if not value.is_finite() or value < 0:
        raise RateError(f"a price must be a finite amount >= 0, got {text!r}")
    return value


def _validate(spec: RateSpec) -> None:
    if not spec.gpu_type.strip():
        raise RateError("a rate needs a GPU type")
    if spec.valid_to is not None and spec.valid_to <= spec.valid_from:
        raise RateError(
            f"rate {spec.describe()}: valid_to must be after valid_from "
            f"({spec.valid_to} <= {spec.valid_from})"
        )
    if len(spec.currency) != 3 or not spec.currency.isalpha() or not spec.currency.isupper():
        raise RateError(f"currency must be a 3-letter ISO code like USD, got {spec.currency!r}")
    parse_price(spec.price)


def _overlap(a: RateSpec, b: RateSpec) -> bool:
    a_end = a.valid_to or date.max
    b_end = b.valid_to or date.max
    return a.scope == b.scope and a.valid_from < b_end and b.valid_from < a_end


def _spec(row: Any) -> RateSpec:
    return RateSpec(
        gpu_type=row.gpu_type,
        price=Decimal(row.price),
        valid_from=row.valid_from,
        valid_to=row.valid_to,
        pool=row.pool,
        qos=row.qos,
        currency=row.currency,
        note=row.note,
    )


def list_rates(engine: Engine) -> list[RateSpec]:
    with engine.connect() as conn:
        rows = conn.execute(select(RATES).order_by(RATES.c.gpu_type, RATES.c.valid_from))
        return [_spec(r) for r in rows]


def add_rates(engine: Engine, specs: Sequence[RateSpec], now: datetime | None = None) -> None:
    """Add rates, all or none: each is validated against the stored ones and the others."""
    for spec in specs:
        _validate(spec)
    with write_transaction(engine) as conn:
        have = [_spec(r) for r in conn.execute(select(RATES))]
        for i, spec in enumerate(specs):
            for other in [*have, *specs[:i]]:
                if _overlap(spec, other):
                    raise RateError(
                        f"rate {spec.describe()} overlaps {other.describe()}; "
                        "end the old one first (valid_to) or choose other dates"
                    )
                if other.currency != spec.currency:
                    raise RateError(
                        f"rate {spec.describe()}: the ledger prices in {other.currency}, "
                        f"not {spec.currency}"
                    )
        if specs:
            conn.execute(
                insert(RATES),
                [
                    {
                        "gpu_type": s.gpu_type,
                        "pool": s.pool,
                        "qos": s.qos,
                        "valid_from": s.valid_from,
                        "valid_to": s.valid_to,
                        "price": s.price,
                        "currency": s.currency,
                        "note": s.note,
                        "created_at": now or datetime.now(UTC),
                    }
                    for s in specs
                ],
            )


class RateBook:
    """The rates, for pricing ledger rows."""

    def __init__(self, rates: Iterable[RateSpec]) -> None:
        self.rates = list(rates)
        currencies = sorted({r.currency for r in self.rates})
        if len(currencies) > 1:
            raise RateError(f"rates in several currencies: {', '.join(currencies)}")
        self.currency = currencies[0] if currencies else None
        self._cache: dict[tuple[str, str, str, date], Decimal] = {}

    def __bool__(self) -> bool:
        return bool(self.rates)

    def price(self, gpu_type: str, pool: str, qos: str, day: date) -> Decimal:
        """Per GPU-hour of `gpu_type`. A MIG slice's type (`h100_1g.10gb`) without a rate
        of its own takes its GPU's (`h100`): the ledger books a slice's GPU-hours as its
        fraction of that GPU already (docs/finance/slices.md)."""
        key = (gpu_type, pool, qos, day)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        candidates = self._candidates(gpu_type, pool, qos, day)
        parent = parent_gpu_type(gpu_type) if is_mig_type(gpu_type) else None
        if not candidates and parent:
            candidates = self._candidates(parent, pool, qos, day)
        if not candidates:
            raise RateError(
                f"no rate for GPU type {gpu_type!r}"
                + (f" or its GPU {parent!r}" if parent else "")
                + f" on {day.isoformat()} (pool {pool!r}, "
                f"qos {qos!r}); add one with `stb accounting rates add`"
            )
        best = max(candidates, key=lambda r: (r.pool is not None, r.qos is not None))
        self._cache[key] = best.price
        return best.price

    def _candidates(self, gpu_type: str, pool: str, qos: str, day: date) -> list[RateSpec]:
        return [
            r
            for r in self.rates
            if r.gpu_type == gpu_type
            and r.covers(day)
            and r.pool in (None, pool)
            and r.qos in (None, qos)
        ]


def cost(gpu_ms: int, price: Decimal) -> Decimal:
    """Unrounded cost of `gpu_ms` GPU-milliseconds at `price` per GPU-hour."""
    return Decimal(gpu_ms) * price / MS_PER_HOUR


def money(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_EVEN)
