"""A replica's measured load time reaches the lead time, on the lab (issue 29): a lent
replica is given a model whose Triton load takes seconds (`slowload`: its `initialize`
sleeps `load_delay_s`), the placement's load is asked and the passes go on while Triton
loads it (each says it is under way), its time from the ask to its end is stored in the
lease database (`model_load`), and the next pass's snapshot carries it
(`Snapshot.load_s`) and looks at least that far ahead (`bridge.policy.timing.lead_s`).

A load longer than the daemon's Triton client waits for an answer (`longload`, 20 s) is
polled in Triton's index until READY, the passes going on (expected to fail until the
observer counts a server that loads a model while holding others READY as serving: see
that test).

The bridge serves a copy of triton_repo/ with `slowload` and `longload` added (the
`triton_config` override): the project's own repository, which other lab tests count
models of, is left as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bridge.audit.asks import ask_place
from bridge.config import TritonJobConfig
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.leases.loads import LoadStore
from bridge.lifecycle import LeaseState
from bridge.paths import project_root
from bridge.policy.timing import lead_s

from .helpers import lend_serving, tick_until

pytestmark = pytest.mark.lab

#: seconds `slowload`'s initialize sleeps: longer than the load a lab lend holds (5 s)
DELAY_S = 8.0

#: seconds `longload`'s initialize sleeps: past the daemon's Triton client timeout (10 s,
#: the ask goes unanswered and the load is polled) and `[leases] unanswered_grace_s` (15 s)
LONG_S = 20.0


def slow_config(name: str, delay_s: float) -> str:
    """A python-backend model `name` whose load takes `delay_s`."""
    return f"""name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters: {{ key: "load_delay_s" value: {{ string_value: "{delay_s:g}" }} }}
parameters: {{ key: "stb.team" value: {{ string_value: "team-platform" }} }}
parameters: {{ key: "stb.slo_p99_ms" value: {{ string_value: "500" }} }}
parameters: {{ key: "stb.min_replicas" value: {{ string_value: "0" }} }}
parameters: {{ key: "stb.max_replicas" value: {{ string_value: "1" }} }}
"""


SLOWLOAD_MODEL = '''"""slowload: its load takes `load_delay_s` seconds (a large model's weights)."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        raw = config.get("parameters", {}).get("load_delay_s", {}).get("string_value", "0")
        time.sleep(float(raw))

    def execute(self, requests):
        out = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            tensor = pb_utils.Tensor("OUTPUT0", data)
            out.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return out
'''


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(
        project_root() / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__")
    )
    for name, delay_s in (("slowload", DELAY_S), ("longload", LONG_S)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(slow_config(name, delay_s))
        (root / name / "1" / "model.py").write_text(SLOWLOAD_MODEL)
    return root


@pytest.fixture
def triton_config(lab: LabSpec, repo_root: Path) -> TritonJobConfig:
    return triton.job_config(lab).model_copy(update={"model_repository": repo_root})


def test_a_placed_models_measured_load_time_reaches_the_lead_time(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, _ = bridge
    assert rec.requests is not None
    # the operator's lend and placement alone: the policy neither places nor returns
    policy = rec.config.policy.model_copy(update={"placement": False, "scale_in_cooldown_s": 3600})
    rec.config = rec.config.model_copy(update={"policy": policy})
    queue, store = rec.requests, rec.store
    log: list[str] = []
    lease, _address = lend_serving(rec, lab, ["busy"], log)
    # the lend's start is measured: busy's upper bound, from starting -> serving
    tick_until(rec, lambda: "busy" in rec.loads.load_s, 10, log)
    before = rec.last_snapshot
    assert before is not None and "slowload" in before.models
    lead_before = lead_s(before, rec.config)

    ask_place(queue, lease.id, ["busy", "slowload"])

    def placed() -> bool:
        seen = rec.last_observation
        server = seen.server_of(lease.slurm_job_id) if seen is not None else None
        return server is not None and "slowload" in server.models

    mark = len(log)
    tick_until(rec, placed, 40, log)
    # the passes went on while it loaded (a pass a second): each said so
    loading = [line for line in log[mark:] if "loading slowload for" in line]
    assert len(loading) >= DELAY_S / 2, "\n".join(log[mark:])
    rec.run_once()  # the next pass's snapshot
    stored = LoadStore.beside(store).measures()["slowload"]
    assert [source for source, _ in stored] == ["placement"], stored
    (measured,) = [seconds for _, seconds in stored]
    assert DELAY_S <= measured < DELAY_S + 10, stored
    snap = rec.last_snapshot
    assert snap is not None and snap.load_s["slowload"] == measured
    lead = lead_s(snap, rec.config)
    assert lead >= measured > lead_before, (lead, measured, lead_before, "\n".join(log))
    print(
        f"\n{len(loading)} passes while it loaded, the last: {loading[-1]}"
        f"\nslowload loaded in {measured:.2f}s (placement); busy's start bound "
        f"{snap.load_s['busy']:.2f}s; lend time {dict(snap.lend_s)}; "
        f"lead {lead_before:.2f}s -> {lead:.2f}s"
    )


def test_a_load_longer_than_the_clients_timeout_is_polled_until_ready(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, _ = bridge
    assert rec.requests is not None
    policy = rec.config.policy.model_copy(update={"placement": False, "scale_in_cooldown_s": 3600})
    rec.config = rec.config.model_copy(update={"policy": policy})
    store = rec.store
    log: list[str] = []
    lease, _address = lend_serving(rec, lab, ["busy"], log)
    ask_place(rec.requests, lease.id, ["busy", "longload"])

    def ended() -> bool:
        seen = rec.last_observation
        server = seen.server_of(lease.slurm_job_id) if seen is not None else None
        loaded = server is not None and "longload" in server.models
        return loaded or store.get(lease.id).state != LeaseState.SERVING

    mark = len(log)
    tick_until(rec, ended, LONG_S + 30, log)
    timeline = "\n".join(log[mark:])
    assert store.get(lease.id).state == LeaseState.SERVING, timeline
    # the ask went unanswered (the client's 10 s), the load polled, the passes going on
    polled = [line for line in log[mark:] if "loading longload for" in line]
    assert any("unanswered" in line for line in polled), timeline
    assert len(polled) >= LONG_S / 2, timeline
    (measured,) = [s for _, s in LoadStore.beside(store).measures()["longload"]]
    assert LONG_S <= measured < LONG_S + 10, timeline
