"""The ledger's tokens on the lab: the lab's LLM (smol, SmolLM2-135M on llama-cpp-python)
served by a Triton Slurm job on an inference node, a few requests streamed to it, the
server's page scraped into the ledger by the daemon's feed (`LedgerFeed.record_page`)
before and after, the job ended and its window ingested from sacct, then the finance
report's unit economics (`stb report --with economics --format json`) read back.

Checked, over that window:

- the ledger's input and output tokens for smol equal the increases of the model's own
  counters (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, read here from the
  same pages with prometheus_client's parser, not the bridge's), and the output tokens
  equal the events the client received (one per token);
- the reconciliation: cost per million output tokens = the ledger's GPU-hours of smol
  (its booked rows of the job) x the rate / the generated-token counter's increase; the
  loaded figure the same with the job's whole GPU time (smol is its only model).

About 10 s (7.5 and 9.4 s measured): the server's start and the LLM's load, three
streams of up to 16 tokens, the job's end reaching slurmdbd, one ingest.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from typer.testing import CliRunner

from accounting.buckets import MS_PER_HOUR, floor_hour
from accounting.db import open_ledger
from accounting.rates import RateSpec, add_rates, money
from accounting.schema import UNATTRIBUTED
from accounting.tables import LEDGER
from bridge.cli import app
from bridge.daemon.launcher import triton_job
from bridge.lab import triton
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.ledger.feed import LedgerFeed, ingest_window
from bridge.paths import project_root
from bridge.slurm.cli import SlurmCLI
from bridge.triton.metrics import parse_page

from .helpers import wait_sacct_final

pytestmark = pytest.mark.lab

MODEL = "smol"
RATE = Decimal("2.50")
PROMPTS = ("Name three colours.", "What does a scheduler do?", "Write one word.")
COUNTERS = ("vllm:prompt_tokens", "vllm:generation_tokens")  # the parser strips _total


def llm_repository() -> Path:
    """The lab's model repository, which holds smol."""
    return project_root() / "triton_repo"


def counters(text: str) -> dict[str, float]:
    """smol's token counters on a metrics page, by family."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in COUNTERS:
            for s in family.samples:
                if s.labels.get("model") == MODEL and s.name.endswith("_total"):
                    out[family.name] = out.get(family.name, 0.0) + s.value
    return out


def stream(base_url: str, prompt: str) -> int:
    """One streamed request; the events received (one per generated token)."""
    body = {"text_input": prompt, "max_tokens": 16, "stream": True,
            "parameters": {"temperature": 0}}  # fmt: skip
    events = 0
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{base_url}/v2/models/{MODEL}/generate_stream", json=body) as r,
    ):
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:"):
                assert "error" not in json.loads(line[len("data:") :]), line
                events += 1
    return events


def test_the_ledgers_tokens_are_the_models_counters_and_reconcile_with_cost(
    lab: LabSpec, tmp_path: Path
) -> None:
    config = lab_config(lab)
    config = config.model_copy(
        update={
            "database_url": f"sqlite:///{tmp_path / 'bridge.db'}",
            "accounting": config.accounting.model_copy(
                update={"ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}", "sample_interval_s": 0}
            ),
        }
    )
    ledger = open_ledger(config.accounting.ledger_url)
    add_rates(ledger, [RateSpec("h100", RATE, date(2000, 1, 1))])
    feed = LedgerFeed(config, ledger)
    t0 = datetime.now(UTC)

    job_config = triton.job_config(lab).model_copy(update={"model_repository": llm_repository()})
    node = lab.pool_nodes("infer")[0].name
    spec = triton_job(job_config, node=node, models=[MODEL], name="stb-ledger-tokens")
    job_id = SlurmCLI(env=lab.env()).submit(spec)
    try:
        served = triton.wait_ready(lab, job_id, timeout_s=120)

        def scrape() -> dict[str, float]:
            text = httpx.get(served.metrics_url, timeout=5).text
            feed.record_page(job_id, served.http_url, time.time(), parse_page(text))
            return counters(text)

        before = scrape()
        events = sum(stream(f"http://{served.http_url}", p) for p in PROMPTS)
        after = scrape()
    finally:
        slurm(lab, "scancel", job_id, check=False)
    prompt_delta = after["vllm:prompt_tokens"] - before.get("vllm:prompt_tokens", 0.0)
    generated = after["vllm:generation_tokens"] - before.get("vllm:generation_tokens", 0.0)
    assert generated == events > len(PROMPTS), (generated, events)
    assert prompt_delta >= 5 * len(PROMPTS)

    wait_sacct_final(lab, job_id, timeout_s=90)
    since = floor_hour(t0)
    until = datetime.now(UTC).replace(microsecond=0)
    summary = ingest_window(config, SlurmCLI(env=lab.env()), ledger, since, until, now=until)
    assert not summary.deferred, summary.deferred
    with ledger.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.model, LEDGER.c.gpu_ms).where(
                LEDGER.c.source.startswith(f"{lab.cluster}:{job_id}:")
            )
        ).all()
    smol_ms = sum(ms for model, ms in rows if model == MODEL)
    job_ms = sum(ms for _, ms in rows)
    assert 0 < smol_ms < job_ms and {m for m, _ in rows} == {MODEL, UNATTRIBUTED}, rows

    cfg_file = tmp_path / "bridge.toml"
    cfg_file.write_text(
        f'database_url = "{config.database_url}"\n[accounting]\n'
        f'ledger_url = "{config.accounting.ledger_url}"\ncluster = "{lab.cluster}"\n'
    )
    window = f"{since.isoformat()}..{(floor_hour(until) + timedelta(hours=1)).isoformat()}"
    res = CliRunner().invoke(
        app, ["report", "--window", window, "--by", "model", "--format", "json", "--with",
              "economics", "-c", str(cfg_file)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    econ = json.loads(res.stdout)["sections"]["unit_economics"]
    row = next(r for r in econ["rows"] if r["model"] == MODEL and r["version"] == "*")
    assert (row["input_tokens"], row["output_tokens"]) == (prompt_delta, generated)
    assert row["requests"] == len(PROMPTS)

    million = Decimal(1_000_000)
    plain = money(Decimal(smol_ms) * RATE / MS_PER_HOUR / Decimal(generated) * million)
    loaded = money(Decimal(job_ms) * RATE / MS_PER_HOUR / Decimal(generated) * million)
    assert Decimal(row["cost_per_million_output_tokens"]) == plain
    assert Decimal(row["loaded_cost_per_million_output_tokens"]) == loaded
    per_input = money(Decimal(smol_ms) * RATE / MS_PER_HOUR / Decimal(prompt_delta) * million)
    assert Decimal(row["cost_per_million_input_tokens"]) == per_input
    print(
        f"\nsmol, job {job_id}: {int(prompt_delta)} input and {int(generated)} output tokens"
        f" ({events} events); {smol_ms} GPU-ms of the job's {job_ms} computing; at {RATE}/GPU-h:"
        f" {plain} per million output tokens, {loaded} loaded; {row['cost_per_million_requests']}"
        " per million requests"
    )
