"""Triton's ports per slot (issue 32: several Triton jobs on one node, each a lease of
some of its GPUs): slot s listens 10 s ports above slot 0's; a job's comment tag names a
port other than slot 0's; the launcher passes the port to the job script and tags the
job; a client finds a slot's metrics page beside its HTTP port."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import TritonJobConfig
from bridge.daemon.launcher import triton_job
from bridge.slurm.model import TRITON_TAG
from bridge.triton.client import TritonHttpClient
from bridge.triton.ports import (
    HTTP_PORT,
    METRICS_PORT,
    SLOTS,
    http_port,
    metrics_address,
    port_of,
    port_tag,
    server_address,
    slot_of,
)


def test_each_slot_has_ports_of_its_own_and_a_tag_but_slot_0() -> None:
    assert [http_port(s) for s in (0, 1, 2)] == [8000, 8010, 8020]
    assert port_tag(0) is None and port_tag(3) == "stb:port=8030"
    for bad in (-1, SLOTS):
        with pytest.raises(ValueError, match="port slot"):
            http_port(bad)


@pytest.mark.parametrize(
    ("tags", "port", "slot"),
    [
        ((TRITON_TAG,), HTTP_PORT, 0),  # a baseline, a job from before slots
        ((TRITON_TAG, "stb:lease=7.100", "stb:port=8010"), 8010, 1),
        ((TRITON_TAG, "stb:port=9001"), 9001, 0),  # by hand, no slot's: its port, slot 0
        ((TRITON_TAG, "stb:port=x"), HTTP_PORT, 0),  # not a number: ignored
    ],
)
def test_a_jobs_tags_name_its_port_and_slot(tags: tuple[str, ...], port: int, slot: int) -> None:
    assert port_of(tags) == port and slot_of(tags) == slot
    assert server_address("10.0.0.3", tags) == f"10.0.0.3:{port}"
    assert metrics_address("10.0.0.3", tags) == f"10.0.0.3:{port + 2}"


def test_the_launcher_passes_the_slots_port_and_tags_the_job(tmp_path: Path) -> None:
    key = tmp_path / "api.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    cfg = TritonJobConfig(key_file=key)
    shared = triton_job(cfg, node="n4", models=["m"], lease=(8, 100), gpus=1, slot=2)
    assert shared.env["STB_TRITON_PORT"] == "8020"
    assert shared.comment == "stb:triton,stb:lease=8.100,stb:port=8020"
    first = triton_job(cfg, node="n4", models=["m"], lease=(7, 100), gpus=1)
    assert first.env["STB_TRITON_PORT"] == str(HTTP_PORT)
    assert first.comment == "stb:triton,stb:lease=7.100"


def test_a_client_reads_the_metrics_page_beside_its_servers_port() -> None:
    on_slot = TritonHttpClient("127.0.1.4:8010")
    plain = TritonHttpClient("127.0.1.4:8000")
    try:
        assert on_slot.metrics_url == "http://127.0.1.4:8012/metrics"
        assert plain.metrics_url == f"http://127.0.1.4:{METRICS_PORT}/metrics"
    finally:
        on_slot.close()
        plain.close()
