"""The runs of `stb simulate` (`bridge.sim.cli`), each with a progress bar on stderr
(simulated time; left on screen only on a terminal): the comparison of the set-ups
(`run`, `bridge.sim.policies.compare`) and the selection report's trade-off runs and
selection (`run_selection`, `bridge.sim.policies.tradeoff`, `bridge.sim.selection.select`).
"""

from __future__ import annotations

import dataclasses
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from bridge.sim.criteria import Criteria
from bridge.sim.policies import Scenario, compare, tradeoff
from bridge.sim.result import SimReport
from bridge.sim.selection import Selection, select

errors = Console(stderr=True)


def _bars() -> Progress:
    """The runs' progress bars on stderr: name, bar, percentage, time taken (left on
    screen only on a terminal)."""
    return Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=errors,
        transient=not sys.stderr.isatty(),
    )


def run(scenario: Scenario, policies: list[str]) -> SimReport:
    """`compare` with one progress bar per policy on stderr (simulated time)."""
    with _bars() as progress:
        tasks: dict[str, TaskID] = {
            p: progress.add_task(p, total=scenario.horizon_s, start=False) for p in policies
        }
        current: list[str] = []  # the policy running now

        def step(name: str, t: float, total: float) -> None:
            if not current or current[0] != name:  # the next policy's first report
                if current:  # the previous one ended between two reports
                    progress.update(tasks[current[0]], completed=total)
                progress.start_task(tasks[name])
                current[:] = [name]
            progress.update(tasks[name], completed=t, total=total)

        report = compare(scenario, policies, step)
        for task in tasks.values():
            progress.update(task, completed=scenario.horizon_s)
    return report


def run_selection(
    scenario: Scenario, report: SimReport, sizes: list[int], criteria: Criteria
) -> tuple[SimReport, Selection]:
    """The selection report's trade-off runs (`tradeoff` at `sizes`, with a progress bar
    per run on stderr; none when `sizes` is empty) added to `report`, and its selection."""
    if sizes:
        with _bars() as progress:
            tasks: dict[str, TaskID] = {}

            def step(name: str, t: float, total: float) -> None:
                if name not in tasks:  # the next run's first report: the others ended
                    for task in tasks.values():
                        progress.update(task, completed=total)
                    tasks[name] = progress.add_task(name, total=total)
                progress.update(tasks[name], completed=t)

            runs = tradeoff(scenario, sizes, criteria.target, step, report.results)
            for task in tasks.values():
                progress.update(task, completed=scenario.horizon_s)
        report = dataclasses.replace(report, tradeoff=runs)
    return report, select(report, criteria)
