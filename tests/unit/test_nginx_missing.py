"""A lab nginx (`bridge.routing.nginxctl.NginxProcess`) on a machine without nginx: a
clear error naming the binary and what to install, not an OSError's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.routing.errors import NginxUnavailable
from bridge.routing.nginxctl import NginxProcess


def test_starting_without_an_nginx_binary_says_which_and_what_to_install(tmp_path: Path) -> None:
    missing = tmp_path / "bin" / "nginx"
    proc = NginxProcess(tmp_path / "prefix", nginx_bin=str(missing))
    with pytest.raises(NginxUnavailable, match="install nginx") as err:
        proc.start()
    assert str(missing) in str(err.value)
    assert proc.pid() is None  # nothing left running
