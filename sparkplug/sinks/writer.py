"""The task side of a file sink: :class:`SinkWriter` buffers rows, writes them in
record batches to the current part file, and at a checkpoint barrier stages that part
durably and returns a :class:`Committable` for the acknowledgement (two-phase commit,
phase one; the committer in sinks/committer.py does phase two).

Staging, per store (sinks/files.py says what is atomic where):

- local: the part file is written under the attempt's staging folder; staging fsyncs
  it and renames it (atomically) to its staged name.
- S3 (an s3fs ``S3FileSystem``): the part file is written to a local spill folder;
  staging starts a multipart upload at the FINAL key and uploads the file as its parts
  (sinks/multipart.py), without completing it: nothing becomes visible, and the
  committable carries the upload id and the parts' numbers, ETags and sizes.
- any other remote store: the part file spills locally and staging uploads it whole
  to its staged name (one streamed upload).

Either way a staged part is durable when the committable is returned: a failure after
that loses none of its rows, a failure before it makes the checkpoint fail.

Memory stays bounded by ``batch_rows`` rows in the buffer plus ``max_pending_batches``
encoded batches queued for the writer's one I/O thread (plus one upload part,
:data:`dstltree.sparkplug.sinks.multipart.PART_BYTES`, while staging on S3); ``write``
blocks while that queue is full (back-pressure).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

from dstltree.sparkplug.sinks import files, multipart
from dstltree.sparkplug.sinks.errors import SinkError
from dstltree.sparkplug.sinks.formats import PartFile, PartFormat
from dstltree.sparkplug.sinks.layout import (
    STAGING_DIR,
    Committable,
    final_name,
    in_progress_name,
    staged_attempt,
    staged_name,
)
from dstltree.sparkplug.sinks.multipart import UploadPart
from dstltree.sparkplug.sinks.rows import check_row
from dstltree.storage.store import ObjectStore, translate

if TYPE_CHECKING:
    from dstltree.sparkplug.sinks.sink import FileSink


class _Part:
    """One part file being written; every method but ``__init__`` runs on the I/O
    thread. The first error sticks: later writes are skipped and ``stage`` raises it."""

    def __init__(self, store: ObjectStore, fmt: PartFormat, spill: str) -> None:
        self.store = store
        self.fmt = fmt
        self.spill = spill
        self.rows = 0
        self.error: BaseException | None = None
        self._f: IO[bytes] | None = None
        self._part: PartFile | None = None

    def write(self, payload: Any) -> None:
        if self.error is not None:
            return
        try:
            if self._part is None:
                os.makedirs(os.path.dirname(self.spill), exist_ok=True)
                self._f = open(self.spill, "wb")  # noqa: SIM115 - closed in stage/discard
                self._part = self.fmt.open(self._f)
            self._part.write(payload)
        except Exception as e:
            self.error = translate("write", self.spill, e)
            raise self.error from e

    def stage(
        self, staged_url: str, final_url: str
    ) -> tuple[int, tuple[str, list[UploadPart]] | None]:
        """Finish the file and make it durable: renamed to ``staged_url`` (local),
        uploaded as the parts of an open multipart upload at ``final_url`` (S3), or
        uploaded to ``staged_url`` (other stores). Returns its size in bytes and, on
        S3, (upload id, parts). Raises StorageError."""
        if self.error is not None:
            raise self.error
        assert self._part is not None and self._f is not None
        try:
            self._part.finish()
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            size = os.path.getsize(self.spill)
        except Exception as e:
            raise translate("write", self.spill, e) from e
        upload = None
        if files.is_local(self.store):
            files.run(
                self.store, "rename", self.spill, lambda: files.rename_local(self.spill, staged_url)
            )
        elif multipart.supports(self.store):
            upload = multipart.upload_file(self.store, self.spill, final_url)
            os.remove(self.spill)
        else:
            files.upload(self.store, self.spill, staged_url)
            os.remove(self.spill)
        return size, upload

    def discard(self) -> None:
        """Close and delete the file (its rows' checkpoint never came)."""
        if self._f is not None:
            with contextlib.suppress(Exception):  # a trailer for a file deleted next
                self._part.finish() if self._part is not None else None
            self._f.close()
        if os.path.exists(self.spill):
            os.remove(self.spill)


def spill_root(sink: FileSink) -> str:
    """The local folder of a remote sink's part files on this host: one per sink URL
    below ``sink.spill_dir`` (default: the system's temporary folder), one
    ``attempt-<n>`` folder per job attempt inside."""
    digest = hashlib.sha1(sink.url.encode()).hexdigest()[:16]
    return os.path.join(sink.spill_dir or tempfile.gettempdir(), f"dstl-sink-{digest}")


def drop_older_spills(sink: FileSink, attempt: int) -> None:
    """Delete this host's spilled part files of attempts before ``attempt``: a job
    attempt starts only after every task of the earlier ones has stopped, so what they
    left is from a crash (the committer's cleanup cannot see a host's local disk)."""
    root = spill_root(sink)
    if not os.path.isdir(root):
        return
    for entry in os.scandir(root):
        older = staged_attempt(f"{STAGING_DIR}/{entry.name}/")
        if entry.is_dir() and older is not None and older < attempt:
            shutil.rmtree(entry.path, ignore_errors=True)


class SinkWriter:
    """Writes one task attempt's rows of a :class:`FileSink`. Not thread-safe: one task
    thread calls ``write`` and ``prepare_commit``; file I/O runs on the writer's own
    thread. Use as a context manager or call :meth:`close`."""

    def __init__(self, sink: FileSink, task: int, attempt: int) -> None:
        if task < 0 or attempt < 0:
            raise ValueError(f"task and attempt must be >= 0, got {task}, {attempt}")
        self.sink = sink
        self.task = task
        self.attempt = attempt
        self._store = sink.store()
        if not files.is_local(self._store):
            drop_older_spills(sink, attempt)
        self._format = PartFormat(sink.format, sink.schema)
        self._buffer: list[dict[str, Any]] = []
        self._part: _Part | None = None
        self._pending: deque[Future[None]] = deque()
        self._io = ThreadPoolExecutor(1, thread_name_prefix=f"sink-t{task}-a{attempt}")
        self._failed: BaseException | None = None
        self._last_checkpoint = -1
        self._closed = False

    def write(self, row: dict[str, Any]) -> None:
        """Buffer one row (copied); every ``batch_rows`` rows go to the part file.
        Raises SinkRowError naming a column that cannot be written (the row is dropped,
        the writer stays usable), SinkSchemaError if a batch does not fit the schema,
        StorageError if the part file cannot be written, SinkError after either."""
        self._check_usable()
        check_row(row, self._format.name)
        self._buffer.append(dict(row))
        if len(self._buffer) >= self.sink.batch_rows:
            self._flush_buffer()

    def prepare_commit(self, checkpoint_id: int) -> Committable | None:
        """Phase one at checkpoint ``checkpoint_id``'s barrier: close the current part
        and stage it durably; returns its committable, or None if no rows were written
        since the previous checkpoint. Checkpoint ids must increase. Raises
        StorageError, SinkSchemaError, SinkError (see :meth:`write`)."""
        return self.prepare_commit_async(checkpoint_id).result()

    def prepare_commit_async(self, checkpoint_id: int) -> Future[Committable | None]:
        """:meth:`prepare_commit` with the staging on the I/O thread: the call returns
        at once (rows written afterwards go to a new part), the future resolves once the
        staged file is durable. Lets a task go on processing during the upload."""
        self._check_usable()
        if checkpoint_id <= self._last_checkpoint:
            raise ValueError(f"checkpoint {checkpoint_id} after {self._last_checkpoint}")
        self._last_checkpoint = checkpoint_id
        if self._buffer:
            self._flush_buffer()
        part, self._part = self._part, None
        if part is None:
            done: Future[Committable | None] = Future()
            done.set_result(None)
            return done
        staging: Future[Committable | None] = self._io.submit(self._stage, part, checkpoint_id)
        staging.add_done_callback(self._note_failure)
        return staging

    def close(self) -> None:
        """Drop rows not yet staged (their checkpoint never came) and stop the I/O
        thread. Staged files stay for the committer. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        part, self._part = self._part, None
        if part is not None:
            self._io.submit(part.discard)
        self._io.shutdown(wait=True)
        self._buffer.clear()

    def __enter__(self) -> SinkWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note_failure(self, done: Future[Committable | None]) -> None:
        if done.exception() is not None:
            self._failed = done.exception()

    def _check_usable(self) -> None:
        if self._closed:
            raise SinkError(f"sink writer of task {self.task} is closed")
        if self._failed is not None:
            raise SinkError(f"sink writer of task {self.task} failed earlier") from self._failed

    def _flush_buffer(self) -> None:
        rows, self._buffer = self._buffer, []
        try:
            payload = self._format.payload(rows)
        except Exception as e:
            self._failed = e
            raise
        if self._part is None:
            self._part = _Part(self._store, self._format, self._spill_path())
        self._part.rows += len(rows)
        self._submit(self._part.write, payload)

    def _submit(self, fn: Any, payload: Any) -> None:
        """Queue ``fn(payload)`` on the I/O thread, first waiting while the queue is full."""
        while self._pending and (
            self._pending[0].done() or len(self._pending) >= self.sink.max_pending_batches
        ):
            error = self._pending.popleft().exception()
            if error is not None:
                self._failed = error
                raise error
        self._pending.append(self._io.submit(fn, payload))

    def _spill_path(self) -> str:
        name = in_progress_name(self.task, self.attempt, self.sink.extension)
        if files.is_local(self._store):
            return self._store.join(name)
        return os.path.join(spill_root(self.sink), name.removeprefix(STAGING_DIR + "/"))

    def _stage(self, part: _Part, checkpoint_id: int) -> Committable | None:
        ext = self.sink.extension
        staged = staged_name(checkpoint_id, self.task, self.attempt, ext)
        final = final_name(checkpoint_id, self.task, self.attempt, ext)
        size, upload = part.stage(self._store.join(staged), self._store.join(final))
        c = Committable(checkpoint_id, self.task, self.attempt, staged, final, part.rows, size)
        if upload is not None:
            upload_id, parts = upload
            c = dataclasses.replace(c, upload_id=upload_id, parts=tuple(parts))
            try:
                c.validate()  # what the store returned goes out in the acknowledgement
            except ValueError as e:
                with contextlib.suppress(Exception):  # the committer's cleanup retries
                    multipart.abort(self._store, self._store.join(final), upload_id)
                raise SinkError(f"the store's multipart upload cannot be committed: {e}") from e
        return c
