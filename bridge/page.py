"""The self-contained HTML page both of the project's reports render into, and the chart
code they share: the finance report (`accounting.html`) and the simulator's
(`bridge.sim.render`, `bridge.sim.selection_render`).

One file, readable offline and safe to mail or archive: inline CSS (`CSS`), inline SVG
charts, no scripts, fonts, images or URLs, and a Content-Security-Policy that loads
nothing (`head`). Charts use matplotlib's object API (`Figure`, no pyplot: no GUI
backend, no global figure state), drawn under `drawing()` (glyphs as paths, so their
text needs no font on the reader's machine; "$" in a name is no math) and saved with
`svg` (deterministic: no metadata, a hash salt per chart). Text is escaped with
`html.escape` by whoever makes it.
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: one saturated colour per workload (the finance report's screenshot test looks for the
#: first three; the simulator's charts use the same)
WORKLOAD_COLOURS: Mapping[str, str] = {
    "training": "#0060df",
    "elastic": "#ff7f00",
    "inference": "#00b140",
    "idle": "#a0a0a0",
}

CSS = """
body { font-family: "DejaVu Sans", Verdana, Arial, sans-serif; margin: 2em auto;
       max-width: 1150px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; }
h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1em; margin: 1.5em 0 .5em; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dl.meta dt { font-weight: bold; }
dl.meta dd { margin: 0; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
figcaption, p.caption { font-size: .9em; color: #555; }
table { border-collapse: collapse; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
th { background: #f0f0f0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tfoot td { font-weight: bold; background: #f7f7f7; }
.muted { color: #888; }
.wide { overflow-x: auto; }
.wide th { font-size: .85em; }
details { margin: .6em 0; }
summary { cursor: pointer; }
pre { font-size: .8em; background: #f7f7f7; padding: .6em; overflow-x: auto; }
footer { margin-top: 2em; font-size: .85em; color: #666; }
"""

#: no <metadata> block (it carries a date and URLs)
_NO_METADATA: dict[str, Any] = {"Creator": None, "Date": None, "Format": None, "Type": None}


@dataclass(frozen=True)
class Chart:
    title: str
    svg: str
    caption: str


def head(title: str) -> list[str]:
    """The page's opening lines, up to and with its <h1> (`title` escaped here)."""
    e = html.escape
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # belt and braces: the file may load nothing at all
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]


@contextmanager
def drawing() -> Iterator[None]:
    """matplotlib's settings for the page's charts: glyphs as paths (no font needed to
    read them), and "$" in a name is no math."""
    with matplotlib.rc_context({"svg.fonttype": "path", "text.parse_math": False, "font.size": 9}):
        yield


def svg(fig: Figure, salt: str) -> str:
    """The figure as inline SVG, deterministic (no metadata, a hash salt per chart)."""
    buf = io.BytesIO()
    # a salt per chart keeps the id="..." of clip paths distinct between the inline SVGs
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata=_NO_METADATA)
    text = buf.getvalue().decode("utf-8")
    return text[text.index("<svg") :].strip()  # drop the XML prolog and doctype


def no_data(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#888")
    ax.set_xticks([])
    ax.set_yticks([])


def figure(chart: Chart, heading: str = "h3") -> str:
    """A chart under a title, with its caption (escaped)."""
    e = html.escape
    return (
        f"<{heading}>{e(chart.title)}</{heading}>"
        f"<figure>{chart.svg}<figcaption>{e(chart.caption)}</figcaption></figure>"
    )


__all__ = ["CSS", "WORKLOAD_COLOURS", "Chart", "drawing", "figure", "head", "no_data", "svg"]
