"""Bulk replay (squash, then decode and write only the kept changes) gives exactly the
state of a change-by-change replay: value, map and list operations mixed in any
interleaving, over a state restored before, in any split into batches; changes a
per-change replay treats differently (other encodings, shapes, key groups, kinds)
give the same state or the same error."""

from __future__ import annotations

import tempfile
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.api import ChangelogClient
from dstltree.sparkplug import replay as replay_module
from dstltree.sparkplug.keygroups import encode_key, key_group_of
from dstltree.sparkplug.replay import BulkReplay
from dstltree.sparkplug.state_backend import KeyedStateBackend

M = 8
KEYS: list[Any] = [None, True, 1, 0, -200, 2**40, "a", "1", b"1", "", (1, "x"), "ü" * 40]
USER_KEYS: list[Any] = ["x", 1, True, 1.0, None, (1, 2), b"x", "y" * 40, -3]
VALUES = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=5),
    st.none(),
    st.lists(st.booleans(), max_size=3),
    st.floats(allow_nan=False),
)
KINDS = ["set", "set", "vclear", "put", "put", "remove", "mclear", "add", "add", "update"]
OPS = st.tuples(
    st.sampled_from([*KINDS, "lclear"]),
    st.integers(0, len(KEYS) - 1),
    st.integers(0, 1),
    st.integers(0, len(USER_KEYS) - 1),
    VALUES,
)
Op = tuple[str, int, int, int, Any]


class Recorder:
    """Stands in for a ChangelogWriter: (key group, change) in append order."""

    def __init__(self) -> None:
        self.changes: list[tuple[int, bytes]] = []

    def append(self, key_group: int, change: bytes) -> None:
        self.changes.append((key_group, change))


def _do(b: KeyedStateBackend, op: Op) -> None:
    what, k, n, uk, v = op
    b.set_current_key(KEYS[k])
    if what in ("set", "vclear"):
        vs = b.value_state(("v", "w" * 40)[n])
        vs.set(v) if what == "set" else vs.clear()
    elif what in ("put", "remove", "mclear"):
        ms = b.map_state(("m", "n")[n])
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


def _log(ops: list[Op]) -> list[tuple[int, bytes]]:
    rec = Recorder()
    b = KeyedStateBackend(range(M), rec, M)  # type: ignore[arg-type]
    for op in ops:
        _do(b, op)
    return rec.changes


def _log_staged(ops: list[Op], folds: list[int], base: str) -> list[tuple[int, bytes]]:
    """The changes of ``ops`` as a task logs them, through a real writer with last-wins
    staging (value state as value sets changes), folded before each op in ``folds``;
    (key group, change) in replay order."""
    with ChangelogClient.open(base) as client:
        w = client.create_writer("w", range(M))
        b = KeyedStateBackend(range(M), w, M)
        for i, op in enumerate(ops):
            if i in folds:
                w.next_sqn()
            _do(b, op)
        h = w.persist_durably(0).result(timeout=10)
        return [(kg, c) for _, kg, c in client.iter_changes(h)]


def _contents(b: KeyedStateBackend) -> dict[str, dict[bytes, bytes]]:
    """name -> encoded key -> packed state (keeps map user-key and list order)."""
    return {
        n: {
            encode_key(k): msgpack.packb(list(v.items()) if isinstance(v, dict) else v)
            for k, v in b.items(n)
        }
        for n in b.state_names()
    }


def _base(before: list[Op]) -> KeyedStateBackend:
    """A backend holding the state of ``before`` (as restored from a snapshot)."""
    src = KeyedStateBackend(range(M), None, M)
    for op in before:
        _do(src, op)
    b = KeyedStateBackend(range(M), None, M)
    b.restore_snapshot(src.snapshot())
    return b


def _batches(changes: list[tuple[int, bytes]], cuts: list[int]) -> list[tuple[int, list[bytes]]]:
    """Consecutive changes of one key group, also cut at ``cuts``."""
    out: list[tuple[int, list[bytes]]] = []
    for i, (kg, c) in enumerate(changes):
        if out and out[-1][0] == kg and i not in cuts:
            out[-1][1].append(c)
        else:
            out.append((kg, [c]))
    return out


def _both(
    before: list[Op], batches: list[tuple[int, list[bytes]]]
) -> tuple[Any, Any, int, KeyedStateBackend]:
    """(result of a per-change replay, of a bulk replay: contents or the error text,
    changes applied in bulk, the bulk backend)."""
    full = _base(before)
    try:
        for origin, (kg, changes) in enumerate(batches):
            for c in changes:
                try:
                    full.apply_change(kg, c)
                except ValueError as e:
                    raise ValueError(f"segment at s{origin}: {e}") from e
        expected: Any = _contents(full)
    except ValueError as e:
        expected = ("error", str(e).split(":")[0])
    bulk = _base(before)
    r = BulkReplay(bulk)
    for origin, (kg, changes) in enumerate(batches):
        r.feed(kg, changes, origin)
    applied = -1
    try:
        applied = r.apply([f"s{i}" for i in range(len(batches))])
        got: Any = _contents(bulk)
    except ValueError as e:
        got = ("error", str(e).split(":")[0])
    return expected, got, applied, bulk


@settings(max_examples=200, deadline=None)
@given(
    st.lists(OPS, max_size=20),
    st.lists(OPS, max_size=80),
    st.lists(st.integers(0, 80), max_size=6),
)
def test_bulk_replay_equals_per_change_replay(
    before: list[Op], ops: list[Op], cuts: list[int]
) -> None:
    changes = _log(ops)
    expected, got, applied, _ = _both(before, _batches(changes, cuts))
    assert got == expected
    assert 0 <= applied <= len(changes)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(OPS, max_size=10),
    st.lists(OPS, max_size=60),
    st.lists(st.integers(0, 60), max_size=4),
    st.lists(st.integers(0, 60), max_size=6),
)
def test_value_sets_replay_as_the_changes_they_stand_for(
    before: list[Op], ops: list[Op], folds: list[int], cuts: list[int]
) -> None:
    """A task's changelog with last-wins staging (value sets changes, folded anywhere)
    restores, in bulk and change by change, to the state of every change logged."""
    with tempfile.TemporaryDirectory() as base:
        staged = _log_staged(ops, folds, base)
    every, _, _, _ = _both(before, _batches(_log(ops), []))
    expected, got, _, _ = _both(before, _batches(staged, cuts))
    assert got == expected == every


def test_regular_changes_never_take_the_change_by_change_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(self: BulkReplay, where: Any) -> int:
        raise AssertionError("change by change")

    monkeypatch.setattr(BulkReplay, "_one_by_one", refuse)
    ops: list[Op] = [(k, i % 12, i % 2, i % 9, i) for i, k in enumerate(KINDS * 20)]
    changes = _log(ops)
    expected, got, applied, _ = _both([], _batches(changes, []))
    assert got == expected and 0 < applied < len(changes)
    with tempfile.TemporaryDirectory() as base:  # value state as value sets changes
        staged = _log_staged(ops, [50, 120], base)
    assert any(c[1] == 8 for _, c in staged)
    _, got_staged, applied, _ = _both([], _batches(staged, []))
    assert got_staged == expected and applied > 0


def test_map_clears_past_the_scan_budget_replay_change_by_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replay_module, "_SCAN_BUDGET", 5)
    ops: list[Op] = [("put", i % 3, 0, i % 9, i) for i in range(40)]
    ops += [("mclear", 1, 0, 0, None), ("put", 1, 0, 2, "z"), ("mclear", 2, 0, 0, None)]
    expected, got, applied, _ = _both([], _batches(_log(ops), []))
    assert got == expected and applied == 43


def _raw(op: int, name: bytes, key: bytes, *rest: bytes, head: int | None = None) -> bytes:
    """The change [op, name, key, *rest] from encoded items (array header ``head``)."""
    return bytes([0x93 + len(rest) if head is None else head, op]) + name + key + b"".join(rest)


def _sets(name: bytes, entries: dict[Any, Any]) -> bytes:
    """The value sets change [8, name, entries] (``name`` encoded, entries packed)."""
    return bytes([0x93, 8]) + name + msgpack.packb(entries)


KG_A = key_group_of("a", M)
SET_A = _raw(0, b"\xa1v", b"\xa1a", b"\x01")
ODD_CHANGES = {
    # a key encoded as str8: the same key as "a" for a per-change replay
    "other key encoding": [SET_A, _raw(0, b"\xa1v", b"\xd9\x01a", b"\x02")],
    "other user key encoding": [
        _raw(2, b"\xa1m", b"\xa1a", b"\xa1x", b"\x01"),
        _raw(2, b"\xa1m", b"\xa1a", b"\xd9\x01x", b"\x02"),
    ],
    "other name encoding": [SET_A, _raw(0, b"\xd9\x01v", b"\xa1a", b"\x03")],
    "an extra item": [_raw(0, b"\xa1v", b"\xa1a", b"\x01", b"\x02")],
    "a missing value, kept": [SET_A, _raw(0, b"\xa1v", b"\xa1a", head=0x94)],
    "an unknown operation": [_raw(9, b"\xa1v", b"\xa1a", b"\x01")],
    "a name that is no string": [_raw(0, b"\x01", b"\xa1a", b"\x01")],
    "a truncated change": [b"\x94\x00\xa1v"],
    "an empty change": [b""],
    "a kind clash": [SET_A, _raw(5, b"\xa1v", b"\xa1a", b"\x01")],
    "a malformed kept value": [SET_A, _raw(0, b"\xa1v", b"\xa1a", b"\xc1")],
    "a malformed list value": [_raw(5, b"\xa1l", b"\xa1a", b"\xc1")],
    "an update of no list": [_raw(7, b"\xa1l", b"\xa1a", b"\x05")],
    "a malformed map value": [_raw(2, b"\xa1m", b"\xa1a", b"\xa1x", b"\xc1")],
    "trailing bytes": [SET_A + b"\x00"],
    "value sets": [SET_A, _sets(b"\xa1v", {b"\xa1a": b"\x02", b"\xa1b": None})],
    "value sets, another key encoding": [_sets(b"\xa1v", {b"\xd9\x01a": b"\x02"})],
    "value sets, a key of another key group": [_sets(b"\xa1v", {b"\xa1b": b"\x02"})],
    "value sets, a malformed value": [_sets(b"\xa1v", {b"\xa1a": b"\xc1"})],
    "value sets, two items as a value": [_sets(b"\xa1v", {b"\xa1a": b"\x01\x02"})],
    "value sets, two items as a key": [_sets(b"\xa1v", {b"\xa1a\x01": b"\x02"})],
    "value sets, a str key": [_sets(b"\xa1v", {"a": b"\x02"})],
    "value sets, an int value": [_sets(b"\xa1v", {b"\xa1a": 2})],
    "value sets, no map": [_raw(8, b"\xa1v", b"\x01")],
    "value sets, an extra item": [_raw(8, b"\xa1v", msgpack.packb({b"\xa1a": b"\x02"}), b"\x01")],
    "value sets, trailing bytes": [_sets(b"\xa1v", {b"\xa1a": b"\x02"}) + b"\x00"],
    "value sets, a kind clash": [
        _raw(2, b"\xa1v", b"\xa1a", b"\xa1x", b"\x01"),
        _sets(b"\xa1v", {}),
    ],
    "value sets, empty, a kind clash": [_sets(b"\xa1m", {})],
    "value sets, empty, a new state": [_sets(b"\xa1z", {})],
    "value sets, a name not UTF-8": [_sets(b"\xa1\xff", {b"\xa1a": b"\x02"})],
    "value sets, a long name": [_sets(b"\xd9\xc8" + b"v" * 200, {b"\xa1a": b"\x02"})],
    "value sets, a name as str8": [SET_A, _sets(b"\xd9\x01v", {b"\xa1a": b"\x03"})],
}


@pytest.mark.parametrize("case", sorted(ODD_CHANGES))
def test_odd_changes_give_what_a_per_change_replay_gives(case: str) -> None:
    batches = [(KG_A, ODD_CHANGES[case])]
    expected, got, _, _ = _both([("set", 6, 0, 0, 7), ("put", 6, 0, 0, 1)], batches)
    assert got == expected


def test_a_malformed_superseded_change_goes_unnoticed() -> None:
    """The squash's decided limit: a superseded change's value is never decoded."""
    for bad in (_raw(0, b"\xa1v", b"\xa1a"), _raw(0, b"\xa1v", b"\xa1a", b"\xc1")):
        expected, got, applied, _ = _both([], [(KG_A, [SET_A])])
        _, got_bad, applied_bad, _ = _both([], [(KG_A, [bad, SET_A])])
        assert got_bad == got == expected and applied_bad == applied == 1


def test_a_key_of_another_key_group_raises_as_per_change() -> None:
    other = (KG_A + 1) % M
    expected, got, _, _ = _both([], [(KG_A, [SET_A]), (other, [SET_A])])
    assert expected == got == ("error", "segment at s1")


@pytest.mark.parametrize("odd", [False, True])
def test_value_sets_count_as_the_changes_they_stand_for(odd: bool) -> None:
    """``read`` and the changes applied count a value sets change's entries, in bulk
    as change by change (``apply_change`` returns them): applied <= read. ``odd``: a
    change (another key encoding) sends the bulk replay change by change."""
    ops: list[Op] = [("set", i % 12, i % 2, 0, i) for i in range(60)] + [("vclear", 3, 0, 0, None)]
    with tempfile.TemporaryDirectory() as base:
        staged = _log_staged(ops, [20, 40], base)
    if odd:
        staged.append((KG_A, _raw(0, b"\xa1v", b"\xd9\x01a", b"\x02")))
    full = _base([])
    each = sum(full.apply_change(kg, c) for kg, c in staged)
    assert each == 3 * 12 + 1 + odd  # three folds of twelve keys' last sets, a clear
    r = BulkReplay(bulk := _base([]))
    for i, (kg, c) in enumerate(staged):
        r.feed(kg, [c], i)
    applied = r.apply([f"s{i}" for i in range(len(staged))])
    assert r.read == each and applied <= r.read and _contents(bulk) == _contents(full)
    assert applied == (each if odd else 13)  # twelve keys' last sets, a clear of another state


def test_value_sets_store_nothing_unless_every_entry_is_good() -> None:
    """A value sets change with one bad entry (a key of another key group, a malformed
    value) raises, change by change leaving the state as it was (its entries are
    checked before any is stored); the bulk replay raises the same error."""
    for bad_entry in ({b"\xa1b": b"\x06"}, {b"\xa1a": b"\xc1"}):
        bad = _sets(b"\xa1v", {encode_key(None): b"\x05", **bad_entry})  # None: group 5
        for kg in (KG_A, key_group_of(None, M)):
            b = _base([("set", 6, 0, 0, 7)])
            before = _contents(b)
            with pytest.raises(ValueError, match="bad state change"):
                b.apply_change(kg, bad)
            assert _contents(b) == before
            expected, got, _, _ = _both([("set", 6, 0, 0, 7)], [(kg, [bad])])
            assert got == expected == ("error", "segment at s0")


def test_a_long_name_before_tiny_entries_replays_change_by_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value sets change whose name, copied into each entry's change, would take
    more than four times its bytes goes change by change (no copy per entry)."""
    calls = []
    one_by_one = BulkReplay._one_by_one

    def spy(self: BulkReplay, where: Any) -> int:
        calls.append(1)
        return one_by_one(self, where)

    monkeypatch.setattr(BulkReplay, "_one_by_one", spy)
    name = msgpack.packb("v" * 40)
    tiny = {encode_key(k): None for k in range(500) if key_group_of(k, M) == KG_A}
    expected, got, applied, _ = _both([], [(KG_A, [_sets(name, tiny)])])
    assert got == expected and applied == len(tiny) and calls == [1]
    calls.clear()
    short = _sets(b"\xa1v", tiny)
    expected, got, applied, _ = _both([], [(KG_A, [short])])
    assert got == expected and applied == len(tiny) and calls == []


def test_changes_of_key_groups_not_owned_are_skipped() -> None:
    b = KeyedStateBackend(range(0, 0), None, M)
    r = BulkReplay(b)
    r.feed(KG_A, [SET_A], 0)
    assert r.read == 1 and r.apply(["s0"]) == 0 and _contents(b) == {}
