"""Triton's ports on the nodes the bridge runs servers on: the one place they are written
in Python (no import beyond the standard library, so tools such as the load generator take
them without loading tritonclient). The job script (deploy/slurm/triton-server.sbatch)
starts the server on the same ports; tests/unit/test_protocol_constants.py checks that the
two agree.

A node may run more than one Triton job (leases of some of its GPUs each, `Lease.slot`):
the job of slot s listens on the three ports `PORT_STRIDE * s` above slot 0's, passed to the
job script as `STB_TRITON_PORT` and named in the job's comment as `stb:port=<HTTP port>`,
which is how the daemon finds each server's address from Slurm alone. A job whose tags
name no port (a baseline, every job before slots) is on slot 0's."""

from __future__ import annotations

from collections.abc import Iterable

HTTP_PORT = 8000
"""Triton's HTTP port of slot 0, where the bridge's servers listen."""

GRPC_PORT = 8001
"""Triton's gRPC port of slot 0."""

METRICS_PORT = 8002
"""Triton's metrics port of slot 0; the page is http://HOST:8002/metrics."""

PORT_STRIDE = 10
"""How far apart two slots' ports are: slot s serves HTTP on HTTP_PORT + 10 s."""

SLOTS = 64
"""Triton jobs one node may run at once (slots 0-63: HTTP ports 8000-8630); each holds a
GPU or a MIG slice of one, so 8 GPUs of 7 slices each fit."""

PORT_TAG_PREFIX = "stb:port="
"""The comment tag of a Triton job on another slot than 0: `stb:port=<its HTTP port>`."""


def http_port(slot: int) -> int:
    """The HTTP port of `slot` (gRPC is the next port, metrics the one after)."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"a port slot is 0..{SLOTS - 1}, got {slot}")
    return HTTP_PORT + PORT_STRIDE * slot


def port_tag(slot: int) -> str | None:
    """The comment tag naming `slot`'s port; None for slot 0 (a job without it is there)."""
    return f"{PORT_TAG_PREFIX}{http_port(slot)}" if slot else None


def port_of(tags: Iterable[str]) -> int:
    """The HTTP port a Triton job's comment tags name (HTTP_PORT when none does)."""
    for tag in tags:
        if tag.startswith(PORT_TAG_PREFIX) and tag[len(PORT_TAG_PREFIX) :].isdigit():
            return int(tag[len(PORT_TAG_PREFIX) :])
    return HTTP_PORT


def slot_of(tags: Iterable[str]) -> int:
    """The slot of the Triton job with `tags` (0 where they name no port, or one of no
    slot: a job started by hand on ports of its own)."""
    slot, off = divmod(port_of(tags) - HTTP_PORT, PORT_STRIDE)
    return slot if off == 0 and 0 <= slot < SLOTS else 0


def server_address(host: str, tags: Iterable[str]) -> str:
    """`host:port` of the HTTP endpoint of the Triton job with `tags` on `host`."""
    return f"{host}:{port_of(tags)}"


def metrics_port(http: int) -> int:
    """The metrics port of the server whose HTTP port is `http` (two above it)."""
    return http + METRICS_PORT - HTTP_PORT


def metrics_address(host: str, tags: Iterable[str]) -> str:
    """`host:port` of the metrics endpoint of the Triton job with `tags` on `host`."""
    return f"{host}:{metrics_port(port_of(tags))}"
