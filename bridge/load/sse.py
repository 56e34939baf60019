"""Server-sent events as Triton's `/v2/models/{model}/generate_stream` writes them: one
`data: {json}` event per response (`\\n\\n` after each), an error as `data: {"error":
...}`, the stream's end the response body's end. Pure: an incremental parser fed the
body's text in whatever chunks it arrives, and the reading of one event's JSON.

Called by `bridge.load.streams` for every chunk of every stream; tests feed it literal
bodies cut at every byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


class StreamProtocolError(ValueError):
    """An event that is not what Triton's generate extension sends (not a JSON object);
    the message quotes it."""


class SseParser:
    """The data of each complete event, in order (the W3C EventSource rules that Triton's
    stream uses): lines end in LF, CRLF or CR; `data:` lines (one leading space dropped)
    are joined with LF; a blank line ends the event; `:` comments and other fields are
    skipped; an event with no data line is none. `pending` says whether the text so far
    ends inside an event (a body that ends there was cut)."""

    def __init__(self) -> None:
        self._tail = ""
        self._data: list[str] = []
        self._fields = False
        self._cr = False

    def feed(self, text: str) -> list[str]:
        events: list[str] = []
        if self._cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF split across two chunks
        self._cr = False
        buf = self._tail + text
        start = 0
        n = len(buf)
        i = 0
        while i < n:
            ch = buf[i]
            if ch not in "\r\n":
                i += 1
                continue
            if ch == "\r" and i + 1 == n:
                self._cr = True  # may be the first half of a CRLF
            line = buf[start:i]
            i += 2 if ch == "\r" and i + 1 < n and buf[i + 1] == "\n" else 1
            start = i
            self._line(line, events)
        self._tail = buf[start:]
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
            self._data = []
            self._fields = False
            return
        self._fields = True
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if sep and value.startswith(" ") else value)

    @property
    def pending(self) -> bool:
        """The text so far ends inside an event: a partial line or an unfinished event."""
        return bool(self._tail) or bool(self._data) or self._fields


@dataclass(frozen=True)
class TokenEvent:
    """One event of a generate stream. text: `text_output` ("" when absent: a token that
    ends inside a UTF-8 character, the end-of-sequence token); error: the server's error,
    if it sent one; finish_reason: the vLLM backend's (`return_finish_reason`), None
    when not sent or "None" (the events before the last); input_tokens: the prompt's
    tokens as the server counted them (`return_num_input_tokens`), None when not sent."""

    text: str
    error: str | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None


def _first(value: object) -> object:
    """A tensor output as Triton's generate extension writes it: a scalar, or a list
    (the first element) for an output with dims."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def parse_event(data: str) -> TokenEvent:
    """The event's JSON read as Triton's generate extension writes it: outputs by name
    at the top level (`text_output`, `finish_reason`, `num_input_tokens`) beside
    `model_name` and `model_version`; `error` on failure."""
    try:
        body = json.loads(data)
    except ValueError:
        raise StreamProtocolError(f"event is not JSON: {data[:200]!r}") from None
    if not isinstance(body, dict):
        raise StreamProtocolError(f"event is not a JSON object: {data[:200]!r}")
    if "error" in body:
        return TokenEvent("", error=str(body["error"]))
    text = _first(body.get("text_output"))
    reason = _first(body.get("finish_reason"))
    count = _first(body.get("num_input_tokens"))
    return TokenEvent(
        text=text if isinstance(text, str) else "",
        finish_reason=str(reason) if reason not in (None, "None", "") else None,
        input_tokens=int(count) if isinstance(count, (int, float)) else None,
    )
