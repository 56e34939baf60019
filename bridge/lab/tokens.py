"""The lab's API tokens: `.lab/api/tokens` (the daemon's `[api] tokens_file`) with one
token per role, each also in `.lab/api/<role>.token` for the CLI (`stb lend --api ...
--token-file .lab/api/operator.token`) and for Prometheus (`metrics.token`). Made once by
`stb lab up`, kept afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

from bridge.http.auth import add_token

#: the lab's callers: name -> role
LAB_CALLERS = {"lab-operator": "operator", "lab-finance": "finance", "prometheus": "metrics"}


def tokens_file(api_dir: Path) -> Path:
    return api_dir / "tokens"


def token_file(api_dir: Path, role: str) -> Path:
    return api_dir / f"{role}.token"


def ensure_tokens(api_dir: Path) -> Path:
    """The tokens file, with a token per lab caller (only the missing ones are added)."""
    api_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(api_dir, 0o700)
    path = tokens_file(api_dir)
    for name, role in LAB_CALLERS.items():
        own = token_file(api_dir, role)
        if own.exists():
            continue
        token = add_token(path, name, {role})
        fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    return path
