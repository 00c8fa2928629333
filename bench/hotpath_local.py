"""Hot-path figures measured inside one process without a node: the state-update loop
of a keyed operator with and without the changelog, and restore by changelog replay
against snapshot-only restore of the same state."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dstltree.client.api import ChangelogClient
from dstltree.client.handle import ChangelogHandle
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM
from dstltree.sparkplug.restore import restore_key_groups
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore

_BATCH = 1000  # records between clock reads
_RECORDS_PER_CHECKPOINT = 20_000  # records between two persists of the loop
_KEYS = 5_000  # distinct keys (the demo's bench job uses 5,000)


@dataclass(frozen=True)
class LoopRate:
    """``records`` state updates in ``seconds`` (wall clock)."""

    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


def _keys(n: int) -> list[str]:
    return [f"key-{i}" for i in range(n)]


def state_loop(backend: KeyedStateBackend, seconds: float) -> LoopRate:
    """Run the state update of a keyed operator (set the current key, read a count and
    a sum in value state, write both back) for about ``seconds`` s; when the backend has
    a writer, persist every 20,000 records (at most one persist in flight, truncated
    once durable, as a task does at its checkpoints). Returns the rate."""
    keys = _keys(_KEYS)
    count, total = backend.value_state("count"), backend.value_state("sum")
    writer = backend.writer
    pending: Future[ChangelogHandle] | None = None
    after, done, start = 0, 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for i in range(done, done + _BATCH):
            backend.set_current_key(keys[i % _KEYS])
            count.set((count.get() or 0) + 1)
            total.set((total.get() or 0) + i)
        done += _BATCH
        if writer is not None and done % _RECORDS_PER_CHECKPOINT == 0:
            if pending is not None:
                writer.truncate(pending.result().sqn_range[1])
            pending = writer.persist_durably(after)
            after = writer.next_sqn()
    if pending is not None:
        pending.result()
    return LoopRate(done, time.perf_counter() - start)


def task_loop_figures(base_path: str, seconds: float) -> dict[str, float]:
    """Records/s of :func:`state_loop` with the changelog (a writer on a direct client
    under ``base_path``) and without it (no writer), ``seconds`` s each, alternating
    halves so that machine noise hits both. Keys ``with_changelog``, ``without``
    (records/s) and ``ratio`` (with / without)."""
    rkg = range(DEFAULT_MAX_PARALLELISM)
    with_cl, without = LoopRate(0, 0.0), LoopRate(0, 0.0)
    with ChangelogClient.open(base_path) as client:
        for half in range(2):
            writer = client.create_writer(f"bench-loop-{half}", rkg)
            a = state_loop(KeyedStateBackend(rkg, writer), seconds / 2)
            b = state_loop(KeyedStateBackend(rkg, None), seconds / 2)
            with_cl = LoopRate(with_cl.records + a.records, with_cl.seconds + a.seconds)
            without = LoopRate(without.records + b.records, without.seconds + b.seconds)
    return {
        "with_changelog": with_cl.per_second,
        "without": without.per_second,
        "ratio": with_cl.per_second / without.per_second,
    }


def _changelog_state(
    client: ChangelogClient, store: ObjectStore, changes: int
) -> tuple[ChangelogHandle, MaterializedRef]:
    """Log ``changes`` value-state sets over 5,000 keys (persisted every 20,000 changes,
    like checkpoints), then snapshot the final state. Returns (the changelog handle of
    every change, the snapshot of the same state)."""
    rkg = range(DEFAULT_MAX_PARALLELISM)
    writer = client.create_writer("bench-restore", rkg)
    backend = KeyedStateBackend(rkg, writer)
    keys, state = _keys(_KEYS), backend.value_state("count")
    for i in range(changes):
        backend.set_current_key(keys[i % _KEYS])
        state.set(i)
        if (i + 1) % _RECORDS_PER_CHECKPOINT == 0:
            writer.next_sqn()
    handle = writer.persist_durably(0).result()
    data = backend.snapshot()
    path = store.new_snapshot_path()
    store.put(path, data)
    return handle, MaterializedRef(path, writer.next_sqn(), len(data))


def _timed_restore(store: ObjectStore, task: TaskCheckpoint) -> tuple[float, int]:
    """(seconds, changes replayed) of restoring all key groups of a one-task checkpoint."""
    cp = CompletedCheckpoint(1, 0, 0, time.time(), 0.0, {0: task}, 1, DEFAULT_MAX_PARALLELISM)
    backend = KeyedStateBackend(range(DEFAULT_MAX_PARALLELISM), None)
    t0 = time.perf_counter()
    stats = restore_key_groups(store, cp, backend)
    return time.perf_counter() - t0, stats.changes


def restore_figures(base_path: str, changes: int) -> dict[str, Any]:
    """Restore of ``changes`` value-state changes over 5,000 keys written under
    ``base_path``: by replaying the changelog (no snapshot) and from a snapshot of the
    same final state only. Keys ``changes``, ``replay_seconds``, ``snapshot_seconds``,
    ``replay`` and ``snapshot_only`` (changes/s: ``changes`` / seconds) and ``ratio``
    (replay / snapshot-only)."""
    store = ObjectStore(base_path)
    with ChangelogClient.open(base_path) as client:
        handle, snap = _changelog_state(client, store, changes)
    kg = (0, DEFAULT_MAX_PARALLELISM)
    replay_s, replayed = _timed_restore(
        store, TaskCheckpoint(0, 0, changelog=(handle,), key_groups=kg)
    )
    snap_s, _ = _timed_restore(store, TaskCheckpoint(0, 0, materialized=snap, key_groups=kg))
    if replayed != changes:
        raise RuntimeError(f"replayed {replayed} changes, logged {changes}")
    return {
        "changes": changes,
        "replay_seconds": replay_s,
        "snapshot_seconds": snap_s,
        "replay": changes / replay_s,
        "snapshot_only": changes / snap_s,
        "ratio": snap_s / replay_s,
    }
