"""The StateChangelog API of FLIP-158 for one task: writers, SQNs, handles, the object
format and its reader, the wire messages."""

# importing the fault-injecting filesystem registers fsspec's "faulty" protocol, so that
# ``faulty::file:///...`` base paths work in every process (nodes included)
from client import faults as _faults  # noqa: F401
from client.api import ChangelogClient
from client.errors import (
    CorruptObjectError,
    DstlError,
    PersistError,
    RetryableStorageError,
    StorageError,
    WireError,
)
from client.handle import ChangelogHandle, SegmentRef
from client.storage import ObjectStore
from client.writer import ChangelogWriter

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
