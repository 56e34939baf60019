"""Slurm hostlist expressions: `n[1-3,7]` <-> ["n1", "n2", "n3", "n7"], on python-hostlist
(module `hostlist`). Pure functions, used wherever node names cross the Slurm boundary:
the parsers, the backends' submissions, the ledger's events, the lab's slurm.conf.

python-hostlist covers the Slurm syntax the bridge meets: top-level commas, numbers and
ranges in brackets, zero padding kept (`gpu-a[01-04]`; a range is as wide as its lower
bound, so `n[8-10]` is n8..n10, as in Slurm), several bracket groups in one name as a
cross product (`r[1-2]n[1-3]`), text after a group (`n[1-2]-ib`). It refuses nested
brackets and descending or empty ranges, as Slurm does, and lists of over 100,000 names.
This module adds two things: duplicates are kept in order (python-hostlist drops them by
default), and blanks beside commas and inside brackets are dropped. No fallback parser is
needed. Slurm syntax read neither here nor by python-hostlist: blanks as separators
(Slurm splits on them too; here `n1 n2` is one name) and the `n[000x133]` boxes of 3-D
torus machines.

`compress` is python-hostlist's: names sorted and grouped on their rightmost number, as
Slurm prints a node list (`gpu[01-10]`, `n[1-2]-ib`), duplicates dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import hostlist as _hostlist

#: blanks beside a comma, after "[" or before "]" (dropped before expanding)
_BLANKS = re.compile(r"\s*,\s*|\[\s+|\s+\]")


class HostlistError(ValueError):
    """A hostlist expression Slurm would not accept; the message quotes it."""


def _tight(match: re.Match[str]) -> str:
    return match.group(0).strip()


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression to node names, in order, duplicates kept."""
    if not expr or not expr.strip():
        return []
    text = _BLANKS.sub(_tight, expr.strip())
    try:
        names: list[str] = _hostlist.expand_hostlist(text, allow_duplicates=True)
    except _hostlist.BadHostlist as exc:
        raise HostlistError(f"{exc} in hostlist {expr!r}") from exc
    return names


def compress(names: Iterable[str]) -> str:
    """Format node names as a hostlist expression (`n[1-3,7]`), sorted and grouped as
    Slurm prints them; blank names are skipped, a name with "[", "]" or "," refused."""
    given = list(names)
    try:
        text: str = _hostlist.collect_hostlist(given)
    except _hostlist.BadHostlist as exc:
        bad = [n for n in given if re.search(r"[][,]", n)]
        raise HostlistError(f"{exc}: node names {bad!r} cannot be put in a hostlist") from exc
    return text


__all__ = ["HostlistError", "compress", "expand"]
