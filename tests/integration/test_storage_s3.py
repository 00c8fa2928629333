"""ObjectStore and the changelog client on a real S3 protocol (moto; MinIO with Docker),
and the classification and retrying of storage errors."""

from __future__ import annotations

import errno
import uuid
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from fsspec.implementations.memory import MemoryFileSystem
from s3fs.errors import translate_boto_error

from dstltree.cli.commands.inspect import inspect_base
from dstltree.client import ChangelogClient, ObjectStore, RetryableStorageError, StorageError
from dstltree.client.errors import CorruptObjectError
from dstltree.client.handle import SegmentRef
from dstltree.client.objectformat import build_object
from dstltree.client.reader import read_exact, read_index
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator.cleanup import list_data_files, scan_orphans
from dstltree.storage.store import NO_RETRY, RetryPolicy, classify, translate
from tests.support.s3_server import S3Target

pytestmark = pytest.mark.timeout(60)


def _object(n: int = 2) -> tuple[list[Any], list[Any]]:
    data = [bytes([65 + i]) * (100 + i) for i in range(n)]
    metas = [SegmentMeta(f"log-{i}", i, i + 1, (i,), len(d), 1234 + i) for i, d in enumerate(data)]
    parts, offsets = build_object(list(zip(metas, data, strict=True)))
    return parts, [SegmentRef(m, "", o) for m, o in zip(metas, offsets, strict=True)]


# -- ObjectStore on S3 -------------------------------------------------------------------
@pytest.mark.s3
def test_object_store_round_trip(s3_any: S3Target) -> None:
    store = ObjectStore(f"{s3_any.base_url}/job-1", s3_any.storage_options)
    assert store.base_url == f"{s3_any.base_url}/job-1"
    assert store.list_objects() == []
    parts, entries = _object(3)
    urls = [store.new_object_path() for _ in range(2)]
    for u in urls:
        assert u.startswith(f"{s3_any.base_url}/job-1/changelog/")
        size = store.put(u, parts)
        assert size == sum(len(p) for p in parts)
        assert store.size(u) == size and store.exists(u)
    assert store.list_objects() == sorted(urls)
    whole = store.read(urls[0])
    assert whole == b"".join(bytes(p) for p in parts)
    e = entries[1]
    assert store.read_range(urls[0], e.offset, e.length) == bytes(parts[1])
    # opaque payloads, not segments: the index alone, without the cross-check
    indexed = read_index(store, urls[1], verify=False)
    assert indexed == [replace(e, path=urls[1]) for e in entries]
    assert store.read_range(urls[0], len(whole) - 4, 10) == whole[-4:], "a short read"
    with pytest.raises(CorruptObjectError, match="truncated") as info:
        read_exact(store, urls[0], len(whole) - 4, 10)
    assert info.value.offset == len(whole)
    # S3 DELETE is idempotent: a missing object raises nothing (and may be listed).
    assert urls[0] in store.delete([urls[0], store.new_object_path()])
    assert store.list_objects() == [urls[1]]
    assert not store.exists(urls[0])


@pytest.mark.s3
def test_missing_object_is_not_retried(s3: S3Target) -> None:
    store = ObjectStore(s3.base_url, s3.storage_options)
    missing = store.new_object_path()
    with pytest.raises(StorageError) as info:
        store.read(missing)
    assert not isinstance(info.value, RetryableStorageError)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert store.stats.snapshot()["retries"] == {}


@pytest.mark.s3
def test_bucket_state_is_reset_between_tests(s3: S3Target) -> None:
    store = ObjectStore(s3.base_url, s3.storage_options)
    assert store.list_files(s3.base_url) == []
    store.put(store.join("marker"), b"x")


@pytest.mark.s3
def test_bucket_state_is_reset_between_tests_again(s3: S3Target) -> None:
    test_bucket_state_is_reset_between_tests(s3)


@pytest.mark.s3
def test_client_on_s3(s3: S3Target) -> None:
    base = f"{s3.base_url}/prefix"
    with ChangelogClient.open(base, storage_options=s3.storage_options) as client:
        w = client.create_writer("op-1/task-0", range(0, 8))
        after = w.next_sqn()
        for i in range(20):
            w.append(i % 8, f"change-{i}".encode())
        h1 = w.persist_durably(after).result(timeout=30)
        w.append(3, b"late")
        h2 = w.persist_durably(after).result(timeout=30)
        assert h2.segments[0] == h1.segments[0], "the first upload is reused"
        assert all(s.path.startswith(f"{base}/changelog/") for s in h2.segments)
        assert list(client.read_changes(h2, 3)) == [b"change-3", b"change-11", b"change-19"] + [
            b"late"
        ]
        assert [c for _, kg, c in client.iter_changes(h1) if kg == 0] == [
            b"change-0",
            b"change-8",
            b"change-16",
        ]
        assert sorted(client.store.list_objects()) == sorted({s.path for s in h2.segments})


@pytest.mark.s3
def test_an_empty_object_file_is_a_reservation_not_an_object(s3: S3Target) -> None:
    """On S3 as on a local disk, an empty ``*.dstl`` (a name created ahead and never
    written, e.g. left by a killed process) is a reservation: no object to listings
    and ``dstl inspect``, yet a file of the job the final orphan sweep deletes."""
    store = ObjectStore(f"{s3.base_url}/job", s3.storage_options)
    parts, _ = _object()
    written, empty = store.new_object_path(), store.new_object_path()
    store.put(written, parts)
    store.put(empty, b"")
    assert store.list_objects() == [written]
    assert store.list_reservations() == [empty]
    info = inspect_base(store.base_url, s3.storage_options)
    assert info["present"] == [written] and info["reservations"] == [empty]
    assert scan_orphans(store, [written]).orphans == (empty,)
    assert list_data_files(store) == [written]
    store.delete(scan_orphans(store, [written]).orphans)
    assert store.list_reservations() == [] and store.list_objects() == [written]


# -- error classification ------------------------------------------------------------------
def _client_error(code: str, status: int, op: str = "PutObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} message"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


@pytest.mark.parametrize(
    ("code", "status", "retryable"),
    [
        ("SlowDown", 503, True),
        ("ServiceUnavailable", 503, True),
        ("InternalError", 500, True),
        ("RequestTimeout", 400, True),
        ("503", 503, True),
        ("SomethingNew", 502, True),
        ("AccessDenied", 403, False),
        ("NoSuchKey", 404, False),
        ("NoSuchBucket", 404, False),
        ("InvalidArgument", 400, False),
    ],
)
def test_s3fs_errors_are_classified_by_code(code: str, status: int, retryable: bool) -> None:
    boto = _client_error(code, status)
    # s3fs raises an OSError subclass with the botocore error chained as the cause.
    raised = translate_boto_error(boto)
    assert raised.__cause__ is boto
    err = translate("put", "s3://b/k", raised)
    assert isinstance(err, RetryableStorageError) is retryable
    assert err.retryable is retryable
    assert classify(raised)[0] is retryable


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (TimeoutError("timed out"), True),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (OSError(errno.EBUSY, "Please reduce your request rate."), True),
        (ReadTimeoutError(endpoint_url="http://x"), True),
        (EndpointConnectionError(endpoint_url="http://x"), True),
        (ConnectionClosedError(endpoint_url="http://x"), True),
        (FileNotFoundError(errno.ENOENT, "gone"), False),
        (PermissionError(errno.EACCES, "denied"), False),
        (NoCredentialsError(), False),
        (ValueError("bad offset 5003"), False),
        (RuntimeError("upstream said: 503 Slow Down"), True),
    ],
)
def test_transport_errors_are_classified(exc: BaseException, retryable: bool) -> None:
    assert isinstance(translate("read", "s3://b/k", exc), RetryableStorageError) is retryable


def test_cause_chain_is_searched() -> None:
    inner = _client_error("SlowDown", 503)
    try:
        try:
            raise inner
        except ClientError as e:
            raise OSError("wrapped without errno") from e
    except OSError as outer:
        err = translate("put", "s3://b/k", outer)
    assert isinstance(err, RetryableStorageError)
    assert "[SlowDown]" in str(err)


# -- retries on the store --------------------------------------------------------------------
class _FlakyMemory(MemoryFileSystem):
    """An in-memory fs whose next ``failures`` writes raise ``error()``."""

    cachable = False

    def __init__(self, failures: int, error: Any) -> None:
        super().__init__()
        self.store: dict[str, Any] = {}  # private to this instance
        self.pseudo_dirs = [""]
        self.failures = failures
        self.error = error
        self.calls = 0

    def pipe_file(self, path: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error()
        super().pipe_file(path, value, *args, **kwargs)


def _slowdown() -> BaseException:
    return translate_boto_error(_client_error("SlowDown", 503))


def _fast(attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, initial_backoff=0.001, max_backoff=0.01)


def _store(fs: _FlakyMemory, retry: RetryPolicy) -> ObjectStore:
    return ObjectStore(f"memory://retry-{uuid.uuid4().hex[:8]}", fs=fs, retry=retry)


def test_throttling_is_retried_until_success() -> None:
    fs = _FlakyMemory(2, _slowdown)
    store = _store(fs, _fast(3))
    url = store.new_object_path()
    seen: list[BaseException] = []
    assert store.put(url, [b"abc", b"def"], on_retry=seen.append) == 6
    assert fs.calls == 3
    assert store.read(url) == b"abcdef"
    assert store.stats.snapshot()["retries"] == {"put": 2}
    assert len(seen) == 2 and all(isinstance(e, RetryableStorageError) for e in seen)


def test_retries_stop_after_max_attempts_with_cause_chained() -> None:
    fs = _FlakyMemory(10, _slowdown)
    store = _store(fs, _fast(3))
    with pytest.raises(RetryableStorageError) as info:
        store.put(store.new_object_path(), b"x")
    assert fs.calls == 3
    assert isinstance(info.value.__cause__, OSError)
    assert isinstance(info.value.__cause__.__cause__, ClientError)
    assert store.stats.snapshot() == {"retries": {"put": 2}, "failures": {"put": 1}}


def test_non_retryable_error_fails_at_once() -> None:
    fs = _FlakyMemory(1, lambda: translate_boto_error(_client_error("AccessDenied", 403)))
    store = _store(fs, _fast(5))
    with pytest.raises(StorageError) as info:
        store.put(store.new_object_path(), b"x")
    assert not isinstance(info.value, RetryableStorageError)
    assert isinstance(info.value.__cause__, PermissionError)
    assert fs.calls == 1


def test_no_retry_policy() -> None:
    fs = _FlakyMemory(1, _slowdown)
    store = _store(fs, NO_RETRY)
    with pytest.raises(RetryableStorageError):
        store.put(store.new_object_path(), b"x")
    assert fs.calls == 1


def test_retry_policy_validation() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(initial_backoff=-1)


@pytest.mark.s3
def test_shared_node_objects_on_s3_are_deleted_only_when_all_the_jobs(s3: S3Target) -> None:
    """A job's release of objects a shared node wrote elsewhere in the bucket: the
    index is read with two range reads; an object with another job's segment stays."""
    from dstltree.coordinator.events import DeleteObjects, ObjectsDeleted
    from dstltree.coordinator.storage_worker import StorageWorker
    from dstltree.coordinator.store import CheckpointStore

    job = ObjectStore(f"{s3.base_url}/job", s3.storage_options)
    shared = ObjectStore(f"{s3.base_url}/nodes", s3.storage_options)
    urls = []
    for logs in (["job-t0-a0"], ["job-t0-a0", "other-t0-a0"]):
        data = [bytes([65 + i]) * 100 for i in range(len(logs))]
        metas = [SegmentMeta(g, 0, 1, (0,), 100, 0) for g in logs]
        parts, _ = build_object(list(zip(metas, data, strict=True)))
        urls.append(shared.new_object_path())
        shared.put(urls[-1], parts)
    worker = StorageWorker(job, CheckpointStore(job), extra_prefixes=[shared.join("changelog")])
    try:
        event = worker.call(DeleteObjects(tuple(urls), frozenset({"job-t0-a0"})))
        assert isinstance(event, ObjectsDeleted) and event.deleted == 1
        assert not shared.exists(urls[0]) and shared.exists(urls[1])
        assert worker.counters.snapshot()["shared_objects_kept"] == 1
    finally:
        worker.shutdown()
