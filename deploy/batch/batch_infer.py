"""A batch inference client for the bridge's batch route: send each request of a JSON
lines file to `/batch/v2/models/<model>/infer` through the bridge's nginx, one at a time,
and write each answer to a JSON lines file. Standard library only (it runs inside a Slurm
job, with any Python 3.9+ on the node); run by deploy/batch/batch-infer.sbatch.

The batch route yields to online load: while the bridge's gate is closed nginx answers
429 with Retry-After. The client then waits that long (capped by --max-wait-s) and
sends the same request again, as often as it takes: the work pauses and resumes, nothing
is lost. A 503 (the model has no ready replica) and a connection error are retried the
same way, after a wait that doubles from 1 s up to --max-wait-s. Any other answer is
written as it is and the client goes on (a request the model refuses is the input's
fault, not a reason to stop).

Resumable: the output file is the progress. A job that is requeued (the batch
workload's elastic partition may preempt it) starts again, reads how many answers the
output already holds, and goes on from the next request. A Slurm job array shares one
input: task i of n (`--shard i/n`) takes the requests whose line number is i modulo n,
each task with its own output file.

Each request names its Slurm job in the `X-Stb-Job` header (`--job`; by default the
job's own id from the environment Slurm gives it: `<array job>_<task>` for a task of a job
array, else `$SLURM_JOB_ID`, as sacct and the ledger name it; none outside a job): nginx
logs it, and the ledger books the batch share of the replicas' serving time to that job's
team (docs/operators/batch.md).

Input lines: `{"model": "echo", "request": {...Triton's infer request body...}}`, or a
bare request body with --model. Output lines: `{"line": <input line number>, "status":
<HTTP status>, "response": <the JSON answer, or its text>}`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

#: HTTP statuses after which the same request is sent again
RETRIED = (429, 503)
#: the header the request names its batch job in (nginx's batch log writes it)
JOB_HEADER = "X-Stb-Job"
#: a job id as sacct names it: `123`, or `123_4` for a task of a job array
JOB_ID = re.compile(r"[0-9][0-9_]{0,63}")


def job_of(env: Mapping[str, str]) -> str | None:
    """The Slurm job this process runs in, as sacct names it; None outside a job."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


def job_id(text: str) -> str:
    """--job's value: a Slurm job id (digits, an array task's underscore)."""
    if not JOB_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"--job {text!r}: expected a Slurm job id such as 1234 or 1234_5"
        )
    return text


def requests_of(
    path: Path, model: str | None, shard: tuple[int, int]
) -> Iterator[tuple[int, str, bytes]]:
    """(line number, model, request body) of each of the shard's input lines."""
    index, count = shard
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if number % count != index or not line.strip():
                continue
            item = json.loads(line)
            if model is not None:
                yield number, model, json.dumps(item.get("request", item)).encode()
            else:
                yield number, item["model"], json.dumps(item["request"]).encode()


def done_lines(out: Path) -> set[int]:
    """The input lines the output already answers (a line cut short by a kill is not
    one: it is dropped and its request sent again)."""
    if not out.exists():
        return set()
    done = set()
    text = out.read_text(encoding="utf-8")
    keep = []
    for line in text.splitlines(keepends=True):
        try:
            done.add(int(json.loads(line)["line"]))
            keep.append(line)
        except (ValueError, KeyError, TypeError):
            break
    if "".join(keep) != text:
        out.write_text("".join(keep), encoding="utf-8")
    return done


def post(
    url: str, body: bytes, timeout_s: float, job: str | None = None
) -> tuple[int, str, str | None]:
    """(status, body text, Retry-After) of one POST (naming `job` in `JOB_HEADER` when
    given); status 0 when nothing answered."""
    headers = {"Content-Type": "application/json"}
    if job is not None:
        headers[JOB_HEADER] = job
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8", "replace"), None
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace")
        return err.code, text, err.headers.get("Retry-After")
    except (urllib.error.URLError, OSError) as err:
        return 0, str(err), None


def wait_s(retry_after: str | None, backoff: float, cap: float) -> float:
    """How long to wait before sending again: the server's Retry-After (seconds), else
    the doubling backoff; at most `cap`."""
    if retry_after is not None and retry_after.strip().isdigit():
        return min(float(retry_after), cap)
    return min(backoff, cap)


def run(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    out = Path(args.out)
    done = done_lines(out)
    sent = paused = 0
    job = args.job if args.job is not None else job_of(os.environ)
    if job is not None and not JOB_ID.fullmatch(job):
        print(f"batch_infer: {job!r} from the environment is no Slurm job id: the requests "
              "name no job (the ledger books their share to no team)", file=sys.stderr)  # fmt: skip
        job = None
    with open(out, "a", encoding="utf-8") as sink:
        for number, model, body in requests_of(Path(args.input), args.model, args.shard):
            if number in done:
                continue
            url = f"{base}/batch/v2/models/{model}/infer"
            backoff = 1.0
            while True:
                status, text, retry_after = post(url, body, args.timeout_s, job)
                if status not in RETRIED and status != 0:
                    break
                pause = wait_s(retry_after if status == 429 else None, backoff, args.max_wait_s)
                if status == 429:
                    paused += 1
                    print(f"batch route closed (429): waiting {pause:g} s", file=sys.stderr)
                backoff = min(backoff * 2, args.max_wait_s)
                time.sleep(pause)
            try:
                response: object = json.loads(text)
            except ValueError:
                response = text
            sink.write(json.dumps({"line": number, "status": status, "response": response}) + "\n")
            sink.flush()
            sent += 1
    print(
        f"batch_infer: {sent} answered, {len(done)} already done, {paused} pauses", file=sys.stderr
    )
    return 0


def shard(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    i, n = int(index), int(count)
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected i/n with 0 <= i < n")
    return i, n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--url", required=True, help="the bridge's nginx, e.g. http://infer.example:8080"
    )
    p.add_argument("--input", required=True, help="JSON lines of requests")
    p.add_argument("--out", required=True, help="JSON lines of answers (also the progress)")
    p.add_argument("--model", help="the model of every line (lines are bare request bodies)")
    p.add_argument("--shard", type=shard, default=(0, 1), help="i/n: this task's share")
    p.add_argument("--max-wait-s", type=float, default=300.0, help="longest wait between tries")
    p.add_argument("--timeout-s", type=float, default=300.0, help="one request's timeout")
    p.add_argument(
        "--job",
        type=job_id,
        help="the Slurm job the requests are booked to (default: this job's, from "
        "SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID or SLURM_JOB_ID)",
    )
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
