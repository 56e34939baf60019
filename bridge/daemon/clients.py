"""One Triton client per server address, shared by the observe step and the reconciler.

`forget(address)` closes a server's client before the bridge stops that server: an open
keep-alive connection makes tritonserver wait out its whole exit timeout (20 s in the lab)
before it exits, which would hold the node that long after a return.
"""

from __future__ import annotations

from bridge.triton.client import TritonHttpClient


class TritonClients:
    def __init__(self, api_key: str | None, timeout_s: float = 10.0) -> None:
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._clients: dict[str, TritonHttpClient] = {}

    def __call__(self, address: str) -> TritonHttpClient:
        client = self._clients.get(address)
        if client is None:
            client = TritonHttpClient(address, api_key=self._api_key, timeout_s=self._timeout_s)
            self._clients[address] = client
        return client

    def forget(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for address in list(self._clients):
            self.forget(address)
