"""The object format: many writers' segments in one DFS object.

Layout::

    segment_0 | segment_1 | ... | index (msgpack) | footer (28 bytes)

The index is ``{"v": 1, "segments": [[log_id, sqn_from, sqn_to, [key_groups], offset,
length, crc32], ...]}``, where a row's ``crc32`` is its segment's trailer checksum
(CRC32C for segment version 2, CRC32 for version 1: see :mod:`.segment`). The footer
is ``magic (8 bytes) | version u16 | reserved u16 | index_offset u64 | index_length u32
| index_checksum u32`` (big-endian), so a reader finds the index with one range read
of the tail. Segment bytes are written as received: nodes never re-encode them.

Format versions (the footer's and the index's ``v`` agree):

- 1 (written by default): the index checksum is zlib's CRC32.
- 2: the index checksum is CRC32C (as segment version 2), and the index map also holds
  ``"w"``, who wrote the object (a node id, or ``"direct"`` for a task's own upload),
  and ``"t"``, when (seconds since the epoch, a float), for an operator reading it.
  Written by a node whose topology sets ``object_format: 2``.

A reader reads both and refuses any other version with
:class:`~dstltree.client.errors.UnsupportedVersionError` (path, offset, version), never
by misreading. No checksum covers the footer's version field; a footer naming an
unknown version whose index carries a known version's checksum and names that version
is reported as corrupt instead (:func:`corrupt_version`): a damaged byte, not a reason
to upgrade. A release writes a new version by default only once the release
before it reads it (docs/design.md, "Formats and compatibility").

Nothing in an object is trusted: the footer's ``index_crc32`` is the index's own
checksum; :func:`parse_index` checks every row's types and that the rows tile the
segment area ``[0, index_offset)`` back to back; :func:`verify_segments` decodes every
segment and cross-checks it against its row (log id, SQN range, key groups, length,
trailer checksum), so an index rewritten with a fresh checksum is caught too. Every failure is a
:class:`CorruptObjectError` naming the object path and the byte offset.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgpack

from dstltree.client.errors import CorruptObjectError, UnsupportedVersionError
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import (
    SegmentMeta,
    check_segment,
    decode_segment,
    segment_checksum,
    segment_crc,
    segment_parts,
    segment_size,
)
from dstltree.storage.store import Buffer

MAGIC = b"DSTLTREE"
FORMAT_VERSION = 1  # what build_object writes by default
FORMAT_VERSIONS = (1, 2)  # what parse_footer and parse_index read
FOOTER = struct.Struct("!8sHHQII")
FOOTER_SIZE = FOOTER.size
DIRECT_WRITER = "direct"  # the "w" of an object a task uploaded itself (version 2)


class Footer(NamedTuple):
    """An object's footer: where its index is, the index's checksum, the version."""

    index_offset: int
    index_length: int
    index_checksum: int
    version: int


def index_checksum(data: Buffer, version: int) -> int:
    """The checksum a footer of format ``version`` stores for the index bytes ``data``:
    zlib's CRC32 for version 1, CRC32C for version 2 (an unsigned 32-bit int): the
    checksums of the segment versions of the same numbers."""
    return segment_checksum(memoryview(data), version)


def build_object(
    segments: Sequence[tuple[SegmentMeta, Buffer | tuple[Buffer, ...]]],
    version: int = FORMAT_VERSION,
    writer: str = DIRECT_WRITER,
) -> tuple[list[Buffer], list[int]]:
    """Lay out the (metadata, bytes) ``segments`` back to back, then the index and footer
    of format ``version`` (1 or 2; ``writer``: the node id a version-2 index names).
    A segment's bytes are one buffer or a tuple of buffers back to back
    (:func:`~dstltree.client.segment.segment_parts`).

    Returns the parts to write in order (segment buffers are not copied) and the offset
    where each segment lands in the object (its :class:`SegmentRef` once the object's
    path is known). Raises ValueError when a segment's length differs from its bytes or
    for an unknown ``version``.
    """
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"object format version {version}: known {FORMAT_VERSIONS}")
    parts: list[Buffer] = []
    rows: list[list[Any]] = []
    offsets: list[int] = []
    pos = 0
    for meta, data in segments:
        size = segment_size(data)
        if size != meta.length:
            raise ValueError(f"{meta.log_id}: segment of {size} bytes, meta says {meta.length}")
        # a sender that gave no CRC (0): the index takes the segment's trailer (4 bytes read)
        crc = meta.crc32 or (segment_crc(data) if size >= 8 else 0)
        rows.append(
            [meta.log_id, meta.sqn_from, meta.sqn_to, list(meta.key_groups), pos, meta.length, crc]
        )
        offsets.append(pos)
        parts.extend(segment_parts(data))
        pos += meta.length
    head: dict[str, Any] = {"v": version, "segments": rows}
    if version == 2:
        head.update(w=writer, t=round(time.time(), 3))
    index = msgpack.packb(head)
    parts.append(index)
    checksum = index_checksum(index, version)
    parts.append(FOOTER.pack(MAGIC, version, 0, pos, len(index), checksum))
    return parts, offsets


def parse_footer(
    tail: Buffer,
    path: str,
    object_size: int,
    read_index: Callable[[int, int], Buffer] | None = None,
) -> Footer:
    """Check the footer (the last FOOTER_SIZE bytes). Raises CorruptObjectError for a
    bad magic, reserved field or index bounds, then UnsupportedVersionError for a
    version not in FORMAT_VERSIONS, unless ``read_index(offset, length)`` (the bytes the
    footer points to) shows the footer's version field itself is corrupt
    (:func:`corrupt_version`): then CorruptObjectError. Offsets in errors are absolute."""
    footer_at = object_size - FOOTER_SIZE
    if object_size < FOOTER_SIZE or len(tail) != FOOTER_SIZE:
        raise CorruptObjectError(path, max(footer_at, 0), "object too short for a footer")
    magic, version, reserved, index_offset, index_length, index_crc = FOOTER.unpack(tail)
    if magic != MAGIC:
        raise CorruptObjectError(path, footer_at, f"bad magic {magic!r}")
    if reserved != 0:
        raise CorruptObjectError(path, footer_at + 10, f"reserved footer field is {reserved}")
    if index_offset + index_length != footer_at:
        raise CorruptObjectError(path, footer_at, "index bounds do not match object size")
    footer = Footer(index_offset, index_length, index_crc, version)
    if version not in FORMAT_VERSIONS:
        told = None if read_index is None else corrupt_version(footer, read_index, path)
        if told is not None:
            raise CorruptObjectError(path, footer_at + 8, told)
        raise UnsupportedVersionError(path, footer_at + 8, "object", version, FORMAT_VERSIONS)
    return footer


def corrupt_version(
    footer: Footer, read_index: Callable[[int, int], Buffer], path: str
) -> str | None:
    """Why a footer naming an unknown format version is corrupt rather than newer: its
    index carries the checksum of a known version and names that version, so the
    footer's version field (not covered by any checksum) was damaged; None when the
    index is no known version's (a newer format, or corrupt beyond telling)."""
    data = read_index(footer.index_offset, footer.index_length)
    for v in FORMAT_VERSIONS:
        if index_checksum(data, v) != footer.index_checksum:
            continue
        try:
            raw = msgpack.unpackb(data)
        except (ValueError, msgpack.UnpackException):
            return None
        if isinstance(raw, dict) and raw.get("v") == v:
            return (
                f"the footer names object format version {footer.version}, but its index "
                f"is version {v} with an intact checksum: the footer is corrupt (not a "
                "newer version)"
            )
    return None


def parse_index(data: Buffer, path: str, footer: Footer) -> list[SegmentRef]:
    """Verify and decode the index of object ``path`` (``data``: the bytes the footer
    points to): one reference per segment, in object order. Checks the checksum, the
    version (the footer's), every row's types (non-negative integers, a string log id,
    ascending distinct key groups, a CRC32 below 2**32, sqn_from <= sqn_to) and that the
    rows tile [0, index_offset) back to back. Raises CorruptObjectError (path, the
    index's offset or the offset of the segment a bad row points to)."""
    index_offset = footer.index_offset
    if index_checksum(data, footer.version) != footer.index_checksum:
        raise CorruptObjectError(path, index_offset, "index checksum mismatch")
    try:
        raw = msgpack.unpackb(data)
        if not isinstance(raw, dict) or raw.get("v") != footer.version:
            raise ValueError(f"not the version {footer.version} index map the footer names")
        rows = raw["segments"]
        if not isinstance(rows, list):
            raise TypeError("segments is not a list")
        refs = [_row(r, path) for r in rows]
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise CorruptObjectError(path, index_offset, f"bad index: {e}") from e
    pos = 0
    for i, ref in enumerate(refs):
        if ref.offset != pos:
            raise CorruptObjectError(
                path, index_offset, f"index entry {i} starts at {ref.offset}, expected {pos}"
            )
        pos += ref.length
    if pos != index_offset:
        raise CorruptObjectError(
            path, index_offset, f"index entries end at {pos}, the index starts at {index_offset}"
        )
    return refs


def _row(row: Any, path: str) -> SegmentRef:
    """One index row ``[log_id, sqn_from, sqn_to, [key_groups], offset, length, crc32]``.
    Raises ValueError or TypeError."""
    if not isinstance(row, list) or len(row) != 7:
        raise ValueError(f"row {row!r} is not a 7-element list")
    log_id, sqn_from, sqn_to, kgs, offset, length, crc = row
    if not isinstance(log_id, str) or not isinstance(kgs, list):
        raise TypeError(f"row {row!r}: log id must be a string, key groups a list")
    ints = [_uint(x) for x in (sqn_from, sqn_to, offset, length, crc)]
    key_groups = tuple(_uint(k) for k in kgs)
    if ints[1] < ints[0] or ints[4] >= 1 << 32:
        raise ValueError(f"row {row!r}: reversed SQN range or CRC32 out of range")
    if list(key_groups) != sorted(set(key_groups)):
        raise ValueError(f"row {row!r}: key groups not ascending and distinct")
    meta = SegmentMeta(log_id, ints[0], ints[1], key_groups, ints[3], ints[4])
    return SegmentRef(meta, path, ints[2])


def _uint(x: Any) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ValueError(f"expected a non-negative integer, got {x!r}")
    return x


def verify_segments(refs: Sequence[SegmentRef], segments: Buffer) -> None:
    """Decode every segment of an object (``segments``: its bytes [0, index_offset)) and
    cross-check it against its index entry. Raises CorruptObjectError naming the path and
    the segment's offset (or the position inside it)."""
    view = memoryview(segments)
    for ref in refs:
        data = view[ref.offset : ref.offset + ref.length]
        if len(data) != ref.length:
            raise CorruptObjectError(ref.path, ref.offset, "index entry points past the segments")
        seg = decode_segment(data, ref.path, ref.offset)
        check_segment(seg, ref.meta, ref.path, ref.offset)
