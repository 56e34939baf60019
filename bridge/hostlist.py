"""Slurm hostlist expressions: `n[1-3,7]` <-> ["n1", "n2", "n3", "n7"].

Pure functions, used wherever node names cross the Slurm boundary. Zero padding is
kept (`gpu-a[01-04]`). Several bracket groups in one name (`r[1-2]n[1-3]`) expand as a
cross product, as Slurm does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_TAIL_NUMBER = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """A hostlist expression Slurm would not accept; the message quotes it."""


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise HostlistError(f"empty range in hostlist {expr!r}")
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"bad range {item!r} in hostlist {expr!r}")
        if not sep:
            out.append(lo)
            continue
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        a, b = int(lo), int(hi)
        if b < a:
            raise HostlistError(f"descending range {item!r} in hostlist {expr!r}")
        if b - a > 100_000:
            raise HostlistError(f"range {item!r} in hostlist {expr!r} is too large")
        out.extend(str(i).zfill(width) for i in range(a, b + 1))
    return out


def _expand_one(name: str, expr: str) -> list[str]:
    start = name.find("[")
    if start < 0:
        if "]" in name:
            raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        return [name]
    end = name.find("]", start)
    if end < 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    prefix, body, rest = name[:start], name[start + 1 : end], name[end + 1 :]
    return [prefix + n + r for n in _expand_ranges(body, expr) for r in _expand_one(rest, expr)]


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression to node names, in order, duplicates kept."""
    if not expr or not expr.strip():
        return []
    return [host for part in _split_top(expr) for host in _expand_one(part, expr)]


def compress(names: Iterable[str]) -> str:
    """Format node names as a hostlist expression (`n[1-3,7]`), order of first sight."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        m = _TAIL_NUMBER.match(name)
        if not m:
            if name not in plain:
                plain.append(name)
                order.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        if int(digits) not in groups[key]:
            groups[key].append(int(digits))
    out = []
    for entry in order:
        if isinstance(entry, str):
            out.append(entry)
            continue
        prefix, width = key = entry
        nums = sorted(groups[key])
        if len(nums) == 1:
            out.append(f"{prefix}{str(nums[0]).zfill(width)}")
            continue
        ranges, lo, prev = [], nums[0], nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            a, b = str(lo).zfill(width), str(prev).zfill(width)
            ranges.append(a if lo == prev else f"{a}-{b}")
            if n is not None:
                lo = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
