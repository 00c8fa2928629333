"""Errors of the changelog client. Storage errors keep the fsspec/OS cause chained."""

from __future__ import annotations


class DstlError(Exception):
    """Base class of every dstltree error."""


class CorruptObjectError(DstlError):
    """An object or segment failed a checksum, magic or length check.

    ``path`` is the object path and ``offset`` the byte offset where the bad part starts.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt object {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class StorageError(DstlError):
    """A DFS operation failed; ``path`` names the object, ``op`` the operation."""

    retryable: bool = False

    def __init__(self, op: str, path: str, detail: str) -> None:
        super().__init__(f"{op} {path}: {detail}")
        self.op = op
        self.path = path


class RetryableStorageError(StorageError):
    """A transient DFS failure (throttling, 5xx, timeout, connection reset)."""

    retryable = True


class WireError(DstlError):
    """A message could not be decoded or failed validation (malformed or oversized)."""


class PersistError(DstlError):
    """A persist request could not be made durable by any route; changes are kept."""
