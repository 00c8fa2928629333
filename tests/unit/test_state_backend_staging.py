"""The backend stages its changes in the writer's staging lists: the writer sees every
change before any SQN call, the same SQNs, handles and changes as one append per
change; hand-over every FOLD_RECORDS records (pre-emptive uploads), replaced or
narrower writers, a closed writer."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.batching import PersistItem
from dstltree.client.errors import DstlError
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import decode_segment
from dstltree.client.writer import ChangelogWriter
from dstltree.sparkplug import state_backend
from dstltree.sparkplug.keygroups import key_group_of
from dstltree.sparkplug.state_backend import FOLD_RECORDS, KeyedStateBackend

KEYS: list[Any] = ["a", "b", 7, None, (1, "x"), b"k", "ü" * 40]


class MemoryUploader:
    """Keeps segments in memory and resolves every future at once."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.submitted = 0

    def register(self, log_id: str) -> None: ...

    def unregister(self, log_id: str) -> None: ...

    def close(self) -> None: ...

    def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
        self.submitted += 1
        fut: Future[SegmentRef | None] = Future()
        if item.data is None:
            fut.set_result(None)
            return fut
        path = f"mem://{len(self.data)}"
        self.data[path] = bytes(item.data)
        fut.set_result(SegmentRef(item.meta, path, 0))
        return fut

    def read(self, w: ChangelogWriter, after: int) -> tuple[Any, ...]:
        """Persist ``w`` from ``after``: (SQN range, [(sqn, key group, change)])."""
        h = w.persist_durably(after).result(timeout=10)
        lo, hi = h.sqn_range
        changes = [
            c
            for ref in h.segments
            for c in decode_segment(self.data[ref.path]).key_group_changes(lo, hi)
        ]
        return h.sqn_range, sorted(changes, key=lambda c: (c[0], c[1]))


class PerChange:
    """Hands every change to a writer's ``append`` (the backend's path for writer
    objects without staging)."""

    def __init__(self, writer: ChangelogWriter) -> None:
        self.w = writer

    def append(self, key_group: int, change: bytes) -> None:
        self.w.append(key_group, change)


def _writer(kgs: range = range(128), preemptive: int = 1 << 40) -> tuple[ChangelogWriter, Any]:
    up = MemoryUploader()
    return ChangelogWriter("w", kgs, up, preemptive_bytes=preemptive), up


def _mutate(b: KeyedStateBackend, op: tuple[Any, ...]) -> None:
    _, k, kind, x = op
    b.set_current_key(KEYS[k])
    v, m, lst = b.value_state("v"), b.map_state("m"), b.list_state("l")
    if kind == 0:
        v.set((v.get() or 0) + x)
    elif kind == 1:
        v.clear()
    elif kind == 2:
        m.put(x % 3, x)
    elif kind == 3:
        m.remove(x % 3)
    elif kind == 4:
        lst.add(x)
    elif kind == 5:
        lst.update(lst.get()[-2:])
    else:
        (m if x % 2 else lst).clear()


_op = st.one_of(
    st.tuples(st.just("rec"), st.integers(0, len(KEYS) - 1), st.integers(0, 6), st.integers(0, 9)),
    st.tuples(st.sampled_from(["next", "persist", "flush", "truncate", "stats"])),
)


@settings(max_examples=120, deadline=None)
@given(st.lists(_op, max_size=60), st.integers(1, 4))
def test_staged_backend_matches_one_append_per_change(
    ops: list[tuple[Any, ...]], fold: int
) -> None:
    """Records, next_sqn, persist, truncate, statistics and explicit hand-overs, in any
    order and with hand-overs every ``fold`` records: the staging backend's writer
    gives the same SQNs, handles and changes as a writer fed one change at a time."""
    with mock.patch.object(state_backend, "FOLD_RECORDS", fold):
        (wa, upa), (wb, upb) = _writer(), _writer()
        a = KeyedStateBackend(range(128), wa)
        b = KeyedStateBackend(range(128), PerChange(wb))  # type: ignore[arg-type]
        after = 0
        for op in ops:
            if op[0] == "rec":
                _mutate(a, op)
                _mutate(b, op)
            elif op[0] == "next":
                assert wa.next_sqn() == wb.next_sqn()
            elif op[0] == "persist":
                assert _squashed(upa.read(wa, after)) == _squashed(upb.read(wb, after))
            elif op[0] == "flush":
                a.flush_changes()
            elif op[0] == "truncate":
                after = wb.next_sqn()
                assert wa.next_sqn() == after
                wa.truncate(after)
                wb.truncate(after)
            else:
                assert _sqns(wa) == _sqns(wb)
        assert _squashed(upa.read(wa, after)) == _squashed(upb.read(wb, after))
        assert _sqns(wa) == _sqns(wb)


def _sqns(w: ChangelogWriter) -> tuple[int, int, int]:
    s = w.statistics()
    return s.active_sqn, s.truncated_before, s.uploads


def _squashed(read: tuple[Any, ...]) -> tuple[Any, ...]:
    """A persisted range as replay sees it: per (SQN, key group) the other states'
    changes in order, and the value state's last change per key (what last-wins
    staging keeps of them)."""
    sqn_range, changes = read
    other: dict[tuple[int, int], list[bytes]] = {}
    last: dict[tuple[int, int, bytes], bytes] = {}
    for sqn, kg, change in changes:
        op, name, key, *_ = msgpack.unpackb(change, strict_map_key=False)
        if op == state_backend.OP_VALUE_SETS:
            last.update(((sqn, kg, kb), c) for kb, c in _value_changes(name, key))
        elif name == "v":
            last[(sqn, kg, msgpack.packb(key))] = change
        else:
            other.setdefault((sqn, kg), []).append(change)
    return sqn_range, other, last


def _value_changes(name: str, entries: dict[bytes, bytes | None]) -> list[tuple[bytes, bytes]]:
    """(key bytes, the value set or clear change the backend logs without last-wins
    staging) per entry of a value sets change, in the map's order."""
    pack = msgpack.packb
    set_head = b"\x94" + pack(state_backend.OP_VALUE_SET) + pack(name)  # [op, name, k, v]
    clear_head = b"\x93" + pack(state_backend.OP_VALUE_CLEAR) + pack(name)  # [op, name, k]
    return [
        (kb, clear_head + kb if vb is None else set_head + kb + vb) for kb, vb in entries.items()
    ]


def test_changes_are_handed_over_every_fold_records() -> None:
    """Without any SQN call, the writer sees the staged bytes every FOLD_RECORDS records
    (a pre-emptive upload starts then), not before."""
    w, up = _writer(preemptive=1)
    b = KeyedStateBackend(range(128), w)
    v = b.list_state("l")
    for i in range(FOLD_RECORDS - 1):
        b.set_current_key(i)
        v.add(i)
    assert up.submitted == 0, "staged changes are not folded per record"
    b.set_current_key(0)
    assert up.submitted == 1, "the FOLD_RECORDS-th record hands the batch over"
    sqn, changes = up.read(w, 0)
    assert len(changes) == FOLD_RECORDS - 1


def test_value_changes_squash_until_the_writer_holds_squash_entries_keys() -> None:
    """Value state goes to last-wins staging: the hand-overs every FOLD_RECORDS records
    leave it staged (a key set many times costs one change) until it holds the
    writer's ``squash_entries`` keys; an SQN call always takes it."""
    up = MemoryUploader()
    w = ChangelogWriter("w", range(128), up, preemptive_bytes=1, squash_entries=10)
    b = KeyedStateBackend(range(128), w)
    v = b.value_state("v")
    for i in range(3 * FOLD_RECORDS):
        b.set_current_key(i % 5)
        v.set(i)
    assert up.submitted == 0, "five keys stay staged across hand-overs"
    sqn_range, changes = up.read(w, 0)
    entries = [e for _, _, c in changes for e in msgpack.unpackb(c)[2].items()]
    assert sorted((msgpack.unpackb(k), msgpack.unpackb(v)) for k, v in entries) == [
        (k, max(i for i in range(3 * FOLD_RECORDS) if i % 5 == k)) for k in range(5)
    ]
    for i in range(FOLD_RECORDS):
        b.set_current_key(i % 10)
        v.set(i)
    assert up.submitted == 2, "ten keys reach squash_entries: handed over and uploaded"


def test_squash_entries_zero_logs_every_value_change() -> None:
    up = MemoryUploader()
    w = ChangelogWriter("w", range(128), up, preemptive_bytes=1 << 40, squash_entries=0)
    b = KeyedStateBackend(range(128), w)
    v = b.value_state("v")
    for i in range(10):
        b.set_current_key("a")
        v.set(i)
    v.clear()
    _, changes = up.read(w, 0)
    assert [msgpack.unpackb(c)[3:] for _, _, c in changes] == [[i] for i in range(10)] + [[]]
    with pytest.raises(ValueError, match=">= 0"):
        ChangelogWriter("x", range(128), up, squash_entries=-1)


def test_flush_changes_hands_over_at_once() -> None:
    w, up = _writer(preemptive=1)
    b = KeyedStateBackend(range(128), w)
    b.set_current_key("a")
    b.list_state("l").add(1)
    b.flush_changes()
    assert up.submitted == 1
    KeyedStateBackend(range(128), None).flush_changes()  # no writer: nothing to do


def test_snapshot_sqn_covers_every_staged_change() -> None:
    """snapshot_now's pattern: next_sqn() then snapshot: every change made before is
    below that SQN, so a restore replays none of them over the snapshot."""
    w, up = _writer()
    b = KeyedStateBackend(range(128), w)
    b.set_current_key("a")
    b.value_state("v").set(1)
    sqn = w.next_sqn()
    b.value_state("v").set(2)
    _, changes = up.read(w, 0)
    assert [s < sqn for s, _, _ in changes] == [True, False]


def test_a_replaced_writer_gets_the_following_changes() -> None:
    (w1, up1), (w2, up2) = _writer(), _writer()
    b = KeyedStateBackend(range(128), w1)
    v = b.value_state("v")
    b.set_current_key("a")
    v.set(1)
    b.writer = w2
    assert b.writer is w2
    v.set(2)  # same record, new writer
    b.set_current_key("b")
    v.set(3)
    b.writer = None
    v.set(4)  # no changelog
    assert [c[-1] for _, _, c in up1.read(w1, 0)[1]] == [1]
    assert [c[-1] for _, _, c in up2.read(w2, 0)[1]] == [2, 3]


def test_a_writer_narrower_than_the_backend_refuses_foreign_key_groups() -> None:
    kg = key_group_of("a")
    w, up = _writer(range(kg, kg + 1))
    b = KeyedStateBackend(range(128), w)
    b.set_current_key("a")
    b.value_state("v").set(1)
    other = next(k for k in range(1000) if key_group_of(k) != kg)
    b.set_current_key(other)
    with pytest.raises(ValueError, match="outside"):
        b.value_state("v").set(2)
    assert len(up.read(w, 0)[1]) == 1


def test_a_closed_writer_fails_the_next_hand_over() -> None:
    w, _ = _writer()
    b = KeyedStateBackend(range(128), w)
    b.set_current_key("a")
    b.value_state("v").set(1)
    w.close()
    with pytest.raises(DstlError, match="closed"):
        b.flush_changes()
