"""Request hedging on the upload path (storage/hedging.py): a stalled attempt loses to a
hedge under a new name, the loser is never referenced and is deleted, statistics are
counted per uploader, and every owner (the in-process uploader, a node's object
writer) has its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dstltree.client.batching import PersistItem
from dstltree.client.direct import DirectUploader, write_items
from dstltree.client.handle import ChangelogHandle
from dstltree.client.reader import read_changes
from dstltree.storage.errors import RetryableStorageError, StorageError
from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.hedging import HedgedUploader, UploadPolicy
from dstltree.storage.store import ObjectStore, RetryPolicy
from tests.support.items import persist_item as _item
from tests.support.memory_fs import faulty_memory, memory_store
from tests.support.s3_server import S3Target

pytestmark = pytest.mark.timeout(60)

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.01)
# Two attempts: the hedge is the only one that can win, however slow the machine.
HEDGE_FAST = UploadPolicy(attempts=2, upload_timeout=0.05)


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    """A fault-injecting in-memory fs; stalls are long (60 s) unless released, and
    every pending wait is released at teardown."""
    with faulty_memory("local,scale=0.1,stall_s=600,seed=11") as fs:
        yield fs


def _store(fs: FaultyFileSystem) -> ObjectStore:
    return memory_store(fs, FAST_RETRY, "h")


def test_stalled_attempt_loses_to_a_hedge(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, HEDGE_FAST)
    faulty.inject("put", "stall")  # the first attempt hangs
    paths: list[str] = []

    def new_path() -> str:
        paths.append(store.new_object_path())
        return paths[-1]

    result = up.upload([b"hello ", b"world"], new_path)
    assert result.winner == 1 and result.attempts_started == 2
    assert result.path == paths[1] != paths[0], "the hedge writes under a new name"
    assert store.read(result.path) == b"hello world"
    assert store.list_objects() == [result.path], "the stalled attempt has not landed"
    # Let the stalled attempt finish: it lands late, loses, and is deleted.
    faulty.release()
    assert up.drain(10)
    assert store.list_objects() == [result.path]
    stats = up.stats.snapshot()
    assert stats["uploads"] == 1 and stats["attempts"] == 2
    assert stats["hedged_attempts"] == 1 and stats["hedge_wins"] == 1
    assert stats["losers"] == 1 and stats["losers_deleted"] == 1
    assert stats["uploads_failed"] == 0


def test_losers_can_be_left_for_cleanup(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.05, delete_losers=False))
    faulty.inject("put", "stall")
    result = up.upload(b"x")
    faulty.release()
    assert up.drain(10)
    objects = store.list_objects()
    assert len(objects) == 2 and result.path in objects, "the loser is an orphan"
    assert up.stats.snapshot()["losers_deleted"] == 0


def test_write_items_references_only_the_winner(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    faulty.inject("put", "stall")
    items = [
        _item("log-a", 0, {1: [b"a1", b"a2"]}),
        _item("log-b", 5, {2: [b"b1"]}),
    ]
    up = HedgedUploader(store, HEDGE_FAST)
    path, refs = write_items(up, items)
    assert [r.path for r in refs] == [path, path]
    assert store.list_objects() == [path]
    handle = ChangelogHandle("log-a", (0, 1), (refs[0],))
    assert list(read_changes(store, handle, 1)) == [b"a1", b"a2"]
    handle_b = ChangelogHandle("log-b", (5, 6), (refs[1],))
    assert list(read_changes(store, handle_b, 2)) == [b"b1"]
    faulty.release()
    assert up.drain(10)
    assert store.list_objects() == [path]
    # the stall hits whichever attempt reaches the store first: on a loaded machine the
    # hedge can overtake the first attempt's thread, so which one won is not asserted
    stats = up.stats.snapshot()
    assert stats["attempts"] == 2 and stats["hedged_attempts"] == 1
    assert stats["losers"] == 1 and stats["losers_deleted"] == 1


def test_write_items_defaults_still_work(tmp_path: object) -> None:
    store = ObjectStore(str(tmp_path))
    up = HedgedUploader(store)
    assert up.policy == UploadPolicy()
    path, refs = write_items(up, [_item("w", 0, {0: [b"z"]})])
    assert store.list_objects() == [path] and refs[0].path == path
    stats = up.stats.snapshot()
    assert stats["uploads"] == 1 and stats["attempts"] == 1 and stats["hedged_attempts"] == 0


def test_write_items_skips_marker_items(tmp_path: object) -> None:
    store = ObjectStore(str(tmp_path))
    marker = PersistItem.marker("m", 3, checkpoint_id=0)
    path, refs = write_items(HedgedUploader(store), [marker, _item("w", 0, {0: [b"z"]})])
    assert [(r.sqn_from, r.sqn_to, r.path) for r in refs] == [(0, 1, path)]


def test_direct_uploaders_own_their_hedged_uploader(tmp_path: object) -> None:
    """No registry: two in-process uploaders on one store and one policy count only
    their own uploads; an owner may share one it created."""
    store = ObjectStore(str(tmp_path))
    a, b = DirectUploader(store), DirectUploader(store)
    shared = HedgedUploader(store, HEDGE_FAST)
    c, d = (DirectUploader(store, hedged=shared) for _ in range(2))
    try:
        assert a.hedged is not b.hedged and c.hedged is d.hedged is shared
        for up, n in ((a, 2), (c, 1), (d, 1)):
            for sqn in range(n):
                assert up.submit(_item("w", sqn, {0: [b"x"]})).result(10) is not None
        assert a.hedged.stats.snapshot()["uploads"] == 2
        assert b.hedged.stats.snapshot()["uploads"] == 0
        assert shared.stats.snapshot()["uploads"] == 2
    finally:
        for up in (a, b, c, d):
            up.close()


def test_retries_inside_an_attempt_are_counted(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(upload_timeout=30))
    faulty.inject("put", "throttle")
    result = up.upload(b"data")
    assert result.winner == 0 and store.read(result.path) == b"data"
    stats = up.stats.snapshot()
    assert stats["retries"] == 1 and stats["attempts"] == 1 and stats["failed_attempts"] == 0


def test_non_retryable_error_fails_the_upload_at_once(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, HEDGE_FAST)
    faulty.inject("put", "stall")
    calls = [0]

    def new_path() -> str:
        calls[0] += 1
        if calls[0] == 2:  # the hedge targets a path the store refuses (not retryable)
            return "memory:///elsewhere/../../x"
        return store.new_object_path()

    original = store.put

    def put(url: str, parts: object, **kw: object) -> int:
        if "elsewhere" in url:
            raise StorageError("put", url, "AccessDenied")
        return original(url, parts, **kw)  # type: ignore[arg-type]

    store.put = put  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="AccessDenied") as info:
        up.upload(b"x", new_path)
    assert not isinstance(info.value, RetryableStorageError)
    faulty.release()
    assert up.drain(10)
    assert store.list_objects() == [], "the late first attempt is a loser and deleted"
    assert up.stats.snapshot()["uploads_failed"] == 1


def test_upload_fails_when_every_attempt_fails(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=30))
    faulty.inject("put", "error500", times=3)  # all three tries of the only attempt
    with pytest.raises(RetryableStorageError, match="InternalError") as info:
        up.upload(b"x")
    assert isinstance(info.value.__cause__, OSError)
    stats = up.stats.snapshot()
    assert stats["failed_attempts"] == 1 and stats["uploads_failed"] == 1
    assert stats["retries"] == 2


def test_deadline_gives_up_and_late_attempts_are_deleted(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.05, deadline=0.3))
    faulty.inject("put", "stall", times=2)
    with pytest.raises(RetryableStorageError, match="no attempt finished"):
        up.upload(b"x")
    assert up.stats.snapshot()["attempts"] == 2
    faulty.release()
    assert up.drain(10)
    assert store.list_objects() == []
    assert up.stats.snapshot()["losers_deleted"] == 2


def test_max_parallel_hedges_zero_waits_for_the_first(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    slow = FaultyFileSystem(faulty.fs, "none,stall_s=0.3")
    store = _store(slow)
    up = HedgedUploader(store, UploadPolicy(upload_timeout=0.02, max_parallel_hedges=0))
    slow.inject("put", "stall")
    result = up.upload(b"x")
    assert result.winner == 0 and result.attempts_started == 1
    assert up.stats.snapshot()["hedged_attempts"] == 0


def test_adaptive_timeout(faulty: FaultyFileSystem) -> None:
    store = _store(FaultyFileSystem(faulty.fs, "none"))
    policy = UploadPolicy(
        upload_timeout=5.0, adaptive_percentile=99, adaptive_floor=1.0, adaptive_min_samples=5
    )
    up = HedgedUploader(store, policy)
    assert up.current_timeout() == 5.0, "fixed until enough samples"
    for _ in range(5):
        up.upload(b"x")
    assert up.current_timeout() == 1.0, "fast uploads: the floor"
    assert HedgedUploader(store, UploadPolicy(upload_timeout=2)).current_timeout() == 2


def test_policy_validation() -> None:
    for bad in (
        {"attempts": 0},
        {"upload_timeout": 0},
        {"adaptive_percentile": 0},
        {"adaptive_percentile": 101},
        {"max_parallel_hedges": -1},
        {"deadline": 0},
    ):
        with pytest.raises(ValueError):
            UploadPolicy(**bad)  # type: ignore[arg-type]


@pytest.mark.s3
def test_hedging_on_s3(s3: S3Target) -> None:
    import s3fs

    fs = FaultyFileSystem(s3fs.S3FileSystem(**s3.storage_options), "none,stall_s=600")
    try:
        store = ObjectStore(f"{s3.base_url}/hedge", fs=fs, retry=FAST_RETRY)
        up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.1))
        fs.inject("put", "stall")
        result = up.upload(b"s3 bytes")
        assert result.winner == 1
        plain = ObjectStore(s3.base_url, s3.storage_options)
        assert plain.read(result.path) == b"s3 bytes"
        fs.release()
        assert up.drain(20)
        assert plain.list_files(f"{s3.base_url}/hedge") == [result.path]
    finally:
        fs.release()


def test_a_throttled_upload_is_not_hedged(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    up = HedgedUploader(store, UploadPolicy(attempts=2, upload_timeout=0.3, deadline=1.0))
    faulty.inject("put", "throttle")  # 503 SlowDown, then the retry hangs
    faulty.inject("put", "stall")
    with pytest.raises(RetryableStorageError, match="deadline"):
        up.upload(b"data")
    stats = up.stats.snapshot()
    assert stats["throttled"] == 1 and stats["hedges_skipped_throttled"] == 1
    assert stats["attempts"] == 1 and stats["hedged_attempts"] == 0
    faulty.release()
    assert up.drain(10)


def test_a_throttled_upload_was_hedged_by_the_old_rule(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    blind = UploadPolicy(attempts=2, upload_timeout=0.05, throttle_aware=False)
    up = HedgedUploader(store, blind)
    faulty.inject("put", "throttle")
    faulty.inject("put", "stall")
    assert up.upload(b"data").winner == 1
    stats = up.stats.snapshot()
    assert stats["throttled"] == 1 and stats["hedges_skipped_throttled"] == 0
    faulty.release()
    assert up.drain(10)


def test_hedges_wait_for_the_quiet_period_after_throttling(faulty: FaultyFileSystem) -> None:
    store = _store(faulty)
    policy = UploadPolicy(attempts=2, upload_timeout=0.05, throttle_quiet=1.0, copies=2)
    up = HedgedUploader(store, policy)
    faulty.inject("put", "throttle")  # upload A: throttled once, then written
    faulty.inject("put", None)  # A's copy (started with it, before the 503)
    assert up.upload(b"a").winner in (0, 1)
    assert up.drain(10)  # the throttled copy has had its 503 and its retry
    before = up.stats.snapshot()
    faulty.inject("put", "stall")  # upload B: its first attempt hangs
    result = up.upload(b"b")  # no copy, and the hedge only after the quiet period
    assert result.winner == 1 and store.read(result.path) == b"b"
    stats = up.stats.snapshot()
    assert before["throttled"] == 1 and before["copies"] == 1
    assert stats["copies"] == 1, "B started no copy while throttled recently"
    assert stats["hedges_skipped_throttled"] - before["hedges_skipped_throttled"] == 2
    assert stats["hedged_attempts"] - before["hedged_attempts"] == 1
    faulty.release()
    assert up.drain(10)


def test_the_timeout_grows_with_the_size() -> None:
    store = ObjectStore("memory://size-timeout")
    up = HedgedUploader(store, UploadPolicy(upload_timeout=1.0, bandwidth=1e6))
    assert up.current_timeout() == 1.0
    assert up.current_timeout(3_000_000) == pytest.approx(4.0)
    assert UploadPolicy().hedging().bandwidth == UploadPolicy().bandwidth
    with pytest.raises(ValueError):
        UploadPolicy(copies=0)
