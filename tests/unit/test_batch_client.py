"""The batch inference client (deploy/batch/batch_infer.py) and its sbatch template, run
as real processes against a stand-in of the bridge's nginx on 127.0.0.1: a closed gate's
429 makes it wait its Retry-After (capped) and send the same request again, a 503 and a
refused connection too; other answers are written as they are; a rerun (a requeued job)
resumes after the last whole answer; array tasks share the input; each request names
its Slurm job (`X-Stb-Job`: `--job`, else the job's id from the environment, an array
task's `<job>_<task>`). The real nginx's gate is tests/lab/test_batch_route_nginx.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "deploy" / "batch" / "batch_infer.py"
SBATCH = ROOT / "deploy" / "batch" / "batch-infer.sbatch"


class Stand:
    """Answers POST /batch/v2/models/<m>/infer: the first `closed` requests 429 (the gate
    closed, Retry-After 7), then 200 with the request's data, 400 for model "bad"."""

    def __init__(self, closed: int = 0) -> None:
        self.closed = closed
        self.paths: list[str] = []
        #: each request's X-Stb-Job header (None: none sent)
        self.jobs: list[str | None] = []
        stand = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand.paths.append(self.path)
                stand.jobs.append(self.headers.get("X-Stb-Job"))
                model = self.path.split("/")[4]
                if stand.closed > 0:
                    stand.closed -= 1
                    self._answer(429, {"error": "the batch route is closed"}, retry="7")
                elif model == "bad":
                    self._answer(400, {"error": "bad input"})
                else:
                    self._answer(200, {"model": model, "data": body["inputs"][0]["data"]})

            def _answer(self, status: int, payload: object, retry: str | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                if retry:
                    self.send_header("Retry-After", retry)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stand() -> Iterator[Stand]:
    s = Stand()
    yield s
    s.server.shutdown()
    s.server.server_close()


def _inputs(tmp_path: Path, models: list[str]) -> Path:
    path = tmp_path / "requests.jsonl"
    lines = [
        json.dumps({"model": m, "request": {"inputs": [{"name": "x", "data": [i]}]}})
        for i, m in enumerate(models)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _client(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    bare = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [sys.executable, str(CLIENT), *args], capture_output=True, text=True, timeout=60,
        env={**bare, **(env or {})},
    )  # fmt: skip


def _answers(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_closed_gate_pauses_the_client_and_it_resumes(stand: Stand, tmp_path: Path) -> None:
    stand.closed = 3
    inputs = _inputs(tmp_path, ["echo", "bad", "echo"])
    out = tmp_path / "answers.jsonl"
    done = _client("--url", stand.url, "--input", str(inputs), "--out", str(out),
                   "--max-wait-s", "0.05")  # fmt: skip
    assert done.returncode == 0, done.stderr
    # three 429s (each waited, capped at 0.05 s of its Retry-After 7), then the same
    # request again: every line answered once, in order, nothing lost
    assert done.stderr.count("batch route closed (429): waiting 0.05 s") == 3
    assert stand.paths == ["/batch/v2/models/echo/infer"] * 4 + [
        "/batch/v2/models/bad/infer",
        "/batch/v2/models/echo/infer",
    ]
    assert _answers(out) == [
        {"line": 0, "status": 200, "response": {"model": "echo", "data": [0]}},
        {"line": 1, "status": 400, "response": {"error": "bad input"}},
        {"line": 2, "status": 200, "response": {"model": "echo", "data": [2]}},
    ]


def test_a_rerun_resumes_after_the_last_whole_answer(stand: Stand, tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, ["a", "b", "c", "d"])
    out = tmp_path / "answers.jsonl"
    out.write_text(
        json.dumps({"line": 0, "status": 200, "response": {}}) + "\n"
        + json.dumps({"line": 1, "status": 200, "response": {}}) + "\n"
        + '{"line": 2, "sta'  # killed mid-write
    )  # fmt: skip
    done = _client("--url", stand.url, "--input", str(inputs), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert stand.paths == ["/batch/v2/models/c/infer", "/batch/v2/models/d/infer"]
    assert [a["line"] for a in _answers(out)] == [0, 1, 2, 3]
    assert "2 answered, 2 already done" in done.stderr
    assert stand.jobs == [None, None]  # outside a Slurm job: no job named


def test_each_request_names_its_job(stand: Stand, tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, ["a", "b"])
    args = ("--url", stand.url, "--input", str(inputs))
    done = _client(*args, "--out", str(tmp_path / "1.jsonl"), env={"SLURM_JOB_ID": "812"})
    assert done.returncode == 0, done.stderr
    done = _client(*args, "--out", str(tmp_path / "2.jsonl"), "--job", "900_3",
                   env={"SLURM_JOB_ID": "812"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    # an environment value that is no job id names none, and says so
    done = _client(*args, "--out", str(tmp_path / "3.jsonl"), env={"SLURM_JOB_ID": "8 12"})
    assert done.returncode == 0 and "'8 12' from the environment is no Slurm job id" in done.stderr
    assert stand.jobs == ["812", "812", "900_3", "900_3", None, None]
    bad = _client(*args, "--out", str(tmp_path / "4.jsonl"), "--job", "12;rm")
    assert bad.returncode == 2 and "--job '12;rm': expected a Slurm job id" in bad.stderr


def test_nothing_listening_is_retried_with_backoff(tmp_path: Path) -> None:
    """A refused connection is retried (the bridge's nginx restarting); the test stops
    the client after a few tries."""
    inputs = _inputs(tmp_path, ["echo"])
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, str(CLIENT), "--url", "http://127.0.0.1:9", "--input",
             str(inputs), "--out", str(tmp_path / "o.jsonl"), "--max-wait-s", "0.1"],
            capture_output=True, text=True, timeout=1.5,
        )  # fmt: skip
    assert (tmp_path / "o.jsonl").read_text() == ""  # nothing written for it


def test_the_sbatch_template_runs_an_array_task(stand: Stand, tmp_path: Path) -> None:
    """The template as slurmd runs it for task 1 of `--array=0-1`: every other request."""
    inputs = _inputs(tmp_path, ["m0", "m1", "m2", "m3"])
    env = {
        "PATH": os.environ["PATH"],
        "STB_PYTHON": sys.executable,
        "STB_BATCH_URL": stand.url,
        "STB_BATCH_INPUT": str(inputs),
        "STB_BATCH_OUT": str(tmp_path / "out"),
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": "42",
        "SLURM_ARRAY_JOB_ID": "40",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_ARRAY_TASK_COUNT": "2",
        "SLURM_ARRAY_TASK_MIN": "0",
    }
    done = subprocess.run(
        ["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert stand.paths == ["/batch/v2/models/m1/infer", "/batch/v2/models/m3/infer"]
    assert [a["line"] for a in _answers(tmp_path / "out" / "answers-1.jsonl")] == [1, 3]
    assert stand.jobs == ["40_1", "40_1"]  # the task as sacct names it
    # its #SBATCH lines ask for the batch workload on an elastic partition, requeueable
    head = SBATCH.read_text()
    for line in ("#SBATCH --comment=stb:batch", "#SBATCH --partition=elastic", "#SBATCH --requeue"):
        assert line in head.splitlines()
    missing = subprocess.run(
        ["bash", str(SBATCH)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "STB_BATCH_URL is not set" in missing.stderr
