"""The in-process uploader: writes segments straight to DFS, no node involved.

With ``persist_delay=0`` and a tiny target every segment becomes its own object (the
flat, Spark-RocksDB-changelog-style baseline, design ``task``); with a delay it batches
all writers of this process into one object per flush (Flink DSTL style, design
``executor``). It is also the fallback route of the node uploader.

:func:`write_items` and :func:`start_items` are the one place where persist items become
an object; the node's writer (aggregator/object_writer.py) calls them too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from dstltree.client.batching import Batch, LocalOrigin, PersistItem
from dstltree.client.errors import DstlError
from dstltree.client.futures import SegmentFuture
from dstltree.client.handle import SegmentRef
from dstltree.client.objectformat import build_object
from dstltree.storage.errors import StorageError
from dstltree.storage.hedging import HedgedUploader, Outcome, UploadPolicy
from dstltree.storage.store import ObjectStore

#: a written object: its URL and one ref per data item (:func:`write_items`)
Written = tuple[str, list[SegmentRef]]


def write_items(
    uploader: HedgedUploader, items: Sequence[PersistItem]
) -> tuple[str, list[SegmentRef]]:
    """Write the items that carry data as ONE object (segments back to back, index,
    footer: ``build_object``) with ``uploader``, whose policy hedges the upload
    (storage/hedging.py). Returns the object URL and one ref per data item, in order;
    the refs name the winning attempt's object only. Blocking. Raises StorageError."""
    with_data = [i for i in items if i.data is not None]
    parts, offsets = build_object([(i.meta, i.data) for i in with_data if i.data is not None])
    path = uploader.upload(parts).path
    refs = [SegmentRef(i.meta, path, o) for i, o in zip(with_data, offsets, strict=True)]
    return path, refs


def start_items(
    uploader: HedgedUploader,
    items: Sequence[PersistItem],
    on_done: Callable[[Written | StorageError], None],
) -> None:
    """Like :func:`write_items`, but the upload's first attempt runs on the calling
    thread (:meth:`HedgedUploader.start`): returns when it has ended, and ``on_done``
    gets ``(url, refs)`` or the StorageError once, as soon as the upload is decided,
    on the thread that decides it (maybe before this returns). Raises what building
    the object raises (nothing is started then)."""
    with_data = [i for i in items if i.data is not None]
    parts, offsets = build_object([(i.meta, i.data) for i in with_data if i.data is not None])

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
    ``upload_policy`` is not used)."""

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
        self._pool = ThreadPoolExecutor(upload_threads, thread_name_prefix="dstl-upload")
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
            self._batch.add(item, time.monotonic())
            self._cond.notify()
        return fut

    def _run(self) -> None:
        with self._cond:
            while not self._closed or self._batch.items:
                now = time.monotonic()
                reason = self._batch.due(now, len(self._writers))
                if self._closed or reason:
                    items = self._batch.take(reason, len(self._writers))
                    self._pool.submit(self._flush, items)
                    continue
                deadline = self._batch.deadline()
                self._cond.wait(None if deadline is None else max(deadline - now, 0.0))

    def _flush(self, items: list[PersistItem]) -> None:
        data_items = [i for i in items if i.data is not None]
        if not data_items:
            return
        try:
            self.requests += 1
            # blocking upload (attempts on attempt threads): this pool thread is free
            # again once the upload is decided, even while an attempt hangs
            _, refs = write_items(self.hedged, data_items)
            self.objects_written += 1
        except BaseException as e:  # noqa: BLE001 - every failure goes to the futures
            for i in data_items:
                i.future().set_exception(e)
            return
        for i, ref in zip(data_items, refs, strict=True):
            i.future().set_result(ref)

    def close(self) -> None:
        """Flush what is pending, wait for uploads, stop the thread. Blocking."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)
