"""Builders of small checkpoint records for tests (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint


def handle(log_id: str, paths: Iterable[str], sqn_from: int = 0) -> ChangelogHandle:
    """A handle of ``log_id`` with one 10-byte segment per path, consecutive SQNs."""
    segs = tuple(
        SegmentRef(SegmentMeta(log_id, sqn_from + i, sqn_from + i + 1, (0,), 10, 0), p, 0)
        for i, p in enumerate(paths)
    )
    return ChangelogHandle(log_id, (sqn_from, sqn_from + len(segs)), segs)


def task_checkpoint(
    task: int,
    attempt: int,
    paths: Iterable[str] = (),
    snapshot: str | None = None,
    records: int = 0,
) -> TaskCheckpoint:
    """A task's acknowledgement referencing ``paths`` and, optionally, a snapshot."""
    mat = None if snapshot is None else MaterializedRef(snapshot, 0, 1)
    return TaskCheckpoint(task, attempt, records, mat, (handle(f"log-{task}", paths),))


def completed(
    checkpoint_id: int, per_task: Mapping[int, Iterable[str]], attempt: int = 0
) -> CompletedCheckpoint:
    """A completed checkpoint whose task ``t`` references ``per_task[t]``."""
    tasks = {t: task_checkpoint(t, attempt, ps) for t, ps in per_task.items()}
    return CompletedCheckpoint(checkpoint_id, attempt, 0, 0.0, 0.0, tasks)
