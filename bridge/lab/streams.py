"""Token streams from a client outside the project, and lend/return cycles under them: the
lab's proof that a return cuts no stream (tests/lab/test_stream_return_lab.py, one cycle;
bench/stream_returns.py, ten).

Each stream is one `curl` process (a plain HTTP client reading the server-sent events of
Triton's `/v2/models/<model>/generate_stream`, not the project's load generator), bounded
in time, to a loopback endpoint only. A stream is whole when the response was 200, curl
read it to its end (exit 0: the chunked body closed properly) and its last event carries
the model's `finish_reason` (`stop` or `length`); it is broken when it began (200) and is
not whole; refused when it never began (no 200). `StreamLoad` keeps `clients` streams
open at once, one after the other, until stopped.

`cycle` lends the elastic node for the model through the daemon's operator queue (the
reconciler's pass carries it out), waits until it serves, lets the load reach it, asks for
its return and ticks until it is returned: the return's duration is from the request to
`returned`, the drain's from `draining` to `releasing`.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bridge.audit.asks import ask_lend, ask_return
from bridge.lifecycle import LeaseState

if TYPE_CHECKING:
    from bridge.daemon.reconciler import Reconciler
    from bridge.lab.spec import LabSpec

#: what each stream asks: a short chat prompt, this many tokens at most (about 1 s on the lab)
PROMPT = "Tell a short story about a lighthouse keeper."
MAX_TOKENS = 48
FINISHED = ("stop", "length")


@dataclass(frozen=True)
class StreamResult:
    """What the client saw of one stream."""

    started: float
    ended: float
    status: int
    upstream: str
    events: int
    finish_reason: str
    curl_rc: int
    error: str = ""

    @property
    def whole(self) -> bool:
        return (
            self.status == 200
            and self.curl_rc == 0
            and not self.error
            and self.finish_reason in FINISHED
        )

    @property
    def broken(self) -> bool:
        return self.status == 200 and not self.whole

    @property
    def refused(self) -> bool:
        return self.status != 200


def check_loopback(endpoint: str) -> str:
    """`endpoint` (host:port) when its host is a loopback address; ValueError otherwise."""
    host, _, port = endpoint.rpartition(":")
    try:
        loopback = ipaddress.ip_address(host).is_loopback and port.isdigit()
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"streams go to loopback endpoints only (127.0.0.0/8): {endpoint!r}")
    return endpoint


def stream_once(
    endpoint: str, model: str, *, max_tokens: int = MAX_TOKENS, timeout_s: float = 60
) -> StreamResult:
    """One generate_stream through `endpoint`, read by curl to its end."""
    body = {
        "text_input": PROMPT,
        "max_tokens": max_tokens,
        "stream": True,
        "return_finish_reason": True,
        "parameters": {"temperature": 0},
    }
    url = f"http://{check_loopback(endpoint)}/v2/models/{model}/generate_stream"
    argv = ["curl", "-sS", "-N", "-D", "-", "--max-time", f"{timeout_s:g}", "-X", "POST"]
    argv += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body), url]
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 10)
    ended = time.time()
    # text mode reads curl's CRLFs as newlines: the head ends at the first empty line
    head, _, rest = proc.stdout.partition("\n\n")
    lines = head.splitlines()
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
    upstream = next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("x-stb-upstream:")),
        "",
    )
    events, reason, error = 0, "", proc.stderr.strip()
    for line in rest.splitlines():
        if not line.startswith("data:"):
            continue
        events += 1
        try:
            event = json.loads(line[len("data:") :])
        except json.JSONDecodeError:
            error = error or f"not JSON: {line[:80]!r}"
            continue
        if "error" in event:
            error = error or str(event["error"])[:200]
        said = event.get("finish_reason", "")
        reason = str(said[0] if isinstance(said, list) and said else said)
    return StreamResult(started, ended, status, upstream, events, reason, proc.returncode, error)


@dataclass
class StreamLoad:
    """`clients` streams at once, each started when the one before it ends, until `stop`;
    at most `max_streams` in all (a bound, whatever happens)."""

    endpoint: str
    model: str
    clients: int = 3
    max_streams: int = 2000
    results: list[StreamResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_loopback(self.endpoint)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)
        ]

    def start(self) -> StreamLoad:
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if len(self.results) >= self.max_streams:
                    return
            result = stream_once(self.endpoint, self.model)
            with self._lock:
                self.results.append(result)

    def stop(self, timeout_s: float = 90) -> list[StreamResult]:
        """Stop starting streams; wait for those open to end; all the results."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
        with self._lock:
            return list(self.results)


@dataclass(frozen=True)
class Cycle:
    """One lend and return under load: the lease, its server's address, and timings."""

    lease_id: int
    address: str
    asked_at: float
    """when the return was asked (epoch seconds, as `StreamResult.started`)"""
    returned_s: float
    """from the return's request to the lease `returned`"""
    draining_s: float
    """time the lease spent draining (out of routing, waiting for what is in flight)"""


def tick(rec: Reconciler, until: Callable[[], bool], timeout_s: float, log: list[str]) -> None:
    """The reconciler's pass every half second until `until()`; TimeoutError with the log."""
    deadline = time.monotonic() + timeout_s
    while True:
        log += rec.run_once(datetime.now(UTC)).lines()
        if until():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s:g}s:\n" + "\n".join(log[-40:]))
        time.sleep(0.5)


def cycle(
    rec: Reconciler, lab: LabSpec, model: str, load: StreamLoad, hold_s: float, log: list[str]
) -> Cycle:
    """Lend the elastic node for `model`, let `load` reach it for `hold_s`, return it."""
    assert rec.requests is not None
    store = rec.store
    node = lab.pool_nodes("elastic")[0].name
    ask_lend(rec.requests, node, [model])
    tick(rec, lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 120, log)
    (lease,) = store.open_leases()
    assert lease.id is not None
    obs = rec.last_observation
    server = obs.server_of(lease.slurm_job_id) if obs is not None else None
    address = server.address if server is not None else ""
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:  # keep the passes going while the load reaches it
        log += rec.run_once(datetime.now(UTC)).lines()
        time.sleep(0.5)
    asked, asked_at = time.monotonic(), time.time()
    ask_return(rec.requests, lease.id)
    tick(rec, lambda: not store.open_leases(), 180, log)
    returned = time.monotonic() - asked
    history = store.history(lease.id)
    at = {e.to_state.value: e.at for e in history}
    draining = (
        (at["releasing"] - at["draining"]).total_seconds()
        if "releasing" in at and "draining" in at
        else float("nan")
    )
    return Cycle(lease.id, address, asked_at, returned, draining)
