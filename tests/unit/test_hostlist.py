"""Hostlist expressions, on forms Slurm prints."""

from __future__ import annotations

import pytest

from bridge.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("gpu-a[01-04]", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]),
        ("n[3-4],login1", ["n3", "n4", "login1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node[009-011]", ["node009", "node010", "node011"]),
        ("", []),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
        (["gpu-a01", "gpu-a02", "gpu-a04"], "gpu-a[01-02,04]"),
        (["n4", "n3"], "n[3-4]"),
        (["login", "n1"], "login,n1"),
        (["n5"], "n5"),
    ],
)
def test_compress(names: list[str], expr: str) -> None:
    assert compress(names) == expr


def test_round_trip_keeps_padding() -> None:
    names = [f"gpu{i:03d}" for i in (1, 2, 3, 10, 11, 99)]
    assert expand(compress(names)) == names


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[1,,2]"])
def test_bad_expressions_are_refused_quoting_them(bad: str) -> None:
    with pytest.raises(HostlistError, match="hostlist"):
        expand(bad)
