"""The runtime installs without the lab's Triton wheel: nvidia-pytriton is the `lab` extra
(only `[triton] runtime = "wheel"` needs it), the CLI, the daemon's configuration and the
ledger's report start without it, and a wheel-runtime launch without it says what to
install."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from bridge.paths import project_root

ROOT = project_root()
# pytriton made unimportable, as on an install without the `lab` extra
BLOCK = "import sys; sys.modules['pytriton'] = None; "


def test_the_triton_wheel_is_an_extra_not_a_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("nvidia-pytriton")]
    assert any(d.startswith("nvidia-pytriton") for d in project["optional-dependencies"]["lab"])
    assert "'.[dev,lab]'" in (ROOT / "deploy" / "bootstrap.sh").read_text()


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_cli_and_the_configuration_start_without_it() -> None:
    done = _run(
        "from bridge.cli import app; "
        "app(['config', 'check', 'deploy/lab/bridge.toml'], standalone_mode=False)"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "valid" in done.stdout
    report = _run("from bridge.cli import app; app(['report', '--help'], standalone_mode=False)")
    assert report.returncode == 0, report.stderr[-2000:]


def test_a_wheel_launch_without_it_says_what_to_install() -> None:
    done = _run(
        "from bridge.daemon.launcher import LauncherError, triton_home\n"
        "try:\n    triton_home()\nexcept LauncherError as exc:\n    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nvidia-pytriton is not installed" in done.stdout
