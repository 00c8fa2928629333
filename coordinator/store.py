"""Completed checkpoints on DFS, under ``<job>/checkpoints/``, and the fencing of drivers.

Layout::

    checkpoints/chk-0000000007.json   one metadata file per completed checkpoint
    checkpoints/LATEST-0000000042     pointer version 42: {"latest": 7, "retained": [6, 7],
                                      "owner": "<driver token>"}

Completing a checkpoint writes its metadata file first and a new pointer version last.
The pointer is the commit point: the highest version names the latest checkpoint and
every retained one, so a crash between the two writes leaves a metadata file no pointer
names (removed by :meth:`CheckpointStore.stale_files` cleanup) and the previous
checkpoints intact. An older layout with a single ``checkpoints/LATEST`` file is read
as version 0 (and replaced by ``LATEST-0000000001`` at the first write).

Fencing (one driver per job): every pointer version and every metadata file is
created exclusively (:meth:`dstltree.storage.store.ObjectStore.put` with
``exclusive=True``). A driver :meth:`CheckpointStore.claim`\\ s the job at start by
creating version n+1 over the highest version n it read; afterwards it writes version
v+1 over its own last version v only. If that version already exists, or a listing
right after the create shows a higher one, another driver claimed the job since: this
driver is fenced, raises :class:`JobFencedError` and never writes or deletes through
this store again. The newest driver wins: a second driver of a job fences the first
at the first's next pointer write (a restarted driver must be able to take over from
a dead one, and a dead one cannot hand over). The check after the create closes the
gap left by deleting old pointer versions (all but the last two are deleted). Only
stores with a conditional create fence reliably (see ObjectStore.put: local POSIX,
S3 with ``If-None-Match``, memory); on the others two simultaneous claims may both
succeed.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Sequence
from typing import Any

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.errors import CoordinatorError, CorruptCheckpointError
from dstltree.storage.errors import StorageError
from dstltree.storage.store import CHECKPOINT_DIR, ObjectExistsError, ObjectStore

log = logging.getLogger(__name__)
LATEST_NAME = "LATEST"
_POINTER = re.compile(r"/LATEST-(\d{10,})$")
_CLAIM_ATTEMPTS = 5
_READ_ATTEMPTS = 3


class JobFencedError(CoordinatorError):
    """Another driver took over this job (a newer pointer version, ``path``): this
    driver must stop; it writes and deletes nothing more."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"fenced: another driver runs this job ({path}: {reason})")
        self.path = path


class CheckpointStore:
    """Reads and writes completed checkpoints through ``store`` (the only DFS access).

    ``owner``: this driver's token, written into every pointer version (default: a
    random one). Methods raise :class:`dstltree.storage.errors.StorageError` for
    storage failures, :class:`dstltree.coordinator.errors.CorruptCheckpointError`
    (naming the file) for files that cannot be decoded, and writes and deletions
    :class:`JobFencedError` once another driver claimed the job.
    """

    def __init__(self, store: ObjectStore, owner: str | None = None) -> None:
        self.store = store
        self.root = store.join(CHECKPOINT_DIR)
        self.owner = owner or uuid.uuid4().hex
        self.version: int | None = None  # the pointer version this store wrote last
        self.fenced: JobFencedError | None = None
        self.pointers_deleted = 0

    # -- paths -------------------------------------------------------------------------
    def metadata_path(self, checkpoint_id: int) -> str:
        """URL of the metadata file of ``checkpoint_id``."""
        return self.store.join(CHECKPOINT_DIR, f"chk-{checkpoint_id:010d}.json")

    def pointer_path(self, version: int) -> str:
        """URL of pointer version ``version`` (0: the old single ``LATEST`` file)."""
        name = LATEST_NAME if version == 0 else f"{LATEST_NAME}-{version:010d}"
        return self.store.join(CHECKPOINT_DIR, name)

    @property
    def latest_path(self) -> str:
        """URL of the current (highest) pointer version, or of version 1 if none."""
        versions = self._versions()
        return self.pointer_path(versions[-1] if versions else 1)

    def _versions(self) -> list[int]:
        """Pointer versions present, ascending (0 for an old ``LATEST`` file)."""
        out = []
        legacy = self.pointer_path(0)
        for url in self.store.list_files(self.root):
            m = _POINTER.search(url)
            if m:
                out.append(int(m.group(1)))
            elif url == legacy:
                out.append(0)
        return sorted(out)

    # -- fencing -----------------------------------------------------------------------
    def claim(self) -> int:
        """Take the job over: create the pointer version after the highest one, with the
        same content. Returns the version claimed. Raises JobFencedError if other
        drivers keep claiming in between (5 tries), StorageError."""
        for _ in range(_CLAIM_ATTEMPTS):
            version, latest, retained = self._pointer()
            new = (version or 0) + 1
            try:
                created = self._create_pointer(new, latest, retained)
            except StorageError as e:
                if not isinstance(e.__cause__, FileNotFoundError):
                    raise
                continue  # the fenced driver's cleanup removed our temporary file
            if created:
                self.version, self.fenced = new, None
                self._drop_pointers(self._versions(), below=new - 1)
                return new
        raise self._fence(self.pointer_path(new), "other drivers keep claiming the job")

    def verify_owner(self) -> None:
        """Raise JobFencedError if another driver claimed the job since this store's
        last pointer write (no-op before any write or claim). Raises StorageError."""
        if self.fenced is not None:
            raise self.fenced
        if self.version is None:
            return
        versions = self._versions()
        if versions and versions[-1] > self.version:
            raise self._fence(self.pointer_path(versions[-1]), "a newer pointer version")

    def _fence(self, path: str, reason: str) -> JobFencedError:
        self.fenced = JobFencedError(path, reason)
        return self.fenced

    def _body(self, latest: int | None, retained: Sequence[int]) -> bytes:
        body = {"latest": latest, "retained": sorted(retained), "owner": self.owner}
        return json.dumps(body, separators=(",", ":")).encode()

    def _create_pointer(self, version: int, latest: int | None, retained: Sequence[int]) -> bool:
        """Create pointer ``version`` exclusively; False if it exists and is not ours
        (ours: a retried create whose first attempt landed)."""
        body = self._body(latest, retained)
        return self._create(self.pointer_path(version), body)

    def _create(self, url: str, data: bytes) -> bool:
        try:
            self.store.put(url, data, exclusive=True)
            return True
        except ObjectExistsError:
            try:
                return self.store.read(url) == data
            except StorageError:
                return False

    def _drop_pointers(self, versions: list[int], below: int) -> None:
        """Delete the pointer versions of ``versions`` under ``below`` (best effort:
        leftovers are stale files for the cleanup)."""
        old = [self.pointer_path(v) for v in versions if v < below]
        if not old:
            return
        try:
            self.pointers_deleted += len(self.store.delete(old))
        except StorageError as e:
            log.warning("old pointer versions left for the cleanup: %s", e)

    # -- writes ------------------------------------------------------------------------
    def add(self, checkpoint: CompletedCheckpoint, retained: Sequence[int] | None = None) -> str:
        """Write ``checkpoint``'s metadata (created exclusively), then the pointer
        version naming it (claiming the job first if this store has not yet).

        ``retained``: ids of the older checkpoints that stay retained (subsumption is
        committed with the pointer); None keeps every currently retained one. Returns
        the metadata URL. Raises JobFencedError, StorageError (also when a metadata
        file of this id exists: another driver wrote it; retry with a new id).
        """
        self._check_not_fenced()
        path = self.metadata_path(checkpoint.checkpoint_id)
        data = json.dumps(checkpoint.to_dict(), separators=(",", ":")).encode()
        if not self._create(path, data):
            raise StorageError("put", path, "a different metadata file of this id exists")
        older = self._pointer()[2] if retained is None else list(retained)
        ids = sorted(
            {i for i in older if i < checkpoint.checkpoint_id} | {checkpoint.checkpoint_id}
        )
        self._write_pointer(checkpoint.checkpoint_id, ids)
        return path

    def delete(self, checkpoint_id: int) -> None:
        """Drop ``checkpoint_id`` from the retained set (writing a new pointer version if
        it is named) and delete its metadata file. Deleting what is absent is a no-op.
        Raises JobFencedError (nothing deleted then), StorageError."""
        self._check_not_fenced()
        _, _, retained = self._pointer()
        if checkpoint_id in retained:
            rest = [i for i in retained if i != checkpoint_id]
            self._write_pointer(max(rest) if rest else None, rest)
        self.store.delete([self.metadata_path(checkpoint_id)])

    def _check_not_fenced(self) -> None:
        if self.fenced is not None:
            raise self.fenced

    def _write_pointer(self, latest: int | None, retained: Sequence[int]) -> None:
        if self.version is None:
            self.claim()
        assert self.version is not None
        new = self.version + 1
        if not self._create_pointer(new, latest, retained):
            raise self._fence(self.pointer_path(new), "this pointer version exists")
        versions = self._versions()
        if versions and versions[-1] > new:
            raise self._fence(self.pointer_path(versions[-1]), "a newer pointer version")
        self.version = new
        self._drop_pointers(versions, below=new - 1)

    # -- reads -------------------------------------------------------------------------
    def _pointer(self) -> tuple[int | None, int | None, list[int]]:
        """(version, latest id, retained ids) of the highest pointer version; (None,
        None, []) when there is none."""
        for attempt in range(_READ_ATTEMPTS):
            versions = self._versions()
            if not versions:
                return None, None, []
            path = self.pointer_path(versions[-1])
            try:
                raw = self.store.read(path)
            except StorageError:
                if attempt + 1 == _READ_ATTEMPTS or self.store.exists(path):
                    raise
                continue  # deleted after the listing: a newer version exists
            latest, retained = _decode_pointer(path, raw)
            return versions[-1], latest, retained
        raise AssertionError("unreachable")  # pragma: no cover

    def latest_id(self) -> int | None:
        """Id of the latest completed checkpoint, or None if there is none."""
        return self._pointer()[1]

    def retained_ids(self) -> list[int]:
        """Ids of the retained checkpoints, ascending."""
        return self._pointer()[2]

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

    def stale_files(self, cutoff: float | None = None) -> list[str]:
        """Files under ``checkpoints/`` the pointer does not need: metadata files no
        pointer names (checkpoints written but never committed, subsumed ones whose
        deletion was interrupted), leftover temporary files, and pointer versions
        older than the last two; with ``cutoff`` (epoch seconds, the store's clock)
        only those modified before it (a write under way, another driver's claim
        included, is younger)."""
        version, _, retained = self._pointer()
        keep = {self.metadata_path(i) for i in retained}
        if version is not None:
            keep |= {self.pointer_path(v) for v in (version - 1, version) if v >= 0}
        return [
            i.url
            for i in self.store.list_info(self.root)
            if i.url not in keep and (cutoff is None or (i.mtime is not None and i.mtime < cutoff))
        ]


def _decode_pointer(path: str, raw: bytes) -> tuple[int | None, list[int]]:
    """(latest, retained) of a pointer file. Raises CorruptCheckpointError."""
    try:
        d: Any = json.loads(raw)
        latest = None if d["latest"] is None else int(d["latest"])
        retained = sorted({int(i) for i in d["retained"]})
    except Exception as e:  # noqa: BLE001 - any decode failure is corruption
        raise CorruptCheckpointError(path, f"bad pointer: {e}") from e
    newest = retained[-1] if retained else None
    if latest != newest:
        raise CorruptCheckpointError(path, f"latest {latest} is not the newest of {retained}")
    return latest, retained
