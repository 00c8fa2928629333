"""``HedgedUploader.start`` (storage/hedging.py): the first attempt of an upload runs on
the calling thread, the outcome goes to a callback from whichever thread decides it
(the caller's, a hedge's, the watchdog's at the deadline), a loser of the caller's
attempt is deleted off the caller's thread, and the one watchdog per uploader is
woken only for an earlier time than the one it sleeps until."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.events import ObjectFailed
from dstltree.aggregator.node import Node
from dstltree.aggregator.object_writer import ObjectWriter
from dstltree.storage.errors import RetryableStorageError, StorageError
from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.hedging import (
    HedgedUploader,
    Outcome,
    UploadPolicy,
    UploadResult,
    _Upload,
    _Watchdog,
)
from dstltree.storage.store import ObjectStore, RetryPolicy
from tests.support.items import persist_item
from tests.support.memory_fs import faulty_memory, memory_store
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    with faulty_memory() as fs:
        yield fs


def _store(fs: FaultyFileSystem) -> ObjectStore:
    return memory_store(fs, RetryPolicy(1), "s")


class _Outcomes:
    """Collects the outcomes handed to ``on_done`` and the threads that handed them."""

    def __init__(self) -> None:
        self.items: list[Outcome] = []
        self.threads: list[str] = []

    def __call__(self, outcome: Outcome) -> None:
        self.items.append(outcome)
        self.threads.append(threading.current_thread().name)


def _in_thread(fn: Any) -> threading.Thread:
    t = threading.Thread(target=fn, name="caller", daemon=True)
    t.start()
    return t


def test_the_first_attempt_runs_on_the_calling_thread(tmp_path: Any) -> None:
    store = ObjectStore(str(tmp_path))
    up = HedgedUploader(store)
    putters: list[str] = []
    real = store.put

    def put(url: str, parts: Any, **kw: Any) -> int:
        putters.append(threading.current_thread().name)
        return real(url, parts, **kw)

    store.put = put  # type: ignore[method-assign]
    got = _Outcomes()
    for i in range(5):
        up.start([b"part-", str(i).encode()], got)
    assert putters == [threading.current_thread().name] * 5
    assert got.threads == [threading.current_thread().name] * 5
    results = [o for o in got.items if isinstance(o, UploadResult)]
    assert [store.read(r.path) for r in results] == [b"part-%d" % i for i in range(5)]
    assert up._threads.threads_started() == 0, "no attempt thread without a hedge"
    stats = up.stats.snapshot()
    assert (stats["uploads"], stats["attempts"], stats["hedged_attempts"]) == (5, 5, 0)
    assert up.drain(5)


def test_a_hedge_decides_while_the_callers_attempt_hangs(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.05))
    faulty.inject("put", "stall")  # the caller's attempt hangs
    got = _Outcomes()
    caller = _in_thread(lambda: up.start(b"hedged", got))
    wait_until(lambda: len(got.items) == 1)
    result = got.items[0]
    assert isinstance(result, UploadResult) and result.winner == 1
    assert got.threads[0] != "caller" and caller.is_alive(), "decided before the caller ends"
    assert store.read(result.path) == b"hedged"
    faulty.release()
    caller.join(10)
    assert not caller.is_alive() and up.drain(10)
    assert len(got.items) == 1, "told once"
    assert store.list_objects() == [result.path], "the caller's late object was deleted"
    stats = up.stats.snapshot()
    assert stats["hedge_wins"] == 1 and stats["losers"] == 1 and stats["losers_deleted"] == 1


def test_the_caller_does_not_delete_its_losing_object(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.05))
    deleters: list[str] = []
    real = store.delete

    def delete(urls: Any) -> list[str]:
        deleters.append(threading.current_thread().name)
        return real(urls)

    store.delete = delete  # type: ignore[method-assign]
    faulty.inject("put", "stall")
    got = _Outcomes()
    caller = _in_thread(lambda: up.start(b"x", got))
    wait_until(lambda: len(got.items) == 1)
    faulty.release()
    caller.join(10)
    assert up.drain(10)
    assert len(deleters) == 1 and deleters[0] != "caller"


def test_the_watchdog_fails_an_upload_at_its_deadline(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=1, deadline=0.2))
    faulty.inject("put", "stall")
    got = _Outcomes()
    caller = _in_thread(lambda: up.start(b"late", got))
    wait_until(lambda: len(got.items) == 1)
    err = got.items[0]
    assert isinstance(err, RetryableStorageError) and "deadline" in str(err)
    assert got.threads[0] == "dstl-hedge-watchdog" and caller.is_alive()
    faulty.release()
    caller.join(10)
    assert up.drain(10) and store.list_objects() == [], "the late object is a loser"
    stats = up.stats.snapshot()
    assert stats["deadline_failures"] == 1 and stats["losers_deleted"] == 1


def test_a_failed_attempt_is_reported_and_deleted(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=30))
    faulty.inject("put", "error500")
    got = _Outcomes()
    up.start(b"x", got)
    assert len(got.items) == 1 and isinstance(got.items[0], RetryableStorageError)
    assert up.drain(10)
    stats = up.stats.snapshot()
    assert stats["failed_attempts"] == 1 and stats["uploads_failed"] == 1


def test_unhedged_uploads_without_deadline_report_too(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=1, deadline=None))
    got = _Outcomes()
    up.start(b"ok", got)
    faulty.inject("put", "error500")
    up.start(b"bad", got)
    ok, bad = got.items
    assert isinstance(ok, UploadResult) and store.read(ok.path) == b"ok"
    assert isinstance(bad, StorageError)
    assert up.stats.snapshot()["uploads_failed"] == 1


def test_a_raising_callback_is_logged_not_raised(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    up = HedgedUploader(ObjectStore(str(tmp_path)))
    calls: list[Outcome] = []

    def on_done(outcome: Outcome) -> None:
        calls.append(outcome)
        raise RuntimeError("callback bug")

    up.start(b"x", on_done)
    assert len(calls) == 1 and "upload callback failed" in caplog.text
    assert up.drain(5)


def test_copies_start_with_the_callers_attempt(tmp_path: Any) -> None:
    store = ObjectStore(str(tmp_path))
    up = HedgedUploader(store, UploadPolicy(attempts=2, copies=2, upload_timeout=30))
    got = _Outcomes()
    up.start(b"twice", got)
    wait_until(lambda: len(got.items) == 1)
    assert up.drain(10)
    stats = up.stats.snapshot()
    assert stats["copies"] == 1 and stats["attempts"] == 2 and stats["uploads"] == 1
    assert stats["losers"] == 1 and len(store.list_objects()) == 1


def _open_upload() -> _Upload:
    return _Upload([b"x"], lambda: "unused", time.monotonic(), None, None)


def test_the_watchdog_is_woken_only_for_an_earlier_time() -> None:
    looked: list[_Upload] = []
    wd = _Watchdog("t-watchdog", lambda up, now: looked.append(up), idle_s=0.1)
    notified = [0]
    real_notify = wd._cond.notify

    def notify(n: int = 1) -> None:
        notified[0] += 1
        real_notify(n)

    wd._cond.notify = notify  # type: ignore[method-assign]
    far, farther, soon = _open_upload(), _open_upload(), _open_upload()
    now = time.monotonic()
    wd.watch(far, now + 30)
    wait_until(lambda: wd._sleeps_until == now + 30)
    wd.watch(farther, now + 40)  # later than the time it sleeps until: no wake-up
    assert notified[0] == 0
    wd.watch(soon, now)  # earlier: woken, looks at it at once
    wait_until(lambda: looked == [soon])
    assert notified[0] == 1
    far.closed = farther.closed = True  # decided meanwhile: dropped, never looked at
    wd.watch(_closed_upload(), now)
    wait_until(lambda: not wd._running)  # nothing left to watch: the thread ends
    assert looked == [soon] and wd.threads_started == 1


def _closed_upload() -> _Upload:
    up = _open_upload()
    up.closed = True
    return up


def test_object_writer_start_hands_refs_to_the_callback(tmp_path: Any) -> None:
    store = ObjectStore(str(tmp_path))
    writer = ObjectWriter(store)
    got: list[Any] = []
    items = [persist_item("a", 0, {0: [b"a0"]}), persist_item("b", 3, {1: [b"b3"]})]
    writer.start(items, got.append)
    [(path, refs)] = got
    assert [r.path for r in refs] == [path, path] and store.list_objects() == [path]
    assert [r.meta.log_id for r in refs] == ["a", "b"]


def test_a_node_reports_a_write_that_cannot_start(tmp_path: Any) -> None:
    node = Node(NodeConfig("n", None, 1 << 20, plans=False), ObjectStore(str(tmp_path)))

    def broken(items: Any, on_done: Any) -> None:
        raise ValueError("cannot build the object")

    node.writer.start = broken  # type: ignore[method-assign]
    try:
        node._write(7, (persist_item("a", 0, {0: [b"a"]}),))
        event = node._results.get(timeout=5)
        assert isinstance(event, ObjectFailed) and event.object_id == 7
        assert "cannot build" in event.error
    finally:
        node._close()


def test_the_watchdog_survives_a_failing_look(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def look(up: _Upload, now: float) -> float | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("cannot start a thread")
        return None

    wd = _Watchdog("t-watchdog-error", look, idle_s=0.1)
    wd.watch(_open_upload(), time.monotonic())
    wait_until(lambda: len(calls) == 2)  # looked at again, not lost
    assert "looking at an upload failed" in caplog.text
    wait_until(lambda: not wd._running)


def test_callers_attempts_feed_the_adaptive_timeout(tmp_path: Any) -> None:
    policy = UploadPolicy(
        upload_timeout=5.0, adaptive_percentile=50, adaptive_floor=1.0, adaptive_min_samples=2
    )
    up = HedgedUploader(ObjectStore(str(tmp_path)), policy)
    got = _Outcomes()
    up.start(b"a", got)
    assert up.current_timeout() == 5.0, "one sample is not enough"
    up.start(b"b", got)
    assert up.current_timeout() == 1.0, "noted before start() returns"
