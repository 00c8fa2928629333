"""Orphans: objects under the job's prefix that no retained checkpoint references.

Objects of a crashed or aborted attempt, duplicate copies of a retried persist,
snapshots of an abandoned materialization and leftover temporary files all end up here
(docs/design.md, Invariants). A job's prefix is the base path of its ObjectStore
(``<checkpoint_dir>/<job name>``); only ``<job>/changelog/``, ``<job>/materialized/``
and ``<job>/checkpoints/`` are ever listed or deleted (:func:`within_job` refuses the
rest), so jobs sharing a checkpoint directory never touch each other's files.

A file is an orphan candidate when it is not referenced; it is deleted only when its
modification time (the store's clock) is older than a cutoff, so files a writer may
still reference are spared: :func:`find_orphans` at coordinator start and in the
in-run sweeps (coordinator/sweep.py) take the cutoff from the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dstltree.storage.store import (
    CHANGELOG_DIR,
    CHECKPOINT_DIR,
    SNAPSHOT_DIR,
    ObjectInfo,
    ObjectStore,
    is_reservation,
)

#: Folders of a job's prefix that cleanup may delete in.
JOB_DIRS = (CHANGELOG_DIR, SNAPSHOT_DIR, CHECKPOINT_DIR)


def normalize(store: ObjectStore, url: str) -> str:
    """The canonical form of an object URL for ``store`` (so that ``/x``,
    ``file:///x`` and the like compare equal; ``.`` and ``..`` segments resolved)."""
    path = str(store.fs._strip_protocol(url))
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    lead = "/" if path.startswith("/") else ""
    return store.url(lead + "/".join(parts))


def job_prefixes(store: ObjectStore, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Canonical URL prefixes (ending in ``/``) deletions are allowed under: the job's
    changelog, materialized and checkpoints folders, then ``extra``."""
    dirs = [store.join(d) for d in JOB_DIRS] + list(extra)
    return tuple(normalize(store, d).rstrip("/") + "/" for d in dirs)


def within_job(store: ObjectStore, url: str, extra: Sequence[str] = ()) -> bool:
    """Whether ``url``'s canonical form lies under one of :func:`job_prefixes`."""
    canonical = normalize(store, url)
    return any(canonical.startswith(p) for p in job_prefixes(store, extra))


def list_data_files(store: ObjectStore) -> list[str]:
    """Every file under ``<base>/changelog/`` and ``<base>/materialized/`` (sorted URLs),
    including temporary files of interrupted writes, but not the reservations (empty
    object files created ahead: no data, see :func:`data_files_and_reservations`).
    Raises StorageError."""
    return data_files_and_reservations(store)[0]


def data_files_and_reservations(store: ObjectStore) -> tuple[list[str], list[str]]:
    """One listing of the job's data folders split in two (sorted URLs): the data files
    (:func:`list_data_files`) and the reservations
    (:func:`dstltree.storage.store.is_reservation`). Raises StorageError."""
    data: list[str] = []
    reserved: list[str] = []
    for info in list_data_info(store):
        (reserved if is_reservation(info) else data).append(info.url)
    return data, reserved


def list_data_info(store: ObjectStore) -> list[ObjectInfo]:
    """Every file under ``<base>/changelog/`` and ``<base>/materialized/`` with its size
    and modification time (sorted by URL), reservations included: the orphan scan
    (:func:`scan_orphans`) deletes those a dead process left like any other file."""
    found = store.list_info(store.join(CHANGELOG_DIR)) + store.list_info(store.join(SNAPSHOT_DIR))
    return sorted(found, key=lambda i: i.url)


@dataclass(frozen=True)
class OrphanScan:
    """One listing: ``orphans`` (URLs to delete: unreferenced and older than the
    cutoff), ``spared`` (unreferenced but too young, or of unknown age)."""

    orphans: tuple[str, ...]
    spared: tuple[str, ...]


def scan_orphans(
    store: ObjectStore, referenced: Iterable[str], cutoff: float | None = None
) -> OrphanScan:
    """Data files under the job's prefix not in ``referenced``; those modified at or
    after ``cutoff`` (epoch seconds, the store's clock; None = no age limit), or whose
    age the store does not give (unless ``cutoff`` is None), are spared."""
    keep = {normalize(store, p) for p in referenced}
    orphans: list[str] = []
    spared: list[str] = []
    for info in list_data_info(store):
        if normalize(store, info.url) in keep:
            continue
        old = cutoff is None or (info.mtime is not None and info.mtime < cutoff)
        (orphans if old else spared).append(info.url)
    return OrphanScan(tuple(orphans), tuple(spared))


def find_orphans(
    store: ObjectStore, referenced: Iterable[str], cutoff: float | None = None
) -> list[str]:
    """Data files present under the job's prefix that are not in ``referenced`` and
    older than ``cutoff`` (see :func:`scan_orphans`)."""
    return list(scan_orphans(store, referenced, cutoff).orphans)
