"""ChangelogWriter's staging lists (lock-free batched appends) against one change at a
time: any interleaving of appends, staged changes, folds and SQN calls gives the same
SQNs, handles and changes; the SQN rules hold for staged changes; pre-emptive uploads,
back-pressure, closing and a concurrent producer."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.batching import PersistItem
from dstltree.client.errors import DstlError, PersistError
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.inflight import InFlightLimit
from dstltree.client.segment import decode_segment
from dstltree.client.writer import ChangelogWriter

KGS = range(2, 6)
BIG = 1 << 40  # pre-emptive threshold never reached


class MemoryUploader:
    """Keeps segments in memory; resolves futures at once, or fails the next
    ``fail_next`` data items, or holds every future when ``hold`` is set."""

    def __init__(self, hold: bool = False) -> None:
        self.data: dict[str, bytes] = {}
        self.fail_next = 0
        self.hold = hold
        self.held: list[Future[SegmentRef | None]] = []

    def register(self, log_id: str) -> None: ...

    def unregister(self, log_id: str) -> None: ...

    def close(self) -> None: ...

    def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
        fut: Future[SegmentRef | None] = Future()
        if self.hold:
            self.held.append(fut)
        elif item.data is None:
            fut.set_result(None)
        elif self.fail_next:
            self.fail_next -= 1
            fut.set_exception(OSError("upload failed"))
        else:
            path = f"mem://{len(self.data)}"
            self.data[path] = bytes(item.data)
            fut.set_result(SegmentRef(item.meta, path, 0))
        return fut

    def read(self, handle: ChangelogHandle) -> list[tuple[int, int, bytes]]:
        """(sqn, key group, change) of the handle, in SQN then key-group order."""
        lo, hi = handle.sqn_range
        out: list[tuple[int, int, bytes]] = []
        for ref in handle.segments:
            out.extend(decode_segment(self.data[ref.path]).key_group_changes(lo, hi))
        return sorted(out, key=lambda c: (c[0], c[1]))


def _writer(preemptive: int = BIG, **kw: Any) -> tuple[ChangelogWriter, MemoryUploader]:
    up = MemoryUploader()
    return ChangelogWriter("w", KGS, up, preemptive_bytes=preemptive, **kw), up


def _outcome(
    w: ChangelogWriter, up: MemoryUploader, fut: Future[ChangelogHandle]
) -> tuple[Any, ...]:
    try:
        h = fut.result(timeout=10)
    except PersistError:
        return ("failed",)
    segs = [(s.sqn_from, s.sqn_to, s.key_groups) for s in h.segments]
    return (h.sqn_range, segs, up.read(h))


def _stats(w: ChangelogWriter) -> tuple[Any, ...]:
    s = w.statistics()
    return (s.active_sqn, s.truncated_before, s.bytes_in_memory, s.bytes_not_uploaded, s.uploads)


_change = st.binary(min_size=0, max_size=12)
_op = st.one_of(
    st.tuples(st.sampled_from(["append", "stage"]), st.sampled_from(KGS), _change),
    st.tuples(st.sampled_from(["flush", "next", "stats", "fail"])),
    st.tuples(st.just("persist"), st.integers(0, 3)),
    st.tuples(st.just("truncate"), st.integers(0, 3)),
)


def _step(op: tuple[Any, ...], pair: list[tuple[ChangelogWriter, MemoryUploader]]) -> list[Any]:
    """Apply ``op`` to the staging writer (pair[0]) and the one-at-a-time writer
    (pair[1]); returns what each observed."""
    results: list[Any] = []
    ref_sqn = pair[1][0].statistics().active_sqn
    for i, (w, up) in enumerate(pair):
        what = op[0]
        if what in ("append", "stage"):
            if what == "stage" and i == 0:
                w.staging(op[1]).append(op[2])
            else:
                w.append(op[1], op[2])
            results.append(None)
        elif what == "flush":
            if i == 0:
                w.flush_staged()
            results.append(None)
        elif what == "next":
            results.append(w.next_sqn())
        elif what == "stats":
            results.append(_stats(w))
        elif what == "fail":
            up.fail_next += 1
            results.append(None)
        elif what == "persist":
            after = max(w.truncated_before, ref_sqn - op[1])
            results.append(_outcome(w, up, w.persist_durably(after)))
        else:
            w.truncate(w.truncated_before + op[1])
            results.append(w.truncated_before)
    return results


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=40))
def test_any_interleaving_matches_one_change_at_a_time(ops: list[tuple[Any, ...]]) -> None:
    """Appends, staged changes, folds, next_sqn, persist (failed uploads included) and
    truncate give the same SQNs, handles, changes and statistics as appending every
    change one at a time."""
    pair = [_writer(), _writer()]
    for op in ops:
        a, b = _step(op, pair)
        assert a == b, op
    final = [_outcome(w, up, w.persist_durably(w.truncated_before)) for w, up in pair]
    assert final[0] == final[1]
    assert _stats(pair[0][0]) == _stats(pair[1][0])
    assert pair[0][0].statistics().uploads_started == pair[1][0].statistics().uploads_started


_sqn_op = st.one_of(
    st.tuples(st.sampled_from(["append", "stage"]), st.sampled_from(KGS)),
    st.tuples(st.sampled_from(["flush", "next", "persist"])),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_sqn_op, max_size=60), st.integers(1, 40))
def test_staged_changes_keep_the_sqn_rules_with_preemptive_uploads(
    ops: list[tuple[Any, ...]], preemptive: int
) -> None:
    """With pre-emptive uploads every few bytes: every change staged or appended before
    ``next_sqn()`` returned s has an SQN below s, every later one s or above; each key
    group reads back its changes in append order, each exactly once."""
    w, up = _writer(preemptive)
    appended: list[tuple[int, bytes]] = []
    bounds: list[tuple[int, int]] = []  # (changes appended before, SQN returned)
    for op in ops:
        if op[0] in ("append", "stage"):
            change = b"c%d" % len(appended)
            if op[0] == "stage":
                w.staging(op[1]).append(change)
            else:
                w.append(op[1], change)
            appended.append((op[1], change))
        elif op[0] == "flush":
            w.flush_staged()
        elif op[0] == "next":
            bounds.append((len(appended), w.next_sqn()))
        else:
            w.persist_durably(0).result(timeout=10)
    read = up.read(w.persist_durably(0).result(timeout=10))
    sqn_of = {change: sqn for sqn, _, change in read}
    assert len(read) == len(sqn_of) == len(appended)
    for kg in KGS:
        assert [c for _, k, c in read if k == kg] == [c for k, c in appended if k == kg]
    for n, s in bounds:
        assert all(sqn_of[c] < s for _, c in appended[:n])
        assert all(sqn_of[c] >= s for _, c in appended[n:])


def test_flush_staged_starts_the_preemptive_upload() -> None:
    w, up = _writer(preemptive=10)
    w.staging(2).append(b"x" * 6)
    assert w.statistics().uploads_started == 0, "6 bytes are below the threshold"
    w.staging(3).append(b"y" * 6)
    w.flush_staged()
    assert w.statistics().uploads_started == 1
    assert w.statistics().bytes_not_uploaded == 0
    h = w.persist_durably(0).result(timeout=10)
    assert [c for _, _, c in up.read(h)] == [b"x" * 6, b"y" * 6]


def test_flush_staged_blocks_while_too_much_is_in_flight() -> None:
    """Back-pressure reaches staged changes: the fold that starts an upload beyond the
    in-flight limit waits until an earlier upload is durable."""
    up = MemoryUploader(hold=True)
    limit = InFlightLimit(1024)
    w = ChangelogWriter("bp", KGS, up, preemptive_bytes=600, in_flight=limit)
    w.staging(2).append(b"a" * 700)
    w.flush_staged()
    assert len(up.held) == 1
    w.staging(2).append(b"b" * 700)
    done = threading.Event()

    def fold() -> None:
        w.flush_staged()
        done.set()

    t = threading.Thread(target=fold, daemon=True)
    t.start()
    assert not done.wait(0.3), "the fold must wait while the limit is reached"
    up.held[0].set_result(None)
    assert done.wait(10), "the fold resumes once the in-flight bytes drop"
    t.join(10)
    assert len(up.held) == 2


def test_append_after_staged_changes_keeps_their_order() -> None:
    w, up = _writer()
    w.staging(2).append(b"1")
    w.append(2, b"2")
    w.staging(2).append(b"3")
    h = w.persist_durably(0).result(timeout=10)
    assert [c for _, _, c in up.read(h)] == [b"1", b"2", b"3"]


def test_staging_lists_are_per_key_group_and_checked() -> None:
    w, _ = _writer()
    assert w.staging(3) is w.staging(3)
    assert w.staging(3) is not w.staging(4)
    with pytest.raises(ValueError, match="outside"):
        w.staging(6)


def test_closed_writer_drops_staged_changes_and_refuses_folds() -> None:
    w, _ = _writer()
    w.staging(2).append(b"x")
    w.close()
    with pytest.raises(DstlError, match="closed"):
        w.flush_staged()
    assert w.staging(2) == []
    with pytest.raises(DstlError, match="closed"):
        w.append(2, b"y")


def test_append_copies_buffers_and_refuses_other_types() -> None:
    w, up = _writer()
    buf = bytearray(b"ab")
    w.append(2, buf)
    w.append(2, memoryview(b"cd"))
    buf[0] = ord("z")
    with pytest.raises(TypeError, match="bytes"):
        w.append(2, "str")  # type: ignore[arg-type]
    h = w.persist_durably(0).result(timeout=10)
    assert [c for _, _, c in up.read(h)] == [b"ab", b"cd"]


def test_a_producer_thread_stages_while_another_thread_folds() -> None:
    """Staging lists have one producer; folds may run on other threads meanwhile: every
    change arrives exactly once, in order per key group."""
    w, up = _writer()
    n = 3000
    finished = threading.Event()

    def produce() -> None:
        lists = [w.staging(kg) for kg in KGS]
        for i in range(n):
            lists[i % len(lists)].append(b"%d" % i)
        finished.set()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    folds = 0
    while not finished.is_set() or folds < 3:
        if folds % 2:
            w.next_sqn()
        else:
            w.statistics()
        folds += 1
        assert folds < 10_000_000
    t.join(10)
    read = up.read(w.persist_durably(0).result(timeout=10))
    assert len(read) == n
    for j, kg in enumerate(KGS):
        assert [c for _, k, c in read if k == kg] == [b"%d" % i for i in range(j, n, len(KGS))]


def test_last_wins_logs_the_last_change_per_key_between_folds() -> None:
    """Of a key's sets and clears between two folds only the last one is logged: each
    fold logs a dict as the one change ``prefix + msgpack map`` (None as nil); an SQN
    call folds them, so they keep the SQN rules, and a later set of the key is in a
    change of the next SQN."""
    w, up = _writer()
    d = w.last_wins(2, b"S")
    assert w.last_wins(2, b"S") is d and w.last_wins(3, b"S") is not d
    assert w.last_wins(2, b"T") is not d
    d[b"a"], d[b"b"], d[b"a"] = b"1", b"2", b"3"
    d[b"b"] = None
    first_change = b"S" + msgpack.packb({b"a": b"3", b"b": None})
    assert w.statistics().bytes_in_memory == len(first_change)
    assert not d, "statistics folds"
    first = w.next_sqn()
    d[b"a"] = b"4"
    h = w.persist_durably(0).result(timeout=10)
    assert up.read(h) == [(0, 2, first_change), (first, 2, b"S" + msgpack.packb({b"a": b"4"}))]
    with pytest.raises(ValueError, match="outside"):
        w.last_wins(6, b"S")


def test_last_wins_folds_before_append_and_at_squash_entries() -> None:
    up = MemoryUploader()
    w = ChangelogWriter("lw", KGS, up, preemptive_bytes=BIG, squash_entries=3)
    d = w.last_wins(2, b"S")
    d[b"a"] = b"1"
    w.append(2, b"x")  # the staged change goes first
    d[b"a"], d[b"b"] = b"2", b"3"
    w.flush_staged()
    assert len(d) == 2, "two keys stay staged below squash_entries"
    d[b"c"] = b"4"
    w.flush_staged()
    assert not d, "three keys reach squash_entries: folded"
    h = w.persist_durably(0).result(timeout=10)
    assert [c for _, _, c in up.read(h)] == [
        b"S" + msgpack.packb({b"a": b"1"}),
        b"x",
        b"S" + msgpack.packb({b"a": b"2", b"b": b"3", b"c": b"4"}),
    ]


def test_last_wins_with_a_concurrent_producer_loses_no_key() -> None:
    """A producer thread sets keys while another thread folds (statistics, next_sqn):
    each key's logged values rise with the SQN, and its last value is logged."""
    w, up = _writer()
    d = w.last_wins(2, b"S")
    done = threading.Event()

    def produce() -> None:
        for i in range(20_000):
            d[b"k%02d" % (i % 97)] = b"%06d" % i
        done.set()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    while not done.is_set():
        w.statistics()
        w.next_sqn()
    t.join(10)
    h = w.persist_durably(0).result(timeout=10)
    seen: dict[bytes, list[int]] = {}
    for _, _, change in up.read(h):  # SQN order; within an SQN, fold order
        assert change[:1] == b"S"
        for key, value in msgpack.unpackb(change[1:]).items():
            seen.setdefault(key, []).append(int(value))
    assert len(seen) == 97
    for key, values in seen.items():
        assert values == sorted(values)
        assert values[-1] == max(i for i in range(20_000) if i % 97 == int(key[1:]))
