"""Hostile and broken input, each refused with a message naming what was wrong and nothing
half-written or half-used:

1. a Triton metrics page of gigabytes (streamed from a real HTTP server on loopback, read no
   further than `MAX_METRICS_BYTES`), sent compressed, or with a garbage line (the page is
   refused whole, naming the line); to the observer either is "no data", never calm;
2. sacct --json output with fields no parser knows (ignored) or cut short (refused, saying
   where and "truncated?"), and a ledger ingest (real SQLite file) that writes nothing then;
3. model names that try to leave the repository and model folders holding symbolic links
   or FIFOs, refused before anything is written (the repository and its archive compared
   file by file);
4. a config.pbtxt too large (refused without reading it whole), nested 10,000 deep, not
   UTF-8 or not a regular file.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from typer.testing import CliRunner

from accounting.attribution import Context
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.schema import IngestRun, LedgerRow, NodeSpan, SourceRecord
from bridge.cli import app
from bridge.daemon.observe import Observer
from bridge.ledger.feed import ingest_window
from bridge.models.publish import PublishError, publish, retire, rollback
from bridge.models.repo import ModelRepository, RepositoryError
from bridge.slurm import UnparseableOutput
from bridge.slurm.model import AccountingRecord, Node, SlurmEvent
from bridge.slurm.sacct import parse_sacct_json
from bridge.slurm.squeue import parse_squeue_json
from bridge.triton import client as client_mod
from bridge.triton.client import MAX_METRICS_BYTES, TritonHttpClient
from bridge.triton.errors import TritonRejected
from bridge.triton.metrics import parse_page
from bridge.triton.protocol import RepositoryModel
from bridge.triton.repository import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    ModelConfigError,
    model_teams,
    parse_config,
    read_config_text,
)
from tests.unit.fakes import BASELINE_JOB, N1, N3, FakeSlurm, make_config

ROOT = Path(__file__).resolve().parents[2]
TRITON_DATA = ROOT / "tests" / "data" / "triton"
SLURM_DATA = ROOT / "tests" / "data" / "slurm"
GOOD = (ROOT / "triton_repo" / "echo" / "config.pbtxt").read_text().replace('name: "echo"\n', "")
RUN = CliRunner()


# ---- 1. Triton metrics pages -----------------------------------------------------------


class PageServer:
    """A metrics endpoint on loopback: serves `page` (bytes), or with `endless` an endless
    page (close-delimited, no length), counting what it managed to send."""

    def __init__(self) -> None:
        self.page = b""
        self.endless = False
        self.encoding: str | None = None
        self.sent = 0
        self.asked: list[dict[str, str]] = []
        self.done = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.asked.append(dict(self.headers))
                try:
                    owner.serve(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    owner.done.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/metrics"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        self.done.clear()
        self.sent = 0
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        if self.encoding:
            h.send_header("Content-Encoding", self.encoding)
        if not self.endless:
            h.send_header("Content-Length", str(len(self.page)))
        h.end_headers()
        if not self.endless:
            h.wfile.write(self.page)
            self.sent = len(self.page)
            return
        # "Endless", but capped at four limits: a client that reads it all fails the test
        # instead of hanging it.
        line = b'nv_inference_count{model="m",version="1"} 1\n' * 1500
        while self.sent < 4 * MAX_METRICS_BYTES:
            h.wfile.write(line)
            self.sent += len(line)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server() -> Iterator[PageServer]:
    s = PageServer()
    yield s
    s.close()


def fetch(server: PageServer) -> str:
    with TritonHttpClient("127.0.0.1:1", metrics_url=server.url) as c:
        return c.metrics_text()


def test_an_endless_page_is_refused_after_the_limit_and_read_no_further(
    server: PageServer,
) -> None:
    server.endless = True
    with pytest.raises(TritonRejected) as err:
        fetch(server)
    assert f"page larger than {MAX_METRICS_BYTES} bytes (MAX_METRICS_BYTES)" in str(err.value)
    assert err.value.operation == "metrics" and not err.value.transient
    assert server.done.wait(10), "the server was still sending: the client did not hang up"
    # What the client read, plus what the sockets' buffers took: far from the whole page.
    assert MAX_METRICS_BYTES < server.sent < 2 * MAX_METRICS_BYTES


def test_a_page_at_the_limit_is_read_and_one_byte_more_is_not(
    server: PageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_mod, "MAX_METRICS_BYTES", 1000)
    server.page = b"#" * 999 + b"\n"
    assert fetch(server) == server.page.decode()
    assert server.asked[-1].get("Accept-Encoding") == "identity"
    server.page += b"\n"
    with pytest.raises(TritonRejected, match="page larger than 1000 bytes"):
        fetch(server)


def test_a_compressed_page_is_refused_unread(server: PageServer) -> None:
    # A few KiB of gzip can inflate to gigabytes: the page is asked for uncompressed, and
    # one sent compressed anyway is refused rather than inflated.
    server.page = gzip.compress((TRITON_DATA / "busy_a.prom").read_bytes())
    server.encoding = "gzip"
    with pytest.raises(TritonRejected, match="Content-Encoding 'gzip', not asked for"):
        fetch(server)


def test_prometheus_client_alone_names_no_line() -> None:
    # Why the parser's own words are not enough: prometheus_client 0.2x says what it could
    # not convert, never where, so `parse_page` finds the line itself.
    from prometheus_client.parser import text_string_to_metric_families

    with pytest.raises(ValueError) as err:
        list(text_string_to_metric_families("a 1\nb 2\ngarbage\n"))
    assert "line" not in str(err.value) and "3" not in str(err.value)


@pytest.mark.parametrize(
    ("bad", "complaint"),
    [
        ("garbage", "could not convert string to float: 'garbage'"),
        ('nv_inference_count{model="busy",version="1"} abc', "could not convert"),
        ('nv_inference_count{model="busy",version="1" 3', "could not convert"),
        ("# TYPE nv_inference_count histogrum", "Invalid metric type: histogrum"),
        ("\x00\x01\x02", "invalid metric name"),
        ("# TYPE some_family", ": ValueError"),  # the parser's bare ValueError, named
    ],
)
def test_a_page_with_a_garbage_line_is_refused_whole_naming_the_line(
    bad: str, complaint: str
) -> None:
    lines = (TRITON_DATA / "busy_a.prom").read_text().split("\n")
    assert parse_page("\n".join(lines)).models  # the page without it is fine
    at = len(lines) - 3  # near the end: everything before it parsed
    page = parse_page("\n".join([*lines[: at - 1], bad, *lines[at - 1 :]]))
    assert not page.ok and page.models == {}
    assert page.error is not None
    assert page.error.startswith(f"unparseable page: line {at} {bad!r}: "), page.error
    assert complaint in page.error


class Replica:
    """A ready Triton replica holding `busy`, whose metrics page comes over HTTP."""

    def __init__(self, address: str, metrics_url: str) -> None:
        self.address = address
        self.http = TritonHttpClient("127.0.0.1:1", metrics_url=metrics_url)

    def is_ready(self) -> bool:
        return True

    def repository_index(self) -> tuple[RepositoryModel, ...]:
        return (RepositoryModel("busy", "1", "READY", ""),)

    def metrics_text(self) -> str:
        return self.http.metrics_text()


def _oversized(page: bytes) -> bytes:
    return page + b"# padding\n" * (MAX_METRICS_BYTES // 10 + 1)


def _garbage_line(page: bytes) -> bytes:
    return page.replace(b"# HELP nv_inference_count", b"garbage\n# HELP nv_inference_count")


@pytest.mark.parametrize("spoil", [_oversized, _garbage_line], ids=["oversized", "garbage"])
def test_a_refused_page_is_no_data_to_the_observer_never_calm(
    server: PageServer, tmp_path: Path, spoil: Callable[[bytes], bytes]
) -> None:
    clock = iter(range(0, 1000, 5))
    replicas: dict[str, Replica] = {}

    def triton_for(address: str) -> Replica:
        return replicas.setdefault(address, Replica(address, server.url))

    observer = Observer(
        FakeSlurm([N1], [BASELINE_JOB]),
        make_config(tmp_path),
        triton_for,  # type: ignore[arg-type]
        clock=lambda: float(next(clock)),
    )
    server.page = (TRITON_DATA / "busy_a.prom").read_bytes()
    observer.observe(0.0)
    server.page = (TRITON_DATA / "busy_b.prom").read_bytes()
    observer.observe(5.0)
    good = observer.latest("busy")
    assert good is not None and good.p99_ms is not None and good.request_rate is not None
    server.page = spoil(server.page)
    observation = observer.observe(10.0)
    sample = observer.latest("busy")
    assert sample is not None and sample.at == 10.0
    assert (sample.p99_ms, sample.request_rate, sample.pending, sample.mean_ms) == (
        None,
        None,
        None,
        None,
    )
    (replica,) = observation.servers
    assert replica.ready  # it said it was; only its page is refused
    for r in replicas.values():
        r.http.close()


# ---- 2. sacct --json -------------------------------------------------------------------


def _with_unknown_fields(value: Any) -> Any:
    """Every object of the document with two fields added that no release has yet."""
    if isinstance(value, dict):
        out = {k: _with_unknown_fields(v) for k, v in value.items()}
        out["x_future_field"] = {"set": True, "number": 7, "nested": [1, {"a": None}]}
        out["x_future_flag"] = ["NEW_FLAG"]
        return out
    if isinstance(value, list):
        return [_with_unknown_fields(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("file", "parse"),
    [
        ("sacct-requeue-22.05.json", parse_sacct_json),
        ("sacct-admin-comment-22.05.json", parse_sacct_json),
        ("squeue-22.05.json", parse_squeue_json),
    ],
)
def test_fields_no_parser_knows_are_ignored(file: str, parse: Callable[[str], Any]) -> None:
    text = (SLURM_DATA / file).read_text()
    newer = json.dumps(_with_unknown_fields(json.loads(text)))
    assert "x_future_field" in newer
    records = parse(text)
    assert records and parse(newer) == records


SACCT = (SLURM_DATA / "sacct-requeue-22.05.json").read_text()


@pytest.mark.parametrize(
    "cut",
    [
        len(SACCT) // 2,  # between two fields
        len(SACCT.rstrip()) - 1,  # all but the last '}'
        SACCT.index('"COMPLETED') + 4,  # inside a string
        SACCT.index("1795961640") + 5,  # inside a number
        SACCT.index(": null") + 4,  # inside `null`
    ],
)
def test_truncated_sacct_json_is_refused_saying_where(cut: int) -> None:
    with pytest.raises(UnparseableOutput) as err:
        parse_sacct_json(SACCT[:cut])
    message = str(err.value)
    assert message.startswith("cannot parse sacct --json output (not valid JSON: "), message
    assert f" of {cut}; the output ends there: truncated?)" in message


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("", "(empty)"),
        ("   \n", "(empty)"),
        ("[]", "(not a JSON object)"),
        ('{"meta": {}}', "(no 'jobs' list)"),
        ('{"jobs": {"1": {}}}', "('jobs' is not a list)"),
        ('{"jobs": [}', "(not valid JSON: Expecting value at char 10 of 11)"),
        ('{"jobs": [{"job_id": 1, "state": "X", "time": []}]}', "a job in sacct --json ("),
        ('{"jobs": [{"state": "COMPLETED"}]}', "a job in sacct --json (no field 'job_id')"),
    ],
)
def test_broken_sacct_json_names_what_is_wrong(raw: str, why: str) -> None:
    with pytest.raises(UnparseableOutput) as err:
        parse_sacct_json(raw)
    assert why in str(err.value)
    assert "truncated" not in str(err.value)  # cut short only where it is


class SacctSlurm:
    """The reads `ingest_window` makes; day `bad_day` of sacct is cut short; a slurmdbd
    that keeps no events (so the ingest takes the inventory's capacity)."""

    def __init__(self, nodes: list[Node], bad_day: int | None) -> None:
        self._nodes = nodes
        self.bad_day = bad_day
        self.reads = 0

    def nodes(self) -> list[Node]:
        return self._nodes

    def cluster_name(self) -> str:
        return "lab"

    def accounting(self, since: datetime, until: datetime) -> list[AccountingRecord]:
        self.reads += 1
        text = SACCT if self.reads != self.bad_day else SACCT[: len(SACCT) // 2]
        return parse_sacct_json(text)

    def events(self, since: datetime, until: datetime) -> list[SlurmEvent]:
        return []


def _rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t.__tablename__: conn.scalar(select(func.count()).select_from(t.__table__)) or 0  # type: ignore[attr-defined]
            for t in (LedgerRow, SourceRecord, NodeSpan, IngestRun)
        }


def test_an_ingest_with_truncated_sacct_output_writes_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    since = datetime(2026, 11, 29, tzinfo=UTC)  # the recorded jobs ran on the 29th
    # The recorded jobs ran on n3 with H100s.
    nodes = [replace(N1, gpu_type="h100"), replace(N3, gpu_type="h100")]
    empty = _rows(engine)
    assert set(empty.values()) == {0}
    # The second day's read is cut short: the first day's jobs are not booked either.
    until, now = since + timedelta(days=2), since + timedelta(days=3)
    slurm = SacctSlurm(nodes, bad_day=2)
    with pytest.raises(UnparseableOutput, match="truncated"):
        ingest_window(config, slurm, engine, since, until, now=now, events=False)  # type: ignore[arg-type]
    assert slurm.reads == 2
    assert _rows(engine) == empty
    # The same window read whole books the jobs, the capacity and the run.
    slurm = SacctSlurm(nodes, bad_day=None)
    ingest_window(config, slurm, engine, since, until, now=now, events=False)  # type: ignore[arg-type]
    assert all(n > 0 for n in _rows(engine).values()), _rows(engine)


def test_records_failing_part_way_roll_the_whole_ingest_back(tmp_path: Path) -> None:
    # ingest_records is one transaction: records that stream in and fail after chunks
    # were written leave nothing.
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    records = parse_sacct_json(SACCT)
    horizon = datetime(2026, 12, 1, tzinfo=UTC)
    ctx = Context(pool_of_node={"n3": "elastic"}, horizon=horizon)

    def stream(fail: bool) -> Iterator[AccountingRecord]:
        yield from records
        if fail:
            parse_sacct_json(SACCT[:-40])

    with pytest.raises(UnparseableOutput, match="truncated"):
        ingest_records(engine, stream(True), ctx, chunk_size=1, now=horizon)
    assert set(_rows(engine).values()) == {0}
    summary = ingest_records(engine, stream(False), ctx, chunk_size=1, now=horizon)
    assert summary.rows_written > 0 and _rows(engine)["ledger_row"] > 0


# ---- 3. model names and folders --------------------------------------------------------


def tree(root: Path) -> dict[str, str]:
    """Every entry under root: a file's text, "/" for a folder, "-> target" for a link."""
    out = {}
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {os.readlink(p)}"
        elif p.is_file():
            out[rel] = p.read_text()
        else:
            out[rel] = "/"
    return out


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    root = tmp_path / "site" / "models"
    shutil.copytree(ROOT / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    return ModelRepository(root)


def model_dir(tmp_path: Path, config: str | bytes = GOOD) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    if isinstance(config, bytes):
        (d / "config.pbtxt").write_bytes(config)
    else:
        (d / "config.pbtxt").write_text(config)
    (d / "model.py").write_text("# a model\n")
    return d


@pytest.fixture
def site(repo: ModelRepository) -> Iterator[Callable[[], None]]:
    """Call it to assert that the repository, its archive and what lies beside them are
    as they were (the archive must not even have been created)."""
    before = tree(repo.root.parent)
    assert not repo.archive.exists()

    def unchanged() -> None:
        assert tree(repo.root.parent) == before

    yield unchanged


ESCAPING_NAMES = ["..", "../x", "../../etc", "a/b", "/abs", "a\x00b", ".hidden", "", "x" * 65]


@pytest.mark.parametrize("name", [*ESCAPING_NAMES, "x" * 100_000, "a\\b", "a b", "é"])
def test_a_bad_model_name_is_refused_before_anything_is_written(
    repo: ModelRepository, tmp_path: Path, site: Callable[[], None], name: str
) -> None:
    src = model_dir(tmp_path)
    with pytest.raises(ModelConfigError) as err:
        publish(repo, src, name, [])
    message = str(err.value)
    shown = repr(name) if len(name) <= 80 else f"{name[:80]!r}... (100000 chars)"
    assert message.startswith(f"invalid model name {shown}: 1-64 letters"), message[:200]
    assert len(message) < 300
    site()


@pytest.fixture
def outside(repo: ModelRepository) -> Path:
    """A model-like folder beside the repository, with versions 1 and 2."""
    d = repo.root.parent / "outside"
    for v in ("1", "2"):
        (d / v).mkdir(parents=True)
        (d / v / "model.py").write_text(f"# v{v}\n")
    (d / "config.pbtxt").write_text(GOOD)
    return d


@pytest.mark.parametrize(
    "name", ["..", "../outside", "../../etc", "a/b", "/abs", "a\x00b", ".hidden", "", "x" * 300]
)
@pytest.mark.parametrize("act", [rollback, retire])
def test_rollback_and_retire_refuse_names_that_leave_the_repository(
    repo: ModelRepository,
    outside: Path,
    site: Callable[[], None],
    act: Callable[..., Any],
    name: str,
) -> None:
    # Before names were checked here, rollback(repo, "../outside") moved outside/2 into
    # the archive.
    with pytest.raises(PublishError, match="is not a plain folder name"):
        act(repo, name, [], "why")
    site()


@pytest.mark.parametrize("name", ESCAPING_NAMES[:8])
def test_the_repository_builds_no_path_from_a_bad_name(repo: ModelRepository, name: str) -> None:
    for call in (
        lambda: repo.versions(name),
        lambda: repo.config_text(name),
        lambda: repo.stage(name, repo.root / "echo"),
        lambda: repo.set_aside(name, 1, "why"),
        lambda: repo.retire(name, "why"),
    ):
        with pytest.raises(RepositoryError, match="is not a plain folder name"):
            call()


def _link_outside(src: Path) -> Path:
    secret = src.parent / "secret.txt"
    secret.write_text("not for Triton\n")
    (src / "model.py").unlink()
    (src / "model.py").symlink_to(secret)
    return src / "model.py"


def _link_inside(src: Path) -> Path:
    (src / "weights.bin").write_text("1 2 3\n")
    (src / "alias.bin").symlink_to("weights.bin")
    return src / "alias.bin"


def _link_to_a_folder(src: Path) -> Path:
    (src / "1").mkdir()
    (src / "1" / "model.py").write_text("# v1\n")
    (src / "1" / "etc").symlink_to("/etc")
    return src / "1" / "etc"


def _dangling_link(src: Path) -> Path:
    (src / "gone").symlink_to(src / "nowhere")
    return src / "gone"


def _linked_config(src: Path) -> Path:
    real = src.parent / "real.pbtxt"
    real.write_text(GOOD)
    (src / "config.pbtxt").unlink()
    (src / "config.pbtxt").symlink_to(real)
    return src / "config.pbtxt"


@pytest.mark.parametrize(
    "plant", [_link_outside, _link_inside, _link_to_a_folder, _dangling_link, _linked_config]
)
def test_a_model_folder_holding_a_symlink_is_refused_naming_it(
    repo: ModelRepository,
    tmp_path: Path,
    site: Callable[[], None],
    plant: Callable[[Path], Path],
) -> None:
    src = model_dir(tmp_path)
    link = plant(src)
    with pytest.raises(RepositoryError) as err:
        publish(repo, src, "echo", [])
    assert str(err.value) == (
        f"{link} is a symbolic link (to {os.readlink(link)}): a model folder may hold only "
        "regular files and folders"
    )
    site()


def test_a_model_folder_holding_a_fifo_is_refused_without_blocking(
    repo: ModelRepository, tmp_path: Path, site: Callable[[], None]
) -> None:
    src = model_dir(tmp_path)
    os.mkfifo(src / "pipe")  # copying it would wait for a writer forever
    with pytest.raises(RepositoryError, match=r"pipe is not a regular file or folder"):
        publish(repo, src, "echo", [])
    site()


def test_the_clean_folder_publishes(repo: ModelRepository, tmp_path: Path) -> None:
    # The control of the refusals above: the same folder without the hostile entry.
    src = model_dir(tmp_path)
    assert publish(repo, src, "echo", []).version == 2


def _cli_config(tmp_path: Path) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(f'[accounting]\nledger_url = "sqlite:///{tmp_path / "ledger.db"}"\n')
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["publish", "{src}", "--name", "../x"], "error: invalid model name '../x'"),
        (["publish", "{src}", "--name", "echo"], "is a symbolic link (to "),
        (["rollback", "../outside"], "error: model name '../outside' is not a plain folder"),
        (["retire", ".."], "error: model name '..' is not a plain folder name"),
    ],
)
def test_the_command_line_refuses_before_asking_slurm(
    repo: ModelRepository,
    tmp_path: Path,
    site: Callable[[], None],
    args: list[str],
    message: str,
) -> None:
    # No Slurm here: a refusal that came after asking it would fail differently.
    src = model_dir(tmp_path)
    _link_outside(src)
    cmd = ["models", *(a.format(src=src) for a in args), "--repository", str(repo.root)]
    res = RUN.invoke(app, [*cmd, "-c", str(_cli_config(tmp_path))])
    assert res.exit_code == 1, res.output
    assert message in " ".join(res.output.split())
    site()


# ---- 4. config.pbtxt -------------------------------------------------------------------


def test_a_config_over_the_limit_is_refused_unread(
    repo: ModelRepository, tmp_path: Path, site: Callable[[], None]
) -> None:
    src = model_dir(tmp_path)
    with open(src / "config.pbtxt", "r+b") as f:
        f.truncate(1 << 30)  # 1 GiB (sparse: no disk used)
    tracemalloc.start()
    try:
        with pytest.raises(ModelConfigError) as err:
            publish(repo, src, "echo", [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (
        f"{src / 'config.pbtxt'}: larger than {MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES); "
        "not read further"
    )
    assert peak < 4 * MAX_CONFIG_BYTES  # it read about the limit, not the gigabyte
    site()


def test_a_config_at_the_limit_is_read_and_one_byte_more_is_not(
    repo: ModelRepository, tmp_path: Path
) -> None:
    padded = GOOD + "#" * (MAX_CONFIG_BYTES - len(GOOD) - 1) + "\n"
    assert len(padded.encode()) == MAX_CONFIG_BYTES
    src = model_dir(tmp_path, padded)
    assert parse_config(read_config_text(src / "config.pbtxt"), "at limit").backend == "python"
    (src / "config.pbtxt").write_text(padded + "\n")
    with pytest.raises(ModelConfigError, match="larger than"):
        read_config_text(src / "config.pbtxt")


@pytest.mark.parametrize(
    "nested",
    [
        "{" * 10_000 + "}" * 10_000,
        "optimization { " * 10_000 + "}" * 10_000,
        "input < " * 10_000 + ">" * 10_000,
    ],
    ids=["braces", "messages", "angle-brackets"],
)
def test_a_deeply_nested_config_is_refused_naming_the_limit(
    repo: ModelRepository, tmp_path: Path, site: Callable[[], None], nested: str
) -> None:
    src = model_dir(tmp_path, GOOD + nested)
    line = GOOD.count("\n") + 1
    with pytest.raises(ModelConfigError) as err:
        publish(repo, src, "echo", [])
    assert str(err.value) == (
        f"{src / 'config.pbtxt'}: line {line}: messages nested deeper than "
        f"{MAX_CONFIG_DEPTH} (MAX_CONFIG_DEPTH)"
    )
    site()


def test_brackets_in_strings_and_comments_do_not_count_as_nesting() -> None:
    text = GOOD + "# " + "{" * 100 + "\n" + 'default_model_filename: "' + "{<" * 100 + '"\n'
    assert parse_config(text, "w").default_model_filename == "{<" * 100


def test_the_parser_complaint_about_a_huge_token_is_cut() -> None:
    with pytest.raises(ModelConfigError) as err:
        parse_config(GOOD + "name: " + "x" * 500_000, "w")
    message = str(err.value)
    assert message.startswith("w: not a Triton ModelConfig: ")
    assert len(message) < 400 and message.endswith(" chars)")


def test_a_config_that_is_not_utf8_is_refused(
    repo: ModelRepository, tmp_path: Path, site: Callable[[], None]
) -> None:
    src = model_dir(tmp_path, GOOD.encode() + b"# \xff\xfe\n")
    with pytest.raises(ModelConfigError, match=rf"not UTF-8 text \(byte {len(GOOD) + 2}\)"):
        publish(repo, src, "echo", [])
    site()


def test_a_config_that_is_a_fifo_is_never_opened(tmp_path: Path) -> None:
    # The ledger reads every served model's config (model_teams); a FIFO there would block
    # an ingest forever if it were opened.
    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "config.pbtxt")
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt: not a regular file"):
        read_config_text(tmp_path / "m" / "config.pbtxt")
    assert model_teams(tmp_path) == {}


def test_the_ledger_skips_a_huge_config_and_keeps_the_others(repo: ModelRepository) -> None:
    teams = model_teams(repo.root)
    assert "echo" in teams
    (repo.root / "echo" / "config.pbtxt").write_text(GOOD + "#" * MAX_CONFIG_BYTES)
    assert model_teams(repo.root) == {k: v for k, v in teams.items() if k != "echo"}
