"""``FileSource``: every file under an fsspec URL is one split, read with pyarrow.

Discovery (:func:`list_files`), on every ``discover()`` of the enumerator:

- The URL names a directory (local path, ``file://``, ``s3://``, ``memory://``, any
  fsspec protocol); every file below it, at any depth, is a split whose ``id`` is its
  path relative to the URL (``"part-0001.parquet"``, ``"day=1/a.csv"``) and whose
  ``location`` is its full URL. Splits are assigned in ``id`` (name) order.
- Names starting with ``_`` or ``.`` (files or folders on the way: ``_temporary/``,
  ``.part-1.crc``) are ignored, except the marker.
- Files must appear complete (written elsewhere, then renamed or committed; an S3 PUT
  is atomic): a file is read as it is when its split is first read.
- The marker ``_SUCCESS`` directly under the URL (Hadoop's convention, written last by
  Spark and MapReduce jobs) ends discovery: the listing that sees it is the last one,
  and the source is finished once every file of that listing is consumed. Files
  added after that are not read. Without a marker the source never finishes.
- A URL naming a single file is one split, complete at once; a URL that does not
  exist yet lists no split (the directory may appear later).

Reading: dstltree.sparkplug.sources.formats (parquet, csv, json lines).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from dstltree.sparkplug.sources.base import (
    EnumeratorState,
    Listing,
    Record,
    Source,
    SourceError,
    Split,
    SplitEnumerator,
    SplitReader,
)
from dstltree.sparkplug.sources.enumerator import ListingEnumerator
from dstltree.sparkplug.sources.formats import FORMATS, read_file

MARKER = "_SUCCESS"


def list_files(fs: AbstractFileSystem, root: str) -> Listing:
    """The splits under ``root`` on ``fs`` now (rules in the module docstring). Raises
    SourceError if listing fails for another reason than a missing ``root``."""
    fs.invalidate_cache(root)
    try:
        if fs.isfile(root):
            return Listing([Split(root.rsplit("/", 1)[-1], fs.unstrip_protocol(root))], True)
        paths = fs.find(root)
    except FileNotFoundError:
        return Listing([], False)
    except OSError as e:
        raise SourceError(root, f"cannot list: {type(e).__name__}: {e}") from e
    base = root.rstrip("/") + "/"
    splits, complete = [], False
    for path in paths:
        rel = path[len(base) :] if path.startswith(base) else path
        if rel == MARKER:
            complete = True
        elif not any(part.startswith(("_", ".")) for part in rel.split("/")):
            splits.append(Split(rel, fs.unstrip_protocol(path)))
    return Listing(sorted(splits), complete)


class FileSource(Source):
    relists = True  # a directory listing names every file there is

    """Files under ``url`` (an fsspec URL) in ``format`` ``"parquet"``, ``"csv"`` or
    ``"json"`` (JSON lines), one split per file; ``storage_options`` go to the
    filesystem (s3fs: ``endpoint_url``, ``key``, ``secret``, ...); ``schema`` (a
    ``pyarrow.Schema`` of some or all columns) fixes csv and json column types instead
    of inferring them from each file's first block. Records are dicts,
    column -> plain value (dstltree.sparkplug.sources.values). Picklable: it holds the
    parameters only. Raises ValueError for an unknown format."""

    def __init__(
        self,
        url: str,
        format: str = "parquet",
        storage_options: dict[str, Any] | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"format {format!r} is not one of {FORMATS}")
        self.url = url
        self.format = format
        self.storage_options = dict(storage_options or {})
        self.schema = schema

    def _fs(self, url: str) -> tuple[AbstractFileSystem, str]:
        return url_to_fs(url, **self.storage_options)

    def list_splits(self) -> Listing:
        """The files under the URL now (:func:`list_files`)."""
        fs, root = self._fs(self.url)
        return list_files(fs, root)

    def create_enumerator(self, restored_state: EnumeratorState | None = None) -> SplitEnumerator:
        return ListingEnumerator(self.list_splits, restored_state)

    def create_reader(self) -> SplitReader:
        return FileSplitReader(self.format, self.storage_options, self.schema)


class FileSplitReader(SplitReader):
    """Reads a file split (its ``location`` URL) in one format (fsspec caches one
    filesystem instance per protocol and options)."""

    def __init__(
        self, format: str, storage_options: dict[str, Any], schema: pa.Schema | None = None
    ) -> None:
        self.format = format
        self.storage_options = storage_options
        self.schema = schema

    def read(self, split: Split, offset: int) -> Iterator[Record]:
        fs, path = url_to_fs(split.location, **self.storage_options)
        return read_file(fs, path, self.format, offset, self.schema)
