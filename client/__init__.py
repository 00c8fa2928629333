"""The StateChangelog API of FLIP-158 for one task: writers, SQNs, handles, the object
format and its reader, the wire messages. The storage boundary below it
(:class:`ObjectStore` and the storage errors) is :mod:`dstltree.storage`, re-exported
here."""

from dstltree.client.api import ChangelogClient
from dstltree.client.errors import (
    CorruptObjectError,
    DstlError,
    PersistError,
    RetryableStorageError,
    StorageError,
    WireError,
)
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.writer import ChangelogWriter
from dstltree.storage.store import ObjectStore

__all__ = [
    "ChangelogClient",
    "ChangelogHandle",
    "ChangelogWriter",
    "CorruptObjectError",
    "DstlError",
    "ObjectStore",
    "PersistError",
    "RetryableStorageError",
    "SegmentRef",
    "StorageError",
    "WireError",
]
