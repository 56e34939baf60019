"""Token lengths for the stream load generator: each request's prompt and output length,
drawn from the token columns of the Azure LLM traces (`ContextTokens`, `GeneratedTokens`)
or given as fixed numbers, scaled and clipped for a small model; and the prompt text built
to a target token count. Pure: no clock, no network; the only I/O is `read_token_trace`
reading a file.

Called by `bridge.load.streams` (one length pair per scheduled request), by `stb load
--stream` and by the LLM benches (`bench/llm_capacity.py`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bridge.load.arrivals import ArrivalError, read_trace_file

PROMPT_COLUMN = "ContextTokens"
OUTPUT_COLUMN = "GeneratedTokens"
MAX_TOKENS = 1 << 20
"""Ceiling on any one length, prompt or output: far above any context a model holds."""

PROMPT_WORD = "hello"
"""The word a prompt repeats: one token each (after a space) in SmolLM2's tokenizer, as in
Llama's and GPT-2's, so `n` repeats add `n` tokens to whatever the server wraps around."""

LEAD_WORDS = (
    "apple", "river", "stone", "cloud", "green", "house", "light", "music", "paper",
    "water", "table", "chair", "bread", "horse", "night", "dream", "earth", "money",
    "plant", "ocean", "train", "field", "glass", "sugar", "story", "voice", "world",
    "forest", "summer", "winter", "market", "doctor",
)  # fmt: skip
"""A prompt's first word, by request index: one token each, first or after a space, in
SmolLM2's tokenizer (checked one by one). Prompts that differ from their first word share
no prefix beyond the server's template, so a prefix cache (llama.cpp keeps the last
prompt's) does not spare them a prefill that real, distinct prompts would pay."""


@dataclass(frozen=True)
class TokenTrace:
    """The token columns of an LLM trace: row i's prompt and output lengths, file order."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    source: str

    def __len__(self) -> int:
        return len(self.prompt)


def _tokens(source: str, line: int, column: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ArrivalError(
            f"{source}: line {line}: {column} {raw!r} is not a whole number of tokens"
        ) from None
    if not 0 <= value <= MAX_TOKENS:
        raise ArrivalError(f"{source}: line {line}: {column} {value} is not in 0..{MAX_TOKENS}")
    return value


def parse_token_trace(lines: Iterable[str], *, source: str = "trace") -> TokenTrace:
    """The `ContextTokens` and `GeneratedTokens` columns of a trace's CSV lines (header
    first). Tolerates CRLF, a byte-order mark and blank lines; refuses (ArrivalError,
    naming the line and quoting the value) a missing column, an empty or non-integer
    field, or a trace with no rows."""
    reader = csv.reader(lines)
    header = next((row for row in reader if any(c.strip() for c in row)), None)
    if header is None:
        raise ArrivalError(f"{source}: empty trace (no header, no rows)")
    names = [c.strip().lstrip("\ufeff") for c in header]
    missing = [c for c in (PROMPT_COLUMN, OUTPUT_COLUMN) if c not in names]
    if missing:
        raise ArrivalError(
            f"{source}: no column {', '.join(missing)} in header {names}; token lengths "
            f"come from an Azure LLM trace ({PROMPT_COLUMN}, {OUTPUT_COLUMN})"
        )
    pcol, ocol = names.index(PROMPT_COLUMN), names.index(OUTPUT_COLUMN)
    prompt: list[int] = []
    output: list[int] = []
    for row in reader:
        if not any(c.strip() for c in row):
            continue
        line = reader.line_num
        cells = [row[i].strip() if i < len(row) else "" for i in (pcol, ocol)]
        prompt.append(_tokens(source, line, PROMPT_COLUMN, cells[0]))
        output.append(_tokens(source, line, OUTPUT_COLUMN, cells[1]))
    if not prompt:
        raise ArrivalError(f"{source}: trace has a header but no rows")
    return TokenTrace(tuple(prompt), tuple(output), source)


def read_token_trace(path: Path) -> TokenTrace:
    """The token columns of the trace file at `path` (see `parse_token_trace`)."""
    return read_trace_file(path, lambda lines: parse_token_trace(lines, source=path.name))


@dataclass(frozen=True)
class LengthSpec:
    """How each request's lengths are chosen.

    prompt_tokens, output_tokens: a fixed length for every request; None takes it from
        `trace` (a fixed one wins over the trace's column).
    trace: rows drawn at random (seeded, with replacement), prompt and output of one row
        together, so their correlation is kept.
    prompt_scale, output_scale: a trace length is multiplied by this (rounded) before
        clipping: the traces' conversations (median ~1,000 prompt tokens) are far longer
        than a CPU model's budget.
    min_*/max_*: the clip, applied to trace lengths and checked against fixed ones.
    """

    prompt_tokens: int | None = None
    output_tokens: int | None = None
    trace: TokenTrace | None = None
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    min_prompt_tokens: int = 1
    max_prompt_tokens: int = 2048
    min_output_tokens: int = 1
    max_output_tokens: int = 2048

    def __post_init__(self) -> None:
        for name in ("prompt", "output"):
            lo = getattr(self, f"min_{name}_tokens")
            hi = getattr(self, f"max_{name}_tokens")
            if not 1 <= lo <= hi <= MAX_TOKENS:
                raise ArrivalError(
                    f"{name} token bounds must satisfy 1 <= min <= max <= {MAX_TOKENS}, "
                    f"got min {lo}, max {hi}"
                )
            fixed = getattr(self, f"{name}_tokens")
            if fixed is not None and not lo <= fixed <= hi:
                raise ArrivalError(f"{name} tokens {fixed} is not within {lo}..{hi}")
            scale = getattr(self, f"{name}_scale")
            if not (math.isfinite(scale) and scale > 0):
                raise ArrivalError(f"{name} scale must be a finite number > 0, got {scale!r}")
        if self.trace is None and (self.prompt_tokens is None or self.output_tokens is None):
            raise ArrivalError(
                "token lengths: give a trace with token columns, or both a fixed prompt "
                "and a fixed output length"
            )

    def describe(self) -> str:
        def one(name: str, fixed: int | None, scale: float, lo: int, hi: int) -> str:
            if fixed is not None:
                return f"{name} {fixed}"
            return f"{name} trace x{scale:g} in {lo}..{hi}"

        parts = (
            one("prompt", self.prompt_tokens, self.prompt_scale,
                self.min_prompt_tokens, self.max_prompt_tokens),
            one("output", self.output_tokens, self.output_scale,
                self.min_output_tokens, self.max_output_tokens),
        )  # fmt: skip
        src = f" ({self.trace.source})" if self.trace is not None else ""
        return ", ".join(parts) + src


def _scaled(values: npt.NDArray[np.float64], scale: float, lo: int, hi: int) -> list[int]:
    return [int(v) for v in np.clip(np.rint(values * scale), lo, hi)]


def draw_lengths(spec: LengthSpec, count: int, seed: int | None = None) -> tuple[
    tuple[int, int], ...
]:  # fmt: skip
    """`count` (prompt tokens, output tokens) pairs as `spec` says; the same seed gives
    the same pairs."""
    if count < 0:
        raise ArrivalError(f"count must be >= 0, got {count}")
    if spec.trace is None:
        assert spec.prompt_tokens is not None and spec.output_tokens is not None
        return ((spec.prompt_tokens, spec.output_tokens),) * count
    rows = np.random.default_rng(seed).integers(0, len(spec.trace), size=count)
    if spec.prompt_tokens is not None:
        prompts = [spec.prompt_tokens] * count
    else:
        raw = np.asarray(spec.trace.prompt, dtype=float)[rows]
        prompts = _scaled(raw, spec.prompt_scale, spec.min_prompt_tokens, spec.max_prompt_tokens)
    if spec.output_tokens is not None:
        outputs = [spec.output_tokens] * count
    else:
        raw = np.asarray(spec.trace.output, dtype=float)[rows]
        outputs = _scaled(raw, spec.output_scale, spec.min_output_tokens, spec.max_output_tokens)
    return tuple(zip(prompts, outputs, strict=True))


def prompt_text(tokens: int, overhead: int = 0, index: int = 0) -> str:
    """A prompt of about `tokens` tokens as the server counts them: a first word chosen by
    `index` (LEAD_WORDS), then PROMPT_WORD, `tokens - overhead` words in all (at least
    one), `overhead` being what the server adds around the text (a chat template, a BOS
    token). With SmolLM2's tokenizer and its chat template (overhead 30) the count lands
    exactly for any `tokens` > 30; a target at or under the overhead lands at overhead +
    1."""
    if tokens < 1 or overhead < 0:
        raise ArrivalError(
            f"prompt tokens must be >= 1 and overhead >= 0, got {tokens}, {overhead}"
        )
    words = max(1, tokens - overhead)
    return " ".join([LEAD_WORDS[index % len(LEAD_WORDS)], *([PROMPT_WORD] * (words - 1))])
