"""Errors of the storage boundary. Every error of dstltree derives from :class:`DstlError`;
storage errors keep the fsspec/OS cause chained (``raise ... from e``)."""

from __future__ import annotations


class DstlError(Exception):
    """Base class of every dstltree error."""


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
