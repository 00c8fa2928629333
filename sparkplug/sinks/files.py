"""File operations of the sink on top of :class:`dstltree.storage.store.ObjectStore`:
what the store does not offer (streamed upload of a local file, rename, server-side
copy; S3 multipart uploads in sinks/multipart.py) runs through the store's retry
policy and error translation (:func:`run`), so every failure leaves as
:class:`dstltree.storage.errors.StorageError` (``RetryableStorageError`` for transient
ones, retried first).

What is atomic where, and so how each store stages and commits:

- local/POSIX: ``os.replace`` of a file within one filesystem is atomic; the sink
  fsyncs a file before renaming it and the folder after, so a renamed file is durable.
  Staging renames the part file to its staged name; the commit renames that to the
  final name.
- S3 (an s3fs ``S3FileSystem``): there is no rename, but CompleteMultipartUpload makes
  a whole object visible at once, and an open upload is invisible (no listing, GET or
  HEAD sees it) while its uploaded parts are durable. Staging uploads the part file as
  the parts of a multipart upload at the FINAL key and leaves it open; the commit
  completes it: one request per file, no copy, no delete (sinks/multipart.py).
- other object stores (and staged-file committables on S3 written before multipart
  staging): a single PUT and a server-side copy (CopyObject, or multipart copy above
  5 GB) each make the whole object visible at once or not at all. Staging uploads the
  part file to its staged name; the commit is :func:`move`, copy then delete, which is
  NOT atomic as a pair: after a crash between the two both objects exist, which the
  committer's idempotence rules settle (sinks/committer.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from fsspec.implementations.local import LocalFileSystem

from dstltree.storage.store import ObjectStore

T = TypeVar("T")


def is_local(store: ObjectStore) -> bool:
    """Whether the store is the bare local filesystem (rename is atomic there)."""
    return isinstance(store.fs, LocalFileSystem)


def run(store: ObjectStore, op: str, url: str, fn: Callable[[], T]) -> T:
    """``fn`` under the store's retry policy; errors leave as StorageError."""
    return store._call(op, url, fn)


def fsync_dir(path: str) -> None:
    """Make a rename or creation inside folder ``path`` durable (POSIX)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_local(src: str, dst: str) -> None:
    """Atomic rename of a local file (parents of ``dst`` created), made durable."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.replace(src, dst)
    fsync_dir(os.path.dirname(dst))


def upload(store: ObjectStore, local_path: str, url: str) -> None:
    """Put a local file at ``url`` (streamed; s3fs uses a multipart upload for large
    files, visible only once complete). Raises StorageError."""
    run(store, "put", url, lambda: store.fs.put_file(local_path, url))


def move(store: ObjectStore, src: str, dst: str) -> None:
    """Move ``src`` to ``dst``: an atomic rename locally, copy then delete elsewhere
    (the copy is atomic for ``dst``, the pair is not). Raises StorageError."""
    if is_local(store):
        run(store, "rename", src, lambda: rename_local(src, dst))
        return
    run(store, "copy", src, lambda: store.fs.copy(src, dst))
    store.delete([src])
