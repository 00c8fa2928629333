"""Keyed state backend: value, map and list state on the current key; every update is
one change; snapshot + replay restores it, also split over another number of tasks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client import ChangelogClient
from dstltree.sparkplug.keygroups import (
    encode_key,
    key_group_of,
    key_group_of_encoded,
    key_group_range,
    task_of_key_group,
)
from dstltree.sparkplug.state_backend import (
    OP_LIST_ADD,
    OP_LIST_CLEAR,
    OP_LIST_SET,
    OP_MAP_CLEAR,
    OP_MAP_PUT,
    OP_MAP_REMOVE,
    OP_VALUE_CLEAR,
    OP_VALUE_SET,
    OP_VALUE_SETS,
    SNAPSHOT_VERSION,
    KeyedStateBackend,
)

OTHER_KG = (key_group_of("a") + 1) % 128  # not the group of "a"
KEYS: list[Any] = [None, True, 1, 0, -5, "a", "1", b"1", "", (1, "x"), ((None,), b"z"), "ü" * 40]


class ChangeRecorder:
    """Stands in for a ChangelogWriter: keeps (key group, change) in append order."""

    def __init__(self) -> None:
        self.changes: list[tuple[int, bytes]] = []

    def append(self, key_group: int, change: bytes) -> None:
        assert isinstance(change, bytes)
        self.changes.append((key_group, change))


def _backend(kgs: range = range(128), m: int = 128) -> tuple[KeyedStateBackend, ChangeRecorder]:
    rec = ChangeRecorder()
    return KeyedStateBackend(kgs, rec, m), rec  # type: ignore[arg-type]


def _state(b: KeyedStateBackend) -> dict[str, dict[bytes, Any]]:
    """name -> encoded key -> state (encoded keys tell 1 from True)."""
    return {n: {encode_key(k): v for k, v in b.items(n)} for n in b.state_names()}


def _random_op(b: KeyedStateBackend, key: Any, rng: random.Random) -> None:
    """One random mutation of key ``key`` on states "v" (value), "m" (map), "l" (list)."""
    b.set_current_key(key)
    v, m, lst = b.value_state("v"), b.map_state("m"), b.list_state("l")
    r = rng.random()
    if r < 0.3:
        v.set({"n": (v.get() or {"n": 0})["n"] + 1, "t": [key is None, rng.random()]})
    elif r < 0.35:
        v.clear()
    elif r < 0.55:
        m.put(rng.choice(["a", 1, (1, "b"), None, b"x"]), rng.randint(0, 9))
    elif r < 0.62:
        m.remove(rng.choice(["a", 1, (1, "b")]))
    elif r < 0.65:
        m.clear()
    elif r < 0.85:
        lst.add(rng.randint(0, 99))
    elif r < 0.92:
        lst.update(lst.get()[-2:])
    else:
        lst.clear()


def test_value_state_acts_on_the_current_key() -> None:
    b, _ = _backend()
    v = b.value_state("stats")
    assert b.value_state("stats") is v
    for i, key in enumerate(KEYS):
        b.set_current_key(key)
        assert v.get() is None
        v.set({"i": i, "key": key if not isinstance(key, tuple) else list(key)})
    for i, key in enumerate(KEYS):
        b.set_current_key(key)
        assert b.current_key == key and b.current_key_group == key_group_of(key)
        assert v.get()["i"] == i
    b.set_current_key(1)
    got = v.get()
    got["i"] = 99  # a fresh object: the state does not change until set
    assert v.get()["i"] == 2  # KEYS[2] is 1
    v.clear()
    assert v.get() is None
    b.set_current_key(True)
    assert v.get()["i"] == 1  # True is another key than 1
    assert len(_state(b)["stats"]) == len(KEYS) - 1  # only 1 was cleared


def test_map_state_operations() -> None:
    b, _ = _backend()
    m = b.map_state("routes")
    b.set_current_key(("N1", 2))
    assert m.get("x") is None and m.get("x", 7) == 7 and not m.contains("x")
    m.put("JFK", 1)
    m.put(("LAX", 2), [1, 2])
    m.put(None, "none")
    assert m.get("JFK") == 1 and m.get(("LAX", 2)) == [1, 2] and m.get(None) == "none"
    assert m.contains(("LAX", 2)) and not m.contains("LAX")
    assert m.items() == [("JFK", 1), (("LAX", 2), [1, 2]), (None, "none")]
    assert m.keys() == ["JFK", ("LAX", 2), None] and m.values() == [1, [1, 2], "none"]
    m.remove("JFK")
    m.remove("absent")
    assert m.keys() == [("LAX", 2), None]
    b.set_current_key("other")
    assert m.items() == [] and m.keys() == [] and m.values() == []
    m.put("k", 1)
    m.remove("k")  # an emptied map is no state
    assert dict(b.items("routes")) == {("N1", 2): {("LAX", 2): [1, 2], None: "none"}}
    b.set_current_key(("N1", 2))
    m.clear()
    assert list(b.items("routes")) == []
    with pytest.raises(TypeError):
        m.put([1], 1)  # an unhashable user key


def test_list_state_operations() -> None:
    b, _ = _backend()
    lst = b.list_state("recent")
    b.set_current_key(None)
    assert lst.get() == []
    lst.add(1)
    lst.add({"a": [1]})
    assert lst.get() == [1, {"a": [1]}]
    lst.update([3, 4, 5])
    assert lst.get() == [3, 4, 5]
    lst.update([])
    assert lst.get() == [] and list(b.items("recent")) == []
    lst.add("x")
    b.set_current_key(b"k")
    lst.add("y")
    assert dict(b.items("recent")) == {None: ["x"], b"k": ["y"]}
    lst.clear()
    assert dict(b.items("recent")) == {None: ["x"]}


def test_every_mutation_is_one_change_in_the_current_key_group() -> None:
    b, rec = _backend()
    v, m, lst = b.value_state("v"), b.map_state("m"), b.list_state("l")
    key = ("t", 1)
    b.set_current_key(key)
    v.get(), m.get(1), m.contains(1), m.items(), lst.get()  # reads log nothing
    assert rec.changes == []
    v.set(5)
    v.clear()
    m.put(1, "a")
    m.remove(1)
    m.clear()
    lst.add(2)
    lst.update([7, 8])
    lst.clear()
    assert {kg for kg, _ in rec.changes} == {key_group_of(key)}
    decoded = [msgpack.unpackb(c, strict_map_key=False) for _, c in rec.changes]
    k = ["t", 1]  # a tuple key travels as an array
    assert decoded == [
        [OP_VALUE_SET, "v", k, 5],
        [OP_VALUE_CLEAR, "v", k],
        [OP_MAP_PUT, "m", k, 1, "a"],
        [OP_MAP_REMOVE, "m", k, 1],
        [OP_MAP_CLEAR, "m", k],
        [OP_LIST_ADD, "l", k, 2],
        [OP_LIST_SET, "l", k, [7, 8]],
        [OP_LIST_CLEAR, "l", k],
    ]


def test_replaying_the_changes_gives_the_same_state() -> None:
    b, rec = _backend()
    rng = random.Random(3)
    for _ in range(3000):
        _random_op(b, rng.choice(KEYS), rng)
    replayed = KeyedStateBackend(range(128))
    for kg, change in rec.changes:
        replayed.apply_change(kg, change)
    assert _state(replayed) == _state(b)
    assert replayed.state_names() == ["l", "m", "v"]
    assert replayed.state_kind("m") == "map"


def test_snapshot_round_trip_and_key_group_filtering() -> None:
    b, _ = _backend(range(128), 128)
    rng = random.Random(5)
    for _ in range(2000):
        _random_op(b, rng.choice(KEYS + [f"k{i}" for i in range(50)]), rng)
    snap = b.snapshot()
    assert msgpack.unpackb(snap, strict_map_key=False)["v"] == SNAPSHOT_VERSION
    whole = KeyedStateBackend(range(128))
    whole.restore_snapshot(snap)
    assert _state(whole) == _state(b)
    low, high = KeyedStateBackend(range(0, 40)), KeyedStateBackend(range(40, 128))
    for part in (low, high):
        part.restore_snapshot(snap)
        for name in part.state_names():
            assert all(key_group_of(k) in part.key_groups for k, _ in part.items(name))
    merged = KeyedStateBackend(range(128))
    merged.restore_snapshot(low.snapshot())
    merged.restore_snapshot(high.snapshot())  # restore merges key groups
    assert _state(merged) == _state(b)
    assert low.state_names() == ["l", "m", "v"]  # kinds travel even without owned keys


def test_apply_change_ignores_foreign_key_groups() -> None:
    b, rec = _backend()
    b.value_state("v")
    for key in KEYS:
        b.set_current_key(key)
        b.value_state("v").set(1)
    part = KeyedStateBackend(range(0, 64))
    for kg, change in rec.changes:
        part.apply_change(kg, change)
    assert {encode_key(k) for k, _ in part.items("v")} == {
        encode_key(k) for k in KEYS if key_group_of(k) < 64
    }


def test_ownership_and_usage_errors() -> None:
    b = KeyedStateBackend(range(0, 1))
    v = b.value_state("s")
    with pytest.raises(RuntimeError, match="no current key"):
        v.get()
    with pytest.raises(RuntimeError, match="no current key"):
        b.list_state("l").add(1)
    key = next(f"x{i}" for i in range(1000) if key_group_of(f"x{i}") != 0)
    with pytest.raises(KeyError, match="not owned"):
        b.set_current_key(key)
    with pytest.raises(TypeError, match="float"):
        b.set_current_key(1.5)
    with pytest.raises(TypeError, match="list"):
        b.set_current_key(["a"])
    with pytest.raises(ValueError, match="value state, not a map state"):
        b.map_state("s")
    with pytest.raises(ValueError, match="list state, not a value state"):
        b.value_state("l")
    with pytest.raises(ValueError, match="not a range"):
        KeyedStateBackend(range(0, 200), None, 128)


def _snapshot_doc(**changes: Any) -> bytes:
    b = KeyedStateBackend(range(128))
    b.set_current_key("a")
    b.value_state("v").set(1)
    doc = msgpack.unpackb(b.snapshot(), strict_map_key=False)
    doc.update(changes)
    data: bytes = msgpack.packb(doc)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00garbage", "bad state snapshot"),
        (b"", "bad state snapshot"),
        (msgpack.packb([1, 2]), "not a map"),
        (_snapshot_doc(v=1), "version 1, expected 2"),
        (_snapshot_doc(max_parallelism=64), "max_parallelism 64, restoring with 128"),
        (_snapshot_doc(kinds={"v": "tree"}), "unknown state kind 'tree'"),
        (_snapshot_doc(kinds={}), "'v'"),
        (_snapshot_doc(groups=[[500, b""]]), "key group 500 outside"),
        (
            _snapshot_doc(groups=[[OTHER_KG, msgpack.packb([["v", {encode_key("a"): b"\x01"}]])]]),
            "hashes to",
        ),
        (_snapshot_doc(groups=[[0, msgpack.packb([["v", {b"a": 1}]])]]), "bad value entry"),
    ],
)
def test_corrupt_snapshots_are_refused_naming_the_problem(data: bytes, message: str) -> None:
    b = KeyedStateBackend(range(128))
    with pytest.raises(ValueError, match=message):
        b.restore_snapshot(data)


def test_corrupt_changes_are_refused() -> None:
    b = KeyedStateBackend(range(128))
    kg = key_group_of("a")
    for bad in (b"\xc1", msgpack.packb([99, "v", "a", 1]), msgpack.packb([OP_VALUE_SET, "v", "a"])):
        with pytest.raises(ValueError, match="bad state change"):
            b.apply_change(kg, bad)
    with pytest.raises(ValueError, match="hashes to"):
        b.apply_change((kg + 1) % 128, msgpack.packb([OP_VALUE_SET, "v", "a", 1]))
    b.apply_change(kg, msgpack.packb([OP_MAP_PUT, "m", "a", 1, 2]))
    with pytest.raises(ValueError, match="map state, not a value state"):
        b.apply_change(kg, msgpack.packb([OP_VALUE_SET, "m", "a", 1]))


def test_snapshot_plus_replay_through_a_real_changelog(tmp_path: Path) -> None:
    client = ChangelogClient.open(str(tmp_path))
    kgs = range(0, 128)
    writer = client.create_writer("backend", kgs)
    live = KeyedStateBackend(kgs, writer)
    v, m = live.value_state("count"), live.map_state("last")
    for i in range(200):
        live.set_current_key(f"k{i % 17}")
        v.set((v.get() or 0) + 1)
        m.put("i", i)
        if i == 100:
            snap_sqn = writer.next_sqn()
            snapshot = live.snapshot()
    live.set_current_key("k3")
    v.clear()
    live.set_current_key("k4")
    m.remove("i")
    handle = writer.persist_durably(after=snap_sqn).result(timeout=10)
    changes = list(client.iter_changes(handle))
    # only what followed the snapshot: 99 puts and a remove, and of the value state only
    # the last change of each of the 17 keys (last-wins staging, logged as value sets
    # changes, one per key group and fold; k3's entry is its clear)
    value = [msgpack.unpackb(c) for _, _, c in changes if b"count" in c]
    assert len(changes) - len(value) == 99 + 1
    assert {op for op, _, _ in value} == {OP_VALUE_SETS}
    entries = {msgpack.unpackb(k): v for _, _, sets in value for k, v in sets.items()}
    assert sorted(entries) == sorted(f"k{i}" for i in range(17))
    assert entries["k3"] is None and all(msgpack.unpackb(v) >= 6 for v in entries.values() if v)
    restored = KeyedStateBackend(kgs)
    restored.restore_snapshot(snapshot)
    assert sum(dict(restored.items("count")).values()) == 101  # iterations 0..100
    for _, kg, change in changes:
        restored.apply_change(kg, change)
    assert _state(restored) == _state(live)
    counts = dict(restored.items("count"))
    assert "k3" not in counts and sum(counts.values()) == 200 - 12  # k3 counted 12 times
    assert "k4" not in dict(restored.items("last"))  # its map was emptied
    assert dict(restored.items("last"))["k5"] == {"i": 192}  # the last i with i % 17 == 5
    client.close()


key_strategy = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
)


@given(
    ops=st.lists(st.tuples(key_strategy, st.integers(0, 2**32)), max_size=150),
    p1=st.integers(1, 8),
    p2=st.integers(1, 8),
    m=st.integers(16, 128),
    cut=st.floats(0, 1),
)
@settings(max_examples=150, deadline=None)
def test_split_over_p1_tasks_restored_over_p2_tasks_is_the_same_state(
    ops: list[tuple[Any, int]], p1: int, p2: int, m: int, cut: float
) -> None:
    """Tasks of parallelism p1 each snapshot at ``cut`` and log changes after it; p2
    new tasks restore (every old snapshot, then every old change, filtered by key
    group) and together hold exactly the state of one backend that saw every op."""
    reference = KeyedStateBackend(range(m), None, m)
    old = [_backend(key_group_range(t, p1, m), m) for t in range(p1)]
    snaps: list[tuple[bytes, int]] = [(b"", 0)] * p1
    for i, (key, seed) in enumerate(ops):
        if i == int(cut * len(ops)):
            snaps = [(b.snapshot(), len(rec.changes)) for b, rec in old]
        _random_op(reference, key, random.Random(seed))
        _random_op(old[task_of_key_group(key_group_of(key, m), p1, m)][0], key, random.Random(seed))
    if len(ops) == 0 or int(cut * len(ops)) >= len(ops):
        snaps = [(b.snapshot(), len(rec.changes)) for b, rec in old]
    merged: dict[str, dict[bytes, Any]] = {}
    for t2 in range(p2):
        new = KeyedStateBackend(key_group_range(t2, p2, m), None, m)
        for (snap, mark), (_, rec) in zip(snaps, old, strict=True):
            new.restore_snapshot(snap)
            for kg, change in rec.changes[mark:]:
                new.apply_change(kg, change)
        for name, per_key in _state(new).items():
            assert all(key_group_of_encoded(k, m) in new.key_groups for k in per_key)
            assert not per_key.keys() & merged.get(name, {}).keys()  # never twice
            merged.setdefault(name, {}).update(per_key)
    expected = {n: s for n, s in _state(reference).items() if s}
    assert {n: s for n, s in merged.items() if s} == expected
