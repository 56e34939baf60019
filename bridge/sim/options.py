"""`stb simulate`'s option pairs: one table (`PAIRS`) of every option whose value is read
only when another option says so (a trace file only by the arrivals kind that reads it,
a site input only with its source, --load only for generated jobs, ...), and `settle`,
which applies it before anything is read. Pure: options in (by their flag, and which of
them the command line gave), options out, or `OptionClash` naming both options. Called
by `bridge.sim.cli`; tests/unit/test_sim_option_pairs.py walks the table.

An option given where it would not be read is never dropped silently. Where its meaning
is unambiguous it is honoured: a file that only one kind reads, given while that kind's
option was left at its default, chooses that kind (`--arrivals-trace F` means `--arrivals
azure`), and the report says so (`Settled.implied`). Otherwise the run is refused with a
message naming both options and what each is, before any input is read.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.sim.inputs.site import SERVICE_FROM, SITE_ARRIVALS, SITE_JOBS

#: arrivals the simulator makes (the public trace it rescales, the generators): the
#: models are m0, m1, ... at --mean-rps / (i + 1); a site's bring their own
GENERATED_ARRIVALS = ("azure", "synthetic", "ramps", "bursty", "daily")
#: jobs the simulator makes at --load (the public trace it rescales, the generator)
GENERATED_JOBS = ("alibaba", "synthetic")
#: the inputs that have a clock (a window of real time): the site's
CLOCKED = {
    "--arrivals": SITE_ARRIVALS,
    "--jobs": SITE_JOBS,
    "--service-from": tuple(k for k in SERVICE_FROM if k != "options"),
}

Values = Mapping[str, Any]


class OptionClash(ValueError):
    """An option given where another option's value means it would not be read."""


@dataclass(frozen=True)
class Pair:
    """`option` is read only when `reads(values)` holds; `deciders` are the options whose
    values decide that, and `needs` says how in words ("with --arrivals azure").
    `implies` (decider, value): when the command line gave `option` but not that
    decider, the decider takes that value (the one reading of `option`)."""

    option: str
    deciders: tuple[str, ...]
    needs: str
    reads: Callable[[Values], bool]
    implies: tuple[str, str] | None = None


def _given(value: object) -> bool:
    """A value that says something (None, "" and an empty list say nothing)."""
    if value is None:
        return False
    if isinstance(value, str | list | tuple):
        return bool(value)
    return True


def _clocked(v: Values) -> bool:
    """Some input has a real window (site arrivals, site jobs, measured service times)."""
    return any(v[option] in kinds for option, kinds in CLOCKED.items())


def _saved_arrivals(v: Values) -> bool:
    """Arrivals from a file with its own span (a CSV, a saved Prometheus answer)."""
    return v["--arrivals"] == "csv" or (
        v["--arrivals"] == "prometheus" and _given(v["--prometheus-json"])
    )


def _policies(v: Values) -> list[str]:
    return [p.strip() for p in str(v["--policies"]).split(",") if p.strip()]


def _chooses(option: str, decider: str, kind: str, note: str = "") -> Pair:
    """`option` is read by one kind of `decider` only (a file only that kind reads): given
    while `decider` was left at its default, it chooses that kind."""
    return Pair(
        option,
        (decider,),
        f"with {decider} {kind}{note}",
        lambda v: v[decider] == kind,
        implies=(decider, kind),
    )


def _among(option: str, decider: str, kinds: Collection[str], needs: str) -> Pair:
    """`option` is read only when `decider` is one of `kinds`."""
    return Pair(option, (decider,), needs, lambda v: v[decider] in kinds)


_CLOCK = "--arrivals prometheus|csv, --jobs sacct|ledger or --service-from prometheus|ledger"

#: every option read only when others say so (the one place that says which)
PAIRS: tuple[Pair, ...] = (
    # the arrivals
    _chooses("--arrivals-trace", "--arrivals", "azure"),
    _chooses("--arrivals-file", "--arrivals", "csv"),
    _chooses(
        "--prometheus-json", "--arrivals", "prometheus", " (service times have --service-json)"
    ),
    Pair(
        "--query",
        ("--arrivals", "--prometheus-url"),
        "with --arrivals prometheus and --prometheus-url (a live query; a saved answer "
        "holds its query's result)",
        lambda v: v["--arrivals"] == "prometheus" and _given(v["--prometheus-url"]),
    ),
    Pair(
        "--prometheus-url",
        ("--arrivals", "--service-from"),
        "with --arrivals prometheus or --service-from prometheus",
        lambda v: "prometheus" in (v["--arrivals"], v["--service-from"]),
    ),
    Pair(
        "--prometheus-save",
        ("--arrivals", "--prometheus-url"),
        "with --arrivals prometheus and --prometheus-url (it saves the live arrivals query)",
        lambda v: v["--arrivals"] == "prometheus" and _given(v["--prometheus-url"]),
    ),
    _among(
        "--scale",
        "--arrivals",
        SITE_ARRIVALS,
        "with the site's arrivals (--arrivals prometheus|csv; --mean-rps sets the others)",
    ),
    _among(
        "--max-gap-s",
        "--arrivals",
        SITE_ARRIVALS,
        "with the site's arrivals (--arrivals prometheus|csv)",
    ),
    _among(
        "--models",
        "--arrivals",
        GENERATED_ARRIVALS,
        "with generated arrivals (--arrivals synthetic|ramps|bursty|daily|azure; the site's "
        "bring their own models)",
    ),
    _among(
        "--mean-rps",
        "--arrivals",
        GENERATED_ARRIVALS,
        "with generated arrivals (--arrivals synthetic|ramps|bursty|daily|azure; the site's "
        "bring their own rates: --scale them)",
    ),
    # the jobs
    _chooses("--jobs-trace", "--jobs", "alibaba"),
    _chooses("--sacct-json", "--jobs", "sacct"),
    _among(
        "--load",
        "--jobs",
        GENERATED_JOBS,
        "with generated jobs (--jobs synthetic|alibaba; the site's come as they came)",
    ),
    _among(
        "--partition-kind",
        "--jobs",
        SITE_JOBS,
        "with the site's jobs (--jobs sacct|ledger)",
    ),
    Pair(
        "--ledger-url",
        ("--jobs", "--service-from"),
        "with --jobs ledger or --service-from ledger",
        lambda v: "ledger" in (v["--jobs"], v["--service-from"]),
    ),
    Pair(
        "--seed",
        ("--arrivals", "--jobs"),
        "with generated arrivals or jobs (--arrivals synthetic|ramps|bursty|daily|azure, --jobs "
        "synthetic|alibaba; the site's are replayed as they came)",
        lambda v: v["--arrivals"] in GENERATED_ARRIVALS or v["--jobs"] in GENERATED_JOBS,
    ),
    # the service times
    _chooses("--service-json", "--service-from", "prometheus"),
    # the fleet
    Pair(
        "--fleet-partitions",
        ("--fleet-nodes",),
        "with --fleet-nodes FILE",
        lambda v: _given(v["--fleet-nodes"]),
    ),
    Pair(
        "--nodes",
        ("--fleet-nodes",),
        "without --fleet-nodes (its file gives the nodes: give --nodes or --fleet-nodes, not both)",
        lambda v: not _given(v["--fleet-nodes"]),
    ),
    # the window
    Pair(
        "--since",
        ("--until", *CLOCKED),
        f"with site data that has a clock ({_CLOCK}), or with --until (the generators "
        "have none: --since and --until together only give the span)",
        lambda v: _clocked(v) or _given(v["--until"]),
    ),
    Pair(
        "--until",
        ("--since", *CLOCKED),
        f"with site data that has a clock ({_CLOCK}), or with --since (the generators "
        "have none: --since and --until together only give the span)",
        lambda v: _clocked(v) or _given(v["--since"]),
    ),
    Pair(
        "--days",
        ("--since", "--until"),
        "without both --since and --until (they give the span: give at most two of them)",
        lambda v: not (_given(v["--since"]) and _given(v["--until"])),
    ),
    Pair(
        "--days",
        ("--arrivals", "--prometheus-json", "--since", "--until"),
        "beside --since or --until when the arrivals are saved (--arrivals csv, "
        "--prometheus-json: else the file's own span)",
        lambda v: not _saved_arrivals(v) or _given(v["--since"]) or _given(v["--until"]),
    ),
    # the bridge's reserved pool
    Pair(
        "--reserve",
        ("--policies", "--tradeoff"),
        "when the bridge runs at its own size: --policies with bridge, or --tradeoff auto",
        lambda v: "bridge" in _policies(v) or str(v["--tradeoff"]).strip() == "auto",
    ),
    # the bridge's lend cap: every run of the bridge reads it, the trade-off's too
    Pair(
        "--lend-cap",
        ("--policies", "--tradeoff"),
        "when the bridge runs: --policies with bridge, or a --tradeoff other than none",
        lambda v: "bridge" in _policies(v) or str(v["--tradeoff"]).strip() != "none",
    ),
)


@dataclass(frozen=True)
class Settled:
    """The options after `settle`: `values` by flag, and `implied`: each decider a file
    chose, as decider -> the option that chose it (`{"--arrivals": "--arrivals-trace"}`)."""

    values: dict[str, Any]
    implied: dict[str, str] = field(default_factory=dict)


def shown(value: object) -> str:
    """An option's value as a message names it."""
    if not _given(value):
        return "not given"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value)


def settle(values: Values, given: Collection[str], pairs: Sequence[Pair] = PAIRS) -> Settled:
    """`values` (every flag of the table, at its value: given or default) with each
    implication applied, checked against `pairs`: `OptionClash` naming the first option
    of `given` that would not be read, the options that decide it and their values.
    `given`: the flags the command line gave."""
    out = dict(values)
    implied: dict[str, str] = {}
    for pair in pairs:
        if pair.implies is None or pair.option not in given:
            continue
        decider, value = pair.implies
        if decider not in given and decider not in implied and not pair.reads(out):
            out[decider] = value
            implied[decider] = pair.option
    for pair in pairs:
        if pair.option in given and not pair.reads(out):
            here = ", ".join(
                f"{d} {shown(out[d])}" + (f" (implied by {implied[d]})" if d in implied else "")
                for d in pair.deciders
            )
            raise OptionClash(
                f"{pair.option} is read only {pair.needs}; here {here}, so it would be ignored"
            )
    return Settled(out, implied)


def flags(pairs: Sequence[Pair] = PAIRS) -> set[str]:
    """Every flag the table names."""
    return {f for p in pairs for f in (p.option, *p.deciders)}
