"""The storage boundary is a package below the client: its modules import nothing of
dstltree but ``storage`` and ``topology``, the store knows nothing of the object format,
and the client's errors and the storage errors share one base."""

from __future__ import annotations

import ast
import errno
import os
import time
import uuid
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

import dstltree.client as client_api
from dstltree.client import errors as client_errors
from dstltree.coordinator.errors import CoordinatorError
from dstltree.storage import errors as storage_errors
from dstltree.storage.faults import FaultSpec
from dstltree.storage.store import ObjectExistsError, ObjectStore, translate
from tests.support.fsyncs import record_fsyncs

STORAGE = Path(__file__).resolve().parents[2] / "storage"
ALLOWED = {"dstltree.storage", "dstltree.topology"}


def _dstltree_imports(path: Path) -> set[str]:
    """Every ``dstltree...`` module a file imports, at any level (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m == "dstltree" or m.startswith("dstltree.")}


def _allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def test_storage_imports_only_storage_and_topology() -> None:
    files = sorted(STORAGE.glob("*.py"))
    assert {f.name for f in files} >= {
        "__init__.py",
        "errors.py",
        "faults.py",
        "hedging.py",
        "store.py",
        "targets.py",
    }
    bad = {f.name: sorted(m for m in _dstltree_imports(f) if not _allowed(m)) for f in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_import_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from dstltree.client.errors import WireError\n")
    assert _dstltree_imports(f) == {"dstltree.client.errors.WireError"}


def test_store_has_no_object_format_reader() -> None:
    for name in ("read_index", "read_segment", "read_exact"):
        assert not hasattr(ObjectStore, name), f"ObjectStore.{name} parses objects"


def test_a_short_read_is_not_the_stores_business(tmp_path: Path) -> None:
    """The store returns what is there; calling a short read corruption is the
    client's (client/reader.py: read_exact)."""
    store = ObjectStore(str(tmp_path))
    url = store.new_object_path()
    store.put(url, b"0123456789")
    assert store.read_range(url, 6, 10) == b"6789"
    assert store.read_range(url, 10, 4) == b""


def test_errors_share_one_base_and_client_re_exports_storage_errors() -> None:
    for name in ("DstlError", "StorageError", "RetryableStorageError"):
        assert getattr(client_errors, name) is getattr(storage_errors, name)
        assert getattr(client_api, name) is getattr(storage_errors, name)
    assert client_api.ObjectStore is ObjectStore
    for cls in (
        client_errors.CorruptObjectError,
        client_errors.WireError,
        client_errors.PersistError,
        storage_errors.StorageError,
        CoordinatorError,
    ):
        assert issubclass(cls, storage_errors.DstlError)
    assert issubclass(storage_errors.RetryableStorageError, storage_errors.StorageError)
    assert storage_errors.RetryableStorageError.retryable
    assert not storage_errors.StorageError.retryable


def test_client_public_api_is_unchanged() -> None:
    assert sorted(client_api.__all__) == [
        "ChangelogClient",
        "ChangelogHandle",
        "ChangelogWriter",
        "CorruptObjectError",
        "DstlError",
        "ObjectStore",
        "PersistError",
        "RetryableStorageError",
        "SegmentRef",
        "StorageError",
        "WireError",
    ]


# -- conditional create, fsync, listings with modification times -----------------------


def test_exclusive_put_creates_once_on_a_local_store(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    url = store.join("checkpoints", "LATEST-0000000001")
    assert store.put(url, b"first", exclusive=True) == 5
    with pytest.raises(ObjectExistsError):
        store.put(url, b"second", exclusive=True)
    assert store.read(url) == b"first"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["LATEST-0000000001"]


def test_exclusive_put_on_memory_and_under_a_wrapper(tmp_path: Path) -> None:
    mem = ObjectStore(f"memory://excl-{uuid.uuid4().hex}")
    url = mem.join("x")
    mem.put(url, b"1", exclusive=True)
    with pytest.raises(ObjectExistsError):
        mem.put(url, b"2", exclusive=True)
    wrapped = ObjectStore(str(tmp_path), fs=FaultSpec().wrap(LocalFileSystem()))
    url = wrapped.join("y")
    wrapped.put(url, b"1", exclusive=True)
    with pytest.raises(ObjectExistsError):
        wrapped.put(url, b"2", exclusive=True)


def test_local_put_fsyncs_the_object_and_the_directories_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch)
    store = ObjectStore(str(tmp_path))
    url = store.join("changelog", "ab", "obj.dstl")
    store.put(url, [b"a", b"b"])
    # the parents of the new directories, the data before the rename, then the
    # object's directory after the rename
    assert synced[:2] == [str(tmp_path), str(tmp_path / "changelog")]
    assert synced[2].startswith(url + ".tmp-")
    assert synced[3:] == [str(tmp_path / "changelog" / "ab")]
    synced.clear()
    store.put(store.join("changelog", "ab", "two.dstl"), b"x")
    assert len(synced) == 2 and synced[1] == str(tmp_path / "changelog" / "ab")


def test_list_info_gives_sizes_and_modification_times(tmp_path: Path) -> None:
    for store in (ObjectStore(str(tmp_path)), ObjectStore(f"memory://li-{uuid.uuid4().hex}")):
        before = time.time() - 5
        store.put(store.join("changelog", "a.dstl"), b"abc")
        store.put(store.join("changelog", "b", "c.dstl"), b"")
        infos = store.list_info(store.join("changelog"))
        assert [(i.url.rsplit("/", 1)[-1], i.size) for i in infos] == [("a.dstl", 3), ("c.dstl", 0)]
        assert all(i.mtime is not None and before < i.mtime < time.time() + 5 for i in infos)
        assert store.list_info(store.join("nothing")) == []


def test_precondition_failed_translates_to_object_exists() -> None:
    from botocore.exceptions import ClientError

    err = ClientError(
        {"Error": {"Code": "PreconditionFailed"}, "ResponseMetadata": {"HTTPStatusCode": 412}},
        "PutObject",
    )
    assert isinstance(translate("put", "s3://b/k", err), ObjectExistsError)
    assert isinstance(translate("put", "/x", FileExistsError("x")), ObjectExistsError)
    assert not isinstance(translate("put", "/x", FileNotFoundError("x")), ObjectExistsError)


def test_exclusive_put_without_hard_links_falls_back_to_o_excl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "no hard links here")

    monkeypatch.setattr(os, "link", no_link)
    store = ObjectStore(str(tmp_path))
    url = store.join("p")
    store.put(url, b"one", exclusive=True)
    with pytest.raises(ObjectExistsError):
        store.put(url, b"two", exclusive=True)
    assert store.read(url) == b"one" and os.listdir(tmp_path) == ["p"]
