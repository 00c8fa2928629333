"""Sources with resumable offsets (FLIP-27 style): the interface in
dstltree.sparkplug.sources.base, the listing enumerator and its assignment policy,
``FileSource`` (parquet, csv, json lines under any fsspec URL) and ``MemorySource``."""

from dstltree.sparkplug.sources.base import (
    EnumeratorState,
    Listing,
    Record,
    Source,
    SourceError,
    Split,
    SplitEnumerator,
    SplitReader,
    SplitState,
)
from dstltree.sparkplug.sources.enumerator import ListingEnumerator
from dstltree.sparkplug.sources.files import FileSource, FileSplitReader, list_files
from dstltree.sparkplug.sources.memory import MemorySource, MemorySplitReader
from dstltree.sparkplug.sources.values import plain, plain_record

__all__ = [
    "EnumeratorState",
    "FileSource",
    "FileSplitReader",
    "Listing",
    "ListingEnumerator",
    "MemorySource",
    "MemorySplitReader",
    "Record",
    "Source",
    "SourceError",
    "Split",
    "SplitEnumerator",
    "SplitReader",
    "SplitState",
    "list_files",
    "plain",
    "plain_record",
]
