"""The typed sacct JSON reader (`parse_sacct_json`, msgspec) against the reference parser
(`parse_sacct_json_plain`, json and dicts): the same records on the recorded documents and
on generated ones (both OpenAPI shapes, every optional field present, null or absent,
fields of the wrong type, unknown fields), and for input either refuses, the same error
(type and message).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.slurm.sacct import parse_sacct_json, parse_sacct_json_plain

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
PROPS = settings(database=None, deadline=None, max_examples=300)


def outcome(parse: Any, text: str) -> tuple[str, Any]:
    try:
        return "ok", parse(text)
    except Exception as exc:  # the error itself is what must agree
        return type(exc).__name__, str(exc)


def same(text: str) -> None:
    assert outcome(parse_sacct_json, text) == outcome(parse_sacct_json_plain, text)


@pytest.mark.parametrize("name", ["sacct-requeue-22.05.json", "sacct-admin-comment-22.05.json"])
def test_recorded_documents_read_the_same(name: str) -> None:
    text = (DATA / name).read_text()
    fast = parse_sacct_json(text)
    assert fast and fast == parse_sacct_json_plain(text)


def test_recorded_documents_give_the_eligible_time() -> None:
    """22.05 writes `time.eligible` for every run; a requeued run's is reset with its
    submit time (the recorded requeue: job 8's second run)."""
    text = (DATA / "sacct-requeue-22.05.json").read_text()
    raw = json.loads(text)["jobs"]
    records = parse_sacct_json(text)
    for j, rec in zip(raw, records, strict=True):
        want = j["time"]["eligible"]
        assert (int(rec.eligible.timestamp()) if rec.eligible else 0) == want
    reruns = [r for r in records if r.job_id == "8"]
    assert len(reruns) == 2 and reruns[0].eligible != reruns[1].eligible


def test_the_bench_documents_read_the_same() -> None:
    from tests.unit.helpers import load_bench

    doc = next(load_bench("accounting_ingest").documents(300, 3))
    assert parse_sacct_json(doc) == parse_sacct_json_plain(doc)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \n",
        '{"jobs": [',
        '{"jobs": [}',
        "[]",
        '{"meta": {}}',
        '{"jobs": {}}',
        '{"jobs": [1]}',
        '{"jobs": [], "errors": [{"error": "down", "error_number": -1}]}',
        '{"jobs": [], "errors": [{"error_number": 9003}]}',
        '{"jobs": [], "errors": "x"}',
        '{"jobs": [{"job_id": "12", "state": "COMPLETED"}]}',
        '{"jobs": [{"job_id": 12}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "nodes": "n[1-"}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "time": {"start": NaN}}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "time": {"start": 1.5e9}}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "time": {"start": 99999999999999}}]}',
        '{"jobs": [{"job_id": 12, "state": {"current": null}}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "array": []}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "time": null}]}',
        '{"jobs": [{"job_id": 12, "state": "RUNNING", "name": "\\ud800"}]}',
        '{"jobs": [{"job_id": 12, "state": "A", "state": "B"}]}',
    ],
)
def test_bad_or_odd_input_gives_the_same_answer(text: str) -> None:
    same(text)
    try:
        raw = text.encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 bytes
        return
    # the ingest's workers hand the file's bytes over as they are: the same answer
    assert outcome(parse_sacct_json, raw) == outcome(parse_sacct_json, text)


@pytest.mark.parametrize("name", ["sacct-requeue-22.05.json", "sacct-admin-comment-22.05.json"])
def test_bytes_read_as_the_text(name: str) -> None:
    raw = (DATA / name).read_bytes()
    assert parse_sacct_json(raw) == parse_sacct_json(raw.decode())
    # a byte that is not UTF-8 is refused as reading the file as text refused it
    with pytest.raises(UnicodeDecodeError):
        parse_sacct_json(raw.replace(b'"jobs"', b'"jobs\xff"', 1))


# --- generated documents --------------------------------------------------------------

ABSENT = object()


def number(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A number in either shape (plain, or v0.0.39's {"set", "infinite", "number"})."""
    obj = st.fixed_dictionaries(
        {},
        optional={"set": st.booleans(), "infinite": st.booleans(), "number": values | st.none()},
    )
    return values | st.none() | obj


small = st.integers(-3, 2**40)
epoch = st.integers(0, 2_000_000_000)
word = st.text(st.characters(codec="utf-8"), max_size=12)
odd = st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.lists(st.integers())
node_list = st.sampled_from(["n1", "n[1-3]", "gpu[0001-0004],x7", "None assigned", "", "(null)"])
state = (
    st.sampled_from(["COMPLETED", "running", "CANCELLED by 12", "PREEMPTED+REQUEUED", ""])
    | st.lists(st.sampled_from(["RUNNING", "completing", "x"]), max_size=3)
    | st.fixed_dictionaries({"current": st.sampled_from(["FAILED", ["TIMEOUT"], []])})
)
tres_item = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["gres", "cpu", "node"]) | st.none(),
        "name": st.sampled_from(["gpu", "gpu:h100", "gpu:a100", "", "shard"]) | st.none(),
        "count": number(small),
        "id": small,
    },
)
comment = (
    word
    | st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "job": st.sampled_from(["stb:triton", " x ", "(null)", ""]) | st.none(),
            "administrator": st.sampled_from(["stb:workload=inference", "N/A"]) | st.none(),
            "system": word,
        },
    )
)


def maybe(strategy: st.SearchStrategy[Any], wrong: bool) -> st.SearchStrategy[Any]:
    return strategy | odd if wrong else strategy


@st.composite
def job(draw: st.DrawFn) -> dict[str, Any]:
    wrong = draw(st.integers(0, 9)) == 0  # now and then a field of the wrong type
    fields: dict[str, Any] = {
        "job_id": draw(maybe(st.integers(1, 10**9), wrong)),
        "state": draw(maybe(state, wrong)),
        "cluster": draw(maybe(word | st.none(), wrong)),
        "name": draw(word | st.none()),
        "partition": draw(st.sampled_from(["train", "infer", ""]) | st.none()),
        "account": draw(word | st.none()),
        "user": draw(word | st.none()),
        "qos": draw(word | st.none()),
        "nodes": draw(maybe(node_list | st.none(), wrong)),
        "comment": draw(maybe(comment, wrong)),
        "restart_cnt": draw(maybe(number(st.integers(0, 5)), wrong)),
        "array": draw(
            st.none()
            | st.fixed_dictionaries(
                {},
                optional={
                    "job_id": number(st.integers(0, 10**6)),
                    "task_id": number(st.integers(0, 100)),
                    "limits": st.just({"max": {"running": {"tasks": 0}}}),
                },
            )
        ),
        "tres": draw(
            st.fixed_dictionaries(
                {},
                optional={"allocated": st.lists(tres_item, max_size=5), "requested": st.just([])},
            )
        ),
        "time": draw(
            st.fixed_dictionaries(
                {},
                optional={
                    k: maybe(number(epoch), wrong)
                    for k in ("submission", "eligible", "start", "end", "elapsed")
                },
            )
        ),
        "working_directory": "/home/x",
        "steps": [],
    }
    times = fields["time"]
    if "submission" in times and draw(st.booleans()):  # most jobs: eligible when submitted
        times["eligible"] = times["submission"]
    keep = draw(st.lists(st.sampled_from(sorted(fields)), unique=True))
    required = {"job_id", "state"} if draw(st.integers(0, 19)) else set()
    return {k: v for k, v in fields.items() if k in keep or k in required}


@given(
    jobs=st.lists(job(), max_size=6),
    errors=st.sampled_from([ABSENT, None, [], [{"error_number": 9003, "error": "Nothing"}]]),
)
@PROPS
def test_generated_documents_read_the_same(jobs: list[dict[str, Any]], errors: Any) -> None:
    doc: dict[str, Any] = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "jobs": jobs}
    if errors is not ABSENT:
        doc["errors"] = errors
    same(json.dumps(doc))


@given(jobs=st.lists(job(), min_size=1, max_size=3), cut=st.integers(0, 10**6))
@PROPS
def test_cut_documents_fail_the_same(jobs: list[dict[str, Any]], cut: int) -> None:
    text = json.dumps({"jobs": jobs})
    same(text[: cut % len(text)])


@given(jobs=st.lists(job(), max_size=6))
@PROPS
def test_well_typed_documents_take_the_typed_path(jobs: list[dict[str, Any]]) -> None:
    """Where the typed decode takes a document whole, its records are the reference's (so
    the property above is not won by falling back every time)."""
    import msgspec

    from bridge.slurm.sacct import _SACCT_DECODER, _sacct_record

    text = json.dumps({"jobs": jobs})
    try:
        doc = _SACCT_DECODER.decode(text)
        typed = [_sacct_record(j) for j in doc.jobs]
    except (msgspec.ValidationError, ValueError, TypeError):
        return
    except Exception as exc:  # a node list the hostlist parser refuses, and the like
        assert outcome(parse_sacct_json_plain, text)[0] == type(exc).__name__
        return
    assert typed == parse_sacct_json_plain(text)


def test_the_typed_path_takes_both_shapes() -> None:
    from bridge.slurm.sacct import _SACCT_DECODER

    v38 = {"job_id": 5, "state": {"current": "COMPLETED"}, "time": {"start": 1700000000}}
    v40 = {
        "job_id": 6,
        "state": {"current": ["RUNNING"]},
        "time": {"start": {"set": True, "infinite": False, "number": 1700000000}},
        "array": {"job_id": {"set": True, "number": 6}, "task_id": {"set": False, "number": 0}},
        "comment": {"job": "stb:triton", "administrator": None},
    }
    text = json.dumps({"jobs": [v38, v40]})
    assert len(_SACCT_DECODER.decode(text).jobs) == 2
    assert parse_sacct_json(text) == parse_sacct_json_plain(text)
