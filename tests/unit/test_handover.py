"""The Triton job's own user and private /tmp (issue 33's hand-over hygiene), in the
configuration and the job the launcher builds: a bad user name or a container runtime
is refused naming the setting; the job carries the user and the Python it serves with.
The isolation itself is proven on the lab (tests/lab/test_handover_lab.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge.config import TritonJobConfig
from bridge.daemon.launcher import triton_job


def test_run_as_is_a_user_name_for_the_wheel_runtime() -> None:
    with pytest.raises(ValidationError, match="is not a Unix user name"):
        TritonJobConfig(run_as="root; rm -rf /")
    with pytest.raises(ValidationError, match='run_as is for runtime = "wheel"'):
        TritonJobConfig(run_as="stb-triton", runtime="apptainer", image="/images/t.sif")
    assert TritonJobConfig(run_as="stb-triton").run_as == "stb-triton"


def test_the_job_serves_as_the_user_with_the_python_given(tmp_path: Path) -> None:
    key = tmp_path / "api.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    python = tmp_path / "py" / "bin" / "python3"
    cfg = TritonJobConfig(key_file=key, run_as="stb-triton", python=python)
    spec = triton_job(cfg, node="n3", models=["busy"])
    assert spec.env["STB_TRITON_RUN_AS"] == "stb-triton"
    assert spec.env["PATH"].split(":")[0] == str(python.parent)
    plain = triton_job(TritonJobConfig(key_file=key), node="n3", models=["busy"])
    assert "STB_TRITON_RUN_AS" not in plain.env
    assert plain.env["PATH"].split(":")[0] != str(python.parent)
