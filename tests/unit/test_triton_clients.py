"""`bridge.daemon.clients.TritonClients`: one Triton client per address and per thread;
`forget` in one thread makes every other thread's next call get a fresh client (closed
where it lives); `close` closes them all. Mostly with a recording stand-in for
`TritonHttpClient`; one test with the real class on addresses where nothing listens
(constructing a client does not connect)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import pytest

from bridge.daemon import clients as clients_mod
from bridge.daemon.clients import TritonClients
from bridge.triton.client import TritonHttpClient

T = TypeVar("T")
A = "127.0.0.1:18000"
B = "127.0.0.1:18001"


class Recorded:
    """Stands in for TritonHttpClient: records its construction, thread and closes."""

    made: ClassVar[list[Recorded]] = []

    def __init__(self, address: str, *, api_key: str | None = None, timeout_s: float = 0) -> None:
        self.address = address
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.thread = threading.get_ident()
        self.closed_by: list[int] = []
        Recorded.made.append(self)

    def close(self) -> None:
        self.closed_by.append(threading.get_ident())


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> TritonClients:
    Recorded.made = []
    monkeypatch.setattr(clients_mod, "TritonHttpClient", Recorded)
    return TritonClients("secret", timeout_s=3.0)


def in_thread(fn: Callable[[], T]) -> T:
    """Run fn on a new thread that stays alive (its thread-local cache with it) until
    the result is back."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    if errors:
        raise errors[0]
    return out[0]


class Worker:
    """A long-lived thread that runs what it is given, one call at a time."""

    def __init__(self) -> None:
        self._jobs: list[tuple[Callable[[], Any], list[Any], threading.Event]] = []
        self._cv = threading.Condition()
        self._stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._stop:
                    self._cv.wait()
                if self._stop and not self._jobs:
                    return
                fn, out, done = self._jobs.pop(0)
            try:
                out.append(fn())
            except BaseException as exc:
                out.append(exc)
            done.set()

    def call(self, fn: Callable[[], T]) -> T:
        out: list[Any] = []
        done = threading.Event()
        with self._cv:
            self._jobs.append((fn, out, done))
            self._cv.notify()
        assert done.wait(10)
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]  # type: ignore[no-any-return]

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.thread.join(10)


@pytest.fixture
def worker() -> Any:
    w = Worker()
    yield w
    w.stop()


def test_same_thread_same_client_per_address(pool: TritonClients) -> None:
    a1, a2, b = pool(A), pool(A), pool(B)
    assert a1 is a2
    assert b is not a1
    assert [c.address for c in Recorded.made] == [A, B]
    assert (a1.api_key, a1.timeout_s) == ("secret", 3.0)  # type: ignore[attr-defined]


def test_each_thread_gets_its_own_client(pool: TritonClients, worker: Worker) -> None:
    mine = pool(A)
    theirs = worker.call(lambda: pool(A))
    assert theirs is not mine
    assert worker.call(lambda: pool(A)) is theirs  # same within that thread
    assert pool(A) is mine
    assert theirs.thread == worker.thread.ident  # type: ignore[attr-defined]
    assert mine.thread == threading.get_ident()  # type: ignore[attr-defined]


def test_forget_closes_here_and_refreshes_other_threads(
    pool: TritonClients, worker: Worker
) -> None:
    mine = pool(A)
    theirs = worker.call(lambda: pool(A))
    other_address = worker.call(lambda: pool(B))

    pool.forget(A)
    assert mine.closed_by == [threading.get_ident()]  # type: ignore[attr-defined]
    assert theirs.closed_by == []  # type: ignore[attr-defined]  # not from this thread

    fresh = worker.call(lambda: pool(A))
    assert fresh is not theirs
    assert theirs.closed_by == [worker.thread.ident]  # type: ignore[attr-defined]  # where it lives
    assert worker.call(lambda: pool(A)) is fresh
    assert worker.call(lambda: pool(B)) is other_address  # other addresses keep theirs

    again = pool(A)
    assert again is not mine and again is not fresh


def test_forget_from_another_thread(pool: TritonClients, worker: Worker) -> None:
    mine = pool(A)
    worker.call(lambda: pool.forget(A))
    replacement = pool(A)
    assert replacement is not mine
    assert mine.closed_by == [threading.get_ident()]  # type: ignore[attr-defined]


def test_forget_twice_and_forget_unknown_address(pool: TritonClients) -> None:
    pool.forget("127.0.0.1:1")
    first = pool(A)
    pool.forget(A)
    pool.forget(A)
    second = pool(A)
    assert second is not first
    assert first.closed_by == [threading.get_ident()]  # type: ignore[attr-defined]
    assert pool(A) is second


def test_close_closes_every_threads_clients(pool: TritonClients, worker: Worker) -> None:
    mine = [pool(A), pool(B)]
    theirs = [worker.call(lambda: pool(A)), worker.call(lambda: pool(B))]
    gone = in_thread(lambda: pool(A))  # a thread that has ended

    pool.close()
    for client in [*mine, *theirs, gone]:
        assert len(client.closed_by) == 1, client  # type: ignore[attr-defined]
    # after close, a call makes a new client
    assert pool(A) is not mine[0]
    assert worker.call(lambda: pool(A)) is not theirs[0]


def test_close_survives_a_client_that_fails_to_close(
    pool: TritonClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = pool(A)
    good = pool(B)

    def boom() -> None:
        raise RuntimeError("already closed")

    monkeypatch.setattr(bad, "close", boom)
    pool.close()
    assert good.closed_by == [threading.get_ident()]  # type: ignore[attr-defined]


def test_many_threads_each_get_one_client() -> None:
    pool = TritonClients(None)
    seen: dict[int, TritonHttpClient] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def run() -> None:
        barrier.wait()
        first = pool(A)
        assert pool(A) is first
        with lock:
            seen[threading.get_ident()] = first

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == 8
    assert len({id(c) for c in seen.values()}) == 8
    assert all(isinstance(c, TritonHttpClient) and c.address == A for c in seen.values())
    pool.close()


def test_real_client_per_thread_nothing_listening() -> None:
    """The real TritonHttpClient: constructing one does not connect, so this needs no
    server; forget and close go through its real close()."""
    pool = TritonClients("k", timeout_s=1.0)
    mine = pool(A)
    theirs = in_thread(lambda: pool(A))
    assert isinstance(mine, TritonHttpClient) and isinstance(theirs, TritonHttpClient)
    assert mine is not theirs and pool(A) is mine
    pool.forget(A)
    assert pool(A) is not mine
    pool.close()


def test_purge_closes_a_threads_clients_of_forgotten_servers(pool: TritonClients) -> None:
    worker = Worker()
    try:
        a, b = worker.call(lambda: pool(A)), worker.call(lambda: pool(B))
        pool.forget(A)  # on this thread: the worker's client of A is stale now
        assert a.closed_by == []
        worker.call(pool.purge)
        assert a.closed_by == [worker.thread.ident] and b.closed_by == []
        assert worker.call(lambda: pool(B)) is b  # untouched
        assert worker.call(lambda: pool(A)) is not a  # a fresh one
    finally:
        worker.stop()
