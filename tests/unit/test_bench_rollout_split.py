"""bench/rollout_split.py runs end to end on a small count through a real nginx (skipped
where no nginx is installed: `stb lab up` installs it) and reports what it measured."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bridge.paths import project_root
from bridge.routing.nginxctl import find_nginx


def test_the_split_bench_reports_every_share_within_bounds() -> None:
    if not os.access(find_nginx(), os.X_OK):
        pytest.skip(f"nginx is not installed ({find_nginx()} missing; stb lab up installs it)")
    done = subprocess.run(
        [sys.executable, str(project_root() / "bench" / "rollout_split.py"),
         "--requests", "400", "--shares", "10,50"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), done.stdout
    figures = dict(kv.split("=", 1) for kv in last.split()[1:])
    for share in ("10", "50"):
        assert figures[f"failed_{share}"] == "0"
        # 5 sigma: a correct split lands outside about once in 1.7 million runs
        assert abs(float(figures[f"z_{share}"])) <= 5, figures
    assert figures["failed_plain"] == "0" and float(figures["ratio_split_plain"]) > 0
