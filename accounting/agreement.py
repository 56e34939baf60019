"""The ledger against sreport, hour by hour: what finance already reads from Slurm
(`sreport -T gres/gpu cluster Utilization` and `cluster AccountUtilizationByUser`) beside
the ledger's own lines for the same completed hour, with every difference named.

Pure comparison over figures in GPU-seconds; the ledger's side is read here
(`ledger_hour`), sreport's by the caller (`bridge.ledger.sreport.sreport_agreement`).
The ledger keeps GPU-milliseconds from Slurm's whole seconds, so equal means equal.

Differences the ledger makes on purpose are not disagreements (docs/finance/sreport.md):
it splits serving jobs by model and books lent time to the borrower's team, but
neither changes an account's or the cluster's totals, so no allowance is needed for them.
What can differ, and the cause each difference is given:
- GPUs allocated inside an advanced reservation: sreport 22.05 books them as idle (its
  reservations carry no GPU time), the ledger as the job's;
- an hour slurmdbd rolled up before a job's record reached it (slurmctld queues its
  messages while slurmdbd is away): the ledger has GPU time of some accounts that sreport
  lacks, nothing else differs, and the ledger saw those runs change recently: `Pending`,
  named with the runs, until slurmdbd re-rolls the hour (at its next hourly pass, or at
  once with `sacctmgr roll`); an ingest before the hour ended: re-ingest;
- a pool whose allocation and down time exceed its capacity while another has room:
  sreport clamps the cluster, the ledger each pool;
- Planned: sreport books the time eligible jobs waited (its Planned) to CPUs only, in
  22.05 and every release since (as_mysql_rollup.c at slurm-22-05-8-1, l. 1676-1680:
  `TIME_RESV` on `TRES_CPU`, the job's requested CPUs): its gres/gpu Planned is 0, and
  the GPU time jobs waited for is in its Idle, as in the ledger's. The ledger books no
  planned GPU time; a Planned above 0 would mean a release that books GPUs too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from sqlalchemy import Engine, func, select

from accounting.buckets import HOUR
from accounting.capacity import event_capacity, units_of
from accounting.idle import runs_in_disconnects
from accounting.schema import DOWN_WORKLOADS, LedgerRow, SourceRecord
from accounting.slurm_events import load_events, node_attrs
from bridge.slurm.slices import SliceRules

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
SOURCES = SourceRecord.__table__  # type: ignore[attr-defined]
#: sreport's columns the ledger is compared on
COLUMNS = ("allocated", "down", "planned_down", "idle", "planned", "reported")


@dataclass
class HourFigures:
    """One completed hour of one cluster, GPU-seconds, as one side tells it."""

    allocated: int = 0
    down: int = 0
    planned_down: int = 0
    idle: int = 0
    reported: int = 0
    accounts: dict[str, int] = field(default_factory=dict)
    #: sreport's Planned (after `accounts`, so the positional fields keep their places);
    #: the ledger's is 0: sreport books Planned to CPUs only (module docstring)
    planned: int = 0

    def column(self, name: str) -> int:
        return int(getattr(self, name))


@dataclass(frozen=True)
class Difference:
    hour: datetime
    what: str  # a column of COLUMNS, or "account NAME"
    ledger: int
    sreport: int
    cause: str

    @property
    def delta(self) -> int:
        return self.ledger - self.sreport


@dataclass(frozen=True)
class ChangedRun:
    """A job run the ledger books to an hour that sreport's rollup of it may predate."""

    job_id: str
    account: str
    start: datetime | None
    end: datetime | None
    #: GPU-seconds in the hour, the ledger's
    gpu_s: int
    #: when the ledger last saw its record change (or first saw it)
    changed_at: datetime


@dataclass(frozen=True)
class Pending:
    """An hour slurmdbd has not re-rolled since a job record of it changed: the ledger has
    GPU time of some accounts that sreport's rollup lacks and nothing else differs, and the
    ledger saw those accounts' runs change within a re-roll interval. slurmdbd re-rolls such
    an hour at its next hourly pass (or at once: `sacctmgr roll`, `stb accounting agree
    --reroll`). Not a failure of the ledger; `differences` says what sreport lacks now."""

    hour: datetime
    differences: tuple[Difference, ...]
    runs: tuple[ChangedRun, ...]


@dataclass
class Agreement:
    hours: list[datetime] = field(default_factory=list)
    #: hours sreport has no line for (not rolled up yet)
    not_rolled: list[datetime] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    #: per hour: (ledger, sreport)
    figures: dict[datetime, tuple[HourFigures, HourFigures]] = field(default_factory=dict)
    #: hours whose rollup lags a changed job record (not differences)
    pending: list[Pending] = field(default_factory=list)
    #: hours slurmdbd was asked to roll up again before they were compared
    rerolled: list[datetime] = field(default_factory=list)
    #: hours whose lines differ only by sreport's rules (`rollup_view` equals sreport):
    #: per hour, the ledger's lines as sreport counts them
    reconciled: dict[datetime, HourFigures] = field(default_factory=dict)

    @property
    def agreed(self) -> list[datetime]:
        bad = {d.hour for d in self.differences} | {p.hour for p in self.pending}
        return [h for h in self.hours if h not in bad]

    @property
    def ok(self) -> bool:
        return not self.differences


def slurm_ms(ms: int, gpu_type: str, unit: Callable[[str], Fraction]) -> int:
    """The ledger's GPU-ms of a GPU type as Slurm counts them: a MIG slice's fraction of a
    GPU back to one `gres/gpu` per slice (sreport's unit); a whole GPU's as they are."""
    share = unit(gpu_type)
    return ms if share == 1 else round(Fraction(ms) / share)


def ledger_hour(
    engine: Engine, cluster: str, hour: datetime, slices: SliceRules | None = None
) -> HourFigures:
    """The ledger's lines of one hour of one cluster, as sreport's columns: a MIG slice's
    GPU time counted as Slurm counts it, one `gres/gpu` per slice (`slices`: the rules the
    ledger booked it by, `[accounting.slices]`; the default's when None)."""
    unit = units_of(slices or SliceRules())
    q = (
        select(LEDGER.c.workload, LEDGER.c.account, LEDGER.c.gpu_type, func.sum(LEDGER.c.gpu_ms))
        .where(LEDGER.c.bucket == hour, LEDGER.c.cluster == cluster)
        .group_by(LEDGER.c.workload, LEDGER.c.account, LEDGER.c.gpu_type)
    )
    out = HourFigures()
    accounts: dict[str, int] = defaultdict(int)
    with engine.connect() as conn:
        for workload, account, gpu_type, ms in conn.execute(q):
            ms = slurm_ms(int(ms), gpu_type, unit)
            if workload == "idle":
                out.idle += ms
            elif workload == "planned_down":
                out.planned_down += ms
            elif workload in DOWN_WORKLOADS:
                out.down += ms
            else:
                out.allocated += ms
                accounts[account] += ms
    # Slurm's times are whole seconds, so the ledger's milliseconds are too
    for name in ("allocated", "down", "planned_down", "idle", "planned"):
        setattr(out, name, round(getattr(out, name) / 1000))
    # sreport's Reported includes Planned (src/sreport/cluster_reports.c 22.05, l. 1549-1554)
    out.reported = out.allocated + out.down + out.planned_down + out.idle + out.planned
    out.accounts = {a: round(ms / 1000) for a, ms in accounts.items()}
    return out


def compare(hour: datetime, ledger: HourFigures, sreport: HourFigures) -> list[Difference]:
    """Every column and account that differs, each with its likely cause."""
    out = []
    for col in COLUMNS:
        a, b = ledger.column(col), sreport.column(col)
        if a != b:
            out.append(Difference(hour, col, a, b, _cause(col, a - b)))
    for acct in sorted(set(ledger.accounts) | set(sreport.accounts)):
        if acct == "root":
            continue  # sreport's root line is every account together
        a, b = ledger.accounts.get(acct, 0), sreport.accounts.get(acct, 0)
        if a != b:
            cause = (
                "the ledger has jobs of this account sreport has not rolled up (re-roll)"
                if a > b
                else "sreport has jobs of this account the ledger has not ingested (re-ingest)"
            )
            out.append(Difference(hour, f"account {acct}", a, b, cause))
    return out


def _cause(column: str, delta: int) -> str:
    if column == "reported" and delta > 0:
        return (
            "the ledger books capacity Slurm did not have: a node or hour before slurmdbd "
            "registered it (capacity from the inventory, not from slurmdbd's events)"
        )
    if column == "reported":
        return (
            "capacity differs: the cluster's registered TRES or node list changed in the hour "
            "and the ledger's inventory does not know a node's GPUs"
        )
    if column in ("down", "planned_down"):
        return (
            "down time differs: a node event the ledger has not read (re-ingest), or sreport "
            "clamped the cluster where the ledger clamps each pool"
        )
    if column == "planned":
        return (
            "sreport booked GPU time to Planned (eligible jobs waiting): 22.05 books Planned "
            "to CPUs only, so this Slurm release differs; the ledger keeps waiting time in "
            "idle"
        )
    if column == "allocated":
        return (
            "allocation differs: a job record read by one side and not the other (an hour "
            "rolled up or ingested before the job's record reached slurmdbd), or GPUs "
            "allocated inside an advanced reservation (sreport 22.05 books them idle)"
        )
    return "follows from the other columns"


def rollup_view(
    engine: Engine,
    cluster: str,
    hour: datetime,
    now: datetime,
    slices: SliceRules | None = None,
) -> HourFigures:
    """The ledger's hour counted as slurmdbd's rollup counts it (as_mysql_rollup.c,
    `_setup_cluster_usage` and `_setup_cluster_tres_usage`), from the ledger's own inputs
    (slurmdbd's events and the node inventory it stored, its allocation per cell):

    - the down time left after allocation is clamped for the cluster as a whole, not per
      pool and GPU type: a node down while the ledger books its GPUs to a job (a job run
      that slurmctld ended only after the node went down) is down time to sreport, taken
      from the idle time of other pools, and allocation alone in the ledger (a GPU is
      booked once);
    - node events count over the span from the hour's first registration to its last
      one's end, gaps between registrations included.

    Equal to `ledger_hour` but for those two rules; the agreement check compares it with
    sreport where the ledger's own lines differ. MIG slices count as in `ledger_hour`."""
    lo, hi = hour, hour + HOUR
    led = ledger_hour(engine, cluster, hour, slices)
    unit = units_of(slices or SliceRules())
    with engine.connect() as conn:
        events = load_events(conn, [cluster], lo, hi)
        if not any(e.is_registration for e in events):
            return led
        runs = runs_in_disconnects(conn, events, lo, hi)
        cap, down = event_capacity(
            events, node_attrs(conn, cluster), lo, min(hi, max(now, lo)),
            [r for r in runs if r.cell[0] == cluster], hull=True, unit=unit,
        )  # fmt: skip
    total = sum(slurm_ms(ms, c[2], unit) for c, ms in cap.items())
    raw_down = sum(
        slurm_ms(ms, c[2], unit) for (c, line, _u), ms in down.items() if line != "planned_down"
    )
    raw_pdown = sum(
        slurm_ms(ms, c[2], unit) for (c, line, _u), ms in down.items() if line == "planned_down"
    )
    alloc = min(led.allocated * 1000, total)
    d = max(0, min(raw_down, total - alloc))
    pd = max(0, min(raw_pdown, total - alloc - d))
    view = HourFigures(
        allocated=led.allocated,
        down=round(d / 1000),
        planned_down=round(pd / 1000),
        accounts=dict(led.accounts),
        planned=led.planned,
    )
    view.reported = round(total / 1000)
    view.idle = view.reported - view.allocated - view.down - view.planned_down - view.planned
    return view


#: how long after a job record changes sreport may still lack it: slurmdbd re-rolls an hour
#: whose records changed at its next hourly rollup, a few minutes past the hour
REROLL_LAG = timedelta(minutes=75)


def lagging_accounts(differences: Sequence[Difference]) -> set[str] | None:
    """The accounts whose GPU time sreport lacks, when that is the whole difference (the
    shape of a rollup that predates a job record: allocated lower by those accounts'
    shortfall, idle higher by the same, capacity and down time equal); else None."""
    by_what = {d.what: d for d in differences}
    accounts = {
        w.removeprefix("account "): d for w, d in by_what.items() if w.startswith("account ")
    }
    alloc = by_what.get("allocated")
    if alloc is None or alloc.delta <= 0 or not accounts:
        return None
    if any(d.delta <= 0 for d in accounts.values()):
        return None
    if set(by_what) - {"allocated", "idle"} - {f"account {a}" for a in accounts}:
        return None
    idle = by_what.get("idle")
    if idle is None or idle.delta != -alloc.delta:
        return None
    if sum(d.delta for d in accounts.values()) != alloc.delta:
        return None
    return set(accounts)


def changed_runs(
    engine: Engine, cluster: str, hour: datetime, accounts: Iterable[str]
) -> list[ChangedRun]:
    """The ledger's runs of `accounts` in the hour, the most recently changed first."""
    q = (
        select(
            SOURCES.c.job_id, LEDGER.c.account, SOURCES.c.start, SOURCES.c.end,
            SOURCES.c.last_changed_at, func.sum(LEDGER.c.gpu_ms),
        )
        .join(SOURCES, SOURCES.c.key == LEDGER.c.source)
        .where(
            LEDGER.c.bucket == hour, LEDGER.c.cluster == cluster,
            LEDGER.c.account.in_(sorted(accounts)),
        )
        .group_by(
            SOURCES.c.job_id, LEDGER.c.account, SOURCES.c.start, SOURCES.c.end,
            SOURCES.c.last_changed_at,
        )
    )  # fmt: skip
    with engine.connect() as conn:
        runs = [
            ChangedRun(job, acct, _aware(s), _aware(e), round(int(ms) / 1000), _aware(ch) or hour)
            for job, acct, s, e, ch, ms in conn.execute(q)
        ]
    return sorted(runs, key=lambda r: (r.changed_at, r.end or r.changed_at), reverse=True)


def pending_of(
    hour: datetime,
    differences: Sequence[Difference],
    runs: Sequence[ChangedRun],
    now: datetime,
) -> Pending | None:
    """`Pending` when the differences are a lagging rollup's and every lagging account has
    a run the ledger saw change within `REROLL_LAG` of `now`; else None (a difference)."""
    accounts = lagging_accounts(differences)
    if accounts is None:
        return None
    recent = [r for r in runs if r.account in accounts and now - r.changed_at < REROLL_LAG]
    if {r.account for r in recent} != accounts:
        return None
    return Pending(hour, tuple(differences), tuple(recent[:3]))


def _aware(t: datetime | None) -> datetime | None:
    return t if t is None or t.tzinfo else t.replace(tzinfo=UTC)


def summarize(agreement: Agreement) -> dict[str, int]:
    """Totals over the agreed and compared hours, for a bench's RESULT line."""
    totals: dict[str, int] = defaultdict(int)
    for led, srep in agreement.figures.values():
        for col in COLUMNS:
            totals[f"ledger_{col}_s"] += led.column(col)
            totals[f"sreport_{col}_s"] += srep.column(col)
    return dict(totals)
