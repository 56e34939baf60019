"""The Triton adapter (bridge.triton) against the lab's real Triton, a Slurm job on n4:
health, metadata, the keyed repository API, statistics, the metrics page and the signal,
and sane rates across a restart (the job cancelled and a new one on the same node)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import triton_sbatch
from bridge.triton.client import DEFAULT_API_KEY_HEADER, TritonHttpClient
from bridge.triton.errors import TritonRejected, TritonUnreachable
from bridge.triton.metrics import parse_page
from bridge.triton.protocol import TritonInstance
from bridge.triton.signal import Scrape, Window, instance_signal, model_signals

pytestmark = pytest.mark.lab

NODE = "n4"  # the reserved inference node; the only one these tests use
NOBODY = "127.0.1.249:8000"  # a loopback address no lab node serves


class Served:
    """The Triton job these tests run on; the restart test replaces it."""

    def __init__(self, lab: LabSpec) -> None:
        self.lab = lab
        self.job: triton.TritonJob | None = None

    def start(self) -> triton.TritonJob:
        job_id = triton.submit(self.lab, node=NODE, name="stb-triton-adapter")
        try:
            self.job = triton.wait_ready(self.lab, job_id, timeout_s=120)
        except BaseException:
            slurm(self.lab, "scancel", job_id, check=False)
            raise
        return self.job

    def stop(self) -> None:
        """scancel, then wait until the job has left the queue (ports 8000-8002 free)."""
        if self.job is None:
            return
        job_id, self.job = self.job.job_id, None
        slurm(self.lab, "scancel", job_id, check=False)
        deadline = time.monotonic() + 90
        while triton.job_state(self.lab, job_id)[0] and time.monotonic() < deadline:
            time.sleep(0.5)


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[Served]:
    s = Served(lab)
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture()
def client(lab: LabSpec, served: Served) -> Iterator[TritonHttpClient]:
    assert served.job is not None
    with TritonHttpClient(served.job.http_url, api_key=triton.api_key(lab)) as c:
        yield c


def send(address: str, model: str, n: int) -> None:
    c = httpclient.InferenceServerClient(address)
    data = np.arange(8, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 8] if model == "echo" else [8], "FP32")
    inp.set_data_from_numpy(data.reshape(1, -1) if model == "echo" else data)
    for _ in range(n):
        c.infer(model, [inp])
    c.close()


def scrape(c: TritonHttpClient, incarnation: str, *, busy_at_least: float = 0) -> Scrape:
    """One scrape; with `busy_at_least`, rescrape (up to 5 s) until busy's success counter
    shows that many: Triton counts a request a moment after it has sent the response."""
    deadline = time.monotonic() + 5
    while True:
        text = c.metrics_text()
        obs = Scrape(c.address, time.monotonic(), parse_page(text), incarnation)
        busy = obs.page.models.get(("busy", "1"))
        done = busy is not None and (busy.request_success or 0) >= busy_at_least
        if done or time.monotonic() > deadline:
            return obs
        time.sleep(0.05)


def test_client_satisfies_the_protocol_and_uses_the_lab_header(client: TritonHttpClient) -> None:
    assert isinstance(client, TritonInstance)
    # the header the servers are started with is the one the client sends
    script = triton_sbatch().read_text()
    assert f"model-repository:{DEFAULT_API_KEY_HEADER}=@STB_KEY@" in script


def test_the_key_is_on_no_command_line_and_in_no_environment(
    lab: LabSpec, client: TritonHttpClient
) -> None:
    """What another user of the node sees of the Triton job: its command line holds the
    placeholder, its environment is not theirs to read and holds no key anyway, and the
    job's log holds no key; the key still opens the repository API."""
    key = triton.api_key(lab)
    pids = subprocess.run(
        ["pgrep", "-f", "bin/tritonserver"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert pids
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # ww: whole command lines (ps cuts them to 80 columns off a terminal)
    seen = subprocess.run([*nobody, "ps", "-eo", "args", "ww"], capture_output=True, text=True)
    assert seen.returncode == 0 and "tritonserver" in seen.stdout
    assert key not in seen.stdout and "X-Stb-Key=@STB_KEY@" in seen.stdout
    for pid in pids:
        assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert key.encode() not in Path(f"/proc/{pid}/environ").read_bytes()  # as root
        other = subprocess.run([*nobody, "cat", f"/proc/{pid}/environ"], capture_output=True)
        assert other.returncode != 0 and b"Permission denied" in other.stderr
    for log in lab.log_dir.glob("triton-*.log"):
        assert key not in log.read_text(errors="replace")
    client.load_model("echo")  # the key works: the shim put it where Triton reads it


def test_live_and_ready(client: TritonHttpClient) -> None:
    assert client.is_live()
    assert client.is_ready()
    assert client.is_model_ready("busy") and client.is_model_ready("echo", "1")
    assert not client.is_model_ready("no-such-model")


def test_no_server_is_unreachable_not_false() -> None:
    with TritonHttpClient(NOBODY, connect_timeout_s=1, timeout_s=2) as c:
        t0 = time.monotonic()
        with pytest.raises(TritonUnreachable) as err:
            c.is_ready()
        assert time.monotonic() - t0 < 5
        assert err.value.address == NOBODY
        with pytest.raises(TritonUnreachable):
            c.metrics_text()


def test_server_metadata(client: TritonHttpClient) -> None:
    meta = client.server_metadata()
    assert meta.name == "triton"
    assert meta.version.startswith("2.51.")
    assert {"model_repository", "statistics"} <= set(meta.extensions)


def test_repository_index_needs_the_key(lab: LabSpec, served: Served) -> None:
    assert served.job is not None
    with TritonHttpClient(served.job.http_url, api_key=triton.api_key(lab)) as keyed:
        index = {m.name: m for m in keyed.repository_index()}
    assert index["busy"].state == "READY" and index["busy"].version == "1"
    assert index["echo"].state == "READY"
    for key in (None, "wrong-key"):
        with TritonHttpClient(served.job.http_url, api_key=key) as c:
            with pytest.raises(TritonRejected) as err:
                c.repository_index()
            assert err.value.status == 403
            assert "restricted" in err.value.message and "X-Stb-Key" in err.value.message


def test_unload_and_load_with_the_key_refused_without(lab: LabSpec, served: Served) -> None:
    assert served.job is not None
    url = served.job.http_url
    for key in (None, "wrong-key"):
        with TritonHttpClient(url, api_key=key) as c:
            with pytest.raises(TritonRejected, match="restricted") as err:
                c.unload_model("echo")
            assert err.value.status == 403
            with pytest.raises(TritonRejected, match="restricted"):
                c.load_model("echo")
            assert c.is_model_ready("echo")  # the refused unload changed nothing
    with TritonHttpClient(url, api_key=triton.api_key(lab)) as c:
        c.unload_model("echo")
        c.unload_model("echo")  # idempotent
        deadline = time.monotonic() + 20
        while c.is_model_ready("echo") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not c.is_model_ready("echo")
        assert {m.name: m.state for m in c.repository_index()}["echo"] != "READY"
        c.load_model("echo")
        assert c.is_model_ready("echo")  # load returns once loaded
        c.load_model("echo")  # idempotent
        assert c.is_model_ready("echo")
        c.unload_model("no-such-model")  # unloading what is not there succeeds
        with pytest.raises(TritonRejected) as err:
            c.load_model("no-such-model")
        assert "failed to load 'no-such-model'" in err.value.message


def test_statistics_count_the_requests_sent(client: TritonHttpClient) -> None:
    (before,) = client.model_statistics("echo")
    send(client.address, "echo", 7)
    # Triton books a request a moment after its response: allow it a few seconds.
    deadline = time.monotonic() + 5
    while True:
        (after,) = client.model_statistics("echo")
        if after.success_count >= before.success_count + 7 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (after.name, after.version) == ("echo", "1")
    assert after.success_count - before.success_count == 7
    assert after.inference_count - before.inference_count == 7
    assert after.compute_ns > before.compute_ns
    assert after.last_inference_ms > 0
    assert {s.name for s in client.model_statistics()} >= {"busy", "echo"}
    with pytest.raises(TritonRejected) as err:
        client.model_statistics("no-such-model")
    assert err.value.status == 400 and "no-such-model" in err.value.message


def test_metrics_page_parses_and_the_signal_counts_what_was_sent(
    served: Served, client: TritonHttpClient
) -> None:
    assert served.job is not None
    assert client.metrics_url == served.job.metrics_url
    first = scrape(client, served.job.job_id)
    assert first.page.ok and ("busy", "1") in first.page.models
    sent = first.page.models[("busy", "1")].request_success
    assert sent is not None
    send(client.address, "busy", 10)
    second = scrape(client, served.job.job_id, busy_at_least=sent + 10)
    w = next(m for m in instance_signal(first, second).models if m.model == "busy")
    assert w.window is Window.OK
    assert w.requests == 10
    assert w.request_rate == pytest.approx(10 / (second.at - first.at))
    assert w.mean_latency_ms is not None and w.mean_latency_ms >= 20  # service_time_ms = 20
    assert w.p99_ms is not None and w.p99_ms >= 20


def test_rates_stay_sane_across_a_triton_restart(lab: LabSpec, served: Served) -> None:
    assert served.job is not None
    old = served.job
    with TritonHttpClient(old.http_url) as c:
        send(c.address, "busy", 30)
        send(c.address, "echo", 30)
        before = scrape(c, old.job_id, busy_at_least=30)
    t0 = time.monotonic()
    served.stop()
    new = served.start()
    assert new.node == NODE and new.job_id != old.job_id
    with TritonHttpClient(new.http_url) as c:
        send(c.address, "busy", 3)
        after = scrape(c, new.job_id, busy_at_least=3)
        # The same windows judged by counters alone (incarnation unknown to the caller).
        blind = Scrape(after.instance, after.at, after.page)
        unlabelled = Scrape(before.instance, before.at, before.page)
    seconds = after.at - before.at
    assert seconds >= time.monotonic() - t0 - 60  # the window spans the restart
    for sig in (instance_signal(before, after), instance_signal(unlabelled, blind)):
        ws = {w.model: w for w in sig.models}
        assert ws["busy"].window is Window.RESET
        assert ws["busy"].requests == 3  # not 3 - 30
        assert ws["echo"].requests == 0  # echo was not used since the restart
        for w in sig.models:
            for v in (w.requests, w.request_rate, w.failure_rate, w.mean_latency_ms,
                      w.mean_queue_ms, w.queue_compute_ratio, w.pending):  # fmt: skip
                assert v is None or 0 <= v < 1e6
            assert w.request_rate is not None and w.request_rate <= 3 / seconds + 1e-9
        agg = model_signals([sig])["busy"]
        assert agg.request_rate is not None and 0 < agg.request_rate <= 3 / seconds + 1e-9
        assert agg.mean_latency_ms is not None and 20 <= agg.mean_latency_ms < 10_000
