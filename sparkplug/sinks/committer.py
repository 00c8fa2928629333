"""The driver side of a file sink: :class:`SinkCommitter` makes staged output visible
when its checkpoint completes (two-phase commit, phase two), drops staged output whose
rows will be emitted again, and cleans up after failed attempts.

What a commit does per committable (sinks/files.py: what is atomic where):

- local: rename the staged file to its final name (atomic, then fsynced).
- S3, multipart committable: complete the open multipart upload at the final key, one
  CompleteMultipartUpload request (conditional on the name being free); the object
  appears whole at that moment. No copy, no delete.
- staged-file committable on a remote store (other stores, and S3 committables
  written before multipart staging existed): copy to the final name, then delete the
  staged object.

Why a commit is exactly once: the final name is a function of (checkpoint, attempt,
task), so a commit repeated after a crash targets the same name; each step above
either makes the whole final object visible or nothing, and a repeated step is
recognised by the final object already holding the committable's size (a completed
upload, a copy whose delete did not happen): then it is a no-op. A committable whose
staged output is gone (file deleted, upload aborted or expired) while its final object
is missing raises SinkCommitError: its rows are lost, and nobody may pretend otherwise.

The contract with the coordinator (what keeps every row visible exactly once):

- ``commit`` the committables of checkpoint k only once k's metadata is durable and
  recovery would choose k or a later checkpoint.
- k's metadata carries, besides its own committables, those of every earlier
  checkpoint of the same attempt that did not complete (declined, timed out): their
  rows lie before k's cut and are only in their staged files; they are committed with
  k (Flink's committer keeps such committables in its state the same way).
- On recovery from checkpoint k: ``commit`` again the committables of every retained
  checkpoint up to k, oldest first (a commit cut short by a driver crash is finished;
  committed ones are no-ops), then ``abort``/``cleanup`` the rest: the failed attempt's
  staged files after k hold rows that the restored attempt emits again.
- ``abort`` only output whose rows will be emitted again, never a checkpoint that a
  later completed checkpoint of the same attempt follows.
- ``cleanup`` (and ``abort`` of a checkpoint id) may remove every staged output that
  no retained committable names and that is not of an attempt in ``keep_attempts``:
  call it only while no task of another attempt is staging.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from dstltree.sparkplug.sinks import files, multipart
from dstltree.sparkplug.sinks.errors import SinkCommitError
from dstltree.sparkplug.sinks.layout import (
    STAGING_DIR,
    Committable,
    final_key,
    staged_attempt,
    staged_checkpoint,
)

if TYPE_CHECKING:
    from dstltree.sparkplug.sinks.sink import FileSink

#: Committables completed at once on an object store (each is one or two requests).
COMMIT_THREADS = 8


class SinkCommitter:
    """Commits, aborts and cleans up the staged output of one :class:`FileSink`. Every
    method raises StorageError (storage/errors.py) when the store fails; a failed
    ``commit`` may simply be called again."""

    def __init__(self, sink: FileSink) -> None:
        self.sink = sink
        self._store = sink.store()
        self._multipart = multipart.supports(self._store)

    def commit(self, committables: Iterable[Committable]) -> list[str]:
        """Make the committables' output visible under their final names: in name order
        (= commit order) locally; on an object store :data:`COMMIT_THREADS` at a time
        (each appears whole, in any order among them; a reader that lists during a
        commit may see a later part before an earlier one). Idempotent: a committable
        whose final object exists with its size is a no-op (a staged copy left by an
        interrupted copy-then-delete is deleted). Returns the final URLs made visible by
        this call (a store that acknowledges a repeated completion of the same multipart
        upload, as AWS S3 and moto do, has it counted again). Raises SinkCommitError for
        a committable outside this sink's layout, a multipart one on a store without
        multipart uploads, one whose staged output (file or upload) is gone while its
        final object is missing, or a final object of another size."""
        ordered = sorted(committables, key=lambda c: c.final)
        if files.is_local(self._store) or len(ordered) <= 1:
            done = [self._commit_one(c) for c in ordered]
        else:  # one request (or two) each on an object store: COMMIT_THREADS at a time
            with ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="sink-commit") as pool:
                done = list(pool.map(self._commit_one, ordered))
        return [self._store.join(c.final) for c, made in zip(ordered, done, strict=True) if made]

    def _commit_one(self, c: Committable) -> bool:
        self._check(c)
        if c.upload_id is not None:
            return self._complete(c, c.upload_id)
        staged, final = self._store.join(c.staged), self._store.join(c.final)
        if self._store.exists(final):
            self._check_size(c, final)
            self._store.delete([staged])
            return False
        if not self._store.exists(staged):
            raise self._lost(c)
        files.move(self._store, staged, final)
        return True

    def _complete(self, c: Committable, upload_id: str) -> bool:
        """One CompleteMultipartUpload; only when the store says the upload is gone or
        the name taken does a HEAD of the final object decide between "committed
        earlier" (its size: a no-op) and an error."""
        final = self._store.join(c.final)
        outcome = multipart.complete(self._store, final, upload_id, c.parts)
        if outcome is multipart.Outcome.COMPLETED:
            return True
        if not self._store.exists(final):
            if outcome is multipart.Outcome.GONE:
                raise self._lost(c, f"its multipart upload {upload_id} is gone")
            raise SinkCommitError(f"{c.final} was taken, then deleted, while committed")
        self._check_size(c, final)
        if outcome is multipart.Outcome.EXISTS:  # the same bytes, another way: drop ours
            multipart.abort(self._store, final, upload_id)
        return False

    def _check_size(self, c: Committable, final: str) -> None:
        size = self._store.size(final)
        if size != c.bytes:
            raise SinkCommitError(
                f"{c.final} exists with {size} bytes, its committable has {c.bytes}"
            )

    @staticmethod
    def _lost(c: Committable, why: str | None = None) -> SinkCommitError:
        what = why or f"{c.staged} is gone"
        return SinkCommitError(
            f"{what} and {c.final} was never committed: rows of checkpoint "
            f"{c.checkpoint_id}, task {c.task} are lost"
        )

    def abort(self, target: int | Iterable[Committable], attempt: int | None = None) -> list[str]:
        """Drop staged output that must never become visible: that of the given
        committables, or all of checkpoint id ``target`` (of ``attempt`` only, if
        given: ids are reused after a restore). Staged files are deleted, open
        multipart uploads aborted. Returns what was removed: the URLs of deleted
        files, and ``<final URL>?uploadId=<id>`` for each aborted upload (an upload
        the store no longer knows is not listed)."""
        if isinstance(target, int):
            doomed = [
                url
                for url, rel in self._staged_files()
                if staged_checkpoint(rel) == target
                and (attempt is None or staged_attempt(rel) == attempt)
            ]
            uploads = [
                (url, upload_id)
                for url, rel, upload_id in self._uploads()
                if (key := final_key(rel)) is not None
                and key[0] == target
                and (attempt is None or key[1] == attempt)
            ]
        else:
            doomed, uploads = [], []
            for c in target:
                self._check(c)
                if c.upload_id is None:
                    doomed.append(self._store.join(c.staged))
                else:
                    uploads.append((self._store.join(c.final), c.upload_id))
        return self._store.delete(doomed) + self._abort_uploads(uploads)

    def cleanup(
        self, retained: Iterable[Committable], keep_attempts: Collection[int] = ()
    ) -> list[str]:
        """Drop every staged output that no committable in ``retained`` names and that
        is not of an attempt in ``keep_attempts`` (the running one): files below
        ``_staging`` (staged and in-progress files of aborted checkpoints and failed
        attempts) and, on S3, open multipart uploads below the sink URL (listed with
        ListMultipartUploads; an upload's attempt is read from its final key, uploads
        of keys outside the layout are left alone). Committed (final) objects are never
        touched. Returns what was removed, as :meth:`abort` does."""
        retained = list(retained)
        keep = {c.staged for c in retained}
        keep_uploads = {c.upload_id for c in retained if c.upload_id is not None}
        doomed = [
            url
            for url, rel in self._staged_files()
            if rel not in keep and staged_attempt(rel) not in keep_attempts
        ]
        uploads = []
        for url, rel, upload_id in self._uploads():
            key = final_key(rel)
            owner = key[1] if key is not None else staged_attempt(rel)
            if owner is not None and owner not in keep_attempts and upload_id not in keep_uploads:
                uploads.append((url, upload_id))
        deleted = self._store.delete(doomed) + self._abort_uploads(uploads)
        if files.is_local(self._store):
            self._remove_empty_folders()
        return deleted

    def _check(self, c: Committable) -> None:
        if c.final.rsplit(".", 1)[-1] != self.sink.extension:
            raise SinkCommitError(f"{c.final} is not a {self.sink.format} file of this sink")
        try:
            c.validate()
        except ValueError as e:
            raise SinkCommitError(str(e)) from e
        if c.upload_id is not None and not self._multipart:
            raise SinkCommitError(
                f"{c.staged} is a multipart upload, but {self.sink.url} is not on S3"
            )

    def _staged_files(self) -> list[tuple[str, str]]:
        """(URL, path relative to the sink URL) of every file below ``_staging``."""
        base = self._store.base_url.rstrip("/") + "/"
        urls = self._store.list_files(self._store.join(STAGING_DIR))
        return [(u, u[len(base) :]) for u in urls if u.startswith(base)]

    def _uploads(self) -> list[tuple[str, str, str]]:
        """(URL of the key, key relative to the sink URL, upload id) of every open
        multipart upload below the sink URL; none on a store without them."""
        if not self._multipart:
            return []
        base = self._store.base_url.rstrip("/") + "/"
        found = multipart.list_uploads(self._store, self._store.base_url)
        return [(u, u[len(base) :], upload_id) for u, upload_id in found if u.startswith(base)]

    def _abort_uploads(self, uploads: Iterable[tuple[str, str]]) -> list[str]:
        return [
            f"{url}?uploadId={upload_id}"
            for url, upload_id in uploads
            if multipart.abort(self._store, url, upload_id)
        ]

    def _remove_empty_folders(self) -> None:
        root = self._store.join(STAGING_DIR)
        if not os.path.isdir(root):
            return
        for entry in os.scandir(root):
            if entry.is_dir() and not os.listdir(entry.path):
                os.rmdir(entry.path)
