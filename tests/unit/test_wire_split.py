"""``persist_messages``: requests split into Persist messages bounded in bytes and
items, order kept (property tests)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dstltree.client.batching import PersistItem
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import MAX_ITEMS, PersistRequest, dump, load, persist_messages


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
