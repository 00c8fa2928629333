"""The local write path of ObjectStore.put: parts written without joining them
(``os.writev``, partial writes resumed), directories created once per store (no stat or
mkdir per object, a vanished directory made again), retries through one tenacity object
per store, and parts joined once for stores that write one bytes object."""

from __future__ import annotations

import array
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.storage import store as store_module
from dstltree.storage.errors import RetryableStorageError
from dstltree.storage.store import ObjectStore, RetryPolicy, _write_all
from tests.support.fsyncs import record_fsyncs

FAST = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002)


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=300), max_size=40),
    cap=st.integers(min_value=1, max_value=700),
    iov_max=st.integers(min_value=1, max_value=8),
)
def test_write_all_resumes_partial_writes(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], cap: int, iov_max: int
) -> None:
    """Whatever the OS accepts per call (at most ``cap`` bytes, ``iov_max`` buffers),
    the file holds the chunks back to back."""
    real = os.writev

    def short_writev(fd: int, buffers: list[Any]) -> int:
        assert 0 < len(buffers) <= iov_max
        flat = b"".join(bytes(b) for b in buffers)[:cap]
        return real(fd, [flat])

    path = tmp_path_factory.mktemp("w") / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    old_iov = store_module._IOV_MAX
    try:
        store_module._IOV_MAX = iov_max
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "writev", short_writev)
            assert _write_all(fd, chunks) == sum(map(len, chunks))
    finally:
        store_module._IOV_MAX = old_iov
        os.close(fd)
    assert path.read_bytes() == b"".join(chunks)


def test_write_all_refuses_a_write_of_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "writev", lambda fd, bufs: 0)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="wrote nothing"):
            _write_all(fd, [b"x"])
    finally:
        os.close(fd)


def test_put_writes_many_mixed_parts_without_joining(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    words = array.array("I", [1, 2, 3])  # a buffer whose items are not bytes
    parts: list[Any] = [b"a" * 10, bytearray(b"b" * 5), memoryview(b"xyz")[1:], words, b""]
    parts += [bytes([i % 256]) for i in range(3000)]  # more buffers than IOV_MAX
    url = store.join("changelog", "ab", "many.dstl")
    expected = b"".join(bytes(p) if not isinstance(p, array.array) else p.tobytes() for p in parts)
    assert store.put(url, parts) == len(expected)
    assert store.read(url) == expected
    assert os.listdir(tmp_path / "changelog" / "ab") == ["many.dstl"], "no temporary left"


def test_directories_are_created_once_per_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObjectStore(str(tmp_path))
    store.put(store.join("changelog", "ab", "one.dstl"), b"1")
    looked: list[str] = []
    real_isdir = os.path.isdir

    def isdir(path: Any) -> bool:
        looked.append(str(path))
        return real_isdir(path)

    monkeypatch.setattr(os.path, "isdir", isdir)
    monkeypatch.setattr(os, "makedirs", lambda *a, **k: pytest.fail("mkdir per object"))
    for i in range(5):
        store.put(store.join("changelog", "ab", f"n{i}.dstl"), b"x")
    assert looked == [], "no stat per object once the directory is known"
    assert len(os.listdir(tmp_path / "changelog" / "ab")) == 6


def test_a_directory_removed_from_outside_is_created_again(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    first = store.join("changelog", "cd", "a.dstl")
    store.put(first, b"a")
    shutil.rmtree(tmp_path / "changelog")
    second = store.join("changelog", "cd", "b.dstl")
    assert store.put(second, b"bb") == 2
    assert store.read(second) == b"bb"
    assert store.put(store.join("changelog", "cd", "c.dstl"), b"c", exclusive=True) == 1


def test_a_directory_is_made_for_its_first_object_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch)
    store = ObjectStore(str(tmp_path))
    first = store.join("changelog", "ab", "1.dstl")
    store.put(first, b"1")
    changelog = tmp_path / "changelog"
    assert [p.name for p in changelog.iterdir()] == ["ab"]  # nothing made ahead
    # the new directories' parents, the data, then the new entry's directory
    assert synced[:2] == [str(tmp_path), str(changelog)] and synced[-1] == str(changelog / "ab")
    for i in range(5):  # a known directory: data and entry only
        synced.clear()
        store.put(store.join("changelog", "ab", f"x{i}.dstl"), b"2")
        assert len(synced) == 2 and synced[1] == str(changelog / "ab")
    other = ObjectStore(str(tmp_path))  # a second store finds it: no fsync for it
    synced.clear()
    other.put(other.join("changelog", "ab", "3.dstl"), b"3")
    assert len(synced) == 2
    synced.clear()
    store.put(store.join("changelog", "cd", "4.dstl"), b"4")  # a new prefix: its parent
    assert synced[0] == str(changelog) and len(synced) == 3
    assert sorted(p.name for p in changelog.iterdir()) == ["ab", "cd"]


def test_a_failed_local_put_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObjectStore(str(tmp_path), retry=RetryPolicy(max_attempts=1))

    def broken(fd: int) -> None:
        raise OSError(5, "disk on fire")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(store_module.StorageError, match="disk on fire"):
        store.put(store.join("x", "obj"), [b"a", b"b"])
    monkeypatch.undo()
    assert not (tmp_path / "x").exists() or os.listdir(tmp_path / "x") == []


class _Flaky:
    """Wraps ``pipe_file`` of an in-memory fs: the first ``failures`` calls raise a
    retryable error; records the data objects it was given."""

    def __init__(self, failures: int) -> None:
        import fsspec

        self.fs = fsspec.filesystem("memory", skip_instance_cache=True)
        self.fs.store = {}
        self.fs.pseudo_dirs = [""]
        self.failures = failures
        self.seen: list[Any] = []
        real = self.fs.pipe_file

        def pipe_file(path: str, value: Any, *a: Any, **k: Any) -> None:
            self.seen.append(value)
            if self.failures > 0:
                self.failures -= 1
                raise RetryableStorageError("put", path, "SlowDown")
            real(path, value, *a, **k)

        self.fs.pipe_file = pipe_file  # type: ignore[method-assign]


def test_retries_share_one_tenacity_object_and_join_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []
    real = store_module.Retrying

    def counting(*a: Any, **k: Any) -> Any:
        made.append(object())
        return real(*a, **k)

    monkeypatch.setattr(store_module, "Retrying", counting)
    flaky = _Flaky(failures=2)
    store = ObjectStore(f"memory://r-{uuid.uuid4().hex[:8]}", fs=flaky.fs, retry=FAST)
    assert len(made) == 1, "one retry object per store, built with it"
    seen: list[BaseException] = []
    url = store.new_object_path()
    assert store.put(url, [b"ab", bytearray(b"cd")], on_retry=seen.append) == 4
    assert store.read(url) == b"abcd"
    assert len(flaky.seen) == 3 and all(v is flaky.seen[0] for v in flaky.seen)
    assert store.stats.snapshot()["retries"] == {"put": 2} and len(seen) == 2
    for _ in range(3):
        store.put(store.new_object_path(), b"x")
    assert len(made) == 1, "no retry object per write"


def test_prepare_joins_only_where_one_write_takes_one_buffer(tmp_path: Path) -> None:
    local = ObjectStore(str(tmp_path))
    a, b = b"a", bytearray(b"b")
    parts = local.prepare([a, b])
    assert parts[0] is a and parts[1] is b and local.writes_parts()
    mem = ObjectStore(f"memory://p-{uuid.uuid4().hex[:8]}")
    assert not mem.writes_parts()
    assert mem.prepare([a, b]) == [b"ab"]
    single = b"whole"
    assert mem.prepare(single)[0] is single and mem.prepare([single])[0] is single
    assert mem.prepare(memoryview(b"mv")) == [b"mv"]


def test_backoff_doubles_from_the_first_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first wait (before tenacity takes over) and tenacity's own follow one
    schedule: before attempt n+1 at most initial_backoff * 2**(n-1), capped."""
    import random
    import time

    slept: list[float] = []
    monkeypatch.setattr(random, "uniform", lambda lo, hi: hi)
    monkeypatch.setattr(time, "sleep", slept.append)
    flaky = _Flaky(failures=4)
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.03)
    store = ObjectStore(f"memory://b-{uuid.uuid4().hex[:8]}", fs=flaky.fs, retry=policy)
    assert store.put(store.new_object_path(), b"x") == 1
    assert slept == pytest.approx([0.01, 0.02, 0.03, 0.03])
    assert store.stats.snapshot() == {"retries": {"put": 4}, "failures": {}}


_LOCAL = ObjectStore(tempfile.gettempdir())  # nothing is created: only its path rules


@settings(max_examples=200, deadline=None)
@given(path=st.text(alphabet="/ab.c~:", max_size=12))
def test_a_local_store_names_paths_as_fsspec_does(path: str) -> None:
    """Where a local store skips fsspec's path rule (an absolute path without trailing
    slash), that rule would have returned the path unchanged; elsewhere it applies it."""
    from fsspec.implementations.local import LocalFileSystem

    expected = LocalFileSystem._strip_protocol(path)
    if store_module._plain_local(path):
        assert expected == path
    assert _LOCAL._path(path) == expected and _LOCAL.url(path) == expected
