"""`stb simulate` on a site's own data and from a fresh clone: the defaults need nothing
outside the repository (run as a separate process from an empty folder, without
STB_TRACES_DIR); a run end to end on the recorded lab data (tests/data/site/: Prometheus
answers, sacct; tests/data/slurm/: scontrol listings; a lease history written through the
real `LeaseStore`), every input's source in the report; a live Prometheus query against a
local server of the API's shape, saved and replayed the same; bad site input: one line
naming it, exit 2, nothing written."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.db import make_engine
from bridge.leases.store import LeaseStore, create_schema
from bridge.lifecycle import LeaseState
from bridge.sim.policies import POLICIES

RUN = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "data"
SITE = DATA / "site"
RANGE = SITE / "prometheus-rate-range.json"
SERVICE = SITE / "prometheus-service.json"
SACCT = SITE / "sacct-site-22.05.json"
NODES = DATA / "slurm" / "scontrol-nodes-22.05.txt"
PARTITIONS = DATA / "slurm" / "scontrol-partitions-22.05.txt"
WINDOW = json.loads((SITE / "captures.json").read_text())["window"]
S = LeaseState
#: the recorded site, every input named
RECORDED = [
    "simulate",
    "--arrivals", "prometheus", "--prometheus-json", str(RANGE),
    "--jobs", "sacct", "--sacct-json", str(SACCT),
    "--fleet-nodes", str(NODES), "--fleet-partitions", str(PARTITIONS),
    "--service-from", "prometheus", "--service-json", str(SERVICE),
    "--tradeoff", "none",
]  # fmt: skip


def test_the_defaults_need_nothing_outside_the_repository(tmp_path: Path) -> None:
    """A fresh clone: `stb simulate` with no input option, from an empty folder, with no
    traces folder set, runs every set-up on the generators and writes nothing there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STB_")}
    stb = str(Path(sys.executable).with_name("stb"))
    done = subprocess.run(
        [stb, "simulate", "--days", "0.02", "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["policy"] for r in report["results"]] == list(POLICIES)
    for result in report["results"]:
        assert result["models"] and result["ticks"] > 0
    s = report["scenario"]
    assert s["arrivals"]["source"] == "synthetic" and s["batch_jobs"]["source"] == "synthetic"
    assert (s["nodes"], s["gpus_per_node"], s["jobs"] > 0) == (256, 8, True)
    assert list(tmp_path.iterdir()) == []


def _history(path: Path) -> Path:
    """A bridge database whose history holds two preempt lends of the elastic pool."""
    engine = make_engine(f"sqlite:///{path}")
    create_schema(engine)
    store = LeaseStore(engine)
    t0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
    for k, (start, ready) in enumerate([(9.0, 4.0), (7.0, 6.0)]):
        moves = [
            (S.SUBMITTED, 0.1), (S.STARTING, start), (S.SERVING, start + ready),
            (S.DRAINING, 100.0), (S.RELEASING, 104.0), (S.RETURNED, 108.0),
        ]  # fmt: skip
        base = t0 + timedelta(hours=k)
        lease = store.create("n3", "elastic", "preempt", ["busy"], f"k{k}", base)
        assert lease.id is not None
        for state, at in moves:
            store.set_status(lease.id, state, base + timedelta(seconds=at), "test")
    engine.dispose()
    return path


def test_a_site_run_end_to_end_on_recorded_inputs(tmp_path: Path) -> None:
    db = _history(tmp_path / "bridge.db")
    cfg = tmp_path / "bridge.toml"
    # an empty model repository: busy's SLO is the TOML's, echo's --slo-ms
    (tmp_path / "models").mkdir()
    cfg.write_text(
        f'database_url = "sqlite:///{db}"\n[models.busy]\nslo_p99_ms = 150\n'
        f'[triton]\nmodel_repository = "{tmp_path / "models"}"\n'
    )
    out = tmp_path / "sim.json"
    args = [*RECORDED, "--config", str(cfg), "--timing", "leases", "--load-s", "busy=30"]
    res = RUN.invoke(app, [*args, "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert [r["policy"] for r in report["results"]] == list(POLICIES)
    s = report["scenario"]
    # the window: the answer's own span (no --since/--until)
    first = min(
        float(v[0]) for r in json.loads(RANGE.read_text())["data"]["result"] for v in r["values"]
    )
    assert s["window"][0] == datetime.fromtimestamp(first, tz=UTC).isoformat().replace(
        "+00:00", "Z"
    )
    assert s["arrivals"]["source"] == "prometheus" and s["arrivals"]["file"] == RANGE.name
    assert set(s["arrivals"]["gaps"]) == {"busy", "echo"}  # Triton's outage
    assert s["batch_jobs"]["source"] == "sacct" and s["batch_jobs"]["files"] == [SACCT.name]
    assert s["batch_jobs"]["requeued"] == 1 and s["jobs"] == s["batch_jobs"]["jobs"] == 7
    assert s["load"] is None  # the site's jobs are not scaled
    assert (s["nodes"], s["gpus_per_node"]) == (4, 4)
    assert s["fleet"]["pools"] == {"elastic": 1, "inference": 1, "training": 2}
    assert s["models"]["busy"]["slo_p99_ms"] == 150.0  # from the configuration
    assert s["models"]["echo"]["slo_p99_ms"] == 100.0  # --slo-ms
    assert s["models"]["busy"]["service_ms"] == pytest.approx(20.68, abs=0.01)  # Triton's own
    assert s["model_inputs"]["busy"] == {
        "slo_from": "--config [models]",
        "service_from": f"prometheus answer {SERVICE.name}",
    }
    # the lease history: requested -> starting less half a tick (9 - 2.5, 7 - 2.5)
    assert s["timing"]["preempt_start_s"] == pytest.approx(5.5)
    assert s["timing"]["triton_ready_s"] == pytest.approx(5.0)
    assert s["timing"]["model_load_s"] == {"busy": 30.0}
    assert s["timing_source"]["fields"]["preempt_start_s"]["leases"] == 2
    assert s["timing_source"]["model_load_s_from"] == "--load-s"
    assert str(tmp_path) not in out.read_text()  # files by name, not path
    # the table says where the workload came from, without a load share
    table = RUN.invoke(app, [*RECORDED, "--policies", "bridge"])
    assert table.exit_code == 0, table.output
    assert "prometheus arrivals, sacct jobs, seed 0" in table.stdout


def test_a_csv_site_and_a_window(tmp_path: Path) -> None:
    rows = ["time,model,rate"]
    for r in json.loads(RANGE.read_text())["data"]["result"]:
        rows += [f"{t},{r['metric']['model']},{v}" for t, v in r["values"]]
    csv = tmp_path / "rates.csv"
    csv.write_text("\n".join(rows) + "\n")
    since = datetime.fromtimestamp(WINDOW["start"], tz=UTC).isoformat()
    args = [
        "simulate", "--arrivals", "csv", "--arrivals-file", str(csv), "--since", since,
        "--days", "0.01", "--nodes", "4", "--gpus-per-node", "4",
        "--service-ms", "20,echo=1", "--scale", "2", "--tradeoff", "none",
        "--policies", "bridge", "--format", "json",
    ]  # fmt: skip
    res = RUN.invoke(app, args)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["scenario"]
    assert s["arrivals"]["source"] == "csv" and s["arrivals"]["scale"] == 2.0
    assert s["horizon_s"] == pytest.approx(865.0)  # --since and --days, in whole 5 s steps
    assert s["models"]["echo"]["service_ms"] == 1.0 and s["models"]["busy"]["service_ms"] == 20.0
    assert s["batch_jobs"]["source"] == "synthetic"


class Prometheus(BaseHTTPRequestHandler):
    """Serves the recorded answers at Prometheus' API paths, as the lab's Prometheus sent
    them (whatever the window asked: the capture's)."""

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        body = {"/api/v1/query_range": RANGE, "/api/v1/query": SERVICE}[path].read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_live_query_saved_replays_the_same(prometheus: str, tmp_path: Path) -> None:
    since, until = (datetime.fromtimestamp(WINDOW[k], tz=UTC).isoformat() for k in ("start", "end"))
    saved = tmp_path / "answer.json"
    common = [
        "--jobs", "sacct", "--sacct-json", str(SACCT), "--fleet-nodes", str(NODES),
        "--since", since, "--until", until, "--tradeoff", "none", "--format", "json",
    ]  # fmt: skip
    live = RUN.invoke(app, [
        "simulate", "--arrivals", "prometheus", "--prometheus-url", prometheus,
        "--prometheus-save", str(saved), "--service-from", "prometheus", *common,
    ])  # fmt: skip
    assert live.exit_code == 0, live.output
    s = json.loads(live.stdout)["scenario"]
    assert s["arrivals"]["url"] == prometheus and s["arrivals"]["saved"] == "answer.json"
    assert s["arrivals"]["query"] == "sum by (model) (rate(nv_inference_request_success[1m]))"
    assert s["model_inputs"]["busy"]["service_from"] == f"prometheus {prometheus}"
    assert json.loads(saved.read_text()) == json.loads(RANGE.read_text())
    replay = RUN.invoke(app, [
        "simulate", "--arrivals", "prometheus", "--prometheus-json", str(saved),
        "--service-from", "prometheus", "--service-json", str(SERVICE), *common,
    ])  # fmt: skip
    assert replay.exit_code == 0, replay.output
    a, b = json.loads(live.stdout), json.loads(replay.stdout)
    for x, y in zip(a["results"], b["results"], strict=True):
        x.pop("wall_s"), y.pop("wall_s")
        assert x == y


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arrivals", "prometheus"], "give one of --prometheus-url URL (a live query)"),
        (["--arrivals", "csv"], "--arrivals csv and --arrivals-file FILE go together"),
        (["--jobs", "sacct"], "--jobs sacct and --sacct-json FILE go together"),
        (
            ["--fleet-partitions", str(PARTITIONS)],
            "--fleet-partitions is read only with --fleet-nodes",
        ),
        (["--fleet-nodes", str(NODES), "--nodes", "4"], "give --nodes or --fleet-nodes, not both"),
        (["--timing", "leases"], "--timing leases reads the bridge's database: give --config"),
        (["--timing", "fast"], "--timing 'fast': choose from default, leases"),
        (["--service-from", "prometheus"], "give one of --prometheus-url URL or --service-json"),
        (["--service-from", "ledger"], "--service-from ledger reads the bridge's database"),
        (
            ["--since", "2026-11-30T00:00:00", "--until", "2026-11-30T01:00Z"],
            "--since: '2026-11-30T00:00:00' has no time zone",
        ),
        (["--since", "2026-11-30T01:00Z", "--until", "2026-11-30T00:00Z"], "is not after --since"),
        (
            ["--arrivals", "prometheus", "--prometheus-json", str(RANGE), "--scale", "0"],
            "--scale must be a number > 0",
        ),
        (
            ["--arrivals", "prometheus", "--prometheus-json", str(RANGE), "--days", "1"],
            "--days is read only beside --since or --until when the arrivals are saved",
        ),
        (["--service-ms", "busy=x"], "--service-ms: 'x' in 'busy=x' is not a number >= 0"),
        (["--query", "up"], "--query is read only with --arrivals prometheus and --prometheus-url"),
        (
            ["--jobs", "sacct", "--sacct-json", str(SACCT), "--partition-kind", "train"],
            "--partition-kind: 'train': give PARTITION=KIND",
        ),
        (
            ["--arrivals", "prometheus", "--prometheus-json", "{tmp}/nan.json"],
            "value nan is not a rate",
        ),
        (["--arrivals", "prometheus", "--prometheus-json", "{tmp}/gone.json"], "cannot read it"),
        (
            ["--arrivals", "prometheus", "--prometheus-json", str(SITE / "prometheus-error.json")],
            "Prometheus answered bad_data: 1:22: parse error",
        ),
        (
            ["--arrivals", "prometheus", "--prometheus-json", str(RANGE), "--service-ms", "150"],
            "--service-ms 150 is not below --slo-ms 100",
        ),
        (
            [
                "--arrivals",
                "prometheus",
                "--prometheus-json",
                str(RANGE),
                "--service-ms",
                "busy=120",
            ],
            "model busy: its service time 120 ms (--service-ms) is not below its SLO 100 ms",
        ),
        (
            ["--arrivals", "prometheus", "--prometheus-json", str(RANGE), "--service-ms", "m9=5"],
            "--service-ms names models the simulation has not: m9 (its models: busy, echo)",
        ),
        (["--jobs", "sacct", "--sacct-json", "{tmp}/bad.json"], "bad.json: cannot parse sacct"),
        (
            [
                "--jobs",
                "sacct",
                "--sacct-json",
                str(SACCT),
                "--fleet-nodes",
                str(NODES),
                "--gpus-per-node",
                "2",
            ],
            "jobs use more than the fleet's 2 GPUs a node",
        ),
        (["--fleet-nodes", "{tmp}/mixed.txt"], "the fleet mixes GPU counts"),
        (
            [
                "--jobs",
                "sacct",
                "--sacct-json",
                str(SACCT),
                "--since",
                "2020-01-01T00:00Z",
                "--until",
                "2020-01-02T00:00Z",
            ],
            "no batch job in the window",
        ),
    ],
)
def test_bad_site_input_exits_2_naming_it_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "nan.json").write_text(
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"model": "busy"}, "values": [[1, "1"], [6, "NaN"]]}]}})
    )  # fmt: skip
    (tmp_path / "bad.json").write_text('{"jobs": [')
    (tmp_path / "mixed.txt").write_text(
        NODES.read_text().replace("Gres=gpu:h100:4 NodeAddr=127.0.1.4", "Gres=gpu:8 NodeAddr=x")
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "out.json"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    base = ["simulate", "--tradeoff", "none"]
    site = {b for a, b in itertools.pairwise(args) if a == "--arrivals"} & {"prometheus", "csv"}
    if not site:
        base += ["--mean-rps", "1"]  # the generated arrivals' (a site's bring their own)
    if not ({"--until", "--prometheus-json", "--days"} & set(args) or "csv" in site):
        base += ["--days", "0.01"]  # (saved arrivals have their own span)
    if "--fleet-nodes" not in args:
        base += ["--nodes", "16"] if "--nodes" not in args else []
    res = RUN.invoke(app, [*base, "--format", "json", "-o", str(out), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert res.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == before
