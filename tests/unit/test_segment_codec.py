"""Segment encoding round trips in every version (1, 2, 2 with zstd), slices without
copies, and corrupt, truncated or hostile segments (compressed ones included) raising
CorruptObjectError with the path and offset."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import google_crc32c
import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.errors import CorruptObjectError
from dstltree.client.segment import (
    MAX_BODY_BYTES,
    MAX_SEGMENT_PARTS,
    decode_segment,
    encode_segment,
    encode_segment_parts,
    segment_checksum,
    segment_crc,
    segment_parts,
    segment_size,
)

CHANGE = st.binary(max_size=40) | st.sampled_from([b"ab" * 300, b""])
CHANGESETS = st.dictionaries(
    st.integers(0, 9),
    st.dictionaries(st.integers(0, 127), st.lists(CHANGE, max_size=6), max_size=4),
    max_size=5,
)
MODES: list[dict[str, Any]] = [{"version": 1}, {}, {"compression": "zstd"}]


def _expected(changesets: dict[int, dict[int, list[bytes]]]) -> dict[tuple[int, int], list[bytes]]:
    return {(s, kg): list(v) for s, per in changesets.items() for kg, v in per.items()}


def _craft(header: dict[str, Any], body: bytes) -> bytes:
    """A segment with this header and body and a valid trailer checksum for its version."""
    head = msgpack.packb(header)
    data = struct.pack("!I", len(head)) + head + body
    return data + struct.pack("!I", segment_checksum(data, 1 if header.get("v") == 1 else 2))


def _compressed(raw_body: bytes, size: int | None = None, frame: bytes | None = None) -> bytes:
    """A version-2 zstd segment of one entry (sqn 0, key group 1) over ``raw_body``."""
    header = {
        "v": 2,
        "log": "w",
        "sqn": [0, 1],
        "codec": "zstd",
        "size": len(raw_body) if size is None else size,
        "entries": [[0, 1, 1, 0, len(raw_body)]],
    }
    return _craft(header, zstandard.ZstdCompressor().compress(raw_body) if frame is None else frame)


@settings(max_examples=150, deadline=None)
@given(CHANGESETS, st.sampled_from(range(len(MODES))))
def test_any_changesets_round_trip(
    changesets: dict[int, dict[int, list[bytes]]], mode: int
) -> None:
    data = encode_segment("writer-1", 0, 10, changesets, **MODES[mode])
    want = _expected(changesets)
    seg = decode_segment(data, "p", 7)
    assert seg.entries == want and all(type(c) is bytes for v in seg.entries.values() for c in v)
    assert (seg.log_id, seg.sqn_from, seg.sqn_to) == ("writer-1", 0, 10)
    assert seg.length == len(data) and seg.crc32 == segment_crc(data)
    views = decode_segment(bytearray(data), copy=False)
    assert {k: [bytes(c) for c in v] for k, v in views.entries.items()} == want
    assert all(type(c) is memoryview and c.readonly for v in views.entries.values() for c in v)


def test_version_1_bytes_are_those_of_the_first_format() -> None:
    head = msgpack.packb({"v": 1, "log": "w", "sqn": [3, 5], "entries": [[4, 2, 2, 0, 11]]})
    body = b"\x00\x00\x00\x02ab\x00\x00\x00\x01c"
    framed = struct.pack("!I", len(head)) + head + body
    want = framed + struct.pack("!I", zlib.crc32(framed))
    assert encode_segment("w", 3, 5, {4: {2: [b"ab", b"c"]}}, version=1) == want


def test_compression_is_recorded_and_skipped_when_it_saves_nothing() -> None:
    big = {0: {1: [b"x" * 1000] * 20}}
    data = encode_segment("w", 0, 1, big, compression="zstd")
    header = msgpack.unpackb(data[4 : 4 + struct.unpack_from("!I", data)[0]])
    assert header["v"] == 2 and header["codec"] == "zstd" and header["size"] == 20 * 1004
    assert len(data) < 2000
    tiny = encode_segment("w", 0, 1, {0: {1: [b"q"]}}, compression="zstd")
    assert tiny == encode_segment("w", 0, 1, {0: {1: [b"q"]}})


@pytest.mark.parametrize(
    "kwargs",
    [{"compression": "lz9"}, {"compression": "zstd", "version": 1}, {"version": 3}],
)
def test_bad_encoding_options_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        encode_segment("w", 0, 1, {0: {1: [b"a"]}}, **kwargs)


@settings(max_examples=150, deadline=None)
@given(CHANGESETS, st.sampled_from(range(len(MODES))), st.data())
def test_any_damage_raises_corrupt_object_error(
    changesets: dict[int, dict[int, list[bytes]]], mode: int, data: st.DataObject
) -> None:
    good = encode_segment("w", 0, 10, changesets, **MODES[mode])
    cut = data.draw(st.integers(0, len(good) - 1))
    flip = data.draw(st.integers(0, len(good) - 1))
    damaged = [good[:cut], good[:flip] + bytes([good[flip] ^ 0x41]) + good[flip + 1 :]]
    for bad in damaged:
        with pytest.raises(CorruptObjectError) as e:
            decode_segment(bad, "obj", 100)
        assert e.value.path == "obj" and e.value.offset >= 100


@settings(max_examples=100, deadline=None)
@given(CHANGESETS, st.sampled_from(range(len(MODES))))
def test_the_trailer_checksum_is_the_one_of_the_version(
    changesets: dict[int, dict[int, list[bytes]]], mode: int
) -> None:
    data = encode_segment("w", 0, 10, changesets, **MODES[mode])
    version = MODES[mode].get("version", 2)
    want = google_crc32c.value(data[:-4]) if version == 2 else zlib.crc32(data[:-4])
    assert segment_crc(data) == want == segment_checksum(data[:-4], version)
    for form in (data, bytearray(data), memoryview(data), memoryview(b"xy" + data)[2:]):
        assert decode_segment(form).crc32 == want


@pytest.mark.parametrize("version", [1, 2])
def test_a_trailer_of_the_other_version_s_checksum_is_corrupt(version: int) -> None:
    data = encode_segment("w", 0, 1, {0: {1: [b"abc", b"d" * 5000]}}, version=version)
    other = 2 if version == 1 else 1
    swapped = data[:-4] + struct.pack("!I", segment_checksum(data[:-4], other))
    with pytest.raises(CorruptObjectError, match="checksum") as e:
        decode_segment(swapped, "obj", 40)
    assert (e.value.path, e.value.offset) == ("obj", 40)


def test_a_checksum_mismatch_names_stored_and_read_checksums() -> None:
    data = bytearray(encode_segment("w", 0, 1, {0: {1: [b"abc"]}}))
    data[-1] ^= 1
    for form in (bytes(data), data):
        with pytest.raises(CorruptObjectError, match="stored 0x.*read 0x") as e:
            decode_segment(form, "obj", 3)
        assert (e.value.path, e.value.offset) == ("obj", 3)


def _raw_entry(*changes: bytes) -> bytes:
    """A version-2 entry: its table of lengths, then the changes."""
    return struct.pack(f"!{len(changes)}I", *map(len, changes)) + b"".join(changes)


HOSTILE = {
    "claims more than the limit": _compressed(b"a" * 8, size=MAX_BODY_BYTES + 1),
    "frame declares another size": _compressed(
        b"a" * 8, frame=zstandard.ZstdCompressor().compress(b"a" * 9)
    ),
    "frame without its size": _compressed(
        _raw_entry(b"abcd"),
        frame=zstandard.ZstdCompressor(write_content_size=False).compress(_raw_entry(b"abcd")),
    ),
    "bytes after the frame": _compressed(
        _raw_entry(b"abcd"), frame=zstandard.ZstdCompressor().compress(_raw_entry(b"abcd")) + b"!"
    ),
    "two frames": _compressed(
        _raw_entry(b"abcd"), frame=zstandard.ZstdCompressor().compress(_raw_entry(b"abcd")) * 2
    ),
    "corrupt frame": _compressed(_raw_entry(b"abcd"), frame=b"\x28\xb5\x2f\xfd" + b"\x00" * 12),
    "unknown codec": _craft(
        {"v": 2, "log": "w", "sqn": [0, 1], "codec": "lz9", "size": 4, "entries": []}, b"xxxx"
    ),
    "size of the wrong type": _craft(
        {"v": 2, "log": "w", "sqn": [0, 1], "codec": "zstd", "size": -1, "entries": []}, b""
    ),
    "table longer than its entry": _craft(
        {"v": 2, "log": "w", "sqn": [0, 1], "entries": [[0, 1, 2, 0, 8]]},
        struct.pack("!2I", 0, 9),
    ),
    "changes past the entry": _craft(
        {"v": 2, "log": "w", "sqn": [0, 1], "entries": [[0, 1, 1, 0, 6]]},
        struct.pack("!I", 3) + b"ab",
    ),
    "an entry field that is a bool": _craft(
        {"v": 2, "log": "w", "sqn": [0, 1], "entries": [[0, True, 0, 0, 0]]}, b""
    ),
    "a negative entry field": _craft(
        {"v": 2, "log": "w", "sqn": [0, 1], "entries": [[0, 1, 0, 0, -1]]}, b""
    ),
    "unknown version": _craft({"v": 3, "log": "w", "sqn": [0, 1], "entries": []}, b""),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_segments_raise_with_path_and_offset(case: str) -> None:
    with pytest.raises(CorruptObjectError) as e:
        decode_segment(HOSTILE[case], "obj", 1000)
    assert e.value.path == "obj" and e.value.offset >= 1000


def test_a_small_limit_bounds_the_decompressed_size() -> None:
    data = _compressed(_raw_entry(b"x" * 5000))
    assert decode_segment(data).entries == {(0, 1): [b"x" * 5000]}
    with pytest.raises(CorruptObjectError, match="more than 4096"):
        decode_segment(data, "obj", 0, max_body_bytes=4096)


def test_a_client_with_compression_writes_zstd_segments_readers_read(tmp_path: Path) -> None:
    from dstltree.client.api import ChangelogClient
    from dstltree.client.reader import read_exact

    changes = [f"change {i % 7} ".encode() * 20 for i in range(300)]
    with ChangelogClient.open(str(tmp_path), compression="zstd") as client:
        w = client.create_writer("w", range(4))
        for c in changes:
            w.append(2, c)
        handle = w.persist_durably(0).result()
        assert [c for _, _, c in client.iter_changes(handle)] == changes
    ref = handle.segments[0]
    data = read_exact(client.store, ref.path, ref.offset, ref.length)
    header = msgpack.unpackb(data[4 : 4 + struct.unpack_from("!I", data)[0]])
    assert header["codec"] == "zstd" and ref.length < sum(map(len, changes)) // 4
    with pytest.raises(ValueError, match="lz9"):
        ChangelogClient.open(str(tmp_path), compression="lz9")


LARGE = st.binary(min_size=4096, max_size=9000) | st.sampled_from([b"z" * 300_000])
LARGE_SETS = st.dictionaries(
    st.integers(0, 3),
    st.dictionaries(st.integers(0, 127), st.lists(LARGE | CHANGE, max_size=3), max_size=3),
    max_size=3,
)


@settings(max_examples=80, deadline=None)
@given(LARGE_SETS, st.sampled_from(range(len(MODES))))
def test_segment_parts_join_to_the_segment(
    changesets: dict[int, dict[int, list[bytes]]], mode: int
) -> None:
    """``encode_segment_parts``: the same bytes as ``encode_segment``; its large changes
    are the appended objects themselves (not copied); at most MAX_SEGMENT_PARTS
    buffers; size and trailer checksum read from the buffers as from the bytes."""
    data = encode_segment("w", 0, 4, changesets, **MODES[mode])
    parts = encode_segment_parts("w", 0, 4, changesets, **MODES[mode])
    assert b"".join(parts) == data and 1 <= len(parts) <= MAX_SEGMENT_PARTS
    split = tuple(parts)
    assert segment_size(split) == len(data) and segment_crc(split) == segment_crc(data)
    assert segment_parts(split) == split and segment_parts(data) == (data,)
    if len(parts) > 1 and "compression" not in MODES[mode]:
        changes = [c for per in changesets.values() for v in per.values() for c in v]
        assert all(any(p is c for c in changes) for p in parts if len(p) >= 4096)


def test_small_or_too_many_changes_come_as_one_buffer() -> None:
    assert len(encode_segment_parts("w", 0, 1, {0: {0: [b"x" * 100] * 50}})) == 1
    assert len(encode_segment_parts("w", 0, 1, {0: {0: [b"x" * 200_000]}})) == 1  # < 256 KiB
    assert len(encode_segment_parts("w", 0, 1, {})) == 1
    squeezed = encode_segment_parts("w", 0, 1, {0: {0: [b"s" * 1_000_000]}}, compression="zstd")
    assert len(squeezed) == 1, "split by the bytes stored: 1 MB compressed to a few"
    many = {0: {kg: [b"y" * 9000] for kg in range(MAX_SEGMENT_PARTS)}}
    assert len(encode_segment_parts("w", 0, 1, many)) == 1  # two buffers per key group
    change = b"z" * 300_000
    big = encode_segment_parts("w", 0, 1, {0: {0: [change]}})
    assert len(big) == 4 and big[2] is change  # framing, lengths, the change, trailer


def test_the_trailer_is_read_across_tiny_buffers() -> None:
    data = encode_segment("w", 0, 1, {0: {0: [b"q" * 5000]}})
    pieces = tuple(data[i : i + 1] for i in range(len(data) - 6, len(data)))
    split = (memoryview(data[: len(data) - 6]), *pieces)
    assert segment_crc(split) == segment_crc(data) and segment_size(split) == len(data)
    with pytest.raises(ValueError, match="shorter"):
        segment_crc((b"abc", b"defg"))
