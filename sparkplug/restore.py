"""Restoring keyed state from a completed checkpoint with any parallelism (rescale).

A new task owning key groups ``G`` restores from every task of the checkpoint whose
key-group range overlaps ``G``: that task's snapshot (of an incremental
materialization only the files whose key groups meet ``G`` are read, in order; only
the key groups in ``G`` are decoded) and then its changelog handles, reading only the
segments whose key groups meet ``G`` and replaying only the changes of ``G``
(FLIP-158, "Rescaling"; Flink's key-group-range restore). Key groups never move
between tasks of one checkpoint, so every key is restored from exactly the one old
task that held it: none is lost or counted twice, whatever the old and new
parallelism. ``max_parallelism`` (the number of key groups) must not change.

By default the changes of each old task are squashed before they are applied and
only the kept ones are decoded (:mod:`dstltree.sparkplug.replay`: only the last change
per value key, per map user key, and a list's changes after its last clear), the
segments sliced without a copy per change: the restored state is the same as after
replaying every change, and :class:`RestoreStats` counts both the changes read and the
changes applied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from dstltree.client.collector import bulk_load_collector
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.reader import read_segment
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.sparkplug.replay import BulkReplay
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore

#: Snapshot files and segments a restore reads ahead of the one it applies.
READ_AHEAD = 8


class RescaleError(ValueError):
    """The checkpoint cannot be restored with this layout: another max_parallelism."""


@dataclass
class RestoreStats:
    """What a restore read: ``tasks`` old tasks consulted, ``snapshots`` snapshots read,
    ``segments`` changelog segments read, ``changes`` changes read (of the wanted key
    groups only; a value sets change counts as the changes it stands for, one per
    entry), ``changes_applied`` of those applied to the state (all of them without
    squashing), ``bytes_read`` bytes of snapshots and segments."""

    tasks: int = 0
    snapshots: int = 0
    segments: int = 0
    changes: int = 0
    changes_applied: int = 0
    bytes_read: int = 0

    @property
    def changes_squashed(self) -> int:
        """Changes read but not applied: superseded by a later change of their key."""
        return self.changes - self.changes_applied


def restore_key_groups(
    store: ObjectStore,
    checkpoint: CompletedCheckpoint,
    into: KeyedStateBackend,
    squash: bool = True,
) -> RestoreStats:
    """Restore the state of ``into.key_groups`` from ``checkpoint`` into ``into`` (merged
    into what it holds; normally an empty backend without a writer, or whose writer's
    changes are not wanted: replay does not log). ``squash`` applies only the changes
    that are not superseded (:mod:`dstltree.sparkplug.squash`; False: every change).
    Raises RescaleError when
    ``checkpoint.max_parallelism`` (if nonzero) differs from ``into.max_parallelism``;
    ValueError when the checkpoint's tasks leave some wanted key group uncovered or
    hold one twice, or for a corrupt snapshot or change (naming its object);
    CorruptObjectError / StorageError for unreadable changelog objects."""
    if checkpoint.max_parallelism and checkpoint.max_parallelism != into.max_parallelism:
        raise RescaleError(
            f"checkpoint {checkpoint.checkpoint_id} has max_parallelism "
            f"{checkpoint.max_parallelism}, the job {into.max_parallelism}: the number of "
            "key groups cannot change on restore (start from an empty state instead)"
        )
    wanted = into.key_groups
    _check_coverage(checkpoint, wanted)
    stats = RestoreStats()
    with bulk_load_collector():  # what a restore builds survives it: nothing to scan for
        for t in sorted(checkpoint.tasks):
            tc = checkpoint.tasks[t]
            held = tc.key_group_range
            if len(held) and max(held.start, wanted.start) >= min(held.stop, wanted.stop):
                continue  # no overlap (an empty range is unknown: consult the task)
            stats.tasks += 1
            _restore_task(store, tc, into, stats, squash)
    return stats


def restore_all(
    store: ObjectStore, checkpoint: CompletedCheckpoint | None, max_parallelism: int
) -> dict[str, dict[Any, Any]]:
    """The whole state of ``checkpoint``, all key groups: state name -> key -> state
    (value, dict for map state, list for list state); {} for None. Raises as
    :func:`restore_key_groups`."""
    if checkpoint is None:
        return {}
    backend = KeyedStateBackend(range(max_parallelism), None, max_parallelism)
    restore_key_groups(store, checkpoint, backend)
    return {name: dict(backend.items(name)) for name in backend.state_names()}


def _check_coverage(checkpoint: CompletedCheckpoint, wanted: range) -> None:
    """Raise ValueError unless the known key-group ranges of the checkpoint's tasks
    hold every key group of ``wanted`` exactly once (skipped when a task's range is
    unknown, i.e. empty, or the checkpoint has no tasks)."""
    ranges = [tc.key_group_range for tc in checkpoint.tasks.values()]
    if not ranges or any(len(r) == 0 for r in ranges):
        return
    holders = [0] * len(wanted)
    for r in ranges:
        for kg in range(max(r.start, wanted.start), min(r.stop, wanted.stop)):
            holders[kg - wanted.start] += 1
    missing = [wanted.start + i for i, n in enumerate(holders) if n == 0]
    twice = [wanted.start + i for i, n in enumerate(holders) if n > 1]
    if missing or twice:
        raise ValueError(
            f"checkpoint {checkpoint.checkpoint_id}: key groups held by no task "
            f"{missing[:8]}, by several tasks {twice[:8]} (wanted {wanted})"
        )


def _restore_task(
    store: ObjectStore,
    tc: TaskCheckpoint,
    into: KeyedStateBackend,
    stats: RestoreStats,
    squash: bool,
) -> None:
    """Restore one old task: its snapshot, then its handles' changes (squashed first
    when ``squash``) of ``into.key_groups``. Files and segments are read ahead, up to
    :data:`READ_AHEAD` at once (on an object store each read is a round trip), and
    applied in order."""
    paths = [] if tc.materialized is None else _snapshot_files(tc.materialized, into.key_groups)
    segments = [(h, ref) for h in tc.changelog for ref in _wanted_segments(h, into.key_groups)]
    reads: list[Callable[[], Any]] = [partial(store.read, p) for p in paths]
    reads += [partial(read_segment, store, ref, h.log_id) for h, ref in segments]
    with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="dstl-restore") as pool:
        ahead = _read_ahead(pool, reads)
        _apply_task(tc, into, stats, squash, paths, segments, ahead)


def _read_ahead(pool: ThreadPoolExecutor, reads: list[Callable[[], Any]]) -> Iterator[Any]:
    """The results of ``reads`` in order, at most :data:`READ_AHEAD` running ahead."""
    queued: deque[Future[Any]] = deque(pool.submit(r) for r in reads[:READ_AHEAD])
    rest = iter(reads[READ_AHEAD:])
    while queued:
        result = queued.popleft().result()
        following = next(rest, None)
        if following is not None:
            queued.append(pool.submit(following))
        yield result


def _apply_task(
    tc: TaskCheckpoint,
    into: KeyedStateBackend,
    stats: RestoreStats,
    squash: bool,
    paths: list[str],
    segments: list[tuple[ChangelogHandle, SegmentRef]],
    ahead: Iterator[Any],
) -> None:
    """Apply what ``ahead`` yields: the snapshot files ``paths``, then ``segments``."""
    for path in paths:
        data = next(ahead)
        stats.snapshots += 1
        stats.bytes_read += len(data)
        try:
            into.restore_snapshot(data)
        except ValueError as e:
            raise ValueError(f"snapshot {path} of task {tc.task}: {e}") from e
    squasher = BulkReplay(into) if squash else None
    where: list[str] = []  # origin of a squashed change -> its segment
    for handle, ref in segments:
        _replay_segment(next(ahead), handle, ref, into, stats, squasher, where)
    if squasher is not None:
        stats.changes_applied += squasher.apply(where)
        stats.changes += squasher.read


def _snapshot_files(ref: MaterializedRef, wanted: range) -> list[str]:
    """The files of snapshot ``ref`` to read, in order: its parts whose key groups meet
    ``wanted`` (an incremental materialization), else its one file."""
    if not ref.parts:
        return [ref.path]
    return [
        p.path
        for p in ref.parts
        if max(p.key_groups[0], wanted.start) < min(p.key_groups[1], wanted.stop)
    ]


def _wanted_segments(handle: ChangelogHandle, wanted: range) -> list[SegmentRef]:
    """The segments of ``handle`` to read: those overlapping its SQN range and holding
    one of the ``wanted`` key groups."""
    lo, hi = handle.sqn_range
    out = []
    for ref in handle.segments:
        if ref.sqn_to <= lo or ref.sqn_from >= hi or ref.meta.is_marker:
            continue
        if ref.key_groups and not any(kg in wanted for kg in ref.key_groups):
            continue
        out.append(ref)
    return out


def _replay_segment(
    seg: Any,
    handle: ChangelogHandle,
    ref: SegmentRef,
    into: KeyedStateBackend,
    stats: RestoreStats,
    squasher: BulkReplay | None,
    where: list[str],
) -> None:
    """Replay the changes of ``into.key_groups`` in the handle's SQN range from segment
    ``seg`` (read from ``ref``); with a ``squasher``, feed them to it instead
    (``where`` gains the segment's location)."""
    lo, hi = handle.sqn_range
    wanted = into.key_groups
    stats.segments += 1
    stats.bytes_read += ref.length
    location = f"{ref.path}@{ref.offset}"
    where.append(location)
    for (sqn, kg), changes in sorted(seg.entries.items()):
        if not lo <= sqn < hi or kg not in wanted:
            continue
        if squasher is not None:  # counted once applied (_restore_task)
            squasher.feed(kg, changes, len(where) - 1)
            continue
        applied = 0
        try:
            for change in changes:
                applied += into.apply_change(kg, change)
        except ValueError as e:
            raise ValueError(f"segment at {location}: {e}") from e
        stats.changes += applied
        stats.changes_applied += applied
