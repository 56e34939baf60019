"""What GPUs one sacct run holds, per node and GPU type, and its GPU-milliseconds from
them: pure, for `accounting.attribution`.

A run is booked by its `gres/gpu` count shared evenly among its nodes, exactly as before
slices; a run whose TRES names a MIG slice type or shards books each its share of a GPU
(`bridge.slurm.slices`, by `Context.slices`) under the slice's own type
(`h100_1g.10gb`), whole GPUs at 1. A share's GPU-ms per hour are floored on the epoch's
milliseconds as its capacity is (`Share`), so a slice busy a whole hour books exactly its
capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

from accounting.buckets import even_split
from accounting.errors import IngestError
from bridge.slurm.model import AccountingRecord
from bridge.slurm.slices import (
    SliceError,
    SliceRules,
    is_mig_type,
    needs_shares,
    parent_gpu_type,
    shares_from_tres,
    unit_share,
)

if TYPE_CHECKING:
    from accounting.attribution import Context


def holds_gpus(rec: AccountingRecord) -> bool:
    """Whether the run held any GPU: a `gres/gpu` count, or shards (never in it)."""
    return rec.gpus != 0 or "gres/shard" in rec.gpu_tres


def record_shares(rec: AccountingRecord, ctx: Context) -> dict[str | None, Fraction] | None:
    """GPU type or slice name (None: the node's type) -> the GPUs it is, for a run on MIG
    slices or shards (`bridge.slurm.slices.shares_from_tres`, by `ctx.slices`, the shards
    per GPU of its first node), or on a node whose GPU type is a slice's (its untyped
    `gres/gpu` where Slurm tracks no type); None for any other run (booked by its count).
    Raises IngestError naming the record when the rules cannot price it."""
    node = rec.nodes[0] if rec.nodes else None
    node_type = ctx.gpu_type_of_node.get(node) if node else None
    on_slices = bool(rec.gpu_tres) and bool(node_type) and is_mig_type(node_type or "")
    if not (on_slices or needs_shares(rec.gpu_tres)):
        return None
    try:
        return shares_from_tres(rec.gpu_tres, ctx.slices, node=node, gpu_type=node_type)
    except SliceError as exc:
        raise IngestError(rec.key, str(exc)) from exc


class Share(NamedTuple):
    """`units` of `unit` GPUs each on one node: `units` MIG slices of one type
    (`unit`: the slice's share of its GPU), or one unit of an exact share (shards; a share
    divided among nodes). An hour [lo, hi) of epoch milliseconds books units x
    (floor(unit x hi) - floor(unit x lo)) GPU-ms: the floors telescope, so consecutive
    hours and jobs one after another on a slice sum to what its capacity books
    (`capacity_ms`), never a millisecond more."""

    units: int
    unit: Fraction

    def ms(self, lo: int, hi: int) -> int:
        num, den = self.unit.numerator, self.unit.denominator
        return self.units * (hi * num // den - lo * num // den)


#: GPUs a run holds on one node under one type: a count, or a share of GPUs
Gpus = int | Share


def allocations(rec: AccountingRecord, ctx: Context) -> list[tuple[str, str, Gpus]]:
    """(node, GPU type, GPUs) the run holds: its `gres/gpu` count shared evenly among its
    nodes under its type (the first its gres names, else the node's); or, for a run on
    MIG slices or shards (`record_shares`), each type's share divided evenly among its
    nodes (a slice's as a count of its slices where that is whole). Raises IngestError for
    a node with no known GPU type or a type the cluster does not have (a slice of a type
    it has is known: `h100_1g.10gb` of `h100`)."""
    shares = record_shares(rec, ctx)
    pairs: list[tuple[str, str | None, Fraction | int]]
    if shares is None:
        split = even_split(rec.gpus, len(rec.nodes))
        pairs = [(n, rec.gpu_type, g) for n, g in zip(rec.nodes, split, strict=True) if g]
    else:
        per = len(rec.nodes)
        pairs = [(n, name, share / per) for n in rec.nodes for name, share in shares.items()]
    held: dict[tuple[str, str], Fraction | int] = {}
    for node, name, gpus in pairs:
        gpu_type = name or ctx.gpu_type_of_node.get(node) or ""
        if not gpu_type:
            raise IngestError(
                rec.key, f"no GPU type: its gres names none and node {node} is unknown"
            )
        if (
            ctx.known_gpu_types
            and gpu_type not in ctx.known_gpu_types
            and parent_gpu_type(gpu_type) not in ctx.known_gpu_types
        ):
            known = ", ".join(sorted(ctx.known_gpu_types))
            raise IngestError(rec.key, f"unknown GPU type {gpu_type!r} (the cluster has: {known})")
        held[(node, gpu_type)] = held.get((node, gpu_type), 0) + gpus
    return [(node, t, _as_gpus(g, t, ctx.slices)) for (node, t), g in held.items()]


def _as_gpus(gpus: Fraction | int, gpu_type: str, rules: SliceRules) -> Gpus:
    """A whole number of GPUs as an int (booked as before); a share as slices of the
    type's unit where it is a whole number of them, else as one unit of itself."""
    if isinstance(gpus, int) or gpus.denominator == 1:
        return int(gpus)
    unit = unit_share(gpu_type, rules)
    count = gpus / unit
    if unit != 1 and count.denominator == 1:
        return Share(int(count), unit)
    return Share(1, gpus)


def scaled_ms(
    parts: Sequence[tuple[datetime, int]], gpus: Gpus, start_ms: int
) -> list[tuple[datetime, int]]:
    """Each hour's milliseconds (`parts`, consecutive from `start_ms`, epoch ms) x
    `gpus`: exact for a count; for a `Share`, floored on the epoch's milliseconds
    (`Share.ms`)."""
    if isinstance(gpus, int):
        return [(bucket, ms * gpus) for bucket, ms in parts]
    out = []
    lo = start_ms
    for bucket, ms in parts:
        out.append((bucket, gpus.ms(lo, lo + ms)))
        lo += ms
    return out


def total_gpus(held: Sequence[tuple[str, str, Gpus]]) -> Fraction:
    """The GPUs of `allocations` together (a serving job's compute is split by them)."""
    return sum(
        (Fraction(g) if isinstance(g, int) else g.units * g.unit for _, _, g in held),
        Fraction(0),
    )
