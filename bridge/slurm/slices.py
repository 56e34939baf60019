"""How much of a GPU a job's allocation is, from its TRES, pure: a whole GPU counts 1, a MIG
slice the fraction of its GPU it is, shards their share of a GPU. The ledger books
GPU-hours from this share where it books them from `parse.gpus_from_tres`'s count today;
reports by GPU type show the slice's name (`a100_3g.20gb`) as its type.

What Slurm records (https://slurm.schedmd.com/gres.html, "MIG Management" and
"Sharding"; the counting is Slurm's `_set_type_tres_cnt`, src/stepmgr/gres_stepmgr.c in
current releases):

- A MIG slice is a `gres/gpu` like any GPU ("Slurm can treat these MIG instances as
  individual GPUs"). Its GRES type is a substring of the profile slurmd detects,
  `<gpu>_<slices>g.<GiB>gb` (`nvidia_a100_3g.20gb`), so `a100_3g.20gb` or `3g.20gb`.
- A job's untyped `gres/gpu=N` is the sum over everything it holds of GRES name `gpu`,
  slices included, each counting 1; `gres/gpu:<type>=n` is that exact type's count, and
  is there only when `AccountingStorageTRES` lists the type. So one 3g.20gb slice is
  `gres/gpu=1,gres/gpu:a100_3g.20gb=1`: counting the untyped total (as `gpus_from_tres`
  does) books that slice as one whole GPU.
- Shards are their own GRES name: `gres/shard=N` (and `gres/shard:<type>=N` where the
  type is tracked), never in `gres/gpu`, and only when `AccountingStorageTRES` lists
  `gres/shard`. A node's `Gres=gpu:2,shard:64` spreads its shards evenly: 32 per GPU.
- `gres/gpumem` and `gres/gpuutil` (tracked with `gres/gpu`) are usage, not GPUs.

So here each GPU is counted once: the typed slices are taken out of the untyped total,
what is left are whole GPUs, and shards are added at their share. Shares are exact
(`Fraction`: 1/7 stays 1/7) for the ledger's integer arithmetic; `gpu_share_from_tres`
gives the float.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal

from bridge.slurm.parse import gpu_types_of, split_gres, tres_list_text

ShareMode = Literal["compute", "memory"]
SHARE_MODES: tuple[ShareMode, ...] = ("compute", "memory")


class SliceError(ValueError):
    """A MIG profile name, a TRES string or slice rules that cannot give a GPU share; the
    message quotes the text and says what was wrong."""


@dataclass(frozen=True)
class SliceRules:
    """How much of a GPU a MIG slice or a shard books (`[accounting.slices]` in the
    configuration, where the bridge wires it)."""

    #: what a MIG slice's fraction measures: `compute`, its compute slices over its GPU's
    #: (1g of 7: 1/7, NVIDIA's fraction of SMs), so a GPU cut into seven 1g slices books
    #: one whole GPU; or `memory`, its memory over its GPU's (10 GB of 80: 1/8), what the
    #: slice keeps from others. Compute by default: the slices of a GPU then sum to it.
    share: ShareMode = "compute"
    #: compute slices per GPU: 7 on A100, H100, H200 and B200 (NVIDIA's MIG user guide)
    compute_slices: int = 7
    #: GPU type -> compute slices, for GPUs not cut in `compute_slices` (A30: 4)
    compute_slices_of: Mapping[str, int] = field(default_factory=dict)
    #: GPU type -> its memory in GB as Slurm names it in the whole-GPU profile
    #: (`7g.80gb`: 80); needed in `memory` mode only, for each GPU type with slices
    gpu_memory_gb: Mapping[str, int] = field(default_factory=dict)
    #: node name or GPU type -> shards per GPU (a node's `shard:64` on 2 GPUs: 32); a
    #: node's entry wins over its type's. No default: a wrong guess would misbook silently
    shards_per_gpu: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.share not in SHARE_MODES:
            raise SliceError(f"slice share {self.share!r}: one of {', '.join(SHARE_MODES)}")
        if self.compute_slices < 1:
            raise SliceError(f"compute slices per GPU {self.compute_slices}: at least 1")
        for what, table in (
            ("compute slices of", self.compute_slices_of),
            ("GPU memory (GB) of", self.gpu_memory_gb),
            ("shards per GPU of", self.shards_per_gpu),
        ):
            for key, value in table.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise SliceError(f"{what} {key!r}: {value!r} is not a whole number >= 1")
        # read-only copies: frozen means frozen
        for name in ("compute_slices_of", "gpu_memory_gb", "shards_per_gpu"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def __reduce__(self) -> tuple[type[SliceRules], tuple[Any, ...]]:
        """Pickled as plain dicts (a read-only view does not pickle): the ingest's worker
        processes get the rules with its context."""
        return (
            SliceRules,
            (
                self.share,
                self.compute_slices,
                dict(self.compute_slices_of),
                dict(self.gpu_memory_gb),
                dict(self.shards_per_gpu),
            ),
        )


# --- MIG profile names ------------------------------------------------------------------


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile as a GRES type names it: `a100_3g.20gb` -> gpu `a100`, 3 compute
    slices, 20 GB; `1g.10gb+me` -> no gpu, 1 slice, 10 GB, extensions `("+me",)`."""

    name: str
    #: the GPU type before the profile (`a100`, `nvidia_a100`); None for a bare profile
    gpu: str | None
    compute: int
    memory_gb: int
    #: NVIDIA's suffixes (`+me`: media extensions); they do not change the share
    extensions: tuple[str, ...] = ()


_PROFILE = re.compile(
    r"^(?:(?P<gpu>.+)_)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?P<ext>(?:[+-][a-z]+(?:\.[a-z]+)*)*)$",
    re.IGNORECASE,
)
_EXTENSION = re.compile(r"[+-][a-z]+(?:\.[a-z]+)*", re.IGNORECASE)
#: the `<n>g.<m>gb` of a profile anywhere in a name, at its start or after `_`
_LOOKS_MIG = re.compile(r"(?:^|_)\d+g\.\d+gb", re.IGNORECASE)


def is_mig_type(name: str) -> bool:
    """Whether a GRES type names a MIG slice (`a100_3g.20gb`, `1g.10gb+me`), not a whole
    GPU (`a100`, `h100-80gb`)."""
    return bool(_LOOKS_MIG.search(name))


def parse_mig_profile(name: str) -> MigProfile:
    """`1g.10gb`, `3g.40gb`, `7g.80gb`, `1g.10gb+me`, `a100_3g.20gb`, `nvidia_a100_3g.20gb`
    -> `MigProfile`; anything else raises `SliceError` quoting it."""
    m = _PROFILE.match(name.strip())
    if not m:
        raise SliceError(
            f"not a MIG profile name: {name!r} (expected <slices>g.<GB>gb such as 1g.10gb "
            "or 1g.10gb+me, optionally after a GPU type and '_': a100_1g.10gb)"
        )
    compute, memory = int(m["g"]), int(m["gb"])
    if compute < 1 or memory < 1:
        raise SliceError(f"MIG profile {name!r}: a slice has at least 1 compute slice and 1 GB")
    return MigProfile(
        name=name.strip(),
        gpu=m["gpu"],
        compute=compute,
        memory_gb=memory,
        extensions=tuple(_EXTENSION.findall(m["ext"])),
    )


def parent_gpu_type(name: str | None) -> str | None:
    """The GPU type a slice is cut from (`a100_3g.20gb` -> `a100`), the name itself for a
    whole GPU's type, None for a bare profile (`3g.20gb`) or no name: what a rate or a
    GPU's memory is looked up by."""
    if not name:
        return None
    return parse_mig_profile(name).gpu if is_mig_type(name) else name


def slice_share(profile: MigProfile, rules: SliceRules, gpu_type: str | None = None) -> Fraction:
    """The fraction of its GPU one slice is, by `rules.share`. The GPU's figures are looked
    up by the type before the profile, else `gpu_type` (the node's)."""
    keys = [k for k in (profile.gpu, gpu_type) if k]
    if rules.share == "compute":
        total = next(
            (rules.compute_slices_of[k] for k in keys if k in rules.compute_slices_of),
            rules.compute_slices,
        )
        if profile.compute > total:
            raise SliceError(
                f"MIG profile {profile.name!r}: {profile.compute} compute slices of a GPU "
                f"that has {total}"
            )
        return Fraction(profile.compute, total)
    memory = next((rules.gpu_memory_gb[k] for k in keys if k in rules.gpu_memory_gb), None)
    if memory is None:
        where = " or ".join(repr(k) for k in keys) or "(no GPU type named)"
        raise SliceError(
            f"MIG profile {profile.name!r}: memory share needs the GPU's memory: set "
            f"gpu_memory_gb for {where}"
        )
    if profile.memory_gb > memory:
        raise SliceError(
            f"MIG profile {profile.name!r}: {profile.memory_gb} GB of a GPU of {memory} GB"
        )
    return Fraction(profile.memory_gb, memory)


def shard_share(
    shards: int, rules: SliceRules, *, node: str | None = None, gpu_type: str | None = None
) -> Fraction:
    """`shards` as GPUs: shards over the shards per GPU of `node`, else of `gpu_type`."""
    per_gpu = next(
        (rules.shards_per_gpu[k] for k in (node, gpu_type) if k and k in rules.shards_per_gpu),
        None,
    )
    if per_gpu is None:
        where = " or ".join(repr(k) for k in (node, gpu_type) if k) or "(no node or GPU type)"
        raise SliceError(f"{shards} shard(s): no shards per GPU for {where}: set shards_per_gpu")
    return Fraction(shards, per_gpu)


# --- TRES -> GPU share --------------------------------------------------------------------


def shares_from_tres(
    tres: str,
    rules: SliceRules,
    *,
    node: str | None = None,
    gpu_type: str | None = None,
) -> dict[str | None, Fraction]:
    """GPU type or slice name -> GPUs (exact) of a TRES string
    (`cpu=2,gres/gpu=1,gres/gpu:a100_3g.20gb=1`); None is whole GPUs of no listed type;
    {} for no GPU. Keys keep the order of the TRES string; shards are under their typed
    name, else None.

    `node` and `gpu_type` (the node's) are what the string does not say: the shards per GPU
    of that node, the GPU a bare profile (`3g.20gb`) is cut from, and, for a node whose
    GPU type is a MIG profile, what its untyped `gres/gpu` holds where no type is tracked.
    Raises `SliceError` quoting `tres` when the counts contradict Slurm's rule (typed
    counts above the untyped total) or the rules cannot price a slice or a shard."""
    gpu_total: int | None = None
    gpu_typed: dict[str, int] = {}
    shard_total: int | None = None
    shard_typed: dict[str | None, int] = {}
    for item in tres.split(","):
        key, _, value = item.strip().partition("=")
        if not value.isdigit():
            continue
        name, _, subtype = key.partition(":")
        if name == "gres/gpu":
            if subtype:
                gpu_typed[subtype] = gpu_typed.get(subtype, 0) + int(value)
            else:
                gpu_total = int(value)
        elif name == "gres/shard":
            if subtype:
                shard_typed[subtype] = shard_typed.get(subtype, 0) + int(value)
            else:
                shard_total = int(value)
    try:
        out = _gpu_shares(gpu_total, gpu_typed, rules, gpu_type)
        shards = _shards(shard_total, shard_typed)
        for shard_type, count in shards.items():
            share = shard_share(count, rules, node=node, gpu_type=shard_type or gpu_type)
            out[shard_type] = out.get(shard_type, Fraction(0)) + share
    except SliceError as exc:
        raise SliceError(f"{exc} (in TRES {tres!r})") from exc
    return {k: v for k, v in out.items() if v}


def _gpu_shares(
    total: int | None, typed: dict[str, int], rules: SliceRules, gpu_type: str | None
) -> dict[str | None, Fraction]:
    """The `gres/gpu` part: slices at their share, whole GPUs at 1, each counted once."""
    if not typed and total and gpu_type and is_mig_type(gpu_type):
        # no type tracked, on a node whose GPUs are all slices of one profile
        return {gpu_type: total * slice_share(parse_mig_profile(gpu_type), rules)}
    out: dict[str | None, Fraction] = {}
    counted = 0
    for name, count in typed.items():
        if is_mig_type(name):
            out[name] = count * slice_share(parse_mig_profile(name), rules, gpu_type)
        else:
            out[name] = Fraction(count)
        counted += count
    if total is not None:
        if total < counted:
            raise SliceError(f"typed gres/gpu counts ({counted}) above the untyped total ({total})")
        if total > counted:
            out[None] = Fraction(total - counted)
    return out


def _shards(total: int | None, typed: dict[str | None, int]) -> dict[str | None, int]:
    """The `gres/shard` part by type, counted once: the typed counts when they make up the
    untyped total, else the total under no type."""
    if total is None or sum(typed.values()) == total:
        return dict(typed)
    if sum(typed.values()) > total:
        raise SliceError(
            f"typed gres/shard counts ({sum(typed.values())}) above the untyped total ({total})"
        )
    return {None: total} if total else {}


def gpu_share_from_tres(
    tres: str,
    rules: SliceRules,
    *,
    node: str | None = None,
    gpu_type: str | None = None,
) -> tuple[str | None, float]:
    """(GPU type or slice name, GPUs) of a TRES string: a whole GPU counts 1, a MIG slice
    its fraction, shards theirs (`shares_from_tres`, summed). The name is the first one
    the string types (as `gpus_from_tres` keeps it), None when it types none; a plain GPU
    job gives what `gpus_from_tres` gives, its count as a float."""
    shares = shares_from_tres(tres, rules, node=node, gpu_type=gpu_type)
    name = next((k for k in shares if k is not None), None)
    return name, float(sum(shares.values(), Fraction(0)))


def gpu_share_from_tres_list(
    items: list[dict[str, Any]],
    rules: SliceRules,
    *,
    node: str | None = None,
    gpu_type: str | None = None,
) -> tuple[str | None, float]:
    """`gpu_share_from_tres` of sacct JSON's `tres.allocated` list."""
    return gpu_share_from_tres(tres_list_text(items), rules, node=node, gpu_type=gpu_type)


# --- node gres and ledger units -----------------------------------------------------------


def gres_gpu_parts(gres: str) -> dict[str | None, int]:
    """A node's configured gres (`gpu:h100:4`, `gpu:h100_4g.40gb:1,gpu:h100_1g.10gb:2`,
    `gpu:2,shard:64`, `gpu:h100:2(S:0-1)`) -> GPU type (None: untyped) -> count, in the
    order the string names them; shards are not GPUs and are left out. What the ledger's
    capacity counts per node and GPU type."""
    out: dict[str | None, int] = {}
    for entry in split_gres(gres):
        parts = entry.split("(", 1)[0].split(":")
        if parts[0] not in ("gpu", "gres/gpu"):
            continue
        if len(parts) == 1:
            name, count = None, 1
        elif len(parts) == 2:
            name, count = (None, int(parts[1])) if parts[1].isdigit() else (parts[1], 1)
        else:
            name, count = parts[1], int(parts[2]) if parts[2].isdigit() else 0
        if count:
            out[name] = out.get(name, 0) + count
    return out


def free_gpu_types(gres: str, alloc_tres: str) -> dict[str, int]:
    """A node's free GPUs of each type it names in its configured gres (`gres`, as
    `gres_gpu_parts` reads it) less the typed counts of its allocated TRES (`alloc_tres`:
    `gres/gpu:h100_1g.10gb=1`): `{"h100_4g.40gb": 0, "h100_1g.10gb": 1}`. A lend of a
    MIG slice type (`[models.NAME] gpu_type`) takes a node with one free. Untyped GPUs
    are not listed (a job asking for any GPU is not known to hold a type)."""
    held = gpu_types_of(alloc_tres)
    return {
        name: max(0, count - held.get(name, 0))
        for name, count in gres_gpu_parts(gres).items()
        if name is not None
    }


def unit_share(gpu_type: str | None, rules: SliceRules) -> Fraction:
    """The GPUs one unit of a ledger GPU type is: 1 for a whole GPU's type (`h100`, `gpu`,
    None), a MIG slice's fraction for a slice's (`h100_1g.10gb`: 1/7 by compute). What
    the ledger's capacity multiplies a node's count of that type by, and what the sreport
    agreement divides a slice's GPU time by (sreport counts a slice as one gres/gpu)."""
    if not gpu_type or not is_mig_type(gpu_type):
        return Fraction(1)
    return slice_share(parse_mig_profile(gpu_type), rules)


def needs_shares(tres: str) -> bool:
    """Whether a TRES string's GPU share may differ from its `gres/gpu` count: it names
    a MIG slice type or shards. Every other record is booked by its count, as before."""
    return "gres/shard" in tres or bool(_LOOKS_MIG.search(tres))
