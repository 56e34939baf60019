"""Hostlist expressions (`bridge.slurm.hostlist`, on python-hostlist): on forms Slurm
prints, on every node list in the recorded Slurm outputs (tests/data/slurm), against the
names those records list beside it, and against the project's own expansion from before
python-hostlist (`_oracle_expand`, kept here as the oracle) on generated expressions."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.slurm.hostlist import HostlistError, compress, expand

DATA = Path(__file__).parent.parent / "data" / "slurm"
PROPS = settings(database=None, deadline=None, max_examples=400)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("gpu-a[01-04]", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]),
        ("n[3-4],login1", ["n3", "n4", "login1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node[009-011]", ["node009", "node010", "node011"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("n1,n1", ["n1", "n1"]),
        (" n[ 1-2 ] , n4 ", ["n1", "n2", "n4"]),
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
        ([f"gpu{i:02d}" for i in range(1, 11)], "gpu[01-10]"),
        (["n1-ib", "n2-ib"], "n[1-2]-ib"),
        (["n2", "n1", "n2"], "n[1-2]"),
        ([], ""),
    ],
)
def test_compress(names: list[str], expr: str) -> None:
    assert compress(names) == expr


def test_round_trip_keeps_padding() -> None:
    names = [f"gpu{i:03d}" for i in (1, 2, 3, 10, 11, 99)]
    assert expand(compress(names)) == names


@pytest.mark.parametrize(
    "bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[1,,2]", "n[1-[2]]", "n[]", "n[0-200000]"]
)
def test_bad_expressions_are_refused_quoting_them(bad: str) -> None:
    with pytest.raises(HostlistError, match=re.escape(repr(bad))):
        expand(bad)


def test_a_name_with_hostlist_syntax_cannot_be_compressed() -> None:
    with pytest.raises(HostlistError, match=re.escape("['n[1]']")):
        compress(["n2", "n[1]"])


# -- every node list in the recorded Slurm outputs -------------------------------------------

#: JSON keys whose string value is a hostlist (squeue, sacct, slurmrestd); "range" and
#: "list" only inside a "nodes" object (sacct's steps, squeue's job_resources of 24.11+)
JSON_KEYS = {"nodes", "required_nodes", "excluded_nodes", "batch_host", "nodename", "node_list"}
NESTED_KEYS = {"range", "list"}
#: `Nodes=` of scontrol show partition / reservation (not MaxNodes=, TotalNodes=, ...)
SCONTROL_NODES = re.compile(r"(?<![A-Za-z])Nodes=(\S+)")
NOT_A_LIST = {"", "None assigned", "(null)"}


def _json_lists(value: Any, key: str = "", parent: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_lists(v, k, key)
    elif isinstance(value, list):
        for v in value:
            yield from _json_lists(v, key, parent)
    elif isinstance(value, str) and (
        key in JSON_KEYS or (key in NESTED_KEYS and parent == "nodes")
    ):
        yield value


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError:  # a recorded error page (rest-no-token, rest-no-path)
        return None


def recorded_hostlists() -> dict[str, set[str]]:
    """Every node list in tests/data/slurm, by the file it is in."""
    found: dict[str, set[str]] = {}
    for path in sorted(DATA.iterdir()):
        if path.suffix == ".json":
            lists = list(_json_lists(_json(path)))
        elif path.name.startswith("scontrol-"):
            lists = SCONTROL_NODES.findall(path.read_text())
        elif path.name.startswith("sacctmgr-events"):  # Cluster|name|nodes|node|...
            lists = [line.split("|")[2] for line in path.read_text().splitlines() if line]
        else:
            continue
        found[path.name] = {text for text in lists if text not in NOT_A_LIST}
    return found


BY_FILE = recorded_hostlists()
RECORDED = sorted(set().union(*BY_FILE.values()))


def test_the_recorded_outputs_hold_node_lists_with_ranges() -> None:
    # the collector found lists in every format, ranges among them: the tests below
    # cannot pass on nothing
    files = {name for name, lists in BY_FILE.items() if lists}
    assert any(f.startswith("scontrol-") for f in files)
    assert any(f.startswith("sacctmgr-") for f in files)
    assert any(f.startswith("sacct-matrix") for f in files)
    assert any(f.startswith("squeue-") for f in files)
    assert any(f.startswith("rest-") for f in files)
    assert [t for t in RECORDED if "[" in t]


@pytest.mark.parametrize("text", RECORDED)
def test_recorded_node_lists_expand_as_the_oracle_does(text: str) -> None:
    assert expand(text) == _oracle_expand(text)


@pytest.mark.parametrize("text", RECORDED)
def test_recorded_node_lists_compress_back_to_slurms_own_text(text: str) -> None:
    assert compress(expand(text)) == text


def _beside(value: Any) -> Iterator[tuple[str, list[str]]]:
    """(hostlist, the names the record lists beside it) in squeue's and sacct's JSON."""
    if isinstance(value, list):
        for v in value:
            yield from _beside(v)
        return
    if not isinstance(value, dict):
        return
    nodes = value.get("nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("range"), str):  # sacct's steps
        yield nodes["range"], list(nodes["list"])
    if isinstance(nodes, dict) and isinstance(nodes.get("allocation"), list):  # squeue 24.11+
        yield nodes["list"], [a["name"] for a in nodes["allocation"]]
    if isinstance(nodes, str) and isinstance(value.get("allocated_nodes"), list):  # 22.05
        yield nodes, [a["nodename"] for a in value["allocated_nodes"]]
    for v in value.values():
        yield from _beside(v)


def test_node_lists_name_the_nodes_their_records_list_beside_them() -> None:
    pairs = [p for path in sorted(DATA.glob("*.json")) for p in _beside(_json(path))]
    assert any("[" in text for text, _ in pairs)
    for text, names in pairs:
        assert expand(text) == names, text


def _scontrol(name: str) -> list[dict[str, str]]:
    records = []
    for line in (DATA / name).read_text().splitlines():
        fields = re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", line)
        records.append(dict(fields))
    return records


def test_partitions_hold_the_nodes_that_name_them_and_as_many_as_they_count() -> None:
    member: dict[str, set[str]] = {}
    for node in _scontrol("scontrol-nodes-22.05.txt"):
        for part in node["Partitions"].split(","):
            member.setdefault(part, set()).add(node["NodeName"])
    parts = _scontrol("scontrol-partitions-22.05.txt")
    assert parts and any("[" in p["Nodes"] for p in parts)
    for p in parts:
        names = expand(p["Nodes"])
        assert set(names) == member[p["PartitionName"]]
        assert len(names) == int(p["TotalNodes"])
    for r in _scontrol("scontrol-reservations-22.05.txt"):
        assert len(expand(r["Nodes"])) == int(r["NodeCnt"])
    rest = _json(DATA / "rest-partitions-22.05.json")["partitions"]
    for p in rest:
        assert len(expand(p["nodes"])) == p["total_nodes"]
    every = {n for names in member.values() for n in names}
    for line in (DATA / "sacctmgr-events-22.05.txt").read_text().splitlines():
        kind, _, nodes, *_, tres, _ = line.split("|")
        if kind == "Cluster":  # the cluster's nodes, as many as its TRES count
            assert set(expand(nodes)) == every
            assert len(expand(nodes)) == int(dict(t.split("=") for t in tres.split(","))["node"])


# -- generated expressions, against the oracle -----------------------------------------------

_number = st.integers(0, 120)
_width = st.integers(0, 3)


@st.composite
def _range(draw: st.DrawFn) -> str:
    lo, width = draw(_number), draw(_width)
    if draw(st.booleans()):
        return f"{lo:0{width}d}"
    hi = lo + draw(st.integers(-2, 12))  # sometimes descending: refused by both
    return f"{lo:0{width}d}-{hi:0{draw(_width)}d}"


@st.composite
def _part(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(["n", "gpu-a", "r", "node", "x1y"]))
    groups = draw(st.integers(0, 2))
    text = prefix
    for _ in range(groups):
        ranges = draw(st.lists(_range(), min_size=1, max_size=3))
        pad = draw(st.sampled_from(["", " "]))
        text += f"[{pad}{','.join(ranges)}{pad}]" + draw(st.sampled_from(["", "n", "-ib"]))
    if not groups:
        text += str(draw(_number))
    return text


@st.composite
def _expression(draw: st.DrawFn) -> str:
    parts = draw(st.lists(_part(), min_size=1, max_size=4))
    if draw(st.booleans()) and parts:  # a duplicate
        parts.append(parts[0])
    text = draw(st.sampled_from([",", ", ", " ,"])).join(parts)
    # now and then a flaw that both must refuse
    flaw = draw(st.sampled_from(["", "", "", "[", "]", ",[1-]", "[1,,2]"]))
    return text + flaw


def _outcome(fn: Any, text: str) -> list[str] | str:
    try:
        return list(fn(text))
    except HostlistError:
        return "refused"


@PROPS
@given(_expression())
def test_generated_expressions_expand_as_the_oracle_does(text: str) -> None:
    assert _outcome(expand, text) == _outcome(_oracle_expand, text)


@PROPS
@given(st.lists(st.builds(lambda p, n, w: f"{p}{n:0{w}d}", st.sampled_from(["n", "gpu", "a-"]),
                          _number, _width)))  # fmt: skip
def test_compressed_names_expand_to_the_same_names_once_each(names: list[str]) -> None:
    back = expand(compress(names))
    assert sorted(back) == sorted(set(names))


# -- the oracle: the project's own expansion before python-hostlist ---------------------------


def _oracle_split_top(expr: str) -> list[str]:
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


def _oracle_ranges(body: str, expr: str) -> list[str]:
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


def _oracle_one(name: str, expr: str) -> list[str]:
    start = name.find("[")
    if start < 0:
        if "]" in name:
            raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        return [name]
    end = name.find("]", start)
    if end < 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    prefix, body, rest = name[:start], name[start + 1 : end], name[end + 1 :]
    return [prefix + n + r for n in _oracle_ranges(body, expr) for r in _oracle_one(rest, expr)]


def _oracle_expand(expr: str) -> list[str]:
    if not expr or not expr.strip():
        return []
    return [host for part in _oracle_split_top(expr) for host in _oracle_one(part, expr)]
