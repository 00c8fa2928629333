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
from typing import Any

import msgpack

from dstltree.client.errors import CorruptObjectError
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.storage.store import Buffer

MAGIC = b"DSTLTREE"
FORMAT_VERSION = 1
FOOTER = struct.Struct("!8sHHQII")
FOOTER_SIZE = FOOTER.size


def build_object(segments: Sequence[tuple[SegmentMeta, Buffer]]) -> tuple[list[Buffer], list[int]]:
    """Lay out the (metadata, bytes) ``segments`` back to back, then the index and footer.

    Returns the parts to write in order (segment buffers are not copied) and the offset
    where each segment lands in the object (its :class:`SegmentRef` once the object's
    path is known). Raises ValueError when a segment's length differs from its bytes.
    """
    parts: list[Buffer] = []
    rows: list[list[Any]] = []
    offsets: list[int] = []
    pos = 0
    for meta, data in segments:
        if len(data) != meta.length:
            raise ValueError(
                f"{meta.log_id}: segment of {len(data)} bytes, meta says {meta.length}"
            )
        rows.append(
            [
                meta.log_id,
                meta.sqn_from,
                meta.sqn_to,
                list(meta.key_groups),
                pos,
                meta.length,
                meta.crc32,
            ]
        )
        offsets.append(pos)
        parts.append(data)
        pos += meta.length
    index = msgpack.packb({"v": FORMAT_VERSION, "segments": rows})
    parts.append(index)
    parts.append(FOOTER.pack(MAGIC, FORMAT_VERSION, 0, pos, len(index), zlib.crc32(index)))
    return parts, offsets


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


def parse_index(data: Buffer, path: str, index_offset: int, crc: int) -> list[SegmentRef]:
    """Verify and decode the index of object ``path`` read from ``index_offset``: one
    reference per segment, in object order. Raises CorruptObjectError."""
    if zlib.crc32(data) != crc:
        raise CorruptObjectError(path, index_offset, "index checksum mismatch")
    try:
        raw = msgpack.unpackb(data)
        return [
            SegmentRef(
                SegmentMeta(str(a), int(b), int(c), tuple(int(k) for k in d), int(f), int(g)),
                path,
                int(e),
            )
            for a, b, c, d, e, f, g in raw["segments"]
        ]
    except Exception as e:  # noqa: BLE001 - any decode failure is corruption here
        raise CorruptObjectError(path, index_offset, f"bad index: {e}") from e
