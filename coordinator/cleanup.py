"""Orphans: objects under the base path that no retained checkpoint references.

Objects of a crashed attempt, duplicate copies of a retried persist, snapshots of an
abandoned materialization and leftover temporary files all end up here (docs/design.md,
Invariants). Deleting them is only safe when nothing is writing: at coordinator start,
before the first checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

from dstltree.storage.store import CHANGELOG_DIR, SNAPSHOT_DIR, ObjectStore


def normalize(store: ObjectStore, url: str) -> str:
    """The canonical form of an object URL for ``store`` (so that ``/x``,
    ``file:///x`` and the like compare equal)."""
    return store.url(str(store.fs._strip_protocol(url)))


def list_data_files(store: ObjectStore) -> list[str]:
    """Every file under ``<base>/changelog/`` and ``<base>/materialized/`` (sorted URLs),
    including temporary files of interrupted writes."""
    files = store.list_files(store.join(CHANGELOG_DIR)) + store.list_files(store.join(SNAPSHOT_DIR))
    return sorted(files)


def find_orphans(store: ObjectStore, referenced: Iterable[str]) -> list[str]:
    """Data files present under the base path that are not in ``referenced``."""
    keep = {normalize(store, p) for p in referenced}
    return [p for p in list_data_files(store) if normalize(store, p) not in keep]
