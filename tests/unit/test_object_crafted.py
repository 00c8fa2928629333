"""Crafted objects: indexes and segments rewritten with every checksum recomputed, so
only the cross-checks can catch them. Each must raise CorruptObjectError naming the
object path and an offset inside the object (where the lie is found), never return
data, never raise a bare ValueError/TypeError."""

from __future__ import annotations

import contextlib
import struct
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstltree.client import ChangelogHandle, CorruptObjectError, ObjectStore
from dstltree.client.handle import SegmentRef
from dstltree.client.objectformat import FOOTER, FORMAT_VERSION, MAGIC, build_object
from dstltree.client.reader import iter_changes, read_changes, read_index, read_segment
from dstltree.client.segment import (
    SegmentMeta,
    decode_segment,
    encode_segment,
    segment_checksum,
    segment_crc,
    segment_key_groups,
)

pytestmark = pytest.mark.timeout(60)
FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

Row = list[Any]


def _segments(n: int) -> list[tuple[SegmentMeta, bytes]]:
    """``n`` real segments of writers w0.., writer i holding SQNs [2i, 2i+2)."""
    out = []
    for i in range(n):
        cs = {2 * i: {i % 3: [b"a%d" % i]}, 2 * i + 1: {i % 3 + 1: [b"b%d" % i, b"c"]}}
        data = encode_segment(f"w{i}", 2 * i, 2 * i + 2, cs)
        kgs = segment_key_groups(cs)
        out.append(
            (SegmentMeta(f"w{i}", 2 * i, 2 * i + 2, kgs, len(data), segment_crc(data)), data)
        )
    return out


def _rows(segs: list[tuple[SegmentMeta, bytes]]) -> list[Row]:
    rows, pos = [], 0
    for m, d in segs:
        rows.append([m.log_id, m.sqn_from, m.sqn_to, list(m.key_groups), pos, m.length, m.crc32])
        pos += len(d)
    return rows


def _assemble(datas: list[bytes], index_doc: Any) -> bytes:
    """Segments, the msgpack ``index_doc`` and a footer whose bounds and index CRC32 are
    right for them: a crafted object every checksum agrees with."""
    body = b"".join(datas)
    index = msgpack.packb(index_doc)
    footer = FOOTER.pack(MAGIC, FORMAT_VERSION, 0, len(body), len(index), zlib.crc32(index))
    return body + index + footer


def _put(store: ObjectStore, raw: bytes) -> str:
    path = store.new_object_path()
    store.put(path, [raw])
    return path


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return ObjectStore(str(tmp_path))


def _assert_corrupt(fn: Callable[[], object], path: str, size: int) -> CorruptObjectError:
    with pytest.raises(CorruptObjectError) as info:
        fn()
    err = info.value
    assert err.path == path and 0 <= err.offset <= size, err
    assert path in str(err) and f"offset {err.offset}" in str(err)
    return err


def test_honest_object_reads_back(store: ObjectStore) -> None:
    segs = _segments(4)
    parts, offsets = build_object(segs)
    path = _put(store, b"".join(parts))
    refs = read_index(store, path)
    assert [r.offset for r in refs] == offsets
    assert [r.meta for r in refs] == [m for m, _ in segs]
    h = ChangelogHandle("w1", (2, 4), (refs[1],))
    assert list(read_changes(store, h, 2)) == [b"b1", b"c"]


# -- lying index rows: SQN range, key groups, log id, crc, swapped rows ---------------------
def _lie(rows: list[Row], victim: int, field: str, data: st.DataObject) -> None:
    row = rows[victim]
    if field == "sqn":
        lo = data.draw(st.integers(0, 50))
        hi = data.draw(st.integers(lo, 60))
        if [lo, hi] == row[1:3]:
            hi += 1
        row[1:3] = [lo, hi]
    elif field == "key_groups":
        kgs = data.draw(st.lists(st.integers(0, 9), unique=True, max_size=4).map(sorted))
        row[3] = kgs if kgs != row[3] else [*kgs, 10]
    elif field == "log":
        row[0] = data.draw(st.text(max_size=8).filter(lambda s: s != row[0]))
    elif field == "crc":
        row[6] = data.draw(st.integers(0, 2**32 - 1).filter(lambda c: c != row[6]))
    else:  # swap the meta of two rows, keep offsets and lengths
        other = (victim + 1) % len(rows)
        for k in (0, 1, 2, 3):
            row[k], rows[other][k] = rows[other][k], row[k]


@given(
    n=st.integers(2, 5),
    victim=st.integers(0, 4),
    field=st.sampled_from(["sqn", "key_groups", "log", "crc", "swap"]),
    data=st.data(),
)
@FAST
def test_lying_index_entry_is_caught(
    store: ObjectStore, n: int, victim: int, field: str, data: st.DataObject
) -> None:
    segs = _segments(n)
    rows = _rows(segs)
    victim %= n
    _lie(rows, victim, field, data)
    path = _put(store, _assemble([d for _, d in segs], {"v": 1, "segments": rows}))
    size = store.size(path)
    err = _assert_corrupt(lambda: read_index(store, path), path, size)
    assert err.offset in {r[4] for r in rows}, "names the offset of a lying entry's segment"
    # a reader by handle built from the lying index refuses it too
    lying = read_index(store, path, verify=False)
    for ref, (meta, _) in zip(lying, segs, strict=True):
        if ref.meta == meta:
            continue
        e = _assert_corrupt(lambda ref=ref: read_segment(store, ref), path, size)
        assert e.offset == ref.offset
        if ref.sqn_to > 0:  # a handle whose range [0, 100) overlaps the entry reads it
            handle = ChangelogHandle(ref.log_id, (0, 100), (ref,))
            _assert_corrupt(lambda h=handle: list(iter_changes(store, h)), path, size)


@given(n=st.integers(2, 5), victim=st.integers(0, 3), delta=st.integers(-40, 40), data=st.data())
@FAST
def test_moved_boundaries_and_offsets_are_caught(
    store: ObjectStore, n: int, victim: int, delta: int, data: st.DataObject
) -> None:
    segs = _segments(n)
    rows = _rows(segs)
    victim %= n - 1
    mode = data.draw(st.sampled_from(["boundary", "offset", "length"]))
    if mode == "boundary":  # still tiles the area: segment i grows, i + 1 shrinks
        delta = max(min(delta, rows[victim + 1][5] - 1), 1 - rows[victim][5]) or 1
        rows[victim][5] += delta
        rows[victim + 1][4] += delta
        rows[victim + 1][5] -= delta
    else:
        k = 4 if mode == "offset" else 5
        moved = rows[victim][k] + delta
        rows[victim][k] = moved if moved >= 0 and delta else rows[victim][k] + 1
    path = _put(store, _assemble([d for _, d in segs], {"v": 1, "segments": rows}))
    _assert_corrupt(lambda: read_index(store, path), path, store.size(path))


# -- malformed segment headers and bodies, trailer CRC and index recomputed ---------------
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


def _header_mutation(header: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    kind = data.draw(st.sampled_from(["field", "entry", "entry_field", "drop", "extra"]))
    if kind == "field":
        header[data.draw(st.sampled_from(["v", "log", "sqn", "entries"]))] = data.draw(values)
    elif kind == "entry" and header["entries"]:
        header["entries"][data.draw(st.integers(0, len(header["entries"]) - 1))] = data.draw(values)
    elif kind == "entry_field" and header["entries"]:
        e = header["entries"][data.draw(st.integers(0, len(header["entries"]) - 1))]
        e[data.draw(st.integers(0, 4))] = data.draw(values | st.integers(0, 100))
    elif kind == "drop":
        header.pop(data.draw(st.sampled_from(sorted(header))))
    else:
        header["entries"].append(data.draw(st.lists(st.integers(0, 100), min_size=5, max_size=5)))
    return header


def _reframe(header: Any, body: bytes) -> bytes:
    h = msgpack.packb(header)
    out = struct.pack("!I", len(h)) + h + body
    version = header.get("v") if isinstance(header, dict) else None
    return out + struct.pack("!I", segment_checksum(out, 1 if version == 1 else 2))


@given(victim=st.integers(0, 2), data=st.data())
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_malformed_segment_is_corruption_not_a_bare_error(
    store: ObjectStore, victim: int, data: st.DataObject
) -> None:
    segs = _segments(3)
    meta, seg = segs[victim]
    hlen = struct.unpack_from("!I", seg)[0]
    header = msgpack.unpackb(seg[4 : 4 + hlen])
    body = seg[4 + hlen : -4]
    mutated = _header_mutation(header, data)
    if data.draw(st.booleans()):
        body = data.draw(st.binary(max_size=40))
    new = _reframe(mutated, body)
    if new == seg:
        return
    try:  # decoding alone: a CorruptObjectError or a segment, never a bare error
        decode_segment(new, "<crafted>", 0)
    except CorruptObjectError as e:
        assert e.path == "<crafted>" and 0 <= e.offset < len(new)
    # the index follows the crafted segment's length (rows still tile the object); its
    # CRC32 stays the writer's, so a well-formed but different segment is caught too
    segs[victim] = (replace(meta, length=len(new)), new)
    path = _put(store, _assemble([d for _, d in segs], {"v": 1, "segments": _rows(segs)}))
    offset = sum(len(d) for _, d in segs[:victim])
    err = _assert_corrupt(lambda: read_index(store, path), path, store.size(path))
    assert offset <= err.offset < offset + len(new), "names a position inside the segment"
    ref = SegmentRef(segs[victim][0], path, offset)
    err = _assert_corrupt(lambda: read_segment(store, ref), path, store.size(path))
    assert offset <= err.offset < offset + len(new)


@given(doc=values | st.fixed_dictionaries({"v": st.just(1), "segments": values}))
@FAST
def test_malformed_index_is_corruption(store: ObjectStore, doc: Any) -> None:
    segs = _segments(2)
    path = _put(store, _assemble([d for _, d in segs], doc))
    index_offset = sum(len(d) for _, d in segs)
    for verify in (True, False):
        err = _assert_corrupt(
            lambda v=verify: read_index(store, path, verify=v), path, store.size(path)
        )
        assert err.offset == index_offset


def test_rewritten_footer_fields(store: ObjectStore) -> None:
    segs = _segments(2)
    parts, _ = build_object(segs)
    raw = bytearray(b"".join(parts))
    footer_at = len(raw) - FOOTER.size
    raw[footer_at + 10 : footer_at + 12] = b"\x00\x01"  # the reserved field
    path = _put(store, bytes(raw))
    err = _assert_corrupt(lambda: read_index(store, path), path, len(raw))
    assert err.offset == footer_at + 10 and "reserved" in err.reason


def test_index_takes_the_trailer_crc_when_a_sender_gave_none(store: ObjectStore) -> None:
    segs = [(replace(m, crc32=0), d) for m, d in _segments(2)]
    parts, _ = build_object(segs)
    path = _put(store, b"".join(parts))
    assert [r.crc32 for r in read_index(store, path)] == [segment_crc(d) for _, d in segs]


@given(
    field=st.sampled_from(["log_id", "sqn_range", "segments", "seg"]), value=values, data=st.data()
)
@FAST
def test_malformed_handle_record_raises_only_the_documented_errors(
    field: str, value: Any, data: st.DataObject
) -> None:
    (meta, _), *_ = _segments(1)
    d = ChangelogHandle("w0", (0, 2), (SegmentRef(meta, "p.dstl", 0),)).to_dict()
    if field == "seg":
        seg = d["segments"][0]
        seg[data.draw(st.sampled_from(sorted(seg)))] = value
    else:
        d[field] = value
    with contextlib.suppress(KeyError, TypeError, ValueError):
        ChangelogHandle.from_dict(d)
