"""Upload attempts run on reusable threads (storage/hedging.py ``ReusableThreads``): a
thread is started only when none is idle, so back-to-back uploads reuse one; a
stalled attempt does not hold up its hedge; idle threads end; and the bytes of an
upload are prepared once for every attempt."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.hedging import HedgedUploader, ReusableThreads, UploadPolicy
from dstltree.storage.store import ObjectStore, RetryPolicy
from tests.support.memory_fs import faulty_memory, memory_store
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    with faulty_memory() as fs:
        yield fs


def _store(fs: FaultyFileSystem) -> ObjectStore:
    return memory_store(fs, RetryPolicy(1), "t")


def test_back_to_back_uploads_reuse_one_thread(tmp_path: Any) -> None:
    store = ObjectStore(str(tmp_path))
    up = HedgedUploader(store)
    before = threading.active_count()
    for i in range(20):
        result = up.upload([b"part-", str(i).encode()])
        assert store.read(result.path) == b"part-" + str(i).encode()
    assert up._threads.threads_started() == 1
    assert up._watchdog.threads_started == 1, "one watchdog per uploader"
    assert threading.active_count() <= before + 2
    assert up.stats.snapshot()["attempts"] == 20 and up.drain(5)


def test_a_stalled_attempt_keeps_its_thread_and_the_hedge_gets_another(
    faulty: FaultyFileSystem,
) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.05))
    faulty.inject("put", "stall")
    result = up.upload(b"x")
    assert result.winner == 1 and up._threads.threads_started() == 2
    # the next upload takes the idle thread of the hedge while the first still hangs
    second = up.upload(b"y")
    assert second.winner == 0 and up._threads.threads_started() == 2
    faulty.release()
    assert up.drain(10)
    assert store.list_objects() == sorted([result.path, second.path])
    assert up.stats.snapshot()["losers_deleted"] == 1


def test_idle_threads_end_and_new_ones_start_when_needed() -> None:
    pool = ReusableThreads("t-idle", idle_s=0.05)
    done: list[int] = []
    pool.submit(lambda: done.append(1))
    wait_until(lambda: done == [1])
    wait_until(lambda: not any(t.name == "t-idle-1" for t in threading.enumerate()))
    pool.submit(lambda: done.append(2))
    wait_until(lambda: done == [1, 2])
    assert pool.threads_started() == 2


def test_many_tasks_at_once_each_get_a_thread() -> None:
    pool = ReusableThreads("t-many", idle_s=5)
    gate = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def task(i: int) -> None:
        with lock:
            started.append(i)
        gate.wait(10)

    for i in range(5):
        pool.submit(lambda i=i: task(i))
    wait_until(lambda: len(started) == 5)  # none waits for another
    gate.set()
    assert pool.threads_started() == 5
    wait_until(lambda: len(pool._idle) == 5)
    for i in range(5, 10):
        pool.submit(lambda i=i: task(i))
    wait_until(lambda: len(started) == 10)
    assert pool.threads_started() == 5, "idle threads are reused"


def test_attempts_share_the_prepared_bytes(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    seen: list[Any] = []
    real = store.put

    def put(url: str, parts: Any, **kw: Any) -> int:
        seen.append(parts)
        return real(url, parts, **kw)

    store.put = put  # type: ignore[method-assign]
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.05))
    faulty.inject("put", "stall")
    result = up.upload([b"one ", bytearray(b"two")])
    assert store.read(result.path) == b"one two"
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0] == [b"one two"]
