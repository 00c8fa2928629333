"""Completed checkpoints on DFS, under ``<base>/checkpoints/``.

Layout::

    checkpoints/chk-0000000007.json   one metadata file per completed checkpoint
    checkpoints/LATEST                {"latest": 7, "retained": [6, 7]}

Completing a checkpoint writes its metadata file first and the ``LATEST`` pointer last,
each with the atomic :meth:`dstltree.storage.store.ObjectStore.put`. The pointer is the commit
point: it names the latest checkpoint and every retained one, so a crash between the
two writes leaves a metadata file no pointer names (removed by :meth:`stale_files`
cleanup) and the previous checkpoints intact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.errors import CorruptCheckpointError
from dstltree.storage.store import CHECKPOINT_DIR, ObjectStore

LATEST_NAME = "LATEST"


class CheckpointStore:
    """Reads and writes completed checkpoints through ``store`` (the only DFS access).

    Methods raise :class:`dstltree.client.errors.StorageError` for storage failures and
    :class:`dstltree.coordinator.errors.CorruptCheckpointError` (naming the file) for files that
    cannot be decoded.
    """

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.root = store.join(CHECKPOINT_DIR)

    # -- paths -------------------------------------------------------------------------
    def metadata_path(self, checkpoint_id: int) -> str:
        """URL of the metadata file of ``checkpoint_id``."""
        return self.store.join(CHECKPOINT_DIR, f"chk-{checkpoint_id:010d}.json")

    @property
    def latest_path(self) -> str:
        return self.store.join(CHECKPOINT_DIR, LATEST_NAME)

    # -- writes ------------------------------------------------------------------------
    def add(self, checkpoint: CompletedCheckpoint, retained: Sequence[int] | None = None) -> str:
        """Write ``checkpoint``'s metadata, then the ``LATEST`` pointer naming it.

        ``retained``: ids of the older checkpoints that stay retained (subsumption is
        committed with the pointer); None keeps every currently retained one. Returns
        the metadata URL.
        """
        path = self.metadata_path(checkpoint.checkpoint_id)
        data = json.dumps(checkpoint.to_dict(), separators=(",", ":")).encode()
        self.store.put(path, data)
        older = self._pointer()[1] if retained is None else list(retained)
        ids = sorted(
            {i for i in older if i < checkpoint.checkpoint_id} | {checkpoint.checkpoint_id}
        )
        self._write_pointer(checkpoint.checkpoint_id, ids)
        return path

    def delete(self, checkpoint_id: int) -> None:
        """Drop ``checkpoint_id`` from the retained set (rewriting ``LATEST`` if it names
        it) and delete its metadata file. Deleting what is absent is a no-op."""
        latest, retained = self._pointer()
        if checkpoint_id in retained:
            rest = [i for i in retained if i != checkpoint_id]
            if rest:
                self._write_pointer(max(rest), rest)
            else:
                self.store.delete([self.latest_path])
        self.store.delete([self.metadata_path(checkpoint_id)])

    def _write_pointer(self, latest: int, retained: Sequence[int]) -> None:
        body = {"latest": latest, "retained": sorted(retained)}
        self.store.put(self.latest_path, json.dumps(body).encode())

    # -- reads -------------------------------------------------------------------------
    def _pointer(self) -> tuple[int | None, list[int]]:
        if not self.store.exists(self.latest_path):
            return None, []
        raw = self.store.read(self.latest_path)
        try:
            d: Any = json.loads(raw)
            latest = int(d["latest"])
            retained = sorted({int(i) for i in d["retained"]})
        except Exception as e:  # noqa: BLE001 - any decode failure is corruption
            raise CorruptCheckpointError(self.latest_path, f"bad pointer: {e}") from e
        if latest not in retained:
            raise CorruptCheckpointError(self.latest_path, f"latest {latest} not retained")
        return latest, retained

    def latest_id(self) -> int | None:
        """Id of the latest completed checkpoint, or None if there is none."""
        return self._pointer()[0]

    def retained_ids(self) -> list[int]:
        """Ids of the retained checkpoints, ascending."""
        return self._pointer()[1]

    def load(self, checkpoint_id: int) -> CompletedCheckpoint:
        """Read one checkpoint's metadata. Raises CorruptCheckpointError naming the file."""
        path = self.metadata_path(checkpoint_id)
        raw = self.store.read(path)
        try:
            cp = CompletedCheckpoint.from_dict(json.loads(raw))
        except Exception as e:  # noqa: BLE001 - any decode failure is corruption
            raise CorruptCheckpointError(path, f"bad checkpoint metadata: {e}") from e
        if cp.checkpoint_id != checkpoint_id:
            raise CorruptCheckpointError(path, f"holds checkpoint {cp.checkpoint_id}")
        return cp

    def load_latest(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint (for restore), or None."""
        latest = self.latest_id()
        return None if latest is None else self.load(latest)

    def list_retained(self) -> list[CompletedCheckpoint]:
        """Every retained checkpoint, oldest first."""
        return [self.load(i) for i in self.retained_ids()]

    def stale_files(self) -> list[str]:
        """Metadata files (and leftover temporary files) no pointer names: checkpoints
        written but never committed, or subsumed ones whose deletion was interrupted."""
        keep = {self.metadata_path(i) for i in self.retained_ids()} | {self.latest_path}
        return [u for u in self.store.list_files(self.root) if u not in keep]
