"""Segment encoding: the contiguous bytes of one writer's changesets inside an object.

Layout (all integers big-endian)::

    u32 header_length | header (msgpack) | body | u32 crc32(everything before)

The header is ``{"v": 1, "log": log_id, "sqn": [from, to], "entries": [[sqn, key_group,
count, body_offset, body_length], ...]}``; the body holds each entry's changes as
``u32 length | raw change bytes``, entries in SQN order, then key-group order. Change
payloads stay raw bytes (never msgpack-encoded).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import msgpack

from dstltree.client.errors import CorruptObjectError

SEGMENT_VERSION = 1
_U32 = struct.Struct("!I")

# changesets: SQN -> key group -> changes, in append order
Changesets = Mapping[int, Mapping[int, Sequence[bytes]]]


@dataclass(frozen=True)
class SegmentMeta:
    """What every record of one segment shares (the wire, batches, the object index and
    handles' references compose it with their own context): writer ``log_id``, SQN
    range [sqn_from, sqn_to), key groups, ``length`` in bytes and the CRC32 stored in
    its trailer. A marker (a writer persisted with no new changes) has length 0."""

    log_id: str
    sqn_from: int
    sqn_to: int
    key_groups: tuple[int, ...] = ()
    length: int = 0
    crc32: int = 0

    @property
    def is_marker(self) -> bool:
        return self.length == 0


@dataclass(frozen=True)
class DecodedSegment:
    """A decoded segment: ``entries`` maps (sqn, key_group) to its list of changes;
    ``length`` is the segment's size in bytes and ``crc32`` its trailer checksum."""

    log_id: str
    sqn_from: int
    sqn_to: int
    entries: dict[tuple[int, int], list[bytes]]
    length: int = 0
    crc32: int = 0

    @property
    def key_groups(self) -> tuple[int, ...]:
        """The key groups holding changes, ascending (what a writer's meta names)."""
        return tuple(sorted({kg for _, kg in self.entries}))

    def changes(self, key_group: int | None, sqn_from: int, sqn_to: int) -> Iterator[bytes]:
        """Changes in SQN order for ``key_group`` (None: all) with sqn in [from, to)."""
        for (sqn, kg), values in sorted(self.entries.items()):
            if sqn_from <= sqn < sqn_to and (key_group is None or kg == key_group):
                yield from values

    def key_group_changes(self, sqn_from: int, sqn_to: int) -> Iterator[tuple[int, int, bytes]]:
        """(sqn, key_group, change) in SQN order for sqn in [from, to)."""
        for (sqn, kg), values in sorted(self.entries.items()):
            if sqn_from <= sqn < sqn_to:
                for v in values:
                    yield sqn, kg, v


def encode_segment(log_id: str, sqn_from: int, sqn_to: int, changesets: Changesets) -> bytes:
    """Encode the changesets with SQN in [sqn_from, sqn_to) of one writer."""
    body = bytearray()
    entries = []
    for sqn in sorted(changesets):
        if not sqn_from <= sqn < sqn_to:
            raise ValueError(f"changeset SQN {sqn} outside [{sqn_from}, {sqn_to})")
        for kg in sorted(changesets[sqn]):
            start = len(body)
            values = changesets[sqn][kg]
            for v in values:
                body += _U32.pack(len(v))
                body += v
            entries.append([sqn, kg, len(values), start, len(body) - start])
    header = msgpack.packb(
        {"v": SEGMENT_VERSION, "log": log_id, "sqn": [sqn_from, sqn_to], "entries": entries}
    )
    out = bytearray(_U32.pack(len(header)))
    out += header
    out += body
    out += _U32.pack(zlib.crc32(out))
    return bytes(out)


def segment_crc(data: bytes | bytearray | memoryview) -> int:
    """The CRC32 stored in a segment's trailer (no verification)."""
    if len(data) < 8:
        raise ValueError("segment shorter than its framing")
    return int(_U32.unpack_from(data, len(data) - 4)[0])


def segment_key_groups(changesets: Changesets) -> tuple[int, ...]:
    return tuple(sorted({kg for per_kg in changesets.values() for kg in per_kg}))


def decode_segment(
    data: bytes | memoryview, path: str = "<memory>", offset: int = 0
) -> DecodedSegment:
    """Verify and decode a segment. Raises CorruptObjectError naming ``path`` and the
    ``offset`` of the segment (plus the position inside it) on any mismatch: checksum,
    header framing, a header field of the wrong type or out of range, entries out of
    (sqn, key group) order, outside the SQN range, overlapping or leaving gaps in the
    body, or changes that do not fill their entry exactly."""
    buf = memoryview(data)
    if len(buf) < 8:
        raise CorruptObjectError(path, offset, f"segment of {len(buf)} bytes is truncated")
    stored = _U32.unpack_from(buf, len(buf) - 4)[0]
    actual = zlib.crc32(buf[:-4])
    if stored != actual:
        raise CorruptObjectError(
            path, offset, f"segment checksum mismatch (stored {stored:#010x}, read {actual:#010x})"
        )
    hlen = _U32.unpack_from(buf, 0)[0]
    if 4 + hlen > len(buf) - 4:
        raise CorruptObjectError(path, offset, "segment header length exceeds segment")
    try:
        log_id, sqn_from, sqn_to, raw_entries = _parse_header(buf[4 : 4 + hlen])
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise CorruptObjectError(path, offset + 4, f"bad segment header: {e}") from e
    body_start = 4 + hlen
    body = buf[body_start:-4]
    entries: dict[tuple[int, int], list[bytes]] = {}
    expected_start, last = 0, (-1, -1)
    for i, (sqn, kg, count, start, length) in enumerate(raw_entries):
        where = offset + body_start + expected_start
        if (sqn, kg) <= last or not sqn_from <= sqn < sqn_to:
            raise CorruptObjectError(
                path,
                offset + 4,
                f"segment entry {i} (sqn {sqn}, key group {kg}) out of order "
                f"or outside [{sqn_from}, {sqn_to})",
            )
        if start != expected_start:
            raise CorruptObjectError(
                path, where, f"segment entry {i} starts at {start}, expected {expected_start}"
            )
        entries[(sqn, kg)] = _read_changes(body, start, length, count, path, offset + body_start)
        expected_start, last = start + length, (sqn, kg)
    if expected_start != len(body):
        raise CorruptObjectError(
            path,
            offset + body_start + expected_start,
            f"segment body has {len(body) - expected_start} bytes after its last entry",
        )
    return DecodedSegment(log_id, sqn_from, sqn_to, entries, len(buf), stored)


def _parse_header(raw: memoryview) -> tuple[str, int, int, list[tuple[int, int, int, int, int]]]:
    """(log_id, sqn_from, sqn_to, entries) of a msgpack segment header, every integer
    checked to be a non-negative int. Raises ValueError, TypeError or KeyError."""
    header = msgpack.unpackb(raw)
    if not isinstance(header, dict):
        raise TypeError(f"header is a {type(header).__name__}, not a map")
    if header.get("v") != SEGMENT_VERSION:
        raise ValueError(f"unsupported segment version {header.get('v')!r}")
    log_id = header["log"]
    if not isinstance(log_id, str):
        raise TypeError(f"log id {log_id!r} is not a string")
    sqn = header["sqn"]
    if not isinstance(sqn, list) or len(sqn) != 2:
        raise ValueError(f"sqn {sqn!r} is not [from, to]")
    sqn_from, sqn_to = (_uint(x, "sqn") for x in sqn)
    if sqn_to < sqn_from:
        raise ValueError(f"SQN range [{sqn_from}, {sqn_to}) is reversed")
    raw_entries = header["entries"]
    if not isinstance(raw_entries, list):
        raise TypeError("entries is not a list")
    entries = []
    for i, e in enumerate(raw_entries):
        if not isinstance(e, list) or len(e) != 5:
            raise ValueError(f"entry {i} is not [sqn, key_group, count, offset, length]")
        sqn_, kg, count, start, length = (_uint(x, f"entry {i}") for x in e)
        entries.append((sqn_, kg, count, start, length))
    return log_id, sqn_from, sqn_to, entries


def _uint(x: object, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ValueError(f"{what}: expected a non-negative integer, got {x!r}")
    return x


def check_segment(seg: DecodedSegment, meta: SegmentMeta, path: str, offset: int) -> None:
    """Raise CorruptObjectError (``path``, ``offset`` of the segment) unless the decoded
    segment is the one ``meta`` (an index entry or a handle's reference) describes: same
    log id, SQN range, key groups, length in bytes and trailer CRC32."""
    claims = (meta.log_id, meta.sqn_from, meta.sqn_to, meta.key_groups, meta.length, meta.crc32)
    found = (seg.log_id, seg.sqn_from, seg.sqn_to, seg.key_groups, seg.length, seg.crc32)
    names = ("log id", "sqn_from", "sqn_to", "key groups", "length", "crc32")
    for name, want, got in zip(names, claims, found, strict=True):
        if want != got:
            raise CorruptObjectError(
                path, offset, f"segment {name} is {got!r} but its reference says {want!r}"
            )


def _read_changes(
    body: memoryview, start: int, length: int, count: int, path: str, offset: int
) -> list[bytes]:
    out = []
    pos, end = start, start + length
    if end > len(body):
        raise CorruptObjectError(path, offset + pos, "segment entry exceeds body")
    if count > length // 4:
        raise CorruptObjectError(path, offset + pos, f"{count} changes cannot fit {length} bytes")
    for _ in range(count):
        if pos + 4 > end:
            raise CorruptObjectError(path, offset + pos, "truncated change length")
        n = _U32.unpack_from(body, pos)[0]
        pos += 4
        if pos + n > end:
            raise CorruptObjectError(path, offset + pos, "truncated change")
        out.append(bytes(body[pos : pos + n]))
        pos += n
    if pos != end:
        raise CorruptObjectError(path, offset + pos, f"{end - pos} bytes after the entry's changes")
    return out
