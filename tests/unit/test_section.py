"""A section beside a report: the same rows in JSON (money as strings, absent cells left
out), in a rich table and in HTML (escaped, numbers right-aligned, an empty section says
so)."""

from __future__ import annotations

import json
from decimal import Decimal

from markupsafe import Markup
from rich.console import Console

from accounting.section import Section, sections_dict, to_html, to_rich

S = Section(
    "k", "Views <&>", ("model", "requests", "cost"),
    [{"model": "<b>", "requests": 1200, "cost": Decimal("0.50")}, {"model": "echo"}],
    ["a note & more"],
)  # fmt: skip


def test_json_keeps_money_exact_and_leaves_absent_cells_out() -> None:
    doc = json.loads(json.dumps(sections_dict([S])))
    assert doc["k"]["rows"] == [
        {"model": "<b>", "requests": 1200, "cost": "0.50"},
        {"model": "echo"},
    ]
    assert doc["k"]["columns"] == ["model", "requests", "cost"]


def test_html_is_escaped_with_numbers_right_aligned() -> None:
    page = to_html(S)
    assert "<b>" not in page and "&lt;b&gt;" in page and "Views &lt;&amp;&gt;" in page
    assert '<td class="num">1,200</td>' in page and '<td class="num">0.50</td>' in page
    assert "<li>a note &amp; more</li>" in page
    assert "none in this window" in to_html(Section("e", "Empty", ("a",)))


def test_the_rich_table_shows_every_row() -> None:
    console = Console(width=120, record=True)
    console.print(to_rich(S))
    text = console.export_text()
    assert "1,200" in text and "0.50" in text and "echo" in text


def test_html_escapes_markup_and_quotes_everywhere_a_name_can_go() -> None:
    hostile = '"><script>alert(1)</script>'
    page = to_html(Section("x", hostile, (hostile, "n"), [{hostile: hostile, "n": 1}], [hostile]))
    assert "<script" not in page and hostile not in page
    assert page.count("&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;") == 4  # title, th, td, li
    # the fragment is markup: a page's template puts it in as it is, not escaped again
    assert str(Markup("{}").format(page)) == page
