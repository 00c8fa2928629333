"""Squashing on restore: random value/map/list operations over random keys, logged into
segments and handles (some straddling a snapshot or a handle boundary), restore to the
same state with squashing as with every change replayed; the counters tell changes
read from changes applied."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import SegmentMeta, encode_segment
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.sparkplug.keygroups import encode_key, key_group_of
from dstltree.sparkplug.restore import RestoreStats, restore_key_groups
from dstltree.sparkplug.squash import ChangeSquasher
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore

M = 8  # max parallelism: two old tasks of four key groups each
RANGES = (range(0, 4), range(4, 8))
KEYS: list[Any] = [None, True, 1, 0, -200, 2**40, "a", "1", b"1", "", (1, "x"), "ü" * 40]
USER_KEYS: list[Any] = ["x", 1, True, 1.0, None, (1, 2), b"x", "y" * 40, -3]
VALUES = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=5),
    st.none(),
    st.lists(st.booleans(), max_size=3),
)
NAMES = {"value": ("v", "w" * 40), "map": ("m",), "list": ("l",)}

Op = tuple[str, int, int, int, Any]  # (operation, key, state name, user key, value)
Draw = Callable[..., Any]  # data.draw
OPS = st.tuples(
    st.sampled_from(
        [
            "set",
            "set",
            "set",
            "vclear",
            "put",
            "put",
            "put",
            "remove",
            "mclear",
            "add",
            "add",
            "update",
            "lclear",
        ]
    ),
    st.integers(0, len(KEYS) - 1),
    st.integers(0, 1),
    st.integers(0, len(USER_KEYS) - 1),
    VALUES,
)


class Recorder:
    """Stands in for a ChangelogWriter: (sqn, key group, change) with the SQN set by the test."""

    def __init__(self) -> None:
        self.sqn = 0
        self.changes: list[tuple[int, int, bytes]] = []

    def append(self, key_group: int, change: bytes) -> None:
        self.changes.append((self.sqn, key_group, change))


def _do(b: KeyedStateBackend, op: Op) -> None:
    what, k, n, uk, v = op
    b.set_current_key(KEYS[k])
    if what in ("set", "vclear"):
        vs = b.value_state(NAMES["value"][n])
        vs.set(v) if what == "set" else vs.clear()
    elif what in ("put", "remove", "mclear"):
        ms = b.map_state("m")
        if what == "put":
            ms.put(USER_KEYS[uk], v)
        else:
            ms.remove(USER_KEYS[uk]) if what == "remove" else ms.clear()
    else:
        ls = b.list_state("l")
        if what == "add":
            ls.add(v)
        else:
            ls.update([v, uk][: n + 1]) if what == "update" else ls.clear()


def _contents(b: KeyedStateBackend) -> dict[str, dict[bytes, bytes]]:
    """name -> encoded key -> packed state (keeps map user-key and list order, 1 vs True)."""
    return {
        n: {
            encode_key(k): msgpack.packb(list(v.items()) if isinstance(v, dict) else v)
            for k, v in b.items(n)
        }
        for n in b.state_names()
    }


def _cuts(draw: Draw, lo: int, hi: int) -> list[int]:
    inner = draw(st.lists(st.integers(lo + 1, max(lo + 1, hi - 1)), max_size=4, unique=True))
    return sorted({lo, hi, *[c for c in inner if lo < c < hi]})


def _write_segment(
    store: ObjectStore, log_id: str, lo: int, hi: int, changes: list[tuple[int, int, bytes]]
) -> SegmentRef | None:
    sets: dict[int, dict[int, list[bytes]]] = {}
    for sqn, kg, change in changes:
        if lo <= sqn < hi:
            sets.setdefault(sqn, {}).setdefault(kg, []).append(change)
    if not sets:
        return None
    data = encode_segment(log_id, lo, hi, sets)
    path = store.join(store.root, f"{log_id}-{lo}-{hi}")
    store.put(path, data)
    kgs = tuple(sorted({kg for per in sets.values() for kg in per}))
    meta = SegmentMeta(log_id, lo, hi, kgs, len(data), int.from_bytes(data[-4:], "big"))
    return SegmentRef(meta, path, 0)


def _old_task(
    draw: Draw, store: ObjectStore, t: int, ops: list[Op], live: KeyedStateBackend
) -> TaskCheckpoint:
    """Run ``ops`` of task ``t``'s keys, bumping the SQN at random; snapshot at a random
    SQN; cut segments and handles at random SQNs (independently of each other)."""
    rec = Recorder()
    b = live
    b.writer = rec  # type: ignore[assignment]
    snap_at = draw(st.integers(-1, len(ops)))
    materialized = None
    for i, op in enumerate(ops):
        if i == snap_at:
            rec.sqn += 1  # the snapshot holds every change before next_sqn()
            data = b.snapshot()
            path = store.join(store.root, f"snap-{t}")
            materialized = MaterializedRef(path, rec.sqn, store.put(path, data))
        _do(b, op)
        rec.sqn += draw(st.integers(0, 2))
    end = rec.sqn + 1
    start = materialized.sqn if materialized else 0
    seg_cuts = _cuts(draw, 0, end)
    segments = [
        _write_segment(store, f"log{t}", lo, hi, rec.changes)
        for lo, hi in zip(seg_cuts, seg_cuts[1:], strict=False)
    ]
    refs = [s for s in segments if s is not None]
    cuts = _cuts(draw, start, end)
    handles = tuple(
        ChangelogHandle(
            f"log{t}", (lo, hi), tuple(r for r in refs if r.sqn_from < hi and r.sqn_to > lo)
        )
        for lo, hi in zip(cuts, cuts[1:], strict=False)
    )
    return TaskCheckpoint(
        t,
        0,
        materialized=materialized,
        changelog=handles,
        key_groups=(RANGES[t].start, RANGES[t].stop),
    )


def _checkpoint(store: ObjectStore, tasks: dict[int, TaskCheckpoint]) -> CompletedCheckpoint:
    return CompletedCheckpoint(1, 0, 1, 0.0, 0.0, tasks=tasks, parallelism=2, max_parallelism=M)


def _restore(
    store: ObjectStore, cp: CompletedCheckpoint, squash: bool
) -> tuple[KeyedStateBackend, RestoreStats]:
    b = KeyedStateBackend(range(M), None, M)
    return b, restore_key_groups(store, cp, b, squash=squash)


@settings(max_examples=120, deadline=None)
@given(st.lists(OPS, max_size=60), st.data())
def test_squashed_restore_equals_full_replay(ops: list[Op], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = ObjectStore(tmp)
        live = [KeyedStateBackend(r, None, M) for r in RANGES]
        mine = [[op for op in ops if key_group_of(KEYS[op[1]], M) in r] for r in RANGES]
        tasks = {t: _old_task(data.draw, store, t, mine[t], live[t]) for t in range(2)}
        cp = _checkpoint(store, tasks)
        full, full_stats = _restore(store, cp, squash=False)
        squashed, stats = _restore(store, cp, squash=True)
    assert _contents(squashed) == _contents(full)
    expected: dict[str, dict[bytes, bytes]] = {}
    for b in live:
        for name, per_key in _contents(b).items():
            expected.setdefault(name, {}).update(per_key)
    assert {n: s for n, s in _contents(full).items() if s} == {
        n: s for n, s in expected.items() if s
    }
    assert stats.changes == full_stats.changes == full_stats.changes_applied
    assert stats.changes_applied + stats.changes_squashed == stats.changes
    assert stats.changes_applied <= full_stats.changes_applied


def _one_task(store: ObjectStore, ops: list[Op], snap_at: int = -1) -> CompletedCheckpoint:
    """One old task holding every key group, one segment per op, one handle."""
    rec = Recorder()
    b = KeyedStateBackend(range(M), rec, M)  # type: ignore[arg-type]
    materialized = None
    for i, op in enumerate(ops):
        if i == snap_at:
            path = store.join(store.root, "snap")
            materialized = MaterializedRef(path, rec.sqn, store.put(path, b.snapshot()))
        _do(b, op)
        rec.sqn += 1
    refs = [_write_segment(store, "log", i, i + 1, rec.changes) for i in range(rec.sqn)]
    start = materialized.sqn if materialized else 0
    handle = ChangelogHandle("log", (start, rec.sqn), tuple(r for r in refs if r is not None))
    tc = TaskCheckpoint(0, 0, materialized=materialized, changelog=(handle,), key_groups=(0, M))
    return CompletedCheckpoint(1, 0, 1, 0.0, 0.0, tasks={0: tc}, parallelism=1, max_parallelism=M)


def test_counters_value_map_list(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    ops: list[Op] = [("set", 6, 0, 0, i) for i in range(100)]  # 100 sets of one key: 1 applies
    ops += [("put", 6, 0, i % 2, i) for i in range(10)]  # two user keys: 1 put each
    ops += [("add", 6, 0, 0, i) for i in range(5)] + [("lclear", 6, 0, 0, None)]
    ops += [("add", 6, 0, 0, i) for i in range(3)]  # the clear and 3 adds apply
    cp = _one_task(store, ops)
    b, stats = _restore(store, cp, squash=True)
    assert (stats.changes, stats.changes_applied, stats.changes_squashed) == (119, 7, 112)
    assert stats.segments == 119 and stats.tasks == 1
    b.set_current_key(KEYS[6])
    assert b.value_state("v").get() == 99
    assert b.map_state("m").items() == [("x", 8), (1, 9)]
    assert b.list_state("l").get() == [0, 1, 2]
    _, plain = _restore(store, cp, squash=False)
    assert (plain.changes, plain.changes_applied, plain.changes_squashed) == (119, 119, 0)


def test_map_order_and_snapshot_kept(tmp_path: Path) -> None:
    """A user key removed and put again moves to the end, also when the snapshot held
    it; one put again in place keeps its place."""
    store = ObjectStore(str(tmp_path))
    ops: list[Op] = [("put", 6, 0, 0, 1), ("put", 6, 0, 1, 2), ("put", 6, 0, 2, 3)]
    ops += [
        ("remove", 6, 0, 0, None),
        ("put", 6, 0, 1, 20),
        ("put", 6, 0, 0, 10),
        ("put", 6, 0, 1, 21),
    ]
    cp = _one_task(store, ops, snap_at=3)
    b, stats = _restore(store, cp, squash=True)
    assert stats.snapshots == 1 and (stats.changes, stats.changes_applied) == (4, 3)
    b.set_current_key(KEYS[6])
    assert b.map_state("m").items() == [(1, 21), (True, 3), ("x", 10)]


def test_malformed_change_still_raises_with_its_segment(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    kg = key_group_of("a", M)
    ref = _write_segment(
        store, "log", 0, 2, [(0, kg, b"\x93\x00\xa1v"), (1, kg, b"\x94\x09\xa1v\xa1a\x01")]
    )
    assert ref is not None
    tc = TaskCheckpoint(
        0, 0, changelog=(ChangelogHandle("log", (0, 2), (ref,)),), key_groups=(0, M)
    )
    cp = CompletedCheckpoint(1, 0, 1, 0.0, 0.0, tasks={0: tc}, parallelism=1, max_parallelism=M)
    for squash in (False, True):
        with pytest.raises(ValueError, match=rf"segment at {ref.path}@0: bad state change"):
            _restore(store, cp, squash)


def test_squasher_keeps_unparsable_changes_in_order() -> None:
    sq = ChangeSquasher()
    set_a = msgpack.packb(0) + msgpack.packb("v") + msgpack.packb("a")
    sq.feed(3, [b"\x94" + set_a + b"\x01", b"\x93\x00", b"\x94" + set_a + b"\x02", b""], origin=5)
    assert sq.read == 4
    assert [(p, kg, c, o) for p, kg, c, o in sq.kept()] == [
        (1, 3, b"\x93\x00", 5),
        (2, 3, b"\x94" + set_a + b"\x02", 5),
        (3, 3, b"", 5),
    ]


GROUP_5 = [k for k in KEYS if key_group_of(k, M) == 5]  # None, 0, "1", b"1", ""
VALUE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(GROUP_5), st.integers(0, 9)),
        st.tuples(st.just("clear"), st.sampled_from(GROUP_5), st.none()),
        st.tuples(
            st.just("sets"),
            st.dictionaries(
                st.sampled_from(GROUP_5), st.one_of(st.none(), st.integers(0, 9)), min_size=1
            ),
            st.none(),
        ),
    ),
    max_size=30,
)


def _value_change(op: tuple[str, Any, Any]) -> bytes:
    """The change of a value set, clear or value sets (``[8, name, {key: value}]``) of
    state "v"."""
    what, key, value = op
    pack = msgpack.packb
    if what == "sets":
        entries = {encode_key(k): None if v is None else pack(v) for k, v in key.items()}
        return b"\x93\x08" + pack("v") + pack(entries)
    if what == "set":
        return pack([0, "v", key, value])
    return pack([1, "v", key])


@settings(max_examples=100, deadline=None)
@given(VALUE_OPS, st.lists(st.integers(1, 29), max_size=4))
def test_squasher_keeps_value_sets_in_order(
    ops: list[tuple[str, Any, Any]], cuts: list[int]
) -> None:
    """Value sets changes mixed with single value sets and clears of the same keys, fed
    in any batches: the kept changes replay to the state of all of them (a value sets
    change is kept as it is)."""
    changes = [_value_change(op) for op in ops]
    sq = ChangeSquasher()
    for lo, hi in pairwise(sorted({0, len(changes), *[c for c in cuts if c < len(changes)]})):
        sq.feed(5, changes[lo:hi])
    full, squashed = KeyedStateBackend(range(M), None, M), KeyedStateBackend(range(M), None, M)
    for c in changes:
        full.apply_change(5, c)
    kept = [c for _, _, c, _ in sq.kept()]
    for c in kept:
        squashed.apply_change(5, c)
    assert _contents(squashed) == _contents(full)
    assert [c for c in kept if c[1] == 8] == [c for c in changes if c[1] == 8]
