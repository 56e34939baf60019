"""The output of `stb simulate` (`bridge.sim.cli`): the comparison and its selection report
as tables on the terminal, or as a table, JSON, markdown or HTML text (`bridge.sim.render`,
`bridge.sim.selection_render`) on stdout or in a file, written whole or not at all (a
temp file beside it, then a rename: `write_whole`).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rich.console import Console

from bridge.cli_text import fail, say
from bridge.paths import write_whole
from bridge.sim.result import SimReport
from bridge.sim.selection import Selection

errors = Console(stderr=True)


def emit(report: SimReport, selection: Selection, fmt: str, output: Path | None) -> None:
    """`report` and `selection` in `fmt` (one of `bridge.sim.cli.FORMATS`, checked there)
    on stdout, or written to `output` ("wrote ..." on stderr). A file that cannot be
    written ends the command with its one-line error (`fail`), exit code 1."""
    from bridge.sim import render, selection_render  # matplotlib: only when a run ran

    if fmt == "table":
        if output is None:
            out = Console(width=None if sys.stdout.isatty() else 160)
            for table in render.tables(report):
                out.print(table)
            selection_render.print_tables(selection, out)
            return
        buf = io.StringIO()
        text_console = Console(file=buf, width=160, color_system=None)
        for table in render.tables(report):
            text_console.print(table)
        selection_render.print_tables(selection, text_console)
        text = buf.getvalue()
    elif fmt == "json":
        text = render.to_json(report, selection)
    elif fmt == "markdown":
        text = selection_render.to_markdown(report, selection)
    else:
        text = selection_render.to_html(report, selection)
    if output is None:
        sys.stdout.write(text)
        return
    try:
        write_whole(output, text)
    except OSError as exc:
        raise fail(exc) from exc
    say(errors, f"wrote {output}")
