"""Segment encoding: the contiguous bytes of one writer's changesets inside an object.

Layout (all integers big-endian)::

    u32 header_length | header (msgpack) | body | u32 checksum(everything before)

The trailer checksum is CRC32C (Castagnoli, google-crc32c, hardware accelerated) in
version 2 and zlib's CRC32 in version 1; a reader picks the one the segment's version
names. Handles and object indexes call it ``crc32``: that field holds whatever the
segment's trailer holds.

The header is ``{"v": 2, "log": log_id, "sqn": [from, to], "entries": [[sqn, key_group,
count, body_offset, body_length], ...]}``, entries in SQN order, then key-group order;
in version 2 (written by default) each entry's part of the body is a table of its
``count`` change lengths (``u32`` each) followed by the raw changes back to back, so a
reader slices them without a step per change. Version 1 (still read, and written with
``version=1``) holds each change as ``u32 length | raw change bytes``. Change payloads
stay raw bytes (never msgpack-encoded).

Compression (version 2 only, off by default): the header gains ``"codec": "zstd"``
and ``"size": body_bytes``, and the stored body is one zstd frame (declaring its
content size) of the body above; entry offsets refer to the decompressed body.
Readers need no configuration: the header names the codec. A reader refuses
(CorruptObjectError) a body that claims or decompresses to more than
``max_body_bytes`` (:data:`MAX_BODY_BYTES` by default) or to other than its ``size``,
so a hostile segment cannot make it allocate unbounded memory. The trailer's checksum
covers the stored (compressed) bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

import google_crc32c
import msgpack
import zstandard

from dstltree.client.errors import CorruptObjectError, UnsupportedVersionError

SEGMENT_VERSION = 2  # what encode_segment writes by default
SEGMENT_VERSIONS = (1, 2)  # what decode_segment reads
ZSTD = "zstd"
CODECS = (ZSTD,)
MAX_BODY_BYTES = 256 * 1024 * 1024  # the largest (decompressed) body a reader accepts
_U32 = struct.Struct("!I")
# mean bytes per body part below which encode_segment joins the body first (one more copy
# in C) rather than computing the CRC32 part by part (one Python call per change)
_JOIN_BELOW = 4096
MAX_SEGMENT_PARTS = 64  # buffers (ZeroMQ frames) one segment is sent as, at most
# segment bytes from which encode_segment_parts leaves large changes unjoined (below,
# the frames' fixed costs, a ZeroMQ frame each sent and received, outweigh the copy
# saved); a node refuses a smaller segment sent as several frames
SPLIT_FROM_BYTES = 256 * 1024
_INT = {int}

_CRC32C_EXTEND = google_crc32c.extend  # C: accepts bytes (not memoryview / bytearray)


def _crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    if type(data) is not bytes:
        data = bytes(data)
    return int(_CRC32C_EXTEND(crc, data))


def _crc32(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    return zlib.crc32(data, crc)


# the trailer checksum of each version: (data, running checksum) -> checksum
_CHECKSUMS = {1: _crc32, 2: _crc32c}


def segment_checksum(data: bytes | bytearray | memoryview, version: int = SEGMENT_VERSION) -> int:
    """The trailer checksum a segment of ``version`` stores for ``data`` (its bytes before
    the trailer): CRC32C for version 2, zlib CRC32 for version 1, an unsigned 32-bit int.
    Raises KeyError for an unknown version."""
    return _CHECKSUMS[version](data, 0)


# changesets: SQN -> key group -> changes, in append order
Changesets = Mapping[int, Mapping[int, Sequence[bytes]]]


@dataclass(frozen=True)
class SegmentMeta:
    """What every record of one segment shares (the wire, batches, the object index and
    handles' references compose it with their own context): writer ``log_id``, SQN
    range [sqn_from, sqn_to), key groups, ``length`` in bytes and ``crc32``, the checksum
    stored in its trailer (CRC32C for version 2, CRC32 for version 1). A marker (a writer
    persisted with no new changes) has length 0."""

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


def encode_segment(
    log_id: str, sqn_from: int, sqn_to: int, changesets: Changesets, **options: Any
) -> bytes:
    """Encode the changesets with SQN in [sqn_from, sqn_to) of one writer: bytes of the
    layout above. Options (keywords, those of :func:`encode_segment_parts`):
    ``compression``, ``level`` (3), ``version`` (2, or 1). Each change is copied
    once, straight into the result, when changes are large (4 KiB on average or
    more); smaller ones are joined into the body first and the body copied once more
    (two copies in C are cheaper than a CRC32 call per change). ``compression``
    ``"zstd"`` compresses the body at ``level`` when that saves bytes and the body is
    at most :data:`MAX_BODY_BYTES` (else it is stored as it is); None (default): no
    compression. Raises ValueError for a changeset SQN outside the range, an unknown
    codec or version, or compression with version 1. :func:`encode_segment_parts`
    gives the same bytes without joining large changes."""
    parts = encode_segment_parts(log_id, sqn_from, sqn_to, changesets, **options)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def encode_segment_parts(
    log_id: str,
    sqn_from: int,
    sqn_to: int,
    changesets: Changesets,
    *,
    compression: str | None = None,
    level: int = 3,
    version: int = SEGMENT_VERSION,
) -> list[bytes]:
    """:func:`encode_segment` as buffers to send or write back to back, never copying a
    large change: when changes are large (4 KiB on average or more), the segment is
    :data:`SPLIT_FROM_BYTES` (256 KiB) or more as stored (compressed, if it is) and
    takes at most :data:`MAX_SEGMENT_PARTS` buffers, its framing and length tables
    are buffers of their own between the changes themselves; else one ``bytes``.
    Raises as :func:`encode_segment`."""
    if compression is not None and (compression not in CODECS or version != 2):
        raise ValueError(f"segment compression {compression!r}: known {CODECS}, version 2")
    if version not in SEGMENT_VERSIONS:
        raise ValueError(f"unknown segment version {version}")
    parts: list[bytes] = []
    entries = []
    start = 0
    for sqn in sorted(changesets):
        if not sqn_from <= sqn < sqn_to:
            raise ValueError(f"changeset SQN {sqn} outside [{sqn_from}, {sqn_to})")
        per_kg = changesets[sqn]
        for kg in sorted(per_kg):
            values = per_kg[kg]
            lengths = list(map(len, values))
            if version == 2:
                parts.append(struct.pack(f"!{len(values)}I", *lengths))
                parts.extend(values)
            else:
                for n, v in zip(lengths, values, strict=True):
                    parts += (_U32.pack(n), v)
            length = 4 * len(values) + sum(lengths)
            entries.append([sqn, kg, len(values), start, length])
            start += length
    header: dict[str, object] = {"v": version, "log": log_id, "sqn": [sqn_from, sqn_to]}
    if compression is not None and 0 < start <= MAX_BODY_BYTES:
        packed = zstandard.ZstdCompressor(level=level).compress(b"".join(parts))
        if len(packed) < start:
            header.update(codec=compression, size=start)
            parts = [packed]
    header["entries"] = entries
    head = msgpack.packb(header)
    prefix = _U32.pack(len(head)) + head
    checksum = _CHECKSUMS[version]
    if len(parts) > 2 + start // _JOIN_BELOW:  # small changes: one C join beats a CRC call each
        body = b"".join(parts)
        crc = checksum(body, checksum(prefix))
        return [b"".join((prefix, body, _U32.pack(crc)))]
    crc = checksum(prefix)
    for p in parts:
        crc = checksum(p, crc)
    parts[:0] = (prefix,)
    parts.append(_U32.pack(crc))
    split = len(parts) <= MAX_SEGMENT_PARTS and sum(map(len, parts)) >= SPLIT_FROM_BYTES
    return parts if split else [b"".join(parts)]


def segment_crc(data: Any) -> int:
    """The checksum stored in a segment's trailer (no verification): CRC32C for version
    2, CRC32 for version 1. ``data``: a buffer, or the tuple of buffers a segment is
    sent as (:func:`segment_parts`). Raises ValueError for fewer than 8 bytes."""
    if segment_size(data) < 8:
        raise ValueError("segment shorter than its framing")
    if type(data) is tuple:
        return int(_U32.unpack(_tail(data, 4))[0])
    return int(_U32.unpack_from(data, len(data) - 4)[0])


def segment_parts(data: Any) -> tuple[Any, ...]:
    """The buffers of a segment's ``data``: a tuple of buffers (bytes, memoryview,
    zmq.Frame), as :func:`encode_segment_parts` makes and a node receives them, or one
    buffer."""
    return data if type(data) is tuple else (data,)


def segment_size(data: Any) -> int:
    """Bytes of a segment's ``data`` (one buffer or a tuple of them)."""
    if type(data) is tuple:
        return sum(map(_nbytes, data))
    return _nbytes(data)


def _nbytes(buf: Any) -> int:
    """Bytes of bytes, bytearray, memoryview or zmq.Frame (its ``len``: no buffer view
    made)."""
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def _tail(parts: tuple[Any, ...], n: int) -> bytes:
    """The last ``n`` bytes of ``parts`` back to back (at least ``n`` bytes), copying
    only those."""
    chunks: list[bytes] = []
    for p in reversed(parts):
        view = memoryview(p).cast("B")
        take = view[max(0, len(view) - n) :]
        chunks.append(bytes(take))
        n -= len(take)
        if n == 0:
            break
    return b"".join(reversed(chunks))


def segment_key_groups(changesets: Changesets) -> tuple[int, ...]:
    return tuple(sorted({kg for per_kg in changesets.values() for kg in per_kg}))


def decode_segment(
    data: bytes | bytearray | memoryview,
    path: str = "<memory>",
    offset: int = 0,
    *,
    copy: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> DecodedSegment:
    """Verify and decode a segment (version 1 or 2). Raises CorruptObjectError naming
    ``path`` and the ``offset`` of the segment (plus the position inside it; inside a
    compressed body, the offset of the body) on any mismatch: checksum, header framing,
    a header field of the wrong type or out of range, an unknown codec, a compressed
    body that does not decompress to exactly its ``size`` (or claims more than
    ``max_body_bytes``), entries out of (sqn, key group) order, outside the SQN range,
    overlapping or leaving gaps in the body, or changes that do not fill their entry
    exactly. ``copy`` False: the changes are read-only memoryview slices of ``data``
    (or of the decompressed body) instead of bytes copies (no copy per change)."""
    buf = memoryview(data)
    if len(buf) < 8:
        raise CorruptObjectError(path, offset, f"segment of {len(buf)} bytes is truncated")
    try:
        stored, checked = _verify_trailer(data, buf, path, offset)
    except CorruptObjectError:
        _refuse_unknown_version(buf, path, offset)  # a newer segment's other checksum
        raise
    hlen = _U32.unpack_from(buf, 0)[0]
    if 4 + hlen > len(buf) - 4:
        raise CorruptObjectError(path, offset, "segment header length exceeds segment")
    try:
        log_id, sqn_from, sqn_to, raw_entries, size, version = _parse_header(buf[4 : 4 + hlen])
    except _UnknownVersion as e:
        version = e.args[0]
        raise UnsupportedVersionError(path, offset + 4, "segment", version, SEGMENT_VERSIONS) from e
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise CorruptObjectError(path, offset + 4, f"bad segment header: {e}") from e
    if version != checked:
        raise CorruptObjectError(
            path, offset, f"segment checksum mismatch (version {version} with the other checksum)"
        )
    body_start = 4 + hlen
    if size is None:  # uncompressed: the changes are slices of data itself
        src: bytes | memoryview = buf if not copy or type(data) is not bytes else data
        if copy and src is buf:
            src = bytes(buf)
        base, body_len, where = body_start, len(buf) - 4 - body_start, offset + body_start
    else:
        src = _decompress(buf[body_start:-4], size, max_body_bytes, path, offset + body_start)
        base, body_len, where = 0, size, offset + body_start
    if not copy:
        src = memoryview(src).toreadonly()  # hashable slices, whatever ``data`` is
    entries = _read_entries(
        src,
        base,
        body_len,
        raw_entries,
        (sqn_from, sqn_to),
        path,
        (where, size is None, offset + 4),
        _read_changes if version == 1 else _read_table,
    )
    return DecodedSegment(log_id, sqn_from, sqn_to, entries, len(buf), stored)


def _verify_trailer(
    data: bytes | bytearray | memoryview, buf: memoryview, path: str, offset: int
) -> tuple[int, int]:
    """(stored checksum, the version whose checksum it is) of the segment ``buf`` (8 bytes
    or more): CRC32C (version 2) tried first, then CRC32 (version 1). For ``bytes`` the
    CRC32C runs over the whole segment, trailer included, without a copy: appending the
    same 4 bytes to two CRC registers maps them one to one, so ``extend(stored, trailer)
    == crc32c(segment)`` exactly when ``stored == crc32c(segment[:-4])``. Raises
    CorruptObjectError (``path``, ``offset``) when neither checksum matches."""
    trailer = bytes(buf[-4:])
    stored = int(_U32.unpack(trailer)[0])
    if type(data) is bytes:
        if _CRC32C_EXTEND(stored, trailer) == _CRC32C_EXTEND(0, data):
            return stored, 2
    elif _crc32c(buf[:-4]) == stored:
        return stored, 2
    if zlib.crc32(buf[:-4]) == stored:
        return stored, 1
    actual = _crc32c(buf[:-4])
    raise CorruptObjectError(
        path, offset, f"segment checksum mismatch (stored {stored:#010x}, read {actual:#010x})"
    )


def _decompress(body: memoryview, size: int, limit: int, path: str, offset: int) -> bytes:
    """The zstd frame ``body`` decompressed: exactly ``size`` bytes, at most ``limit``.
    Raises CorruptObjectError (``path``, ``offset`` of the body) for a larger claimed
    size, a frame whose content size is missing or differs, a corrupt frame or bytes
    after it; never allocates more than ``size`` bytes of output."""
    if size > limit:
        raise CorruptObjectError(
            path, offset, f"compressed body claims {size} bytes, more than {limit} allowed"
        )
    try:
        declared = zstandard.frame_content_size(body)
        if declared != size:
            raise CorruptObjectError(
                path, offset, f"zstd frame declares {declared} bytes, the header {size}"
            )
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out = dobj.decompress(body)
    except zstandard.ZstdError as e:
        raise CorruptObjectError(path, offset, f"corrupt compressed body: {e}") from e
    if len(out) != size or not dobj.eof or dobj.unused_data:
        raise CorruptObjectError(
            path,
            offset,
            f"compressed body gives {len(out)} of {size} bytes "
            f"({len(dobj.unused_data)} bytes after its frame)",
        )
    return out


def _read_entries(
    src: bytes | memoryview,
    base: int,
    body_len: int,
    raw_entries: list[tuple[int, int, int, int, int]],
    sqn_range: tuple[int, int],
    path: str,
    where: tuple[int, bool, int],
    read: Any,
) -> dict[tuple[int, int], list[Any]]:
    """The changes of every entry, sliced from ``src`` whose body starts at ``base``
    and holds ``body_len`` bytes; ``where`` is (the body's offset in ``path``, whether
    positions inside the body are offsets in ``path`` too, the header's offset in
    ``path``); ``read`` reads one entry's changes (:func:`_read_changes` for version
    1, :func:`_read_table` for version 2). Raises CorruptObjectError."""
    sqn_from, sqn_to = sqn_range
    entries: dict[tuple[int, int], list[Any]] = {}
    expected_start, last = 0, (-1, -1)
    body_offset, exact, header_offset = where
    for i, (sqn, kg, count, start, length) in enumerate(raw_entries):
        if (sqn, kg) <= last or not sqn_from <= sqn < sqn_to:
            raise CorruptObjectError(
                path,
                header_offset,
                f"segment entry {i} (sqn {sqn}, key group {kg}) out of order "
                f"or outside [{sqn_from}, {sqn_to})",
            )
        if start != expected_start:
            raise CorruptObjectError(
                path,
                body_offset + (expected_start if exact else 0),
                f"segment entry {i} starts at {start}, expected {expected_start}",
            )
        if start + length > body_len:
            raise CorruptObjectError(
                path, body_offset + (start if exact else 0), "segment entry exceeds body"
            )
        entries[(sqn, kg)] = read(src, base, start, length, count, path, where)
        expected_start, last = start + length, (sqn, kg)
    if expected_start != body_len:
        raise CorruptObjectError(
            path,
            body_offset + (expected_start if exact else 0),
            f"segment body has {body_len - expected_start} bytes after its last entry",
        )
    return entries


class _UnknownVersion(ValueError):
    """A segment header's ``v`` is an int this code does not read (args: the version)."""


def _refuse_unknown_version(buf: memoryview, path: str, offset: int) -> None:
    """Raise UnsupportedVersionError when the (unverified) header of the segment ``buf``
    is a msgpack map whose ``v`` is an integer not in SEGMENT_VERSIONS: a segment of a
    newer format, whose trailer this code cannot check. Returns otherwise."""
    hlen = _U32.unpack_from(buf, 0)[0]
    if 4 + hlen > len(buf) - 4:
        return
    try:
        header = msgpack.unpackb(buf[4 : 4 + hlen])
    except (ValueError, msgpack.UnpackException):
        return
    version = header.get("v") if isinstance(header, dict) else None
    if type(version) is int and version not in SEGMENT_VERSIONS:
        raise UnsupportedVersionError(path, offset + 4, "segment", version, SEGMENT_VERSIONS)


def _parse_header(
    raw: memoryview,
) -> tuple[str, int, int, list[tuple[int, int, int, int, int]], int | None, int]:
    """(log_id, sqn_from, sqn_to, entries, decompressed body size or None for an
    uncompressed body, version) of a msgpack segment header, every integer checked to be a
    non-negative int. Raises ValueError, TypeError or KeyError."""
    header = msgpack.unpackb(raw)
    if not isinstance(header, dict):
        raise TypeError(f"header is a {type(header).__name__}, not a map")
    version = header.get("v")
    if type(version) is int and version not in SEGMENT_VERSIONS:
        raise _UnknownVersion(version)
    if version not in SEGMENT_VERSIONS or type(version) is not int:
        raise ValueError(f"unsupported segment version {version!r}")
    size = None
    if "codec" in header and version == 2:
        if header["codec"] not in CODECS:
            raise ValueError(f"unknown codec {header['codec']!r}")
        size = _uint(header["size"], "size")
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
        if not (set(map(type, e)) == _INT and min(e) >= 0):  # the common case in C
            for x in e:
                _uint(x, f"entry {i}")
        entries.append((e[0], e[1], e[2], e[3], e[4]))
    return log_id, sqn_from, sqn_to, entries, size, version


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
    src: bytes | memoryview,
    base: int,
    start: int,
    length: int,
    count: int,
    path: str,
    where: tuple[int, bool, int],
) -> list[Any]:
    """The ``count`` changes filling body bytes [start, start + length) (the body
    starts at ``base`` of ``src``), as slices of ``src``. Raises CorruptObjectError."""
    out: list[Any] = []
    append, unpack_from = out.append, _U32.unpack_from
    pos, end = base + start, base + start + length
    body_offset, exact, _ = where
    if count > length // 4:
        raise CorruptObjectError(
            path,
            body_offset + (start if exact else 0),
            f"{count} changes cannot fit {length} bytes",
        )
    for _ in range(count):
        if pos + 4 > end:
            raise CorruptObjectError(
                path, body_offset + (pos - base if exact else 0), "truncated change length"
            )
        n = unpack_from(src, pos)[0]
        pos += 4
        if pos + n > end:
            raise CorruptObjectError(
                path, body_offset + (pos - base if exact else 0), "truncated change"
            )
        append(src[pos : pos + n])
        pos += n
    if pos != end:
        raise CorruptObjectError(
            path,
            body_offset + (pos - base if exact else 0),
            f"{end - pos} bytes after the entry's changes",
        )
    return out


def _read_table(
    src: bytes | memoryview,
    base: int,
    start: int,
    length: int,
    count: int,
    path: str,
    where: tuple[int, bool, int],
) -> list[Any]:
    """The ``count`` changes of a version-2 entry filling body bytes [start, start +
    length) (the body starts at ``base`` of ``src``): its table of lengths, then the
    changes, sliced from ``src`` with no length read per change. Raises
    CorruptObjectError."""
    body_offset, exact, _ = where
    at = body_offset + (start if exact else 0)
    if count > length // 4:
        raise CorruptObjectError(path, at, f"{count} changes cannot fit {length} bytes")
    pos = base + start
    offsets = list(accumulate(struct.unpack_from(f"!{count}I", src, pos), initial=pos + 4 * count))
    if offsets[-1] != pos + length:
        raise CorruptObjectError(
            path,
            at,
            f"entry of {length} bytes holds a table of {count} lengths and "
            f"{offsets[-1] - pos - 4 * count} bytes of changes",
        )
    return [src[a:b] for a, b in pairwise(offsets)]
