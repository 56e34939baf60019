"""The pure parts of the stream load generator, on literal input: token lengths from the
Azure trace's token columns (scaled, clipped, seeded) or fixed; prompts built to a token
count; the server-sent-event parser fed bodies cut at every character; a generate event's
JSON; a stream's TTFT, TPOT and outcome; and the report's figures."""

from __future__ import annotations

import json

import pytest

from bridge.load.arrivals import ArrivalError
from bridge.load.lengths import (
    LEAD_WORDS,
    LengthSpec,
    draw_lengths,
    parse_token_trace,
    prompt_text,
)
from bridge.load.runner import Endpoint, LoadConfigError
from bridge.load.sse import SseParser, StreamProtocolError, parse_event
from bridge.load.stream_report import summarize_streams
from bridge.load.streams import StreamConfig, StreamRecord, StreamResult, _Reading

AZURE = (
    "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2224670,879,55\r\n"
    "2023-11-16 18:15:51.3910170,91,16"
)


# --- lengths ------------------------------------------------------------------------


def test_token_columns_are_read_in_file_order() -> None:
    trace = parse_token_trace(AZURE.splitlines(keepends=True), source="azure")
    assert trace.prompt == (374, 396, 879, 91)
    assert trace.output == (44, 109, 55, 16)
    assert len(trace) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "no column GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no rows"),
        ("ContextTokens,GeneratedTokens\n12,x\n", "line 2: GeneratedTokens 'x'"),
        ("ContextTokens,GeneratedTokens\n12,3\n-1,3\n", "line 3: ContextTokens -1"),
        ("ContextTokens,GeneratedTokens\n12\n", "line 2: GeneratedTokens ''"),
        ("", "empty trace"),
    ],
)
def test_bad_token_columns_are_refused_naming_where(text: str, message: str) -> None:
    with pytest.raises(ArrivalError, match=message):
        parse_token_trace(text.splitlines(keepends=True), source="t.csv")


def test_trace_lengths_are_scaled_clipped_paired_and_seeded() -> None:
    trace = parse_token_trace(AZURE.splitlines(keepends=True))
    spec = LengthSpec(
        trace=trace,
        prompt_scale=0.1,
        output_scale=0.5,
        min_prompt_tokens=31,
        max_prompt_tokens=60,
        max_output_tokens=50,
    )
    pairs = draw_lengths(spec, 200, seed=3)
    assert pairs == draw_lengths(spec, 200, seed=3)
    assert pairs != draw_lengths(spec, 200, seed=4)
    # each row's prompt and output stay together: 374 -> (37, 22), 396 -> (40, 50 clipped
    # from 54.5), 879 -> (60 clipped from 88, 28 from 27.5 rounded to even), 91 -> (31
    # clipped up from 9, 8)
    assert set(pairs) == {(37, 22), (40, 50), (60, 28), (31, 8)}


def test_fixed_lengths_win_over_the_trace_and_are_checked() -> None:
    trace = parse_token_trace(AZURE.splitlines(keepends=True))
    pairs = draw_lengths(LengthSpec(trace=trace, output_tokens=7), 50, seed=1)
    assert {o for _, o in pairs} == {7} and {p for p, _ in pairs} == {374, 396, 879, 91}
    assert draw_lengths(LengthSpec(prompt_tokens=40, output_tokens=8), 3) == ((40, 8),) * 3
    with pytest.raises(ArrivalError, match="give a trace"):
        LengthSpec(prompt_tokens=40)
    with pytest.raises(ArrivalError, match=r"prompt tokens 10 is not within 31\.\.2048"):
        LengthSpec(prompt_tokens=10, output_tokens=4, min_prompt_tokens=31)
    with pytest.raises(ArrivalError, match="output scale"):
        LengthSpec(trace=trace, output_scale=0.0)
    with pytest.raises(ArrivalError, match="min <= max"):
        LengthSpec(trace=trace, min_output_tokens=9, max_output_tokens=8)


def test_prompt_text_repeats_a_word_for_the_tokens_beyond_the_template() -> None:
    assert prompt_text(33, overhead=30) == "apple hello hello"
    assert prompt_text(5, index=1) == "river hello hello hello hello"
    assert prompt_text(20, overhead=30, index=2) == "stone"  # at or under the overhead
    # consecutive requests differ from their first word: no shared prefix to cache
    firsts = [prompt_text(40, 30, i).split()[0] for i in range(len(LEAD_WORDS))]
    assert len(set(firsts)) == len(LEAD_WORDS) and prompt_text(40, 30, len(LEAD_WORDS)) == (
        prompt_text(40, 30, 0)
    )
    with pytest.raises(ArrivalError, match="prompt tokens must be >= 1"):
        prompt_text(0)


# --- server-sent events -------------------------------------------------------------

TRITON_BODY = (
    'data: {"model_name":"smol","model_version":"1","text_output":"Hi"}\n\n'
    'data: {"model_name":"smol","model_version":"1","text_output":" there"}\n\n'
    'data: {"model_name":"smol","model_version":"1","text_output":""}\n\n'
)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_events_come_out_whole_however_the_body_is_cut(newline: str) -> None:
    body = TRITON_BODY.replace("\n", newline)
    whole = SseParser().feed(body)
    assert [json.loads(d)["text_output"] for d in whole] == ["Hi", " there", ""]
    for cut in range(1, len(body)):
        parser = SseParser()
        got = parser.feed(body[:cut]) + parser.feed(body[cut:])
        assert got == whole, cut
        assert not parser.pending
    for cut in range(1, len(body)):  # a body that ends inside an event leaves it pending
        parser = SseParser()
        parser.feed(body[:cut])
        boundary = body[:cut].endswith(newline * 2) or body[:cut].endswith("\r\n\r")
        assert parser.pending == (not boundary), cut


def test_comments_other_fields_and_multi_line_data() -> None:
    parser = SseParser()
    events = parser.feed(": keep-alive\n\nevent: x\ndata:a\ndata: b\nid: 3\n\ndata\n\n")
    assert events == ["a\nb", ""]
    assert not parser.pending
    parser.feed("data: half")
    assert parser.pending


def test_generate_events_are_read_as_tritons_generate_extension_writes_them() -> None:
    ev = parse_event(
        '{"model_name":"smol","text_output":"x","finish_reason":["None"],"num_input_tokens":[31]}'
    )
    assert (ev.text, ev.finish_reason, ev.input_tokens, ev.error) == ("x", None, 31, None)
    last = parse_event('{"text_output":["!"],"finish_reason":"length","num_input_tokens":31}')
    assert (last.text, last.finish_reason, last.input_tokens) == ("!", "length", 31)
    err = parse_event('{"error":"Request was cancelled"}')
    assert err.error == "Request was cancelled"
    for bad in ("not json", "[1, 2]"):
        with pytest.raises(StreamProtocolError, match="event is not"):
            parse_event(bad)


# --- a stream's figures and outcome ------------------------------------------------


def record(**kw: object) -> StreamRecord:
    base: dict[str, object] = {
        "index": 0,
        "endpoint": "127.0.0.1:8000",
        "scheduled_s": 1.0,
        "sent_s": 1.25,
        "first_s": 1.75,
        "last_s": 2.75,
        "done_s": 2.8,
        "tokens": 11,
        "prompt_target": 40,
        "output_target": 11,
        "outcome": "ok",
    }
    base.update(kw)
    return StreamRecord(**base)  # type: ignore[arg-type]


def test_ttft_from_the_scheduled_time_and_from_the_send_tpot_the_mean_gap() -> None:
    r = record()
    assert r.ttft_s == pytest.approx(0.75)
    assert r.service_ttft_s == pytest.approx(0.5)
    assert r.tpot_s == pytest.approx(0.1)  # 1 s over the 10 gaps after the first token
    assert r.e2e_s == pytest.approx(1.8)
    assert record(tokens=1, last_s=1.75).tpot_s is None
    assert record(first_s=None, last_s=None, tokens=0).ttft_s is None
    assert r.prompt_tokens == 40 and record(prompt_counted=41).prompt_tokens == 41


@pytest.mark.parametrize(
    ("reading", "clean", "error", "expect"),
    [
        (_Reading(tokens=3, status=200), True, None, ("ok", None)),
        (_Reading(tokens=3, status=200, saw_reasons=True, reason="length"), True, None,
         ("ok", None)),
        # the server sends finish reasons and the last event had none: cut
        (_Reading(tokens=3, status=200, saw_reasons=True, reason=None), True, None,
         ("broken", "cut")),
        (_Reading(tokens=3, status=200), False, None, ("broken", "cut")),
        (_Reading(tokens=0, status=200), True, None, ("broken", "cut")),
        (_Reading(tokens=3, status=200), False, "RemoteProtocolError",
         ("broken", "RemoteProtocolError")),
        (_Reading(tokens=3, status=200), False, "timeout", ("broken", "timeout")),
        (_Reading(tokens=3, status=200, error="error: Request was cancelled"), False, None,
         ("broken", "error: Request was cancelled")),
        (_Reading(tokens=0, status=200, error="error: prompt too long"), False, None,
         ("failed", "error: prompt too long")),
        (_Reading(status=503), False, "http_503", ("failed", "http_503")),
        (_Reading(), False, "connect", ("failed", "connect")),
        (_Reading(), False, "timeout", ("failed", "timeout")),
    ],
)  # fmt: skip
def test_a_stream_that_stops_before_its_end_is_broken(
    reading: _Reading, clean: bool, error: str | None, expect: tuple[str, str | None]
) -> None:
    assert reading.outcome(clean, error) == expect


def test_stream_config_refuses_bad_input_naming_it() -> None:
    ep = (Endpoint("127.0.0.1", 8000),)
    with pytest.raises(LoadConfigError, match="not a loopback"):
        StreamConfig(endpoints=(Endpoint("10.0.0.1", 8000),), model="smol", lengths=((40, 8),))
    with pytest.raises(LoadConfigError, match="no token lengths"):
        StreamConfig(endpoints=ep, model="smol", lengths=())
    with pytest.raises(LoadConfigError, match=r"token lengths must be >= 1, got \(0, 8\)"):
        StreamConfig(endpoints=ep, model="smol", lengths=((0, 8),))
    with pytest.raises(LoadConfigError, match="bad model name"):
        StreamConfig(endpoints=ep, model="a/b", lengths=((40, 8),))


def test_the_request_is_shaped_as_a_vllm_backend_client_sends_it() -> None:
    config = StreamConfig(
        endpoints=(Endpoint("127.0.0.1", 8000),),
        model="smol",
        lengths=((33, 8), (40, 16)),
        prompt_overhead=30,
        temperature=0.5,
        seed=9,
    )
    body = json.loads(config.body(1))
    assert body["text_input"] == " ".join(["table", *["hello"] * 9])  # LEAD_WORDS[9 + 1]
    assert body["stream"] is True and body["exclude_input_in_output"] is True
    sampling = json.loads(body["sampling_parameters"])
    assert sampling == {
        "max_tokens": 16,
        "temperature": 0.5,
        "seed": 10,
        "return_finish_reason": True,
        "return_num_input_tokens": True,
    }
    assert config.stream_path() == "/v2/models/smol/generate_stream"


# --- the report ---------------------------------------------------------------------


def test_report_figures_on_literal_records() -> None:
    config = StreamConfig(
        endpoints=(Endpoint("127.0.0.1", 8000),), model="smol", lengths=((40, 11),)
    )
    recs = (
        record(index=0),
        record(index=1, scheduled_s=2.0, sent_s=2.0, first_s=2.25, last_s=3.75, done_s=3.8,
               prompt_counted=42),
        record(index=2, tokens=4, last_s=2.05, done_s=2.1, outcome="broken", error="cut"),
        record(index=3, sent_s=None, first_s=None, last_s=None, done_s=None, tokens=0,
               outcome="dropped", error="dropped"),
        record(index=4, first_s=None, last_s=None, tokens=0, outcome="failed", error="http_503"),
        record(index=5, tokens=6, output_target=11, last_s=2.25),
    )  # fmt: skip
    rep = summarize_streams(
        StreamResult(config, "literal", recs, window_s=10.0, elapsed_s=5.0, stopped_by="schedule")
    )
    assert (rep.due, rep.sent, rep.ok, rep.broken, rep.failed, rep.dropped) == (6, 5, 3, 1, 1, 1)
    assert rep.errors == {"broken: cut": 1, "failed: http_503": 1}
    assert rep.ttft.count == 3
    assert rep.ttft.p50_ms == pytest.approx(750.0)  # 750, 250, 750 ms
    assert rep.service_ttft.max_ms == pytest.approx(500.0)
    # per-stream mean gaps: 100 ms, 150 ms, 100 ms (0.5 s over 5 gaps)
    assert rep.tpot.mean_ms == pytest.approx(350.0 / 3)
    assert rep.tpot.max_ms == pytest.approx(150.0)
    assert rep.tokens_in == 40 + 42 + 40 + 40 + 40  # sent streams, the server's count first
    assert rep.tokens_out == 11 + 11 + 4 + 6
    assert rep.tokens_in_per_s == pytest.approx(202 / 10.0)
    assert rep.tokens_out_per_s == pytest.approx(32 / 5.0)
    assert rep.prompt_target_mean == pytest.approx(40.0)
    assert rep.prompt_counted_mean == pytest.approx(42.0)
    assert rep.output_target == 33 and rep.short_answers == 1
    assert json.loads(json.dumps(rep.to_dict()))["broken"] == 1
