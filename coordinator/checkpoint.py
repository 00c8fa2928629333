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
from dstltree.sparkplug.sinks.layout import Committable
from dstltree.sparkplug.sources.base import EnumeratorState, SplitState

METADATA_VERSION = 2


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

    ``records``: records its keyed operator processed since the job began
    (informational: restore positions the source through ``splits``);
    ``key_groups``: the key groups ``[start, stop)`` whose state it holds;
    ``materialized``: the snapshot to restore first, or None (empty initial state);
    ``changelog``: handles to replay after the snapshot, one per writer;
    ``splits``: its source reader's split states at the barrier (FLIP-27 reader state);
    ``committables``: its sink's staged files not yet known committed (two-phase
    commit, phase one; Flink's FileSink).
    """

    task: int
    attempt: int
    records: int = 0
    materialized: MaterializedRef | None = None
    changelog: tuple[ChangelogHandle, ...] = ()
    key_groups: tuple[int, int] = (0, 0)
    splits: tuple[SplitState, ...] = ()
    committables: tuple[Committable, ...] = ()

    @property
    def key_group_range(self) -> range:
        """``key_groups`` as a range."""
        return range(*self.key_groups)

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
            "records": self.records,
            "key_groups": list(self.key_groups),
            "materialized": None if self.materialized is None else self.materialized.to_dict(),
            "changelog": [h.to_dict() for h in self.changelog],
            "splits": [s.as_record() for s in self.splits],
            "committables": [c.to_wire() for c in self.committables],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskCheckpoint:
        mat = d.get("materialized")
        start, stop = (int(x) for x in d.get("key_groups", (0, 0)))
        return cls(
            task=int(d["task"]),
            attempt=int(d["attempt"]),
            records=int(d.get("records", 0)),
            materialized=None if mat is None else MaterializedRef.from_dict(mat),
            changelog=tuple(ChangelogHandle.from_dict(h) for h in d.get("changelog", ())),
            key_groups=(start, stop),
            splits=tuple(SplitState.from_record(r) for r in d.get("splits", ())),
            committables=tuple(Committable.from_wire(c) for c in d.get("committables", ())),
        )


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every task of ``attempt`` acknowledged.

    ``materialization_epoch``: the latest materialization epoch applied when it was
    triggered (0 = none); ``created_at``: wall-clock time (epoch seconds) when the last
    acknowledgement arrived; ``duration_s``: seconds from trigger to the last
    acknowledgement; ``tasks``: task index -> its acknowledged state;
    ``parallelism`` / ``max_parallelism``: tasks and key groups of the job when it was
    taken (a restore with another ``max_parallelism`` is refused); ``enumerator``: the
    split enumerator's snapshot at the trigger (FLIP-27), None for a job without a
    source; ``final``: the last checkpoint of a run that ended (input finished or a
    stop was requested).
    """

    checkpoint_id: int
    attempt: int
    materialization_epoch: int
    created_at: float
    duration_s: float
    tasks: dict[int, TaskCheckpoint] = field(default_factory=dict, hash=False)
    parallelism: int = 0
    max_parallelism: int = 0
    enumerator: EnumeratorState | None = field(default=None, hash=False)
    final: bool = False

    def split_states(self) -> list[SplitState]:
        """Every task's reader split states (for ``EnumeratorState.resumed``)."""
        return [s for t in self.tasks.values() for s in t.splits]

    def committables(self) -> list[Committable]:
        """Every task's committables, in final-name order."""
        out = {c.final: c for t in self.tasks.values() for c in t.committables}
        return [out[k] for k in sorted(out)]

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
            "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "enumerator": None if self.enumerator is None else self.enumerator.as_record(),
            "final": self.final,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompletedCheckpoint:
        version = int(d.get("version", METADATA_VERSION))
        if version != METADATA_VERSION:
            raise ValueError(f"unsupported checkpoint metadata version {version}")
        tasks = [TaskCheckpoint.from_dict(t) for t in d["tasks"]]
        enum = d.get("enumerator")
        return cls(
            checkpoint_id=int(d["checkpoint_id"]),
            attempt=int(d["attempt"]),
            materialization_epoch=int(d["materialization_epoch"]),
            created_at=float(d["created_at"]),
            duration_s=float(d["duration_s"]),
            tasks={t.task: t for t in tasks},
            parallelism=int(d.get("parallelism", len(tasks))),
            max_parallelism=int(d.get("max_parallelism", 0)),
            enumerator=None if enum is None else EnumeratorState.from_record(enum),
            final=bool(d.get("final", False)),
        )
