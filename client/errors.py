"""Errors of the changelog client. The storage errors (and the common base DstlError) are
defined by the storage boundary, :mod:`dstltree.storage.errors`, and re-exported here."""

from __future__ import annotations

from dstltree.storage.errors import DstlError, RetryableStorageError, StorageError

__all__ = [
    "CorruptObjectError",
    "DstlError",
    "PersistError",
    "RetryableStorageError",
    "StorageError",
    "WireError",
]


class CorruptObjectError(DstlError):
    """An object or segment failed a checksum, magic or length check.

    ``path`` is the object path and ``offset`` the byte offset where the bad part starts.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt object {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class WireError(DstlError):
    """A message could not be decoded or failed validation (malformed or oversized)."""


class PersistError(DstlError):
    """A persist request could not be made durable by any route; changes are kept."""
