"""The source interface without files: plain values, split and snapshot records, the
assignment policy, MemorySource reading from every offset, discovery, and exactly-once
across a simulated failure (tests/support/source_driver.py)."""

from __future__ import annotations

import datetime as dt
import pickle
from collections import Counter
from decimal import Decimal
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.sparkplug.sources import (
    EnumeratorState,
    Listing,
    MemorySource,
    SourceError,
    Split,
    SplitState,
    plain,
)
from tests.support.source_driver import SourceDriver


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.int64(3), 3),
        (np.float32(1.5), 1.5),
        (float("nan"), None),
        (np.float64("nan"), None),
        (np.bool_(True), True),
        (pd.NA, None),
        (pd.NaT, None),
        (np.datetime64("NaT"), None),
        (dt.datetime(2013, 1, 1, 5, 17), "2013-01-01T05:17:00"),
        (pd.Timestamp("2013-01-01 05:17", tz="UTC"), "2013-01-01T05:17:00+00:00"),
        (np.datetime64("2013-01-01T05:17:00.000001"), "2013-01-01T05:17:00.000001"),
        (dt.date(2013, 1, 2), "2013-01-02"),
        (dt.time(5, 17), "05:17:00"),
        (dt.timedelta(seconds=2, microseconds=5), 2_000_005),
        (pd.Timedelta(milliseconds=3), 3000),
        (Decimal("12.50"), "12.50"),
        (b"\x00\x01", b"\x00\x01"),
        ({"a": [np.int8(1), None, (2.0, float("nan"))]}, {"a": [1, None, [2.0, None]]}),
        (np.array([1, 2]), [1, 2]),
    ],
)
def test_plain_values(value: Any, expected: Any) -> None:
    assert plain(value) == expected
    assert type(plain(value)) is type(expected)
    msgpack.packb(plain(value))


def test_plain_rejects_unknown_types() -> None:
    with pytest.raises(TypeError, match="object"):
        plain(object())


def test_records_round_trip_through_msgpack() -> None:
    s = SplitState(Split("a/b.csv", "s3://x/a/b.csv"), 7, False)
    assert SplitState.from_record(msgpack.unpackb(msgpack.packb(s.as_record()))) == s
    state = EnumeratorState(
        pending=(SplitState(Split("c"), 3),),
        assigned={"b": (1, SplitState(Split("b", "loc"), 2))},
        finished=frozenset({"a"}),
        complete=True,
    )
    decoded = msgpack.unpackb(msgpack.packb(state.as_record()))
    assert EnumeratorState.from_record(decoded) == state
    assert pickle.loads(pickle.dumps(state)) == state


def _ids(assignment: dict[int, list[SplitState]]) -> dict[int, list[str]]:
    return {r: [s.split.id for s in states] for r, states in assignment.items()}


def test_round_robin_in_id_order_then_least_loaded() -> None:
    src = MemorySource({f"s{i}": [] for i in (4, 0, 2, 1, 3)}, finished=False)
    enum = src.create_enumerator()
    assert [s.id for s in enum.discover()] == ["s0", "s1", "s2", "s3", "s4"]
    assert _ids(enum.assign([0, 1])) == {0: ["s0", "s2", "s4"], 1: ["s1", "s3"]}
    enum.finish(["s0", "s2", "s4"])  # reader 0 is now idle, reader 1 holds two
    src.add_split("t0", [])
    src.add_split("t1", [])
    src.add_split("t2", [])
    src.add_split("t3", [])
    assert [s.id for s in enum.discover()] == ["t0", "t1", "t2", "t3"]
    # loads 0 and 2: t0, t1 to 0; t2 ties (2, 2) and goes to the first listed; t3 to 1
    assert _ids(enum.assign([0, 1])) == {0: ["t0", "t1", "t2"], 1: ["t3"]}
    assert [s.split.id for s in enum.assigned_to(1)] == ["s1", "s3", "t3"]


def test_assign_errors_and_finish_rules() -> None:
    enum = MemorySource({"a": [{"x": 1}]}).create_enumerator()
    assert enum.assign([0]) == {}  # nothing discovered yet
    enum.discover()
    with pytest.raises(ValueError, match="no readers"):
        enum.assign([])
    with pytest.raises(ValueError, match="not assigned"):
        enum.finish(["a"])
    enum.assign([3])
    enum.finish(["a"])
    enum.finish(["a"])  # idempotent
    assert enum.is_finished()
    with pytest.raises(ValueError, match="not assigned"):
        enum.add_splits_back([SplitState(Split("a"), 1)])


@given(
    records=st.lists(st.fixed_dictionaries({"k": st.text(max_size=3), "v": st.integers()})),
    data=st.data(),
)
def test_memory_read_from_any_offset(records: list[dict[str, Any]], data: st.DataObject) -> None:
    reader = MemorySource({"s": records}).create_reader()
    offset = data.draw(st.integers(0, len(records)))
    assert list(reader.read(Split("s"), offset)) == records[offset:]


def test_memory_offset_past_end_and_unknown_split() -> None:
    reader = MemorySource({"s": [{"a": 1}]}).create_reader()
    with pytest.raises(SourceError, match="offset 2 outside") as e:
        list(reader.read(Split("s"), 2))
    assert e.value.path == "s"
    with pytest.raises(SourceError, match="no such split"):
        list(reader.read(Split("t"), 0))


def test_discovery_of_later_splits_and_finishing() -> None:
    src = MemorySource({"b": [{"i": 0}]}, finished=False)
    enum = src.create_enumerator()
    assert enum.discover() == [Split("b")]
    assert enum.discover() == []
    src.add_split("a", [{"i": 1}])
    src.add_split("c", [{"i": 2}])
    assert enum.discover() == [Split("a"), Split("c")]
    enum.assign([0])
    enum.finish(["a", "b", "c"])
    assert not enum.is_finished()  # more splits may come
    src.finish()
    assert enum.discover() == []
    assert enum.is_finished()
    with pytest.raises(ValueError, match="finished"):
        src.add_split("d", [])


def test_listing_apart_from_adding_it() -> None:
    """list_splits() only lists (another thread may call it); add_listing() is what
    discover() does with the listing, without I/O."""
    src = MemorySource({"b": [{"i": 0}]}, finished=False)
    enum = src.create_enumerator()
    before = enum.snapshot()
    listing = enum.list_splits()
    assert listing == Listing([Split("b")], False)
    assert enum.snapshot() == before  # listing changed nothing
    src.add_split("a", [])
    src.finish()
    later = enum.list_splits()
    assert enum.add_listing(listing) == [Split("b")]
    assert enum.add_listing(listing) == []  # known splits are not new
    assert not enum.listing_complete()
    assert enum.add_listing(later) == [Split("a")]
    assert enum.listing_complete() and enum.snapshot().complete
    assert enum.add_listing(Listing([Split("z")], False)) == []  # after the last listing
    assert enum.discover() == []
    assert [s.split.id for s in enum.snapshot().pending] == ["a", "b"]


def test_restored_enumerator_does_not_reread_finished_splits() -> None:
    src = MemorySource({"a": [{"i": 0}], "b": [{"i": 1}]}, finished=False)
    driver = SourceDriver(src, 1)
    driver.poll()
    driver.step(0, 1)  # consumes a, does not yet know a is at its end
    driver.step(0, 1)  # finds a's end, consumes b's record
    cp = driver.checkpoint()
    restored = cp.restored()
    assert restored.finished == {"a"}
    assert restored.pending == (SplitState(Split("b"), 1),)
    again = src.create_enumerator(restored)
    assert again.discover() == []
    assert _ids(again.assign([5])) == {5: ["b"]}


def test_resumed_rejects_unknown_splits_and_backward_offsets() -> None:
    snap = EnumeratorState(assigned={"a": (0, SplitState(Split("a"), 4))})
    with pytest.raises(ValueError, match="unknown split 'z'"):
        snap.resumed([SplitState(Split("z"), 1)])
    with pytest.raises(ValueError, match="offset 3 < 4"):
        snap.resumed([SplitState(Split("a"), 3)])
    assert snap.resumed([]).pending == (SplitState(Split("a"), 4),)


def _splits(sizes: list[int]) -> dict[str, list[dict[str, Any]]]:
    return {f"s{i:02d}": [{"s": i, "i": j} for j in range(n)] for i, n in enumerate(sizes)}


def _assert_exactly_once(out: list[dict[str, Any]], splits: dict[str, list[Any]]) -> None:
    expected = [r for recs in splits.values() for r in recs]
    counts = Counter((r["s"], r["i"]) for r in out)
    assert counts == Counter((r["s"], r["i"]) for r in expected)
    for s in {r["s"] for r in out}:  # each split's records in order
        assert [r["i"] for r in out if r["s"] == s] == sorted(r["i"] for r in out if r["s"] == s)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    p1=st.integers(1, 3),
    p2=st.integers(1, 3),
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), max_size=20),
    lost=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), max_size=6),
)
def test_restore_after_failure_reads_every_record_once(
    sizes: list[int],
    p1: int,
    p2: int,
    steps: list[tuple[int, int]],
    lost: list[tuple[int, int]],
) -> None:
    splits = _splits(sizes)
    src = MemorySource(splits)
    first = SourceDriver(src, p1)
    for reader, n in steps:
        first.poll()
        first.step(reader % p1, n)
    cp = first.checkpoint()
    for reader, n in lost:  # read after the checkpoint, then the attempt fails
        first.step(reader % p1, n)
    snapshot = EnumeratorState.from_record(
        msgpack.unpackb(msgpack.packb(cp.enumerator.as_record()))
    )
    second = SourceDriver(src, p2, snapshot.resumed(cp.readers))
    second.run_to_end()
    _assert_exactly_once(cp.output + second.output, splits)


def test_add_splits_back_resumes_a_failed_readers_splits() -> None:
    splits = _splits([5, 5, 5, 5])
    driver = SourceDriver(MemorySource(splits), 2)
    driver.poll()
    driver.step(0, 3)
    driver.step(1, 7)
    failed = driver.readers[1]
    unfinished = [s for s in failed.states.values() if not s.finished]
    assert [s.split.id for s in driver.enumerator.assigned_to(1)] == [
        s.split.id for s in unfinished
    ]
    assert unfinished == [SplitState(Split("s03"), 2)]  # s01 done, 2 records of s03
    driver.enumerator.add_splits_back(unfinished)
    assert driver.enumerator.assigned_to(1) == []
    back = driver.enumerator.assign([0])
    assert back == {0: [SplitState(Split("s03"), 2)]}
    driver.readers[0].give(back[0])
    del driver.readers[1]
    driver.run_to_end()
    _assert_exactly_once(driver.output, splits)
