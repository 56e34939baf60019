"""`stb models profile` against the lab's LLM (smol on a real Triton job on an inference
node, loaded from the lab's model repository as tests/lab/test_llm_lab.py does): the
command measures streams at 1 and 2 at once and writes the version's profile into the
configuration's repository, here a temporary copy of triton_repo/ (the project's own
repository, with its measured file, is never written). The file reads back with the
model's two sequences, a TPOT at two sequences no lower than at one and a prefill within
sane bounds; --dry-run and a refused version write nothing.

Lean: a short run (7 streams of 12 tokens, prompts of 40 to 120 tokens, twice) on one
server; about 30 s with the server's start.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.models.profile import PROFILE_FILE, read_profiles
from bridge.paths import project_root

from .helpers import triton_serving

pytestmark = pytest.mark.lab
STB = str(Path(sys.executable).with_name("stb"))
MODEL = "smol"
RUN = ("--requests", "6", "--prompt-tokens", "40,80,120", "--output-tokens", "12")


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    """A Triton job on the first inference node serving the LLM."""
    with triton_serving(lab, MODEL, "stb-profile-llm") as job:
        yield job


@pytest.fixture
def config_file(lab: LabSpec, tmp_path: Path) -> Path:
    """A configuration whose model repository is a copy of triton_repo/ without smol's
    measured profile."""
    root = tmp_path / "models"
    shutil.copytree(
        project_root() / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / MODEL / PROFILE_FILE).unlink(missing_ok=True)
    path = tmp_path / "stb.toml"
    path.write_text(
        f'[triton]\nmodel_repository = "{root}"\nkey_file = "{triton.job_config(lab).key_file}"\n'
    )
    return path


def _profile(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STB, "models", "profile", MODEL, "-c", str(config), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_profile_measures_smol_and_writes_its_version(
    served: triton.TritonJob, config_file: Path
) -> None:
    model_dir = config_file.parent / "models" / MODEL
    url = served.http_url
    ours = project_root() / "triton_repo" / MODEL / PROFILE_FILE
    before = ours.read_bytes() if ours.exists() else None

    refused = _profile(config_file, "--url", url, "--version", "9")
    assert refused.returncode == 1, refused.stderr
    assert "no version 9" in refused.stderr
    assert not (model_dir / PROFILE_FILE).exists()

    dry = _profile(config_file, "--url", url, "--dry-run", *RUN)
    assert dry.returncode == 0, dry.stderr
    assert "2 sequences" in dry.stdout and "nothing written" in dry.stdout, dry.stdout
    assert "batch 5/5: 2 at once" in dry.stderr, dry.stderr
    assert not (model_dir / PROFILE_FILE).exists()

    real = _profile(config_file, "--url", url, *RUN)
    assert real.returncode == 0, real.stderr
    assert "written:" in real.stdout, real.stdout
    measured = read_profiles(model_dir)
    assert set(measured) == {"1"}
    entry = measured["1"]
    prof = entry.profile
    assert entry.points == 7  # 3 streams alone, 2 batches of 2
    assert prof.sequences == 2
    assert prof.tpot_s[1] >= prof.tpot_s[0]
    assert 0.002 < prof.tpot_s[0] < 0.5, prof  # smol: ~16-30 ms a token on the lab
    assert 0.0 <= prof.prefill_s_per_token < 0.05, prof
    assert 0.01 < prof.prefill(100) < 10.0, prof
    assert (ours.read_bytes() if ours.exists() else None) == before  # the copy's only
