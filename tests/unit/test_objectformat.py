"""Object format round trip and corruption detection (path and offset named)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client import ChangelogClient, CorruptObjectError, ObjectStore
from dstltree.client.objectformat import FOOTER_SIZE, build_object
from dstltree.client.reader import read_index, read_segment
from dstltree.client.segment import (
    SegmentMeta,
    decode_segment,
    encode_segment,
    encode_segment_parts,
    segment_crc,
)

changesets_st = st.dictionaries(
    st.integers(0, 50),
    st.dictionaries(
        st.integers(0, 127),
        st.lists(st.binary(max_size=40), min_size=1, max_size=5),
        min_size=1,
        max_size=4,
    ),
    max_size=5,
)


@given(changesets_st)
@settings(max_examples=60, deadline=None)
def test_segment_round_trip(changesets: dict[int, dict[int, list[bytes]]]) -> None:
    data = encode_segment("log-1", 0, 51, changesets)
    seg = decode_segment(data)
    assert seg.log_id == "log-1" and (seg.sqn_from, seg.sqn_to) == (0, 51)
    expected = {(s, kg): v for s, per in changesets.items() for kg, v in per.items()}
    assert seg.entries == expected


def _write(store: ObjectStore, n: int) -> tuple[str, list[bytes]]:
    segs = [
        encode_segment(f"w{i}", i, i + 1, {i: {i % 3: [b"v%d" % i] * (i + 1)}}) for i in range(n)
    ]
    parts, _ = build_object(
        [
            (SegmentMeta(f"w{i}", i, i + 1, (i % 3,), len(s), segment_crc(s)), s)
            for i, s in enumerate(segs)
        ]
    )
    path = store.new_object_path()
    store.put(path, parts)
    return path, segs


def test_object_round_trip(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    path, segs = _write(store, 5)
    index = read_index(store, path)
    assert [e.log_id for e in index] == [f"w{i}" for i in range(5)]
    offset = 0
    for e, s in zip(index, segs, strict=True):
        assert (e.offset, e.length) == (offset, len(s))
        assert store.read_range(path, e.offset, e.length) == s
        offset += len(s)
    assert store.size(path) == offset + (store.size(path) - offset)
    assert path.startswith(str(tmp_path)) and path.endswith(".dstl")


def test_corrupt_segment_names_path_and_offset(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    path, _ = _write(store, 3)
    index = read_index(store, path)
    raw = bytearray(Path(path).read_bytes())
    victim = index[1]
    raw[victim.offset + victim.length // 2] ^= 0xFF
    Path(path).write_bytes(bytes(raw))

    ref = victim  # the index entry is the segment's reference
    with pytest.raises(CorruptObjectError) as info:
        read_segment(store, ref)
    assert info.value.path == path and info.value.offset == victim.offset
    assert path in str(info.value) and "checksum" in str(info.value)


def test_truncated_object(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    path, _ = _write(store, 2)
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[: len(raw) - FOOTER_SIZE // 2])
    with pytest.raises(CorruptObjectError) as info:
        read_index(store, path)
    assert info.value.path == path
    Path(path).write_bytes(raw[:10])
    with pytest.raises(CorruptObjectError, match="footer|truncated|magic"):
        read_index(store, path)


def test_read_past_end_is_corruption(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    client = ChangelogClient.open(str(tmp_path))
    w = client.create_writer("w", range(4))
    w.append(1, b"hello")
    h = w.persist_durably(0).result(timeout=10)
    client.close()
    ref = h.segments[0]
    Path(ref.path).write_bytes(Path(ref.path).read_bytes()[: ref.offset + ref.length - 3])
    with pytest.raises(CorruptObjectError) as info:
        list(ChangelogClient(store, client.uploader, 1).read_changes(h, 1))
    assert info.value.path == ref.path


def test_batch_counts_persisted_writers_across_a_size_cut() -> None:
    from dstltree.client.batching import Batch, PersistItem

    def _item(log_id: str, sqn: int, checkpoint_id: int, data: bytes) -> PersistItem:
        return PersistItem(SegmentMeta(log_id, sqn, sqn + 1, (0,), len(data)), checkpoint_id, data)

    b = Batch(target_bytes=10, persist_delay=60.0)
    b.add(_item("w1", 0, 7, b"x" * 12), now=0.0)
    assert b.due(0.0, expected_writers=2) == "size"
    b.take("size", expected_writers=2)
    b.add(_item("w2", 0, 7, b"y"), now=0.1)
    assert b.due(0.1, expected_writers=2) == "all-persisted", "w1 still counts for checkpoint 7"
    b.take("all-persisted")
    b.add(_item("w3", 1, 8, b"z"), now=0.2)
    assert b.due(0.2, expected_writers=2) is None
    assert b.due(60.3, expected_writers=2) == "delay"
    # a checkpoint already complete at a size cut is not carried into the next batch
    b.take("delay")
    b.add(_item("w1", 2, 9, b"x" * 6), now=61.0)
    b.add(_item("w2", 2, 9, b"x" * 6), now=61.0)
    assert b.due(61.0, expected_writers=2) == "size"
    b.take("size", expected_writers=2)
    b.add(_item("w1", 3, 10, b"x"), now=61.1)
    assert b.due(61.1, expected_writers=2) is None, "checkpoint 9 was complete: forgotten"


def test_a_segment_of_several_buffers_lands_as_its_bytes(tmp_path: Path) -> None:
    """``build_object`` writes a segment given as a tuple of buffers (as sent, never
    joined) back to back: the object is the one built from its joined bytes, and the
    index takes its trailer checksum when the meta gives none."""
    parts = encode_segment_parts("w", 0, 1, {0: {5: [b"a" * 5000, b"b" * 300_000]}})
    data = b"".join(parts)
    assert len(parts) > 1
    for crc in (segment_crc(data), 0):
        meta = SegmentMeta("w", 0, 1, (5,), len(data), crc)
        split, offsets = build_object([(meta, tuple(parts))])
        whole, _ = build_object(
            [(SegmentMeta("w", 0, 1, (5,), len(data), segment_crc(data)), data)]
        )
        assert b"".join(split) == b"".join(whole) and offsets == [0]
    with pytest.raises(ValueError, match="meta says"):
        build_object([(SegmentMeta("w", 0, 1, (5,), len(data) + 1), tuple(parts))])
    store = ObjectStore(str(tmp_path))
    path = store.new_object_path()
    store.put(path, split)
    (ref,) = read_index(store, path)
    assert decode_segment(store.read_range(path, ref.offset, ref.length)).entries == {
        (0, 5): [b"a" * 5000, b"b" * 300_000]
    }
