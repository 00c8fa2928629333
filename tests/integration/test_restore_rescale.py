"""Restore with another parallelism: four tasks write real changelogs (in-process
uploads to a DFS under tmp_path; two also a snapshot), their checkpoint is restored by
2, 4 and 8 new tasks, and every key comes back exactly once with its state."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dstltree.client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.sparkplug.keygroups import (
    encode_key,
    key_group_of,
    key_group_of_encoded,
    key_group_range,
    task_of_key_group,
)
from dstltree.sparkplug.restore import RescaleError, restore_all, restore_key_groups
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore

M = 64  # max parallelism
OLD = 4
KEYS: list[Any] = (
    [f"N{i}AA" for i in range(120)]
    + list(range(-20, 40))
    + [None, b"raw", b"", ("JFK", 1), ("JFK", 2), (("a", None), b"x")]
)

State = dict[str, dict[bytes, Any]]  # name -> encoded key -> state


def _state(b: KeyedStateBackend) -> State:
    return {n: {encode_key(k): v for k, v in b.items(n)} for n in b.state_names()}


def _record(b: KeyedStateBackend, key: Any, rng: random.Random) -> None:
    """What a user function does for one record of ``key``: count, remember routes,
    keep values, sometimes only the last three."""
    b.set_current_key(key)
    stats, routes, recent = b.value_state("stats"), b.map_state("routes"), b.list_state("recent")
    s = stats.get() or {"n": 0, "sum": 0}
    x = rng.randint(1, 100)
    stats.set({"n": s["n"] + 1, "sum": s["sum"] + x})
    routes.put(rng.choice(["JFK", "LAX", ("SFO", 1), None]), x)
    if rng.random() < 0.1:
        routes.remove("JFK")
    recent.add(x)  # not idempotent: a change replayed twice shows
    if rng.random() < 0.05:
        recent.update(recent.get()[-3:])
    if rng.random() < 0.03:
        stats.clear()


@dataclasses.dataclass
class OldTask:
    """One task of the old job: its backend, writer and what it will acknowledge."""

    task: int
    backend: KeyedStateBackend
    writer: ChangelogWriter
    keys: list[Any]
    rng: random.Random
    materialized: MaterializedRef | None = None
    handle: ChangelogHandle | None = None

    def run(self, records: int, keys: list[Any] | None = None) -> None:
        for _ in range(records):
            _record(self.backend, self.rng.choice(keys or self.keys), self.rng)

    def persist(self, after: int) -> ChangelogHandle:
        return self.writer.persist_durably(after).result(timeout=30)

    def snapshot(self, store: ObjectStore) -> int:
        sqn = self.writer.next_sqn()
        data = self.backend.snapshot()
        path = store.new_snapshot_path()
        self.materialized = MaterializedRef(path, sqn, store.put(path, data))
        return sqn

    def ack(self) -> TaskCheckpoint:
        r = self.backend.key_groups
        assert self.handle is not None
        return TaskCheckpoint(
            task=self.task,
            attempt=0,
            materialized=self.materialized,
            changelog=(self.handle,),
            key_groups=(r.start, r.stop),
        )


def _old_job(base: str, store: ObjectStore) -> tuple[CompletedCheckpoint, State, list[OldTask]]:
    """Four tasks; 0 and 2 materialize, 1 and 3 only log. Task 0's snapshot falls
    inside a segment its checkpoint handle reuses (FLIP-158, Example: CP3), task 1's last
    segment holds one key group only."""
    client = ChangelogClient.open(base)
    tasks = []
    for t in range(OLD):
        kgs = key_group_range(t, OLD, M)
        mine = [k for k in KEYS if task_of_key_group(key_group_of(k, M), OLD, M) == t]
        writer = client.create_writer(f"old-{t}", kgs)
        tasks.append(OldTask(t, KeyedStateBackend(kgs, writer, M), writer, mine, random.Random(t)))
    for ot in tasks:
        ot.run(300)
    steps: dict[int, Callable[[OldTask], ChangelogHandle]] = {
        0: lambda ot: _straddling_snapshot(ot, store),
        1: _changelog_only_one_group_last,
        2: lambda ot: _snapshot_after_a_persist(ot, store),
        3: _changelog_only_one_group_last,
    }
    for ot in tasks:
        ot.handle = steps[ot.task](ot)
    expected: State = {}
    for ot in tasks:
        for name, per_key in _state(ot.backend).items():
            expected.setdefault(name, {}).update(per_key)
    for ot in tasks:  # after the checkpoint: never restored
        ot.run(50)
        ot.persist(0)
    client.close()
    cp = CompletedCheckpoint(
        checkpoint_id=7,
        attempt=0,
        materialization_epoch=1,
        created_at=0.0,
        duration_s=0.0,
        tasks={ot.task: ot.ack() for ot in tasks},
        parallelism=OLD,
        max_parallelism=M,
    )
    return CompletedCheckpoint.from_dict(json.loads(json.dumps(cp.to_dict()))), expected, tasks


def _straddling_snapshot(ot: OldTask, store: ObjectStore) -> ChangelogHandle:
    sqn = ot.snapshot(store)
    ot.run(200)
    ot.persist(0)  # one segment [0, sqn + 1): its changes below sqn are in the snapshot
    ot.run(200)
    handle = ot.persist(sqn)
    assert handle.segments[0].sqn_from < sqn < handle.segments[0].sqn_to
    return handle


def _snapshot_after_a_persist(ot: OldTask, store: ObjectStore) -> ChangelogHandle:
    ot.persist(0)
    sqn = ot.snapshot(store)
    ot.run(200)
    return ot.persist(sqn)


def _changelog_only_one_group_last(ot: OldTask) -> ChangelogHandle:
    ot.persist(0)
    ot.run(200)
    ot.persist(0)
    ot.run(30, keys=[ot.keys[0]])
    handle = ot.persist(0)
    assert handle.segments[-1].key_groups == (key_group_of(ot.keys[0], M),)
    return handle


@pytest.fixture(scope="module")
def old_job(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ObjectStore, CompletedCheckpoint, State, list[OldTask]]:
    base = str(tmp_path_factory.mktemp("dfs"))
    store = ObjectStore(base)
    cp, expected, tasks = _old_job(base, store)
    return store, cp, expected, tasks


@pytest.mark.parametrize("new", [2, 4, 8])
def test_restore_with_another_parallelism_keeps_every_key_once(
    old_job: tuple[ObjectStore, CompletedCheckpoint, State, list[OldTask]], new: int
) -> None:
    store, cp, expected, _ = old_job
    assert set(expected) == {"recent", "routes", "stats"}
    assert all(len(per_key) > 50 for per_key in expected.values())
    merged: State = {}
    snapshots = 0
    for t in range(new):
        backend = KeyedStateBackend(key_group_range(t, new, M), None, M)
        stats = restore_key_groups(store, cp, backend)
        assert stats.tasks == max(1, OLD // new)  # the old tasks whose range overlaps
        assert stats.changes > 0 and stats.bytes_read > 0
        snapshots += stats.snapshots
        for name, per_key in _state(backend).items():
            assert all(key_group_of_encoded(k, M) in backend.key_groups for k in per_key)
            assert not per_key.keys() & merged.get(name, {}).keys()
            merged.setdefault(name, {}).update(per_key)
    assert snapshots == 2 * max(1, new // OLD)  # each old snapshot read by every new owner
    for name, per_key in expected.items():
        assert merged[name].keys() == per_key.keys(), name
        for k, v in per_key.items():
            assert merged[name][k] == v, (name, k)


def test_only_segments_holding_a_wanted_key_group_are_read(
    old_job: tuple[ObjectStore, CompletedCheckpoint, State, list[OldTask]],
) -> None:
    store, cp, expected, tasks = old_job
    one = tasks[1]
    lone = key_group_of(one.keys[0], M)
    other = next(kg for kg in one.backend.key_groups if kg != lone)
    backend = KeyedStateBackend(range(other, other + 1), None, M)
    stats = restore_key_groups(store, cp, backend)
    segments = cp.tasks[1].changelog[0].segments
    assert stats.segments == sum(1 for s in segments if other in s.key_groups) < len(segments)
    assert stats.snapshots == 0
    got = _state(backend)
    for name, per_key in expected.items():
        want = {k: v for k, v in per_key.items() if key_group_of_encoded(k, M) == other}
        assert got.get(name, {}) == want


def test_restore_all_and_refusals(
    old_job: tuple[ObjectStore, CompletedCheckpoint, State, list[OldTask]],
) -> None:
    store, cp, expected, _ = old_job
    everything = restore_all(store, cp, M)
    assert {n: {encode_key(k): v for k, v in s.items()} for n, s in everything.items()} == expected
    assert restore_all(store, None, M) == {}
    with pytest.raises(RescaleError, match="max_parallelism 64, the job 128"):
        restore_key_groups(store, cp, KeyedStateBackend(range(0, 8), None, 128))
    missing = dataclasses.replace(cp, tasks={t: tc for t, tc in cp.tasks.items() if t != 2})
    with pytest.raises(ValueError, match=r"held by no task \[32, 33,"):
        restore_key_groups(store, missing, KeyedStateBackend(range(M), None, M))
    restore_key_groups(store, missing, KeyedStateBackend(range(0, 16), None, M))  # not needed


def test_a_corrupt_snapshot_is_named(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    path = store.new_snapshot_path()
    store.put(path, b"\x93not a snapshot")
    tc = TaskCheckpoint(
        task=0, attempt=0, materialized=MaterializedRef(path, 0, 16), key_groups=(0, M)
    )
    cp = CompletedCheckpoint(1, 0, 1, 0.0, 0.0, tasks={0: tc}, parallelism=1, max_parallelism=M)
    with pytest.raises(ValueError, match=rf"snapshot {path} of task 0: bad state snapshot"):
        restore_key_groups(store, cp, KeyedStateBackend(range(M), None, M))
