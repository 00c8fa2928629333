"""The uploader protocol: how a writer sends encoded segments somewhere durable."""

from __future__ import annotations

from typing import Protocol

from dstltree.client.batching import PersistItem
from dstltree.client.futures import UploadFuture
from dstltree.client.handle import SegmentRef


class SegmentUploader(Protocol):
    """Makes segments durable. ``submit`` returns a future of the segment's reference
    (None for a marker item with no data): a :class:`~dstltree.client.futures.SegmentFuture`
    from this package's uploaders, any :class:`UploadFuture` (a ``concurrent.futures``
    one too) from others. Futures fail with PersistError or StorageError; the writer
    keeps the changes and re-uploads them on the next persist."""

    def register(self, log_id: str) -> None: ...

    def unregister(self, log_id: str) -> None: ...

    def submit(self, item: PersistItem) -> UploadFuture[SegmentRef | None]: ...

    def close(self) -> None: ...
