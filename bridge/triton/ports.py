"""Triton's ports on every node the bridge runs a server on: the one place they are
written in Python (no import beyond the standard library, so tools such as the load
generator take them without loading tritonclient). The job script
(deploy/slurm/triton-server.sbatch) starts the server on the same ports;
tests/unit/test_protocol_constants.py checks that the two agree."""

from __future__ import annotations

HTTP_PORT = 8000
"""Triton's HTTP port, where the bridge's servers listen."""

GRPC_PORT = 8001
"""Triton's gRPC port."""

METRICS_PORT = 8002
"""Triton's metrics port; the page is http://HOST:8002/metrics."""
