"""The node's object writer: many writers' segments as one DFS object, uploaded with
request hedging (FLIP-158, "Request hedging"; storage/hedging.py).

Each :class:`dstltree.aggregator.node.Node` creates its own :class:`ObjectWriter` in its
constructor: the hedged uploader, its statistics and its latency history (adaptive
upload timeout) belong to that node, never to a process-wide registry, so two nodes in
one process with different upload policies share nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dstltree.client.batching import PersistItem
from dstltree.client.direct import Written, start_items, write_items
from dstltree.client.handle import SegmentRef
from dstltree.client.objectformat import DIRECT_WRITER, FORMAT_VERSION, FORMAT_VERSIONS
from dstltree.storage.errors import StorageError
from dstltree.storage.hedging import HedgedUploader, UploadPolicy
from dstltree.storage.store import ObjectStore

__all__ = ["ObjectWriter"]


class ObjectWriter:
    """Writes objects to ``store``, each upload hedged per ``policy`` (default
    UploadPolicy(): 3 attempts, a new attempt under a new name after 1 s), in object
    format ``object_format`` (client/objectformat.py; 2 names ``node_id`` as the
    object's writer). Thread-safe: the node calls :meth:`start` from its upload
    threads, never from its event loop. Raises ValueError for an unknown format."""

    def __init__(
        self,
        store: ObjectStore,
        policy: UploadPolicy | None = None,
        object_format: int = FORMAT_VERSION,
        node_id: str = DIRECT_WRITER,
    ) -> None:
        if object_format not in FORMAT_VERSIONS:
            raise ValueError(f"object format {object_format}: known {FORMAT_VERSIONS}")
        self.store = store
        self.uploader = HedgedUploader(store, policy, resident=True)  # a node's, for good
        self.object_format = object_format
        self.node_id = node_id

    @property
    def policy(self) -> UploadPolicy:
        return self.uploader.policy

    def write(self, items: Sequence[PersistItem]) -> tuple[str, list[SegmentRef]]:
        """Build one object from the items that carry data (segments back to back,
        index, footer: client/objectformat.py) and upload it. Returns the object URL
        and one ref per data item, in order, naming the winning attempt's object only.
        Blocking. Raises StorageError."""
        return write_items(self.uploader, items, self.object_format, self.node_id)

    def start(
        self, items: Sequence[PersistItem], on_done: Callable[[Written | StorageError], None]
    ) -> None:
        """Like :meth:`write`, the upload's first attempt on the calling thread:
        returns when that attempt has ended; ``on_done`` gets ``(url, refs)`` or the
        StorageError once, as soon as any attempt wins or the upload fails, on the
        thread that decides it (a hedge may win while the first attempt hangs).
        Raises what building the object raises (``on_done`` is not called then)."""
        start_items(self.uploader, items, on_done, self.object_format, self.node_id)

    def upload_stats(self) -> dict[str, int]:
        """This writer's upload counters (``HedgingStats`` fields: uploads, attempts,
        hedged attempts, retries, losers...)."""
        return self.uploader.stats.snapshot()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for running attempts (losers included).
        Returns True if none is left."""
        return self.uploader.drain(timeout)
