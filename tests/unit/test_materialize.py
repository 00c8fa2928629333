"""Incremental materialization in the background (sparkplug/materialize.py): files per
key group shared across materializations, copy-on-write captures, restore of owned
ranges, compaction, abandoned materializations, and the registry's reference counts
per file. Real writers on a local store; no timed assertions."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.client import ChangelogClient, ObjectStore
from dstltree.coordinator.checkpoint import (
    CompletedCheckpoint,
    MaterializedRef,
    TaskCheckpoint,
    job_object_prefixes,
    snapshot_problem,
)
from dstltree.coordinator.registry import SharedStateRegistry
from dstltree.sparkplug.keygroups import key_group_of
from dstltree.sparkplug.materialize import Materializer
from dstltree.sparkplug.restore import restore_key_groups
from dstltree.sparkplug.state_backend import KeyedStateBackend

KGS = range(0, 128)
KEYS = 5000


class _Task:
    """A backend with a real writer, its materializer and its store."""

    def __init__(self, tmp: Path, **opts: Any) -> None:
        base = str(tmp / "dfs")
        self.store = ObjectStore(base)
        self.client = ChangelogClient.open(base)
        self.backend = KeyedStateBackend(KGS, self.client.create_writer("t0", KGS))
        self.mat = Materializer(self.store, self.backend, **opts)
        self.count = self.backend.value_state("count")
        self.seen = self.backend.map_state("seen")
        self.log = self.backend.list_state("log")

    def put(self, key: int, value: int) -> None:
        self.backend.set_current_key(key)
        self.count.set(value)
        if key % 7 == 0:
            self.seen.put(value % 3, value)
            self.log.add(value)

    def state(self) -> dict[str, dict[Any, Any]]:
        b = self.backend
        return {n: dict(b.items(n)) for n in b.state_names()}

    def materialize(self, epoch: int, during: Any = None) -> MaterializedRef:
        """Begin, then step until the reference, calling ``during()`` between steps."""
        self.mat.begin(epoch)
        ref = None
        for _ in range(1_000_000):
            ref = self.mat.step()
            if ref is not None:
                break
            if during is not None:
                during()
        assert ref is not None
        self.mat.applied(ref)
        return ref

    def restored(self, ref: MaterializedRef, kgs: range = KGS) -> dict[str, dict[Any, Any]]:
        tc = TaskCheckpoint(0, 0, materialized=ref, key_groups=(KGS.start, KGS.stop))
        cp = CompletedCheckpoint(1, 0, 0, 0.0, 0.0, {0: tc})
        into = KeyedStateBackend(kgs)
        restore_key_groups(self.store, cp, into)
        return {n: dict(into.items(n)) for n in into.state_names()}


@pytest.fixture
def task(tmp_path: Path) -> Iterator[_Task]:
    t = _Task(tmp_path)
    yield t
    t.mat.close()
    t.client.close()


def _fill(t: _Task) -> None:
    for k in range(KEYS):
        t.put(k, k)


def test_a_second_materialization_writes_only_what_changed(task: _Task) -> None:
    _fill(task)
    first = task.materialize(1)
    assert first.written_bytes == first.size_bytes > 0 and not any(p.delta for p in first.parts)
    assert task.restored(first) == task.state()
    for k in random.Random(1).sample(range(KEYS), KEYS // 100):  # 1 % of the keys
        task.put(k, -k)
    second = task.materialize(2)
    assert second.written_bytes <= 0.05 * second.size_bytes
    assert set(first.paths()) <= set(second.paths()), "the first files are referenced again"
    assert second.reused_bytes == first.size_bytes
    assert task.restored(second) == task.state()
    nothing = task.materialize(3)
    assert nothing.written_bytes == 0 and nothing.parts == second.parts
    assert task.mat.last is not None and task.mat.last.files == 0


def test_writes_during_a_materialization_are_not_in_it_but_in_the_next(task: _Task) -> None:
    _fill(task)
    task.materialize(1)
    for k in range(0, KEYS, 10):
        task.put(k, k + 1)
    task.mat.budget_s = 0.0  # one key group per step: the writes below meet frozen groups
    expected = task.state()
    rng = random.Random(2)
    later: list[int] = []

    def write() -> None:
        k = rng.randrange(KEYS)
        later.append(k)
        task.put(k, 10 * KEYS + k)

    ref = task.materialize(2, during=write)
    assert later, "the materialization ran beside writes"
    assert task.restored(ref) == expected  # the state at its SQN, copy-on-write
    assert task.restored(task.materialize(3)) == task.state()


def test_removed_keys_stay_removed(task: _Task) -> None:
    _fill(task)
    task.materialize(1)
    b = task.backend
    for k in (0, 7, 14, 21):
        b.set_current_key(k)
        task.count.clear()
        task.seen.clear()
        task.log.clear()
    ref = task.materialize(2)
    restored = task.restored(ref)
    assert restored == task.state()
    assert 0 not in restored["count"] and 7 not in restored["seen"]


def test_a_range_restore_reads_only_its_files(tmp_path: Path) -> None:
    t = _Task(tmp_path, target_bytes=4096)
    try:
        _fill(t)
        ref = t.materialize(1)
        assert len(ref.parts) > 8
        wanted = range(32, 48)
        tc = TaskCheckpoint(0, 0, materialized=ref, key_groups=(0, 128))
        into = KeyedStateBackend(wanted)
        stats = restore_key_groups(t.store, CompletedCheckpoint(1, 0, 0, 0.0, 0.0, {0: tc}), into)
        assert 0 < stats.snapshots < len(ref.parts)
        whole = t.state()["count"]
        mine = {k: v for k, v in whole.items() if key_group_of(k, 128) in wanted}
        assert dict(into.items("count")) == mine
    finally:
        t.mat.close()
        t.client.close()


def test_deltas_are_compacted_and_old_files_drop_out(tmp_path: Path) -> None:
    t = _Task(tmp_path, max_deltas=3)
    try:
        _fill(t)
        first = t.materialize(1)
        refs = [first]
        for epoch in range(2, 7):
            for k in range(0, KEYS, 3):
                t.put(k, epoch * KEYS + k)
            refs.append(t.materialize(epoch))
        last = refs[-1]
        assert not set(first.paths()) & set(last.paths()), "compaction rewrote every group"
        assert len(last.parts) <= 4
        assert t.restored(last) == t.state()
    finally:
        t.mat.close()
        t.client.close()


def test_an_abandoned_or_unapplied_materialization_loses_no_key(task: _Task) -> None:
    _fill(task)
    task.materialize(1)
    for k in range(0, KEYS, 5):
        task.put(k, 2 * k)
    task.mat.budget_s = 0.0
    task.mat.begin(2)
    task.mat.step()  # some groups captured, then the epoch is given up
    task.mat.begin(3)
    built = None
    while built is None:
        built = task.mat.step()  # reported, never applied
    for k in range(1, KEYS, 5):
        task.put(k, 3 * k)
    ref = task.materialize(4)
    assert task.restored(ref) == task.state()


def test_an_empty_state_is_one_empty_file(task: _Task) -> None:
    ref = task.materialize(1)
    assert len(ref.parts) == 1 and task.store.exists(ref.path)
    assert task.restored(ref) == {}


def test_the_registry_keeps_shared_files_until_no_checkpoint_names_them(task: _Task) -> None:
    _fill(task)
    first = task.materialize(1)
    task.put(3, 33)
    second = task.materialize(2)

    def checkpoint(cid: int, ref: MaterializedRef) -> CompletedCheckpoint:
        tc = TaskCheckpoint(0, 0, materialized=ref, key_groups=(0, 128))
        return CompletedCheckpoint(cid, 0, 0, 0.0, 0.0, {0: tc})

    reg = SharedStateRegistry()
    reg.register(checkpoint(1, first))
    reg.register(checkpoint(2, second))
    assert reg.unregister(1) == [], "the second materialization still needs every file"
    dropped = reg.unregister(2)
    assert set(dropped) == set(second.paths())


def test_parts_round_trip_and_are_checked(task: _Task) -> None:
    _fill(task)
    ref = task.materialize(1)
    assert MaterializedRef.from_dict(ref.to_dict()) == ref
    prefixes = job_object_prefixes(task.store)
    assert snapshot_problem(ref, prefixes, range(128)) is None
    assert snapshot_problem(ref, prefixes, range(0, 4)) is not None  # outside the range
    outside = ref.to_dict()
    outside["parts"][0]["path"] = "file:///etc/passwd"
    assert snapshot_problem(MaterializedRef.from_dict(outside), prefixes) is not None
