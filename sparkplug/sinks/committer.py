"""The driver side of a file sink: :class:`SinkCommitter` makes staged files visible
when their checkpoint completes (two-phase commit, phase two), deletes staged files
whose rows will be emitted again, and cleans up after failed attempts.

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
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from dstltree.sparkplug.sinks import files
from dstltree.sparkplug.sinks.errors import SinkCommitError
from dstltree.sparkplug.sinks.layout import (
    STAGING_DIR,
    Committable,
    staged_attempt,
    staged_checkpoint,
)

if TYPE_CHECKING:
    from dstltree.sparkplug.sinks.sink import FileSink


class SinkCommitter:
    """Commits, aborts and cleans up the staged files of one :class:`FileSink`. Every
    method raises StorageError (storage/errors.py) when the store fails; a failed
    ``commit`` may simply be called again."""

    def __init__(self, sink: FileSink) -> None:
        self.sink = sink
        self._store = sink.store()

    def commit(self, committables: Iterable[Committable]) -> list[str]:
        """Make the staged files visible under their final names, in name order (=
        commit order). Idempotent: a committable whose final file exists with its size
        is a no-op (a staged copy left by an interrupted copy-then-delete is deleted).
        Returns the final URLs made visible by this call. Raises SinkCommitError for a
        committable outside this sink's layout, one whose staged and final files are
        both missing, or a final file of another size."""
        made = []
        for c in sorted(committables, key=lambda c: c.final):
            if self._commit_one(c):
                made.append(self._store.join(c.final))
        return made

    def _commit_one(self, c: Committable) -> bool:
        self._check(c)
        staged, final = self._store.join(c.staged), self._store.join(c.final)
        if self._store.exists(final):
            size = self._store.size(final)
            if size != c.bytes:
                raise SinkCommitError(
                    f"{c.final} exists with {size} bytes, its committable has {c.bytes}"
                )
            self._store.delete([staged])
            return False
        if not self._store.exists(staged):
            raise SinkCommitError(
                f"{c.staged} is gone and {c.final} was never committed: rows of "
                f"checkpoint {c.checkpoint_id}, task {c.task} are lost"
            )
        files.move(self._store, staged, final)
        return True

    def abort(self, target: int | Iterable[Committable], attempt: int | None = None) -> list[str]:
        """Delete staged files that must never become visible: those of the given
        committables, or every staged file of checkpoint id ``target`` (of ``attempt``
        only, if given: ids are reused after a restore). Returns the URLs deleted."""
        if isinstance(target, int):
            doomed = [
                url
                for url, rel in self._staged_files()
                if staged_checkpoint(rel) == target
                and (attempt is None or staged_attempt(rel) == attempt)
            ]
        else:
            doomed = []
            for c in target:
                self._check(c)
                doomed.append(self._store.join(c.staged))
        return self._store.delete(doomed)

    def cleanup(
        self, retained: Iterable[Committable], keep_attempts: Collection[int] = ()
    ) -> list[str]:
        """Delete every file below ``_staging`` that no committable in ``retained``
        names and that is not in the folder of an attempt in ``keep_attempts`` (the
        running one): staged and in-progress files of aborted checkpoints and failed
        attempts. Committed (final) files are never touched. Returns the URLs deleted."""
        keep = {c.staged for c in retained}
        doomed = [
            url
            for url, rel in self._staged_files()
            if rel not in keep and staged_attempt(rel) not in keep_attempts
        ]
        deleted = self._store.delete(doomed)
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

    def _staged_files(self) -> list[tuple[str, str]]:
        """(URL, path relative to the sink URL) of every file below ``_staging``."""
        base = self._store.base_url.rstrip("/") + "/"
        urls = self._store.list_files(self._store.join(STAGING_DIR))
        return [(u, u[len(base) :]) for u in urls if u.startswith(base)]

    def _remove_empty_folders(self) -> None:
        root = self._store.join(STAGING_DIR)
        if not os.path.isdir(root):
            return
        for entry in os.scandir(root):
            if entry.is_dir() and not os.listdir(entry.path):
                os.rmdir(entry.path)
