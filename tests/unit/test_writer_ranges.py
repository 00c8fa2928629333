"""The writer picks the uploads of a persist and the changes of an upload by SQN from
the newest end: the handles and segments are those of a scan over everything kept
(property test against that model, failed uploads re-uploaded included)."""

from __future__ import annotations

from concurrent.futures import Future

from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.batching import PersistItem
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import decode_segment
from dstltree.client.writer import ChangelogWriter


class _Uploader:
    """Resolves each upload at once: a failure for the sizes in ``fail_once`` (once)."""

    def __init__(self, fail_once: set[int]) -> None:
        self.items: list[PersistItem] = []
        self._fail = set(fail_once)

    def register(self, log_id: str) -> None: ...

    def unregister(self, log_id: str) -> None: ...

    def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
        self.items.append(item)
        fut: Future[SegmentRef | None] = Future()
        if len(self.items) in self._fail:
            self._fail.discard(len(self.items))
            fut.set_exception(OSError("refused"))
        else:
            fut.set_result(SegmentRef(item.meta, f"/o{len(self.items)}", 0))
        return fut

    def close(self) -> None: ...


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10)), min_size=1, max_size=30),
    st.sets(st.integers(1, 30), max_size=4),
)
def test_a_handle_reads_back_exactly_the_changes_of_its_range(
    steps: list[tuple[int, int]], fail_once: set[int]
) -> None:
    """Each step appends ``changes`` changes in a new changeset, then persists after
    ``back`` SQNs before the active one; uploads numbered in ``fail_once`` fail."""
    up = _Uploader(fail_once)
    w = ChangelogWriter("w", range(4), up)  # type: ignore[arg-type]
    appended: list[tuple[int, int, bytes]] = []
    for k, (changes, back) in enumerate(steps):
        sqn = w.next_sqn()
        for c in range(changes):
            w.append(c, b"%d-%d" % (k, c))
            appended.append((sqn, c, b"%d-%d" % (k, c)))
        after = max(w.truncated_before, w.next_sqn() - back)
        fut = w.persist_durably(after)
        if fut.exception() is not None:
            continue  # an upload of the range failed: the next persist uploads it again
        handle = fut.result()
        lo, hi = handle.sqn_range
        by_path = {f"/o{n}": item for n, item in enumerate(up.items, 1)}
        got = sorted(
            (sqn, kg, bytes(v))
            for ref in handle.segments
            for sqn, kg, v in decode_segment(by_path[ref.path].data).key_group_changes(lo, hi)  # type: ignore[arg-type]
        )
        assert got == sorted(c for c in appended if lo <= c[0] < hi)
