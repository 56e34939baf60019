"""The self-contained HTML page both of the project's reports render into, and the chart
code they share: the finance report (`accounting.html`) and the simulator's
(`bridge.sim.render`, `bridge.sim.selection_render`).

One file, readable offline and safe to mail or archive: inline CSS, inline SVG charts, no
scripts, fonts, images or URLs, and a Content-Security-Policy that loads nothing. The
markup is Jinja2 templates, package data: `bridge/templates/page.html.j2` (the page, its
CSS, which a report's template extends) and `macros.html.j2` (a chart under its title, a
table), loaded by `environment` with autoescape on, so every value a template shows is
escaped unless it is `Markup` (an SVG chart, a fragment another template rendered).
Charts use matplotlib's object API (`Figure`, no pyplot: no GUI backend, no global
figure state), drawn under `drawing()` (glyphs as paths, so their text needs no font on
the reader's machine; "$" in a name is no math) and saved with `svg` (deterministic: no
metadata, a hash salt per chart).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import matplotlib
from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined
from markupsafe import Markup
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: one saturated colour per workload (the finance report's screenshot test looks for the
#: first three; the simulator's charts use the same)
WORKLOAD_COLOURS: Mapping[str, str] = {
    "training": "#0060df",
    "elastic": "#ff7f00",
    "inference": "#00b140",
    "staging": "#c0ca33",
    "idle": "#a0a0a0",
}

#: no <metadata> block (it carries a date and URLs)
_NO_METADATA: dict[str, Any] = {"Creator": None, "Date": None, "Format": None, "Type": None}


@dataclass(frozen=True)
class Chart:
    """A chart for the page: `svg` is `svg(fig, salt)`'s output, put in as it is (its text
    is glyph paths); the title and caption are text, escaped."""

    title: str
    svg: str
    caption: str


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


@functools.cache
def environment(package: str = "bridge") -> Environment:
    """The templates of `package` (its `templates/` folder, package data), with bridge's
    page and macros behind them: autoescape on, an undefined name an error (not ""),
    a block tag's own line left out of the output."""
    loaders = [PackageLoader(package, "templates")]
    if package != "bridge":
        loaders.append(PackageLoader("bridge", "templates"))
    return Environment(
        loader=ChoiceLoader(loaders),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(package: str, name: str, **context: Any) -> Markup:
    """Template `name` of `package` rendered: an HTML fragment, safe to put in another
    template as it is."""
    return Markup(environment(package).get_template(name).render(**context))


def render_page(package: str, name: str, **context: Any) -> str:
    """A page template (one that extends `page.html.j2`) rendered as a file's text."""
    # Jinja drops a template's last newline; a file ends with one
    return environment(package).get_template(name).render(**context) + "\n"


__all__ = [
    "WORKLOAD_COLOURS",
    "Chart",
    "drawing",
    "environment",
    "no_data",
    "render",
    "render_page",
    "svg",
]
