"""The object format: many writers' segments in one DFS object.

Layout::

    segment_0 | segment_1 | ... | index (msgpack) | footer (28 bytes)

The index is ``{"v": 1, "segments": [[log_id, sqn_from, sqn_to, [key_groups], offset,
length, crc32], ...]}``. The footer is ``magic (8 bytes) | version u16 | reserved u16 |
index_offset u64 | index_length u32 | index_crc32 u32`` (big-endian), so a reader finds
the index with one range read of the tail. Segment bytes are written as received:
nodes never re-encode them.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from client.errors import CorruptObjectError

MAGIC = b"DSTLTREE"
FORMAT_VERSION = 1
FOOTER = struct.Struct("!8sHHQII")
FOOTER_SIZE = FOOTER.size
OBJECT_SUFFIX = ".dstl"

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class IndexEntry:
    """One segment as listed in an object's index (offset/length in bytes)."""

    log_id: str
    sqn_from: int
    sqn_to: int
    key_groups: tuple[int, ...]
    offset: int
    length: int
    crc32: int


@dataclass(frozen=True)
class SegmentInput:
    """A segment to place in an object: its raw bytes plus the index metadata."""

    log_id: str
    sqn_from: int
    sqn_to: int
    key_groups: tuple[int, ...]
    data: Buffer
    crc32: int


def build_object(segments: Sequence[SegmentInput]) -> tuple[list[Buffer], list[IndexEntry]]:
    """Lay out ``segments`` back to back, then the index and footer.

    Returns the parts to write in order (segment buffers are not copied) and the index
    entries, whose offsets are where each segment lands in the object.
    """
    parts: list[Buffer] = []
    entries: list[IndexEntry] = []
    pos = 0
    for s in segments:
        n = len(s.data)
        entries.append(IndexEntry(s.log_id, s.sqn_from, s.sqn_to, s.key_groups, pos, n, s.crc32))
        parts.append(s.data)
        pos += n
    index = msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "segments": [
                [e.log_id, e.sqn_from, e.sqn_to, list(e.key_groups), e.offset, e.length, e.crc32]
                for e in entries
            ],
        }
    )
    parts.append(index)
    parts.append(FOOTER.pack(MAGIC, FORMAT_VERSION, 0, pos, len(index), zlib.crc32(index)))
    return parts, entries


def parse_footer(tail: Buffer, path: str, object_size: int) -> tuple[int, int, int]:
    """Check the footer (the last FOOTER_SIZE bytes); returns (index_offset, index_length,
    index_crc32). Raises CorruptObjectError naming the path and offset."""
    footer_at = object_size - FOOTER_SIZE
    if object_size < FOOTER_SIZE or len(tail) != FOOTER_SIZE:
        raise CorruptObjectError(path, max(footer_at, 0), "object too short for a footer")
    magic, version, _, index_offset, index_length, index_crc = FOOTER.unpack(tail)
    if magic != MAGIC:
        raise CorruptObjectError(path, footer_at, f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise CorruptObjectError(path, footer_at, f"unsupported format version {version}")
    if index_offset + index_length != footer_at:
        raise CorruptObjectError(path, footer_at, "index bounds do not match object size")
    return index_offset, index_length, index_crc


def parse_index(data: Buffer, path: str, index_offset: int, crc: int) -> list[IndexEntry]:
    """Verify and decode an object index read from ``index_offset``."""
    if zlib.crc32(data) != crc:
        raise CorruptObjectError(path, index_offset, "index checksum mismatch")
    try:
        raw = msgpack.unpackb(data)
        return [
            IndexEntry(str(a), int(b), int(c), tuple(int(k) for k in d), int(e), int(f), int(g))
            for a, b, c, d, e, f, g in raw["segments"]
        ]
    except Exception as e:  # noqa: BLE001 - any decode failure is corruption here
        raise CorruptObjectError(path, index_offset, f"bad index: {e}") from e
