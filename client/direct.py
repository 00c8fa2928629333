"""The in-process uploader: writes segments straight to DFS, no node involved.

With ``persist_delay=0`` and a tiny target every segment becomes its own object (the
flat, Spark-RocksDB-changelog-style baseline, design ``task``); with a delay it batches
all writers of this process into one object per flush (Flink DSTL style, design
``executor``). It is also the fallback route of the node uploader.

:func:`write_items` and :func:`start_items` are the one place where persist items become
an object; the node's writer (aggregator/object_writer.py) calls them too.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from dstltree.client.batching import Batch, LocalOrigin, PersistItem
from dstltree.client.errors import DstlError
from dstltree.client.futures import SegmentFuture
from dstltree.client.handle import SegmentRef
from dstltree.client.objectformat import DIRECT_WRITER, FORMAT_VERSION, build_object
from dstltree.storage.errors import StorageError
from dstltree.storage.hedging import HedgedUploader, Outcome, ReusableThreads, UploadPolicy
from dstltree.storage.store import ObjectStore

#: a written object: its URL and one ref per data item (:func:`write_items`)
Written = tuple[str, list[SegmentRef]]


def write_items(
    uploader: HedgedUploader,
    items: Sequence[PersistItem],
    version: int = FORMAT_VERSION,
    writer: str = DIRECT_WRITER,
) -> tuple[str, list[SegmentRef]]:
    """Write the items that carry data as ONE object (segments back to back, index,
    footer: ``build_object``, format ``version``, written by ``writer``) with
    ``uploader``, whose policy hedges the upload (storage/hedging.py). Returns the
    object URL and one ref per data item, in order; the refs name the winning attempt's
    object only. Blocking. Raises StorageError."""
    with_data = [i for i in items if i.data is not None]
    segments = [(i.meta, i.data) for i in with_data if i.data is not None]
    parts, offsets = build_object(segments, version, writer)
    path = uploader.upload(parts).path
    refs = [SegmentRef(i.meta, path, o) for i, o in zip(with_data, offsets, strict=True)]
    return path, refs


def start_items(
    uploader: HedgedUploader,
    items: Sequence[PersistItem],
    on_done: Callable[[Written | StorageError], None],
    version: int = FORMAT_VERSION,
    writer: str = DIRECT_WRITER,
) -> None:
    """Like :func:`write_items`, but the upload's first attempt runs on the calling
    thread (:meth:`HedgedUploader.start`): returns when it has ended, and ``on_done``
    gets ``(url, refs)`` or the StorageError once, as soon as the upload is decided,
    on the thread that decides it (maybe before this returns). Raises what building
    the object raises (nothing is started then)."""
    with_data = [i for i in items if i.data is not None]
    segments = [(i.meta, i.data) for i in with_data if i.data is not None]
    parts, offsets = build_object(segments, version, writer)

    def done(outcome: Outcome) -> None:
        if isinstance(outcome, StorageError):
            on_done(outcome)
            return
        path = outcome.path
        on_done(
            (path, [SegmentRef(i.meta, path, o) for i, o in zip(with_data, offsets, strict=True)])
        )

    uploader.start(parts, done)


class DirectUploader:
    """Batches persist items of this process and writes them to ``store``.

    Uploads go through :attr:`hedged`, a HedgedUploader with ``upload_policy`` (default
    UploadPolicy()) created here, so its statistics are this uploader's alone. An owner
    of several uploaders may pass its own ``hedged`` instead, to share one (then
    ``upload_policy`` is not used).

    A batch due at once (``persist_delay`` 0, or the batch full) is handed by the
    submitting thread itself to a write thread; a batch due later, by the batching
    thread at its deadline. Write threads are reused (a new one only when none is idle,
    so an attempt that hangs never holds up another object) and run each object's first
    attempt themselves (:func:`start_items`, as a node's do); at most ``upload_threads``
    objects are undecided at once, the others wait in order. The futures resolve as
    soon as an attempt wins or the upload fails."""

    def __init__(
        self,
        store: ObjectStore,
        persist_delay: float = 0.0,
        target_bytes: int = 1,
        upload_threads: int = 4,
        upload_policy: UploadPolicy | None = None,
        hedged: HedgedUploader | None = None,
    ) -> None:
        self.store = store
        self.hedged = hedged or HedgedUploader(store, upload_policy)
        self._batch = Batch(target_bytes=target_bytes, persist_delay=persist_delay)
        self._writers: set[str] = set()
        self._cond = threading.Condition()
        self._threads = ReusableThreads("dstl-upload")
        self._upload_threads = max(1, upload_threads)
        self._running = 0  # objects started and not yet decided
        self._waiting: deque[list[PersistItem]] = deque()  # batches waiting for a slot
        self._closed = False
        self.objects_written = 0
        self.requests = 0
        self._thread = threading.Thread(target=self._run, name="dstl-direct", daemon=True)
        self._thread.start()

    def register(self, log_id: str) -> None:
        with self._cond:
            self._writers.add(log_id)

    def unregister(self, log_id: str) -> None:
        with self._cond:
            self._writers.discard(log_id)
            self._cond.notify()

    def submit(self, item: PersistItem) -> SegmentFuture[SegmentRef | None]:
        fut: SegmentFuture[SegmentRef | None] = SegmentFuture()
        if item.data is None:
            fut.set_result(None)
        item = item.from_origin(LocalOrigin(fut))
        with self._cond:
            if self._closed:
                raise DstlError("uploader is closed")
            now = time.monotonic()
            self._batch.add(item, now)
            reason = self._batch.due(now, len(self._writers))
            if reason:  # due at once: no hand-off to the batching thread
                self._start(self._batch.take(reason, len(self._writers)))
            if self._batch.items:
                self._cond.notify()  # the batching thread watches the deadline
        return fut

    def _run(self) -> None:
        with self._cond:
            while not self._closed or self._batch.items:
                now = time.monotonic()
                reason = self._batch.due(now, len(self._writers))
                if self._closed or reason:
                    self._start(self._batch.take(reason, len(self._writers)))
                    continue
                deadline = self._batch.deadline()
                self._cond.wait(None if deadline is None else max(deadline - now, 0.0))

    def _start(self, items: list[PersistItem]) -> None:
        """Queue the batch ``items`` (its items with data) and start the waiting
        batches while slots are free. Caller holds ``_cond``."""
        data_items = [i for i in items if i.data is not None]
        if data_items:
            self._waiting.append(data_items)
        while self._waiting and self._running < self._upload_threads:
            self._running += 1
            self.requests += 1
            self._threads.submit(functools.partial(self._flush, self._waiting.popleft()))

    def _flush(self, data_items: list[PersistItem]) -> None:
        """Write one object (its first attempt on this thread); the futures resolve
        from whichever thread decides the upload, which then frees the slot."""

        def done(outcome: Written | BaseException) -> None:
            if isinstance(outcome, BaseException):
                for i in data_items:
                    i.future().set_exception(outcome)
            else:
                with self._cond:  # counted before the futures resolve, by one thread at a time
                    self.objects_written += 1
                for i, ref in zip(data_items, outcome[1], strict=True):
                    i.future().set_result(ref)
            with self._cond:
                self._running -= 1
                self._start([])
                if self._closed:
                    self._cond.notify_all()  # close() waits for the last one

        try:
            start_items(self.hedged, data_items, done)
        except BaseException as e:  # noqa: BLE001 - building failed: nothing started
            done(e)

    def close(self) -> None:
        """Flush what is pending, wait for uploads, stop the thread. Blocking."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)
        with self._cond:
            while self._running or self._waiting:
                self._cond.wait()
