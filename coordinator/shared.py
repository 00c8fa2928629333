"""Orphans of this run under the prefixes of nodes shared with other jobs.

Nodes by host write under their topology's own ``<base_path>/changelog/``, and one
object may hold segments of several jobs running on the cluster. The job's orphan
sweeps (coordinator/sweep.py) list that prefix too, but an unreferenced object there is
deleted only if its index (two range reads) names no log but this job's writers': their
log ids start with ``<namespace>-``, for this run's namespace or one of an earlier run
whose checkpoints this run restored (sparkplug names them
``<job_id>-t<task>-a<attempt>``, ``job_id`` random per run: the namespace of a log id
is the part before its first ``-``). Such an object is this run's garbage under the same rule as
the job's own files (unreferenced, older than the sweep's cutoff, named by no pending
acknowledgement); any other object, or one whose index cannot be read, is another
job's business and is kept. Verdicts on objects that are not this run's are remembered
(objects are immutable), so a sweep reads each index at most once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from dstltree.client.errors import CorruptObjectError
from dstltree.client.reader import read_index
from dstltree.coordinator.cleanup import OrphanScan, normalize
from dstltree.storage.errors import StorageError
from dstltree.storage.store import ObjectStore

log = logging.getLogger(__name__)

_MAX_REMEMBERED = 100_000  # verdicts kept on other jobs' objects (then forgotten, re-read)


class SharedOrphans:
    """Scans ``prefixes`` (URLs of shared nodes' changelog folders) on ``store`` for
    objects of the job whose writers' log ids start with ``namespace + "-"`` (or with
    a namespace added by :meth:`add_namespaces`). Not thread-safe (the storage
    worker's thread)."""

    def __init__(self, store: ObjectStore, prefixes: Sequence[str], namespace: str) -> None:
        if not namespace:
            raise ValueError("a shared-prefix sweep needs a non-empty log namespace")
        self.store = store
        self.prefixes = tuple(prefixes)
        self.markers: tuple[str, ...] = (namespace + "-",)
        self._foreign: set[str] = set()

    def add_namespaces(self, log_ids: Iterable[str]) -> None:
        """Count the namespaces of ``log_ids`` (logs of the job's restored checkpoints:
        an earlier run's) as the job's too; a log id without ``-`` names none."""
        found = {lid.split("-", 1)[0] + "-" for lid in log_ids if "-" in lid.strip("-")}
        self.markers = tuple(sorted(set(self.markers) | found))
        self._foreign.clear()  # verdicts given without them

    def scan(self, referenced: Iterable[str], cutoff: float | None) -> OrphanScan:
        """Unreferenced objects of this run modified before ``cutoff`` (epoch seconds,
        the store's clock; None = any age): ``orphans``; those too young: ``spared``.
        Raises StorageError for a failed listing."""
        keep = {normalize(self.store, p) for p in referenced}
        orphans: list[str] = []
        spared: list[str] = []
        for prefix in self.prefixes:
            for info in self.store.list_info(prefix):
                url = normalize(self.store, info.url)
                if url in keep or url in self._foreign or not info.size:
                    continue  # an empty file (a node's reservation) has no index
                if cutoff is not None and (info.mtime is None or info.mtime >= cutoff):
                    spared.append(info.url)
                elif self._ours(info.url, url):
                    orphans.append(info.url)
        return OrphanScan(tuple(orphans), tuple(spared))

    def _ours(self, url: str, canonical: str) -> bool:
        """Whether every segment of object ``url`` is of the job's logs (remembered
        by its ``canonical`` URL when not)."""
        logs = object_log_ids(self.store, url)
        if logs and all(g.startswith(self.markers) for g in logs):
            return True
        if len(self._foreign) >= _MAX_REMEMBERED:
            self._foreign.clear()
        self._foreign.add(canonical)
        return False


def object_log_ids(store: ObjectStore, url: str) -> list[str] | None:
    """The log id of every segment in object ``url``, from its index (two range reads);
    None (logged) when the index cannot be read."""
    try:
        return [r.meta.log_id for r in read_index(store, url, verify=False)]
    except (CorruptObjectError, StorageError) as e:
        log.warning("the index of %s cannot be read: %s", url, e)
        return None
