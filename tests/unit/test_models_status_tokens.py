"""`stb models status` of an LLM in tokens (bridge/models/status_tokens.py): per version
the TTFT and TPOT p99 against the model's token SLOs and the prompt/output tokens since
each server loaded it, from recorded metrics pages of the lab's smol
(tests/data/triton/llm/smol_*.prom); the last hour from a real HTTP server answering
Prometheus' /api/v1/query with recorded answers, with tokens/s; the table and the JSON."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bridge.config import ObserveConfig
from bridge.models.repo import ModelRepository
from bridge.models.status import gather
from bridge.models.status_hour import last_hour_queries
from bridge.models.status_render import render
from bridge.models.status_tokens import last_hour_tokens, live_tokens, token_hour_queries
from bridge.models.status_views import TOKEN_LIVE_NOTE
from bridge.triton.catalog import ModelCatalog
from bridge.triton.metrics import parse_page
from tests.unit.models_status_fakes import (
    NOW,
    ROOT,
    FakeClient,
    FakeServer,
    prometheus,
    vector,
)

PAGES = ROOT / "tests" / "data" / "triton" / "llm"


def _samples(*names: str) -> list[Any]:
    out = []
    for name in names:
        page = parse_page((PAGES / name).read_text())
        out += [s for (m, _), s in page.models.items() if m == "smol"]
    return out


def test_live_tokens_from_a_recorded_page() -> None:
    # smol_b: 5 requests, TTFT buckets 2 at <= 0.25 s, 5 at <= 0.5 s: p99 at rank 4.95,
    # 0.25 + (4.95 - 2) / 3 x 0.25 s; 179 prompt and 294 output tokens
    t = live_tokens(_samples("smol_b.prom"), 2000.0, 150.0)
    assert t is not None
    assert t.requests == 5
    assert t.ttft_p99_ms == pytest.approx((0.25 + 2.95 / 3 * 0.25) * 1000)
    assert t.prompt_tokens == 179 and t.output_tokens == 294
    assert t.tpot_p99_ms is not None and 0 < t.tpot_p99_ms <= 150
    assert not t.ttft_breach and not t.tpot_breach
    assert t.prompt_tps is None and t.output_tps is None  # no window: no rate
    tight = live_tokens(_samples("smol_b.prom"), 400.0, 1.0)
    assert tight is not None and tight.ttft_breach and tight.tpot_breach


def test_live_tokens_sum_the_servers() -> None:
    a, b = (
        live_tokens(_samples("smol_a.prom"), None, None),
        live_tokens(_samples("smol_b.prom"), None, None),
    )
    both = live_tokens(_samples("smol_a.prom", "smol_b.prom"), None, None)
    assert a is not None and b is not None and both is not None
    assert both.requests == (a.requests or 0) + (b.requests or 0)
    assert both.output_tokens == (a.output_tokens or 0) + (b.output_tokens or 0)
    assert not both.ttft_breach  # no SLO: never a breach
    # a page of a model without token metrics: none
    assert live_tokens([], 2000.0, 150.0) is None


Q = token_hour_queries("smol")
HOUR = {
    Q["ttft_s"]: vector(({"version": "1"}, "2.4"), ({"version": "2"}, "NaN")),
    Q["tpot_s"]: vector(({"version": "1"}, "0.045")),
    Q["requests"]: vector(({"version": "1"}, "720")),
    Q["prompt"]: vector(({"version": "1"}, "72000")),
    Q["output"]: vector(({"version": "1"}, "21600")),
    **{q: vector() for q in last_hour_queries("smol").values()},
}


def test_token_queries_read_the_raw_series_per_version() -> None:
    assert Q["ttft_s"] == (
        "histogram_quantile(0.99, sum by (version, le) (increase("
        'vllm:time_to_first_token_seconds_bucket{job="triton",model="smol"}[1h])))'
    )
    assert Q["output"] == (
        'sum by (version) (increase(vllm:generation_tokens_total{job="triton",model="smol"}[1h]))'
    )


def test_last_hour_tokens_from_prometheus() -> None:
    with prometheus(HOUR) as prom:
        hours, note = last_hour_tokens("smol", prom.url, NOW, 2000.0, 150.0)
    assert note == ""
    h = hours[1]
    assert h.ttft_p99_ms == pytest.approx(2400) and h.ttft_breach
    assert h.tpot_p99_ms == pytest.approx(45) and not h.tpot_breach
    assert h.prompt_tps == pytest.approx(20.0) and h.output_tps == pytest.approx(6.0)
    assert hours[2].ttft_p99_ms is None and not hours[2].ttft_breach  # NaN: no requests
    closed = "http://127.0.0.1:9"
    hours, note = last_hour_tokens("smol", closed, NOW, 2000.0, 150.0, timeout_s=0.5)
    assert hours == {} and note.startswith("Prometheus did not answer the token queries")
    assert last_hour_tokens("smol", None, NOW, 2000.0, 150.0) == ({}, "")


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    root = tmp_path / "models"
    shutil.copytree(ROOT / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    return ModelRepository(root)


def _servers() -> list[FakeServer]:
    a = FakeClient("10.0.0.1:8000", {"smol": ["1"]}, (PAGES / "smol_a.prom").read_text())
    b = FakeClient("10.0.0.2:8000", {"smol": ["1"]}, (PAGES / "smol_b.prom").read_text())
    return [FakeServer(x.address, x) for x in (a, b)]


def _gather(repo: ModelRepository, answers: Mapping[str, Any] | None) -> Any:
    facts = ModelCatalog(repo.root, {}, say=False).facts()

    def at(observe: ObserveConfig | None) -> Any:
        return gather(
            "smol", repo, facts, database_url=None, ledger_url=None, servers=_servers(),
            now=NOW, observe=observe,
        )  # fmt: skip

    if answers is None:
        return at(None)
    with prometheus(answers) as prom:
        return at(ObserveConfig(source="prometheus", prometheus_url=prom.url))


def test_status_of_an_llm_shows_its_tokens(repo: ModelRepository) -> None:
    status = _gather(repo, HOUR)
    assert status.facts.slo_ttft_p99_ms == 2000 and status.facts.slo_tpot_p99_ms == 150
    v1 = next(v for v in status.versions if v.version == 1)
    both = live_tokens(_samples("smol_a.prom", "smol_b.prom"), 2000.0, 150.0)
    assert v1.tokens == both
    assert v1.tokens_hour is not None and v1.tokens_hour.ttft_breach
    doc = status.to_json()
    assert doc["token_live_note"] == TOKEN_LIVE_NOTE
    assert doc["versions"][0]["tokens_hour"]["output_tps"] == pytest.approx(6.0)
    console = Console(record=True, width=240)
    render(status, console)
    text = console.export_text()
    assert "tokens" in text and "since start" in text
    assert "(SLO 2000)" in text and "(SLO 150)" in text
    assert "TTFT p99 2000 ms  TPOT p99 150 ms" in text
    assert "2400.0 breach" in text and "6.00" in text
    assert TOKEN_LIVE_NOTE[:40] in text.replace("\n", " ")


def test_status_without_prometheus_still_shows_the_live_tokens(repo: ModelRepository) -> None:
    status = _gather(repo, None)
    v1 = next(v for v in status.versions if v.version == 1)
    assert v1.tokens is not None and v1.tokens_hour is None
    assert v1.tokens.requests is not None and v1.tokens.requests > 0


def test_a_model_without_token_slo_has_no_token_view(repo: ModelRepository) -> None:
    facts = ModelCatalog(repo.root, {}, say=False).facts()
    status = gather(
        "echo", repo, facts, database_url=None, ledger_url=None, servers=_servers(), now=NOW
    )
    assert all(v.tokens is None and v.tokens_hour is None for v in status.versions)
    assert "token_live_note" not in status.to_json()
