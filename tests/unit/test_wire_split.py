"""``persist_messages``: requests split into Persist messages bounded in bytes and
items, order kept (property tests); segments of several buffers as several frames."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstltree.client.batching import PersistItem
from dstltree.client.errors import WireError
from dstltree.client.segment import MAX_SEGMENT_PARTS, SPLIT_FROM_BYTES, SegmentMeta
from dstltree.client.wire import (
    MAX_ITEMS,
    Persist,
    PersistRequest,
    dump,
    load,
    persist_messages,
)


def _request(rid: int, size: int) -> PersistRequest:
    meta = SegmentMeta("w", rid, rid + 1, (0,), size)
    return PersistRequest(rid, PersistItem(meta, None, b"x" * size if size else None))


@given(
    st.lists(st.integers(0, 300), max_size=40), st.integers(1, 500), st.sampled_from([None, "n"])
)
def test_messages_keep_the_order_and_stay_within_the_bound(
    sizes: list[int], max_bytes: int, via: str | None
) -> None:
    requests = [_request(k, n) for k, n in enumerate(sizes)]
    messages = persist_messages(requests, max_bytes, via)
    assert [r for m in messages for r in m.requests] == requests
    assert all(m.via == via for m in messages)
    assert len(messages) == 1 or all(m.requests for m in messages)
    for m in messages:
        nbytes = sum(r.item.size for r in m.requests)
        assert nbytes <= max_bytes or len(m.requests) == 1, "only a lone item may exceed it"
    for a, b in zip(messages, messages[1:], strict=False):
        joined = sum(r.item.size for r in (*a.requests, b.requests[0]))
        assert joined > max_bytes, "a message is cut only when the next item would not fit"


def test_messages_hold_at_most_max_items_and_each_loads_back() -> None:
    requests = [_request(k, 0 if k % 2 else 1) for k in range(2 * MAX_ITEMS + 3)]
    messages = persist_messages(requests, 1 << 30)
    assert [len(m.requests) for m in messages] == [MAX_ITEMS, MAX_ITEMS, 3]
    assert [r.id for r in load(dump(messages[2])).requests] == [2 * MAX_ITEMS + k for k in range(3)]  # type: ignore[union-attr]


def test_no_requests_give_one_empty_message() -> None:
    assert persist_messages([], 10) == [persist_messages([], 10)[0]]
    assert persist_messages([], 10)[0].requests == ()


def _split_request(rid: int, parts: tuple[bytes, ...]) -> PersistRequest:
    meta = SegmentMeta("w", rid, rid + 1, (0,), sum(map(len, parts)))
    return PersistRequest(rid, PersistItem(meta, 3, parts))


def test_a_segment_of_several_buffers_travels_as_that_many_frames() -> None:
    """An item whose data is a tuple of buffers goes as one frame each (``n`` in its
    header) and loads back as the same buffers, between items of one frame."""
    one = _request(1, 5)
    split = _split_request(2, (b"head", b"x" * SPLIT_FROM_BYTES, b"tail"))
    marker = _request(3, 0)
    frames = dump(Persist((one, split, marker)))
    assert len(frames) == 1 + 1 + 3
    got = load(frames)
    assert isinstance(got, Persist)
    a, b, c = (r.item for r in got.requests)
    assert a.data == b"x" * 5 and c.data is None
    assert b.data == (b"head", b"x" * SPLIT_FROM_BYTES, b"tail")
    assert b.size == SPLIT_FROM_BYTES + 8


BIG = SPLIT_FROM_BYTES + 8  # bytes of a segment that may come as several frames


@pytest.mark.parametrize(
    ("n", "size", "frames", "error"),
    [
        (0, BIG, 1, "1..64 frames"),
        (MAX_SEGMENT_PARTS + 1, BIG, 1, "1..64 frames"),
        ("2", BIG, 2, "int"),
        (3, BIG, 2, "items of 3 payload frames but 2 frames"),
        (2, BIG, 3, "items of 2 payload frames but 3 frames"),
        (2, BIG + 1, 2, f"payload of {BIG} bytes, header says {BIG + 1}"),
        (64, 1, 64, "a segment of 1 bytes comes as one frame, not 64"),
    ],
)
def test_hostile_frame_counts_are_refused(n: object, size: int, frames: int, error: str) -> None:
    """A header's ``n`` outside 1..MAX_SEGMENT_PARTS, not an int, above 1 for a
    segment below SPLIT_FROM_BYTES (frames would cost the node more than their bytes),
    or not matching the frames (count or bytes) is a WireError; nothing is trusted."""
    head = {"t": "persist", "items": [{"id": 1, "log": "w", "sqn": [0, 1], "size": size, "n": n}]}
    part = b"a" * (BIG // 2)
    with pytest.raises(WireError, match=error):
        load([msgpack.packb(head), *[part] * frames])
