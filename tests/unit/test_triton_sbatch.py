"""The Triton job script refuses a bad environment with a clear message."""

from __future__ import annotations

import os
import subprocess

from bridge.paths import model_repository, triton_sbatch


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run(
        ["bash", str(triton_sbatch())], env=base | env, capture_output=True, text=True, timeout=30
    )


def test_missing_triton_home_is_named() -> None:
    done = _run({})
    assert done.returncode == 2
    assert "STB_TRITON_HOME is not set" in done.stderr


def test_missing_key_file_is_named(tmp_path: os.PathLike[str]) -> None:
    home = os.path.join(tmp_path, "triton")
    os.makedirs(os.path.join(home, "bin"))
    binary = os.path.join(home, "bin", "tritonserver")
    with open(binary, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(binary, 0o755)
    done = _run(
        {
            "STB_TRITON_HOME": home,
            "STB_MODEL_REPO": str(model_repository()),
            "STB_TRITON_KEY_FILE": os.path.join(tmp_path, "nope"),
        }
    )
    assert done.returncode == 2
    assert "STB_TRITON_KEY_FILE is not readable" in done.stderr
