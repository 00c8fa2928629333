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
    "UnsupportedVersionError",
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


class UnsupportedVersionError(CorruptObjectError):
    """A file or object names a format version this code does not know (written by a
    newer dstltree, or not ours at all): it is refused, never misread.

    ``path``: the file or object; ``offset``: the byte offset of the version field (0
    for JSON documents); ``kind``: which format (``"object"``, ``"segment"``,
    ``"checkpoint metadata"``...); ``version``: what the file says; ``known``: the
    versions this code reads. A :class:`CorruptObjectError` for callers that treat any
    unreadable object alike."""

    def __init__(
        self, path: str, offset: int, kind: str, version: object, known: tuple[int, ...]
    ) -> None:
        reads = ", ".join(map(str, known))
        reason = (
            f"{kind} format version {version!r} is unknown to this dstltree (it reads "
            f"{reads}); written by a newer version?"
        )
        super().__init__(path, offset, reason)
        self.args = (f"{path}: {reason} (offset {offset})",)
        self.kind = kind
        self.version = version
        self.known = known

    def __str__(self) -> str:
        return str(self.args[0])


class WireError(DstlError):
    """A message could not be decoded or failed validation (malformed or oversized)."""


class PersistError(DstlError):
    """A persist request could not be made durable by any route; changes are kept."""
