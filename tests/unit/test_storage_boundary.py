"""The storage boundary is a package below the client: its modules import nothing of
dstltree but ``storage`` and ``topology``, the store knows nothing of the object format,
and the client's errors and the storage errors share one base."""

from __future__ import annotations

import ast
from pathlib import Path

import dstltree.client as client_api
from dstltree.client import errors as client_errors
from dstltree.coordinator.errors import CoordinatorError
from dstltree.storage import errors as storage_errors
from dstltree.storage.store import ObjectStore

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
