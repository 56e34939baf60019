"""Site arrivals for the simulator (`bridge.sim.inputs`): Prometheus range answers recorded
from the lab's real Prometheus scraping its real Triton (tests/data/site/, provenance in
capture.py), the same read from a CSV, the resampling's rules (means, holds, gaps said),
hostile answers and files refused by name, and `query_range` over HTTP against a local
server speaking Prometheus' API shape (chunks under the points limit, the server's own
error quoted)."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from bridge.sim.inputs import (
    DEFAULT_QUERY,
    InputError,
    Samples,
    arrivals_from_csv,
    arrivals_from_prometheus,
    parse_time,
    prometheus_samples,
    query_instant,
    query_range,
    resample,
)
from bridge.sim.inputs import prometheus as prom

SITE = Path(__file__).resolve().parents[1] / "data" / "site"
RANGE = SITE / "prometheus-rate-range.json"
BY_INSTANCE = SITE / "prometheus-rate-by-instance.json"
CAPTURE = json.loads((SITE / "captures.json").read_text())
WINDOW = CAPTURE["window"]
START = datetime.fromtimestamp(WINDOW["start"], tz=UTC)
END = datetime.fromtimestamp(WINDOW["end"], tz=UTC)


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


# ---- the recorded answers ---------------------------------------------------------------


def test_the_recorded_range_answer_replays_the_load_as_it_happened() -> None:
    series = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=5.0)
    assert sorted(series.rates) == ["busy", "echo"]
    span = WINDOW["end"] - WINDOW["start"]
    assert series.origin == START and series.horizon_s == 5 * math.ceil(span / 5)  # whole steps
    busy = series.rates["busy"]
    # the load's phases as the capture sent them: busy at 10/s, then 30/s, then (after an
    # outage) 15/s for 45 s. Prometheus' 1-minute rate reaches a phase's rate at its end
    # (or rate x 45/60 for the short one)
    phases = [p for p in CAPTURE["phases"] if "rps" in p]
    for phase in phases:
        k = int((phase["to"] - WINDOW["start"]) // 5)
        full = min(1.0, (phase["to"] - phase["from"]) / 60.0)
        assert busy[k] == pytest.approx(phase["rps"]["busy"] * full, rel=0.1), phase
        assert series.rates["echo"][k] == pytest.approx(phase["rps"]["echo"] * full, rel=0.15)
    about = series.about
    assert about["source"] == "prometheus" and about["file"] == RANGE.name
    assert about["series"] == {"busy": 1, "echo": 1}


def test_the_recorded_gaps_are_said_and_zero() -> None:
    """Before Prometheus' first rate and while Triton was down, the answer has no
    sample: those stretches are gaps (rate 0), listed, not a calm reading held."""
    series = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=5.0, max_gap_s=60.0)
    gaps = series.about["gaps"]
    assert isinstance(gaps, dict) and set(gaps) == {"busy", "echo"}
    spans = gaps["busy"]["spans"]
    assert spans[0][0] == START.isoformat().replace("+00:00", "Z")  # the start: no data yet
    outage = next(p["outage"] for p in CAPTURE["phases"] if "outage" in p)
    inside = [
        (parse_time(a, "a"), parse_time(b, "b"))
        for a, b in spans
        if parse_time(a, "a") >= at(outage["from"])
    ]
    assert inside, f"no gap during the outage {outage}: {spans}"
    first, last = inside[0]
    assert at(outage["from"]) < first < last <= at(outage["to"]) + timedelta(seconds=60)
    k0 = int((first - START).total_seconds() // 5)
    k1 = int((last - START).total_seconds() // 5)
    assert not series.rates["busy"][k0:k1].any()


def test_series_per_instance_are_summed_per_model() -> None:
    summed = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=5.0)
    split = arrivals_from_prometheus(BY_INSTANCE, start=START, end=END, step_s=5.0)
    for model in ("busy", "echo"):
        assert np.allclose(split.rates[model], summed.rates[model])
    labels = [s.name for s in prometheus_samples(json.loads(BY_INSTANCE.read_text()), where="x")]
    assert all('instance="' in name and 'version="1"' in name for name in labels)


def test_scale_and_a_coarser_step() -> None:
    base = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=5.0)
    more = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=5.0, scale=1.5)
    assert np.allclose(more.rates["busy"], 1.5 * base.rates["busy"])
    coarse = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=15.0)
    assert len(coarse.rates["busy"]) == len(base.rates["busy"]) // 3 + (
        len(base.rates["busy"]) % 3 > 0
    )
    # without a window: from the first sample to the last one's step
    own = arrivals_from_prometheus(RANGE, start=None, step_s=5.0)
    first = min(
        float(v[0]) for s in json.loads(RANGE.read_text())["data"]["result"] for v in s["values"]
    )
    assert own.origin == at(first)


def test_a_recorded_error_answer_is_quoted() -> None:
    with pytest.raises(InputError, match=r"bad_data: 1:22: parse error: unclosed left paren"):
        arrivals_from_prometheus(SITE / "prometheus-error.json", start=START, step_s=5.0)


# ---- resampling ----------------------------------------------------------------------


def samples(model: str, times: list[float], values: list[float]) -> Samples:
    return Samples(model, model, np.array(times, dtype=float), np.array(values, dtype=float))


T0 = 1_800_000_000.0


def test_a_step_takes_its_samples_mean_holds_briefly_then_says_a_gap() -> None:
    s = samples("m", [T0, T0 + 2, T0 + 5, T0 + 30, T0 + 100], [4.0, 6.0, 7.0, 3.0, 9.0])
    series = resample([s], start=at(T0), end=at(T0 + 110), step_s=5.0, max_gap_s=20.0, where="x")
    r = series.rates["m"]
    assert len(r) == 22
    assert r[0] == 5.0  # the mean of the step's two samples
    assert r[1] == 7.0
    assert list(r[2:6]) == [7.0] * 4  # held: the sample is at most 20 s older than the step
    assert r[6] == 3.0 and list(r[7:11]) == [3.0] * 4
    assert not r[11:20].any()  # 25 s and more after the sample: a gap, rate 0
    assert list(r[20:]) == [9.0, 9.0]
    gaps = series.about["gaps"]
    assert isinstance(gaps, dict)
    assert gaps["m"] == {
        "seconds": 45.0,
        "spans": [[iso(T0 + 55), iso(T0 + 100)]],
        "more_spans": 0,
    }
    assert series.about["held_steps"] == {"m": 9}


def iso(t: float) -> str:
    return at(t).isoformat().replace("+00:00", "Z")


def test_a_gap_of_one_instance_is_no_gap_of_its_model() -> None:
    a = samples("m", [T0 + 5 * k for k in range(20)], [1.0] * 20)
    b = samples("m", [T0, T0 + 5], [2.0, 2.0])
    series = resample([a, b], start=at(T0), end=at(T0 + 100), step_s=5.0, max_gap_s=10.0, where="x")
    assert list(series.rates["m"][:4]) == [3.0, 3.0, 3.0, 3.0] and series.rates["m"][4] == 1.0
    assert series.about["gaps"] == {}
    assert series.about["series"] == {"m": 2}


def test_samples_outside_the_window_only_hold_into_it() -> None:
    s = samples("m", [T0 - 10, T0 + 500], [8.0, 1.0])
    series = resample([s], start=at(T0), end=at(T0 + 20), step_s=5.0, max_gap_s=12.0, where="x")
    assert list(series.rates["m"]) == [8.0, 0.0, 0.0, 0.0]
    with pytest.raises(InputError, match="no sample inside the window"):
        resample(
            [samples("m", [T0 + 500], [1.0])], start=at(T0), end=at(T0 + 20), step_s=5.0, where="x"
        )


# ---- hostile answers -----------------------------------------------------------------


def answer(result: Any, kind: str = "matrix") -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": kind, "result": result}}


def series_of(values: list[Any], **labels: str) -> dict[str, Any]:
    return {"metric": labels or {"model": "busy"}, "values": values}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "not an answer of Prometheus' API (a JSON object)"),
        (
            {"status": "error", "errorType": "timeout", "error": "query timed out"},
            "Prometheus answered timeout: query timed out",
        ),
        ({"status": "success"}, "no data.result list"),
        (answer([]), "no series: the query matched nothing"),
        (
            answer([{"metric": {"model": "a"}, "value": [1, "2"]}], "vector"),
            "resultType 'vector', not 'matrix': give a range query's (/api/v1/query_range) answer",
        ),
        (
            answer([series_of([[1, "1"]], instance="a:8002")]),
            "series 0 {instance=\"a:8002\"} has no 'model' label: keep it in the query "
            "(sum by (model)",
        ),
        (
            answer([series_of([[T0, "1"], [T0 + 5, "NaN"]])]),
            'series 0 {model="busy"}: sample 1 at 2027-01-15T08:00:05Z: value nan is not a rate',
        ),
        (answer([series_of([[T0, "1"], [T0 + 5, "+Inf"]])]), "value inf is not a rate"),
        (answer([series_of([[T0, "-2"]])]), "value -2.0 is not a rate"),
        (
            answer([series_of([[T0 + 5, "1"], [T0, "1"]])]),
            "samples not in time order: sample 1 at 2027-01-15T08:00:00Z is not after sample 0 at "
            "2027-01-15T08:00:05Z",
        ),
        (answer([series_of([[T0, "1"], [T0, "2"]])]), "samples not in time order: sample 1"),
        (
            answer([series_of([[T0, "1", 3]])]),
            "sample 0 [1800000000.0, '1', 3] is not [time, \"value\"]",
        ),
        (answer([series_of([[T0, "x"]])]), 'is not [time, "value"]'),
        (answer([series_of([[True, "1"]])]), 'is not [time, "value"]'),
        (answer([series_of([])]), "has no sample"),
        (answer([{"metric": {"model": "busy"}, "values": {}}]), "has no values list"),
    ],
)
def test_hostile_answers_are_refused_naming_what(doc: Any, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        arrivals_from_prometheus(doc, start=None, step_s=5.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON: Expecting value at line 1 column 1 (cut short?)"),
        ('{"status": "success", "data": {"resul', "(cut short?)"),
        ("{]", "not JSON: Expecting property name"),
    ],
)
def test_a_bad_saved_answer_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "answer.json"
    path.write_text(text)
    with pytest.raises(
        InputError, match=re.escape(f"prometheus answer {path}: ") + ".*" + re.escape(message)
    ):
        arrivals_from_prometheus(path, start=None, step_s=5.0)


# ---- a CSV of time,model,rate -------------------------------------------------------------


def test_a_csv_reads_as_the_same_answer_would(tmp_path: Path) -> None:
    doc = json.loads(RANGE.read_text())
    rows = ["model,time,rate,note"]  # its own column order, and one more column
    for s in doc["data"]["result"]:
        for t, v in s["values"]:
            when = at(float(t)).isoformat() if len(rows) % 2 else str(t)  # ISO and epoch
            rows.append(f"{s['metric']['model']},{when},{v},x")
    path = tmp_path / "rates.csv"
    path.write_text("\n".join(rows) + "\n")
    series, first = arrivals_from_csv(path, step_s=5.0, start=START, end=END)
    want = arrivals_from_prometheus(RANGE, start=START, end=END, step_s=5.0)
    assert first == START and sorted(series.rates) == sorted(want.rates)
    for model in want.rates:
        assert np.allclose(series.rates[model], want.rates[model])
    assert series.about["source"] == "csv" and series.about["file"] == "rates.csv"
    own, origin = arrivals_from_csv(path, step_s=5.0)
    assert (
        origin
        == own.origin
        == at(min(float(v[0]) for s in doc["data"]["result"] for v in s["values"]))
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty (no header)"),
        ("time,model\n1,a\n", "no column rate in its header"),
        ("time,model,rate\n", "no rows under the header"),
        (
            "time,model,rate\n2026-11-30T12:00:00,a,1\n",
            "line 2: time: '2026-11-30T12:00:00' has no time zone",
        ),
        ("time,model,rate\nnoon,a,1\n", "line 2: time: 'noon' is not a time"),
        ("time,model,rate\n100,,1\n", "line 2: empty model"),
        ("time,model,rate\n100,a,NaN\n", "line 2: rate 'NaN' is not a number >= 0"),
        ("time,model,rate\n100,a,-1\n", "line 2: rate '-1' is not a number >= 0"),
        ("time,model,rate\n100,a\n", "line 2: 2 fields, the header has 3"),
        (
            "time,model,rate\n100,a,1\n100,b,1\n\n90,a,2\n",
            "line 5: model 'a' at 1970-01-01T00:01:30Z "
            "is not after its line 2 (1970-01-01T00:01:40Z)",
        ),
        ("time,model,rate\ninf,a,1\n", "line 2: time: 'inf' is not a time"),
    ],
)
def test_hostile_csv_is_refused_naming_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rates.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(message)):
        arrivals_from_csv(path, step_s=5.0)


# ---- query_range over HTTP -----------------------------------------------------------


class Api(BaseHTTPRequestHandler):
    """Answers /api/v1/query_range as Prometheus shapes it: a point every `step` from
    `start` to `end` inclusive (value: the time itself); the query "bad" is refused with
    the lab Prometheus' recorded error, "notjson" with an HTML page."""

    seen: ClassVar[list[dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        Api.seen.append(q)
        if q["query"][0] == "bad":
            self._send(400, (SITE / "prometheus-error.json").read_bytes())
            return
        if q["query"][0] == "notjson":
            self._send(502, b"<html>Bad Gateway</html>")
            return
        if url.path == "/api/v1/query":
            doc = answer(
                [{"metric": {"model": "a"}, "value": [float(q["time"][0]), "1500"]}], "vector"
            )
            self._send(200, json.dumps(doc).encode())
            return
        start, end, step = (float(q[k][0]) for k in ("start", "end", "step"))
        points = int((end - start) // step) + 1
        assert points <= 11_000, "Prometheus refuses this many points"
        values = [[start + k * step, str(start + k * step)] for k in range(points)]
        self._send(200, json.dumps(answer([{"metric": {"model": "a"}, "values": values}])).encode())

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Api.seen.clear()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_long_window_is_asked_in_chunks_and_merged_without_a_point_twice(server: str) -> None:
    start = at(T0)
    end = start + timedelta(days=3)  # 51,841 points at 5 s: six requests of at most 10,000
    doc = query_range(server + "/", DEFAULT_QUERY, start, end, 5.0)
    assert len(Api.seen) == 6 and all(q["query"] == [DEFAULT_QUERY] for q in Api.seen)
    times = [v[0] for v in doc["data"]["result"][0]["values"]]
    assert len(times) == 3 * 86400 // 5 + 1 and times == sorted(set(times))
    assert times[0] == T0 and times[-1] == end.timestamp()
    series = arrivals_from_prometheus(doc, start=start, end=end, step_s=5.0)
    assert len(series.rates["a"]) == 3 * 86400 // 5 and series.about["gaps"] == {}


def test_an_instant_query(server: str) -> None:
    doc = query_instant(server, "q", at(T0))
    assert doc["data"]["result"][0]["value"] == [T0, "1500"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "bad",
            "/api/v1/query_range: HTTP 400: bad_data: 1:22: parse error: unclosed left parenthesis",
        ),
        ("notjson", "HTTP 502, not JSON: '<html>Bad Gateway</html>'"),
    ],
)
def test_the_servers_own_error_is_quoted(server: str, query: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        query_range(server, query, at(T0), at(T0 + 60), 5.0)


def test_no_server_and_bad_urls_are_named() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(InputError, match=f"prometheus http://127.0.0.1:{port}: "):
        query_range(f"http://127.0.0.1:{port}", "q", at(T0), at(T0 + 60), 5.0)
    with pytest.raises(InputError, match=r"give http\(s\)://host:port"):
        query_range("127.0.0.1:9090", "q", at(T0), at(T0 + 60), 5.0)
    with pytest.raises(InputError, match="the window ends"):
        query_range("http://127.0.0.1:9", "q", at(T0), at(T0), 5.0)
    assert prom.shown_url("http://u:secret@host:9090/p?x=1") == "http://host:9090/p"
