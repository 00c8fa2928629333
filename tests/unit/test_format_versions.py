"""Format versions of objects and segments: version 2 objects round trip, and a reader
refuses a version it does not know with an error naming the path and the version."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import pytest

from dstltree.client import ObjectStore
from dstltree.client.errors import CorruptObjectError, UnsupportedVersionError
from dstltree.client.objectformat import (
    FOOTER,
    FOOTER_SIZE,
    FORMAT_VERSIONS,
    MAGIC,
    build_object,
    index_checksum,
)
from dstltree.client.reader import read_index, read_segment
from dstltree.client.segment import SegmentMeta, decode_segment, encode_segment, segment_crc


def _segments(n: int) -> list[tuple[SegmentMeta, bytes]]:
    out = []
    for i in range(n):
        data = encode_segment(f"w{i}", i, i + 1, {i: {i % 3: [b"change-%d" % i]}})
        out.append((SegmentMeta(f"w{i}", i, i + 1, (i % 3,), len(data), segment_crc(data)), data))
    return out


def _put(store: ObjectStore, parts: list) -> str:
    path = store.new_object_path()
    store.put(path, parts)
    return path


@pytest.mark.parametrize("version", FORMAT_VERSIONS)
@pytest.mark.parametrize("verify", [True, False])
def test_every_object_version_round_trips(tmp_path: Path, version: int, verify: bool) -> None:
    store = ObjectStore(str(tmp_path))
    parts, offsets = build_object(_segments(3), version, writer="node-a1")
    path = _put(store, parts)
    refs = read_index(store, path, verify=verify)
    assert [r.offset for r in refs] == offsets
    assert [r.log_id for r in refs] == ["w0", "w1", "w2"]
    assert read_segment(store, refs[2]).entries == {(2, 2): [b"change-2"]}


def test_a_version_2_index_names_its_writer_and_time(tmp_path: Path) -> None:
    parts, _ = build_object(_segments(1), 2, writer="node-a1")
    index = msgpack.unpackb(parts[-2])
    assert index["v"] == 2 and index["w"] == "node-a1" and index["t"] > 1.7e9
    v, _, _, length, checksum = FOOTER.unpack(parts[-1])[1:]
    assert v == 2 and length == len(parts[-2]) and checksum == index_checksum(parts[-2], 2)


def test_build_object_refuses_an_unknown_version() -> None:
    with pytest.raises(ValueError, match="object format version 3"):
        build_object(_segments(1), 3)


def _future_object(store: ObjectStore, version: int) -> str:
    """An object as a newer dstltree might write it: version ``version`` in the footer,
    an index this code has never seen."""
    index = msgpack.packb({"v": version, "layout": "columnar", "segments": {}})
    body = b"\x00" * 64
    footer = FOOTER.pack(MAGIC, version, 0, len(body), len(index), 0)
    return _put(store, [body, index, footer])


@pytest.mark.parametrize("verify", [True, False])
def test_an_object_of_a_future_version_is_refused_by_version(tmp_path: Path, verify: bool) -> None:
    store = ObjectStore(str(tmp_path))
    path = _future_object(store, 7)
    with pytest.raises(UnsupportedVersionError) as info:
        read_index(store, path, verify=verify)
    e = info.value
    assert isinstance(e, CorruptObjectError)  # callers treating any unreadable object alike
    assert (e.version, e.kind, e.path) == (7, "object", path)
    size = store.size(path)
    assert e.offset == size - FOOTER_SIZE + 8  # the footer's version field
    assert path in str(e) and "object format version 7" in str(e) and "1, 2" in str(e)


def test_a_segment_of_a_future_version_is_refused_by_version() -> None:
    """A newer segment (another header, maybe another trailer checksum) is refused by
    its version, not reported as a checksum mismatch."""
    header = msgpack.packb({"v": 9, "log": "w", "sqn": [0, 1], "columns": []})
    body = struct.pack("!I", len(header)) + header + b"payload"
    data = body + struct.pack("!I", 0xDEADBEEF)  # a checksum of some future kind
    with pytest.raises(UnsupportedVersionError) as info:
        decode_segment(data, "s3://bucket/ab/obj.dstl", 4096)
    e = info.value
    assert (e.version, e.kind, e.offset) == (9, "segment", 4096 + 4)
    assert "s3://bucket/ab/obj.dstl" in str(e) and "segment format version 9" in str(e)


def test_a_corrupt_segment_of_a_known_version_is_still_a_checksum_error() -> None:
    data = bytearray(encode_segment("w", 0, 1, {0: {0: [b"x"]}}))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptObjectError) as info:
        decode_segment(bytes(data), "p", 0)
    assert not isinstance(info.value, UnsupportedVersionError)


@pytest.mark.parametrize("version", FORMAT_VERSIONS)
def test_no_single_bit_flip_of_a_footer_passes_for_a_newer_version(
    tmp_path: Path, version: int
) -> None:
    """Every one of the 224 single-bit flips of a real object's footer is reported as
    corruption (path and offset: in the footer, or the index's for a flipped index
    checksum), never as an unknown newer version."""
    store = ObjectStore(str(tmp_path))
    parts, _ = build_object(_segments(3), version)
    data = b"".join(bytes(p) for p in parts)
    size = len(data)
    for bit in range(FOOTER_SIZE * 8):
        raw = bytearray(data)
        raw[size - FOOTER_SIZE + bit // 8] ^= 0x80 >> (bit % 8)
        path = _put(store, [bytes(raw)])
        for verify in (True, False):
            with pytest.raises(CorruptObjectError) as info:
                read_index(store, path, verify=verify)
            e = info.value
            assert not isinstance(e, UnsupportedVersionError), (bit, str(e))
            assert e.path == path and 0 <= e.offset < size, (bit, str(e))
