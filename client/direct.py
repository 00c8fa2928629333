"""The in-process uploader: writes segments straight to DFS, no node involved.

With ``persist_delay=0`` and a tiny target every segment becomes its own object (the
flat, Spark-RocksDB-changelog-style baseline, design ``task``); with a delay it batches
all writers of this process into one object per flush (Flink DSTL style, design
``executor``). It is also the fallback route of the node uploader.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from client.batching import Batch, PersistItem
from client.errors import DstlError
from client.handle import SegmentRef
from client.hedging import UploadPolicy, uploader_for
from client.objectformat import build_object
from client.storage import ObjectStore


def write_items(
    store: ObjectStore, items: list[PersistItem], policy: UploadPolicy | None = None
) -> tuple[str, list[SegmentRef]]:
    """Write the data items as ONE object; returns its URL and one ref per item, in
    order. Blocking. The upload is hedged per ``policy`` (default UploadPolicy():
    a new attempt under a new name after 1 s, 3 attempts; see client.hedging): the refs
    name the winning attempt's object only. Statistics accumulate in
    ``client.hedging.uploader_for(store, policy).stats``. Raises StorageError."""
    with_data = [i for i in items if i.data is not None]
    parts, entries = build_object([i.segment_input() for i in with_data])
    path = uploader_for(store, policy).upload(parts).path
    refs = [
        SegmentRef(i.sqn_from, i.sqn_to, path, e.offset, e.length, e.crc32, i.key_groups)
        for i, e in zip(with_data, entries, strict=True)
    ]
    return path, refs


class DirectUploader:
    """Batches persist items of this process and writes them to ``store``."""

    def __init__(
        self,
        store: ObjectStore,
        persist_delay: float = 0.0,
        target_bytes: int = 1,
        upload_threads: int = 4,
        upload_policy: UploadPolicy | None = None,
    ) -> None:
        self.store = store
        self.upload_policy = upload_policy
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

    def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
        fut: Future[SegmentRef | None] = Future()
        if item.data is None:
            fut.set_result(None)
        item.token = fut
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
            _, refs = write_items(self.store, data_items, self.upload_policy)
            self.objects_written += 1
        except BaseException as e:  # noqa: BLE001 - every failure goes to the futures
            for i in data_items:
                i.token.set_exception(e)
            return
        for i, ref in zip(data_items, refs, strict=True):
            i.token.set_result(ref)

    def close(self) -> None:
        """Flush what is pending, wait for uploads, stop the thread. Blocking."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)
