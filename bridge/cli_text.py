"""How every `stb` command prints an error, and a line of text that came from input (a
file, an option, Slurm, a database, the API): never read as Rich console markup, so the
words in brackets that name a fix (`[triton] runtime`, `'slurm-triton-bridge[lab]'`,
`gpu:[0-3]`, `n[1-4]`) print as they are. Used by every CLI module: `fail` for a
command's error (one line on stderr, `error: ` and the exception's message verbatim),
`say` for a plain line; lines that mix the command's own markup with input escape the
input's parts with `rich.markup.escape`. `first_line`: an exception's first line, as
errors are reported in a line (a command's, a pass's step, a record's cause).
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.text import Text

#: where errors go (stderr: stdout keeps the command's output, a JSON document say)
errors = Console(stderr=True)


def error(problem: Exception | str) -> None:
    """`error: PROBLEM` on stderr, the message as it is (no markup read in it), unwrapped."""
    errors.print(Text.assemble(("error:", "red"), " ", str(problem)), soft_wrap=True)


def fail(problem: Exception | str, code: int = 1) -> typer.Exit:
    """Print `problem` as the command's error (`error`) and return the exit to raise:
    `raise fail(exc) from exc`."""
    error(problem)
    return typer.Exit(code=code)


def say(console: Console, text: str) -> None:
    """`text` as one plain line on `console`: nothing in it is read as markup."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
