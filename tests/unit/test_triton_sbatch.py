"""The Triton job script refuses a bad environment with a clear message, and hands the
model-control key to tritonserver through the key shim: in its arguments, on no command
line another user can read, in no environment."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bridge.daemon.keyshim import build
from bridge.paths import key_shim_source, model_repository, triton_sbatch


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


def _fake_triton(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A tritonserver that reports its arguments, its command line as /proc shows it to
    others, and its environment; the key shim built from the repository; a key file."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    home = tmp_path / "triton"
    (home / "bin").mkdir(parents=True)
    binary = home / "bin" / "tritonserver"
    binary.write_text(
        "#!/bin/bash\n"
        'printf "arg %s\\n" "$@"\n'
        'printf "cmdline %s\\n" "$(tr "\\0" " " < /proc/$$/cmdline)"\n'
        'printf "environ %s\\n" "$(tr "\\0" " " < /proc/$$/environ)"\n'
    )
    binary.chmod(0o755)
    shim = build(key_shim_source(), tmp_path / "libstbkey.so")
    key = tmp_path / "api.key"
    key.write_text("s3cr3t-KEY_value\n")
    key.chmod(0o600)
    return home, shim, key


def _env(home: Path, shim: Path, key: Path) -> dict[str, str]:
    return {
        "STB_TRITON_HOME": str(home),
        "STB_MODEL_REPO": str(model_repository()),
        "STB_TRITON_KEY_FILE": str(key),
        "STB_KEY_SHIM": str(shim),
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_ID": "7",
        "STB_TRITON_ADDR": "127.0.0.1",
    }


def test_the_key_reaches_triton_but_no_command_line_or_environment(tmp_path: Path) -> None:
    home, shim, key = _fake_triton(tmp_path)
    done = _run(_env(home, shim, key))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    args = [line[4:] for line in lines if line.startswith("arg ")]
    assert "--http-restricted-api=model-repository:X-Stb-Key=s3cr3t-KEY_value" in args
    assert "--grpc-restricted-protocol=model-repository:x-stb-key=s3cr3t-KEY_value" in args
    (cmdline,) = [line for line in lines if line.startswith("cmdline ")]
    (environ,) = [line for line in lines if line.startswith("environ ")]
    assert "X-Stb-Key=@STB_KEY@" in cmdline  # what `ps` shows any user
    assert "s3cr3t" not in cmdline and "s3cr3t" not in environ


@pytest.mark.parametrize(
    ("mode", "text", "message"),
    [
        (0o644, "s3cr3t\n", "readable by group or others"),
        (0o600, "two words\n", "may hold only letters"),
        (0o600, "x" * 300, "longer than 256"),
    ],
)
def test_the_shim_fails_closed(tmp_path: Path, mode: int, text: str, message: str) -> None:
    home, shim, key = _fake_triton(tmp_path)
    key.write_text(text)
    key.chmod(mode)
    done = _run(_env(home, shim, key))
    assert done.returncode == 2 and message in done.stderr
    assert "arg " not in done.stdout  # tritonserver never ran


def test_no_shim_no_start(tmp_path: Path) -> None:
    home, shim, key = _fake_triton(tmp_path)
    env = _env(home, shim, key)
    del env["STB_KEY_SHIM"]
    done = _run(env)
    assert done.returncode == 2 and "STB_KEY_SHIM is not readable" in done.stderr
