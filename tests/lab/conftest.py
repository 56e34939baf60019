"""Fixtures of the lab tests that need the bridge's parts wired together (defined in
tests/lab/fixtures.py, which tests/faults/conftest.py imports too), and the README's demo
run once a session for the tests that read it (tests/lab/demo_run.py)."""

from tests.lab.demo_run import demo_run
from tests.lab.fixtures import (
    audit_agrees,
    bridge,
    bridge_update,
    daemon_config,
    pg_database,
    triton_config,
)

__all__ = [
    "audit_agrees",
    "bridge",
    "bridge_update",
    "daemon_config",
    "demo_run",
    "pg_database",
    "triton_config",
]
