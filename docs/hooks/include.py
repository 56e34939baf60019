"""MkDocs hook: pages that show one of the repository's own READMEs as it is
(`bench/README.md`, `slurm_plugins/README.md`, `tests/faults/README.md`), so each text has
one home and the site never holds a stale copy. `mkdocs.yml` names this file under
`hooks`; a page asks with the line `<!-- stb:include PATH -->` (PATH from the repository
root). The README's title, its first line when that is a `# ` heading, is left out: the
page has its own.

The READMEs are written for GitHub, whose lists take their items' content at the item's
text column (two spaces under `- `); Python-Markdown wants four spaces a level and a blank
line before a list that follows a paragraph. `relist` rewrites the indentation, nothing
else, so nested lists, paragraphs, tables and code inside items render as on GitHub."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

_MARKER = re.compile(r"^<!-- stb:include (\S+) -->$", re.MULTILINE)
_ITEM = re.compile(r"^( *)([-*+]|\d+[.)]) +")
_FENCE = re.compile(r"^ *(```|~~~)")


def on_page_markdown(markdown: str, config: Any, **_: Any) -> str:
    """MkDocs' page event: put each asked-for README where its marker line is."""
    root = Path(config["config_file_path"]).parent

    def include(match: re.Match[str]) -> str:
        path = root / match.group(1)
        if not path.is_file():
            raise PluginError(f"stb:include: no file {match.group(1)} under {root}")
        lines = path.read_text().splitlines()
        if lines and lines[0].startswith("# "):
            lines = lines[1:]
        return "\n".join(relist(lines)).strip("\n")

    return _MARKER.sub(include, markdown)


def relist(lines: list[str]) -> list[str]:
    """GitHub list indentation -> Python-Markdown's: each line inside a list item is put
    at four spaces per level (its indentation beyond the item's text column kept), and a
    blank line is put before an item that Python-Markdown would read as text: one after a
    paragraph at its own level, or in a block that does not open with an item."""
    out: list[str] = []
    columns: list[int] = []  # the text column of each open list item, outermost first
    fence = ""  # the open fence's marker, "" outside code
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            out.append("")
            continue
        fenced = _FENCE.match(line)
        if fence:
            out.append(_shift(line, indent, columns))
            if fenced and fenced.group(1) == fence:
                fence = ""
            continue
        while columns and indent < columns[-1] and (indent > 0 or _ITEM.match(line)):
            columns.pop()  # the line is outside the innermost item's text
        if indent == 0 and not _ITEM.match(line) and out and not out[-1]:
            columns = []  # a paragraph after a blank line at the margin: the list ended
        item = _ITEM.match(line)
        if item:
            while columns and indent < columns[-1]:
                columns.pop()
            level = len(columns)
            previous = out[-1] if out else ""
            if (
                previous
                and not _ITEM.match(previous)
                and (_level(previous) <= level or not _starts_list(out, level))
            ):
                out.append("")  # Python-Markdown starts a list only after a blank line
            out.append(" " * (4 * level) + line[indent:])
            columns.append(indent + len(item.group(0)) - len(item.group(1)))
            continue
        out.append(_shift(line, indent, columns))
        if fenced:
            fence = fenced.group(1)
    return out


def _shift(line: str, indent: int, columns: list[int]) -> str:
    if not columns:
        return line
    keep = max(indent - columns[-1], 0)
    return " " * (4 * len(columns) + keep) + line[indent:]


def _starts_list(out: list[str], level: int) -> bool:
    """Whether the block the next line joins (the lines since the last blank one) opens
    with a list item at most `level` deep: Python-Markdown reads items only there."""
    start = len(out)
    while start > 0 and out[start - 1]:
        start -= 1
    return bool(_ITEM.match(out[start])) and _level(out[start]) <= level


def _level(line: str) -> int:
    return (len(line) - len(line.lstrip(" "))) // 4
