"""The DFS boundary: every object-store access goes through :class:`ObjectStore`.

Storage is addressed only by fsspec URLs plus ``storage_options`` (``/tmp/x``,
``file:///tmp/x``, ``s3://bucket/prefix``, ``memory://x``). fsspec and OS errors are
translated here into :class:`StorageError` (or :class:`RetryableStorageError` for
throttling, 5xx, timeouts and connection resets) with the cause chained.
"""

from __future__ import annotations

import errno
import posixpath
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from client.errors import CorruptObjectError, RetryableStorageError, StorageError
from client.objectformat import (
    FOOTER_SIZE,
    OBJECT_SUFFIX,
    Buffer,
    IndexEntry,
    parse_footer,
    parse_index,
)

CHANGELOG_DIR = "changelog"
SNAPSHOT_DIR = "materialized"
SNAPSHOT_SUFFIX = ".snap"
CHECKPOINT_DIR = "checkpoints"
_RETRYABLE_ERRNOS = {
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.EAGAIN,
}
_RETRYABLE_WORDS = (
    "slowdown",
    "throttl",
    "timeout",
    "timed out",
    "reset",
    "503",
    "500",
    "internalerror",
    "serviceunavailable",
)


def translate(op: str, path: str, e: BaseException) -> StorageError:
    """Map an fsspec/OS/botocore error to a StorageError; retryable ones to
    RetryableStorageError. The caller raises it ``from e``."""
    if isinstance(e, StorageError):
        return e
    text = f"{type(e).__name__}: {e}"
    retryable = isinstance(e, TimeoutError | ConnectionError) or (
        isinstance(e, OSError) and e.errno in _RETRYABLE_ERRNOS
    )
    if not retryable and not isinstance(e, FileNotFoundError | PermissionError):
        lowered = text.lower()
        retryable = any(w in lowered for w in _RETRYABLE_WORDS)
    cls = RetryableStorageError if retryable else StorageError
    return cls(op, path, text)


class ObjectStore:
    """Objects under one base path. Paths handed out and accepted are full URLs
    (plain absolute paths for the local filesystem).

    ``fs`` may be given to wrap the filesystem (fault injection); otherwise it is built
    from ``base_path`` and ``storage_options``.
    """

    def __init__(
        self,
        base_path: str,
        storage_options: dict[str, Any] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
    ) -> None:
        opts = dict(storage_options or {})
        if fs is None:
            fs, root = fsspec.core.url_to_fs(base_path, **opts)
        else:
            root = fs._strip_protocol(base_path)
        self.fs: fsspec.AbstractFileSystem = fs
        self.storage_options = opts
        self._local = isinstance(fs, LocalFileSystem)
        self.root: str = str(root).rstrip("/") or "/"
        self.base_url = self.url(self.root)

    # -- paths -------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """The full URL of a filesystem path (local paths stay plain)."""
        if self._local:
            return str(self.fs._strip_protocol(path))
        return str(self.fs.unstrip_protocol(path))

    def _path(self, url: str) -> str:
        return str(self.fs._strip_protocol(url))

    def join(self, *parts: str) -> str:
        return self.url(posixpath.join(self.root, *parts))

    def new_object_path(self) -> str:
        """A fresh changelog object URL derived from a random id (never from user input);
        a two-hex-digit prefix spreads objects over store partitions."""
        oid = uuid.uuid4().hex
        return self.join(CHANGELOG_DIR, oid[:2], oid + OBJECT_SUFFIX)

    def new_snapshot_path(self) -> str:
        """A fresh URL for a materialized-state snapshot (random id, like objects)."""
        oid = uuid.uuid4().hex
        return self.join(SNAPSHOT_DIR, oid[:2], oid + SNAPSHOT_SUFFIX)

    def changelog_root(self) -> str:
        return self.join(CHANGELOG_DIR)

    # -- writes ------------------------------------------------------------------------
    def put(self, url: str, parts: Sequence[Buffer] | Buffer) -> int:
        """Write a whole object atomically (readers see all of it or nothing).
        Returns its size in bytes. Raises StorageError."""
        chunks = [parts] if isinstance(parts, bytes | bytearray | memoryview) else list(parts)
        path = self._path(url)
        try:
            if self._local:
                return self._put_local(path, chunks)
            data = b"".join(chunks)
            self.fs.pipe_file(path, data)
            return len(data)
        except Exception as e:
            raise translate("put", url, e) from e

    def _put_local(self, path: str, chunks: list[Buffer]) -> int:
        parent = posixpath.dirname(path)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        size = 0
        try:
            with open(tmp, "wb") as f:
                for c in chunks:
                    size += f.write(c)
            self.fs.mv(tmp, path)
        except BaseException:
            self.fs.rm(tmp) if self.fs.exists(tmp) else None
            raise
        return size

    def delete(self, urls: Iterable[str]) -> list[str]:
        """Delete objects; missing ones are ignored. Returns the URLs deleted."""
        done = []
        for url in urls:
            try:
                self.fs.rm_file(self._path(url))
                done.append(url)
            except FileNotFoundError:
                continue
            except Exception as e:
                raise translate("delete", url, e) from e
        return done

    # -- reads -------------------------------------------------------------------------
    def read(self, url: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self._path(url)))
        except Exception as e:
            raise translate("read", url, e) from e

    def read_range(self, url: str, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset``; raises CorruptObjectError if the object
        ends early (a truncated object) and StorageError for storage failures."""
        try:
            data = bytes(self.fs.cat_file(self._path(url), start=offset, end=offset + length))
        except Exception as e:
            raise translate("read", url, e) from e
        if len(data) != length:
            raise CorruptObjectError(
                url,
                offset + len(data),
                f"truncated: wanted {length} bytes at {offset}, got {len(data)}",
            )
        return data

    def size(self, url: str) -> int:
        try:
            return int(self.fs.size(self._path(url)))
        except Exception as e:
            raise translate("stat", url, e) from e

    def exists(self, url: str) -> bool:
        try:
            return bool(self.fs.exists(self._path(url)))
        except Exception as e:
            raise translate("stat", url, e) from e

    def list_files(self, prefix_url: str, suffix: str = "") -> list[str]:
        """URLs of every file below ``prefix_url`` ending in ``suffix`` (sorted)."""
        path = self._path(prefix_url)
        try:
            if not self.fs.exists(path):
                return []
            found = self.fs.find(path)
        except Exception as e:
            raise translate("list", prefix_url, e) from e
        return sorted(self.url(p) for p in found if p.endswith(suffix))

    def list_objects(self) -> list[str]:
        """Every changelog object under the base path."""
        return self.list_files(self.changelog_root(), OBJECT_SUFFIX)

    def list_snapshots(self) -> list[str]:
        """Every materialized-state snapshot under the base path."""
        return self.list_files(self.join(SNAPSHOT_DIR), SNAPSHOT_SUFFIX)

    def read_index(self, url: str) -> list[IndexEntry]:
        """The segment index of an object (two range reads). Raises CorruptObjectError."""
        size = self.size(url)
        if size < FOOTER_SIZE:
            raise CorruptObjectError(url, 0, f"object of {size} bytes is too short for a footer")
        tail = self.read_range(url, size - FOOTER_SIZE, FOOTER_SIZE)
        index_offset, index_length, crc = parse_footer(tail, url, size)
        data = self.read_range(url, index_offset, index_length)
        return parse_index(data, url, index_offset, crc)
