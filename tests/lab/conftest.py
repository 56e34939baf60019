"""Fixtures of the lab tests that need the bridge's parts wired together (defined in
tests/lab/fixtures.py, which tests/faults/conftest.py imports too)."""

from tests.lab.fixtures import bridge, bridge_update, daemon_config, pg_database, triton_config

__all__ = ["bridge", "bridge_update", "daemon_config", "pg_database", "triton_config"]
