"""Checkpoint records: what each task acknowledges and what a completed checkpoint holds.

A checkpoint is a consistent cut (docs/design.md, Terms): per task, the source offset, the
materialized-state snapshot and the changelog handles covering the changes made after
that snapshot. Records are frozen and convert to and from JSON-compatible dicts
(:meth:`to_dict` / :meth:`from_dict`); ``from_dict`` raises ``KeyError``, ``TypeError``
or ``ValueError`` on malformed input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dstltree.client.handle import ChangelogHandle

METADATA_VERSION = 1


@dataclass(frozen=True)
class MaterializedRef:
    """A materialized-state snapshot of one task at ``path`` (URL), ``size_bytes`` long.

    The snapshot holds every change with SQN < ``sqn``; the task's changelog handles
    start at ``sqn`` (FLIP-158, "Materializing state changes").
    """

    path: str
    sqn: int
    size_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sqn": self.sqn, "size_bytes": self.size_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MaterializedRef:
        return cls(path=str(d["path"]), sqn=int(d["sqn"]), size_bytes=int(d["size_bytes"]))


@dataclass(frozen=True)
class TaskCheckpoint:
    """What task ``task`` of attempt ``attempt`` acknowledges for one checkpoint.

    ``source_offset``: the position to seek the source to on restore (records);
    ``materialized``: the snapshot to restore first, or None (empty initial state);
    ``changelog``: handles to replay after the snapshot, one per writer.
    """

    task: int
    attempt: int
    source_offset: int
    materialized: MaterializedRef | None = None
    changelog: tuple[ChangelogHandle, ...] = ()

    def referenced_paths(self) -> frozenset[str]:
        """Every DFS path this task state references: changelog objects and snapshot."""
        paths: set[str] = set()
        for h in self.changelog:
            paths |= h.object_paths()
        if self.materialized is not None:
            paths.add(self.materialized.path)
        return frozenset(paths)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "attempt": self.attempt,
            "source_offset": self.source_offset,
            "materialized": None if self.materialized is None else self.materialized.to_dict(),
            "changelog": [h.to_dict() for h in self.changelog],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskCheckpoint:
        mat = d.get("materialized")
        return cls(
            task=int(d["task"]),
            attempt=int(d["attempt"]),
            source_offset=int(d["source_offset"]),
            materialized=None if mat is None else MaterializedRef.from_dict(mat),
            changelog=tuple(ChangelogHandle.from_dict(h) for h in d.get("changelog", ())),
        )


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every task of ``attempt`` acknowledged.

    ``materialization_epoch``: the latest materialization epoch applied when it was
    triggered (0 = none); ``created_at``: wall-clock time (epoch seconds) when the last
    acknowledgement arrived; ``duration_s``: seconds from trigger to the last
    acknowledgement; ``tasks``: task index -> its acknowledged state.
    """

    checkpoint_id: int
    attempt: int
    materialization_epoch: int
    created_at: float
    duration_s: float
    tasks: dict[int, TaskCheckpoint] = field(default_factory=dict, hash=False)

    def referenced_paths(self) -> frozenset[str]:
        """Every object path (changelog objects and snapshots) this checkpoint needs."""
        paths: set[str] = set()
        for t in self.tasks.values():
            paths |= t.referenced_paths()
        return frozenset(paths)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": METADATA_VERSION,
            "checkpoint_id": self.checkpoint_id,
            "attempt": self.attempt,
            "materialization_epoch": self.materialization_epoch,
            "created_at": self.created_at,
            "duration_s": self.duration_s,
            "tasks": [self.tasks[k].to_dict() for k in sorted(self.tasks)],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompletedCheckpoint:
        version = int(d.get("version", METADATA_VERSION))
        if version != METADATA_VERSION:
            raise ValueError(f"unsupported checkpoint metadata version {version}")
        tasks = [TaskCheckpoint.from_dict(t) for t in d["tasks"]]
        return cls(
            checkpoint_id=int(d["checkpoint_id"]),
            attempt=int(d["attempt"]),
            materialization_epoch=int(d["materialization_epoch"]),
            created_at=float(d["created_at"]),
            duration_s=float(d["duration_s"]),
            tasks={t.task: t for t in tasks},
        )
