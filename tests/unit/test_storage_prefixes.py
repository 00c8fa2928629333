"""Changelog objects spread over hashed prefixes (storage/store.py), found again by
listings and orphan cleanup, and the throttling classifier hedging stops on."""

from __future__ import annotations

import errno
import posixpath
from collections import Counter
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from s3fs.errors import translate_boto_error

from dstltree.coordinator.cleanup import find_orphans, within_job
from dstltree.storage.errors import RetryableStorageError
from dstltree.storage.store import (
    DEFAULT_PREFIXES,
    ObjectStore,
    is_throttling,
    object_prefix,
    translate,
)


def test_object_prefix_is_even_and_fixed_width() -> None:
    assert object_prefix("x", 1) == "0"
    names = Counter(object_prefix(str(i), 16) for i in range(16_000))
    assert set(names) == {f"{i:x}" for i in range(16)}
    assert max(names.values()) < 1.1 * 1000  # even within 10 %
    assert {len(object_prefix(str(i), DEFAULT_PREFIXES)) for i in range(100)} == {2}
    assert object_prefix("abc", 300) == object_prefix("abc", 300)  # deterministic
    assert len(object_prefix("abc", 300)) == 3
    with pytest.raises(ValueError):
        object_prefix("x", 0)


@pytest.mark.parametrize("prefixes", [1, 4, DEFAULT_PREFIXES])
def test_objects_under_prefixes_are_listed_and_cleaned(tmp_path: Path, prefixes: int) -> None:
    store = ObjectStore(str(tmp_path / "job"), prefixes=prefixes)
    urls = [store.new_object_path() for _ in range(40)]
    for u in urls:
        store.put(u, b"x")
        assert posixpath.dirname(posixpath.dirname(u)) == store.changelog_root()
        assert within_job(store, u)
    used = {posixpath.basename(posixpath.dirname(u)) for u in urls}
    assert used <= {object_prefix(str(i), prefixes) for i in range(10_000)}
    assert (len(used) == 1) == (prefixes == 1)
    assert store.list_objects() == sorted(urls)
    # a store with another prefix count still lists (and cleanup still finds) them all
    other = ObjectStore(str(tmp_path / "job"), prefixes=2)
    assert other.list_objects() == sorted(urls)
    assert find_orphans(other, urls[1:]) == [urls[0]]
    with pytest.raises(ValueError):
        ObjectStore(str(tmp_path), prefixes=0)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def test_throttling_is_told_apart_from_other_transient_errors() -> None:
    slowdown = translate_boto_error(_client_error("SlowDown", 503))
    assert is_throttling(slowdown)
    assert is_throttling(translate("put", "p", slowdown))  # the cause chain is walked
    assert is_throttling(_client_error("ThrottlingException", 400))
    assert is_throttling(_client_error("TooManyRequests", 429))
    assert is_throttling(OSError(errno.EBUSY, "busy"))
    assert is_throttling(RetryableStorageError("put", "p", "Please reduce your request rate"))
    for other in (
        _client_error("InternalError", 500),
        _client_error("AccessDenied", 403),
        TimeoutError(errno.ETIMEDOUT, "timed out"),
        ConnectionResetError(errno.ECONNRESET, "reset by peer"),
    ):
        assert not is_throttling(other)
        assert not is_throttling(translate("put", "p", other))
