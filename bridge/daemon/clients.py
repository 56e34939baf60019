"""Triton clients for the daemon: one per server address *and per thread*.

tritonclient's HTTP client runs on geventhttpclient, whose connections belong to the
thread (gevent hub) that created them: used from another thread it raises `greenlet.error:
Cannot switch to a different thread`. The daemon's passes run on their own single-thread
executor, but the operator commands, tests and any other scheduler job may call from other
threads, so each thread gets its own clients (a `threading.local` cache) rather than
relying on every caller to stay on one thread. The tick's thread lives as long as the
daemon, so its connections stay warm between passes.

`forget(address)` closes the calling thread's client for a server before the bridge stops
it (an open keep-alive connection makes tritonserver wait out its whole exit timeout, 20 s
in the lab, before it exits); other threads' clients for that address are dropped and
closed by their own thread the next time it asks for that address, or calls `purge()`.
The observer forgets a server too once its job is no longer running (`Observer._let_go`):
a standby, which never cancels, would otherwise hold the lent servers' exits.
"""

from __future__ import annotations

import contextlib
import threading

from bridge.triton.client import TritonHttpClient


class TritonClients:
    def __init__(self, api_key: str | None, timeout_s: float = 10.0) -> None:
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        #: per address, bumped by `forget`: a thread's client of an older generation is stale
        self._generation: dict[str, int] = {}
        #: every thread's cache, so `close` reaches them all at shutdown
        self._caches: list[dict[str, tuple[int, TritonHttpClient]]] = []

    def _cache(self) -> dict[str, tuple[int, TritonHttpClient]]:
        cache: dict[str, tuple[int, TritonHttpClient]] | None = getattr(self._local, "cache", None)
        if cache is None:
            cache = {}
            self._local.cache = cache
            with self._lock:
                self._caches.append(cache)
        return cache

    def __call__(self, address: str) -> TritonHttpClient:
        cache = self._cache()
        generation = self._generation.get(address, 0)
        held = cache.get(address)
        if held is not None and held[0] == generation:
            return held[1]
        if held is not None:  # forgotten by another thread: close it here, where it lives
            with contextlib.suppress(Exception):
                held[1].close()
        client = TritonHttpClient(address, api_key=self._api_key, timeout_s=self._timeout_s)
        cache[address] = (generation, client)
        return client

    def forget(self, address: str) -> None:
        with self._lock:
            self._generation[address] = self._generation.get(address, 0) + 1
        held = self._cache().pop(address, None)
        if held is not None:
            held[1].close()

    def purge(self) -> None:
        """Close the calling thread's clients of forgotten servers (the observe step runs
        this on each of its pool's threads every tick, so a stopped server's keep-alive
        connections close within a tick)."""
        cache = self._cache()
        for address, (generation, client) in list(cache.items()):
            if generation != self._generation.get(address, 0):
                del cache[address]
                with contextlib.suppress(Exception):
                    client.close()

    def close(self) -> None:
        """Close every thread's clients (at shutdown, when their threads are idle)."""
        with self._lock:
            caches = list(self._caches)
        for cache in caches:
            for _generation, client in list(cache.values()):
                with contextlib.suppress(Exception):
                    client.close()
            cache.clear()
