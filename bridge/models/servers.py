"""The running Triton servers as the model tools see them: Slurm's jobs tagged
`stb:triton`, each with an HTTP client holding the Triton key. Used by `stb models` and by
the daemon's model status endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bridge.config import BridgeConfig
from bridge.models.publish import Server
from bridge.slurm.model import BASELINE_TAG, TRITON_TAG
from bridge.slurm.select import open_backend
from bridge.triton.client import TritonHttpClient
from bridge.triton.ports import server_address


@contextmanager
def running_servers(cfg: BridgeConfig) -> Iterator[list[Server]]:
    """The running Triton servers Slurm knows (tag stb:triton), with clients; closed after."""
    key_file = cfg.triton.key_file
    key = key_file.read_text().strip() if key_file.exists() else None
    slurm = open_backend()
    addr = {n.name: n.addr for n in slurm.nodes()}
    servers = []
    for job in slurm.jobs(tag=TRITON_TAG, states=["RUNNING"]):
        if len(job.nodes) != 1 or job.nodes[0] not in addr:
            continue
        address = server_address(addr[job.nodes[0]], job.tags)
        client = TritonHttpClient(address, api_key=key, timeout_s=cfg.triton.ready_timeout_s)
        servers.append(Server(address, client, BASELINE_TAG in job.tags))
    try:
        yield servers
    finally:
        for s in servers:
            s.client.close()
