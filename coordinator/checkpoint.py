"""Checkpoint records: what each task acknowledges and what a completed checkpoint holds.

A checkpoint is a consistent cut (docs/design.md, Terms): per task, the source offset, the
materialized-state snapshot and the changelog handles covering the changes made after
that snapshot, and for an unaligned checkpoint (FLIP-76) the handles of its in-flight
records (channel state) with the task's alignment figures. Records are frozen and
convert to and from JSON-compatible dicts (:meth:`to_dict` / :meth:`from_dict`);
``from_dict`` raises ``KeyError``, ``TypeError`` or ``ValueError`` on malformed input.

Validation of what tasks send (pure, no I/O): :func:`path_problem` (a path is the
canonical form of a path under one of the job's object prefixes) and
:func:`checkpoint_problem` (bounds, SQN ranges, key groups and paths of one
acknowledgement); both return None or a :class:`Refusal`. Figures of a completed
checkpoint: :func:`checkpoint_phases` and :func:`checkpoint_alignment`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.coordinator.cleanup import normalize
from dstltree.sparkplug.sinks.layout import Committable
from dstltree.sparkplug.sources.base import EnumeratorState, SplitState
from dstltree.storage.store import CHANGELOG_DIR, SNAPSHOT_DIR, ObjectStore

#: Format version of checkpoint metadata written; :data:`METADATA_VERSIONS` are read.
#: A checkpoint with channel state (FLIP-76) is written as version 4, every other one as
#: :data:`METADATA_VERSION_ALIGNED`: a reader of version 3 would restore the former
#: without its in-flight records, so it must refuse it, and it still reads the latter.
METADATA_VERSION = 4
METADATA_VERSION_ALIGNED = 3
METADATA_VERSIONS = (2, 3, 4)
#: Largest SQN, byte offset / size (8 TiB) and count accepted from a task.
MAX_SQN = 2**63 - 1
MAX_OBJECT_BYTES = 2**43
MAX_COUNT = 2**63 - 1
#: Longest checkpoint phase a task may report, seconds (a day; NaN is refused too).
MAX_PHASE_S = 86_400.0
#: Longest path and log id accepted from a task, characters.
MAX_PATH_CHARS = 1024
MAX_LOG_ID_CHARS = 256
# One path component below a prefix: no "." / ".." / hidden names, no "%", "?", "#",
# "\\", whitespace or control characters.
_COMPONENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._=+-]*")


#: Most snapshot files one materialized reference may name.
MAX_SNAPSHOT_PARTS = 4096


@dataclass(frozen=True)
class SnapshotPart:
    """One file of an incremental materialization: the state of some key groups in
    ``[key_groups[0], key_groups[1])`` at ``path`` (URL), ``size_bytes`` long, either
    their whole state (``delta`` False) or only the keys changed since the parts before
    it (``delta`` True; a removed key is recorded as removed). Restore reads, in order,
    the parts whose range meets the key groups it wants (FLINK-7449's incremental
    checkpoints; FLIP-151)."""

    path: str
    key_groups: tuple[int, int]
    size_bytes: int
    delta: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "key_groups": list(self.key_groups),
            "size_bytes": self.size_bytes,
            "delta": self.delta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SnapshotPart:
        start, stop = (int(x) for x in d["key_groups"])
        return cls(str(d["path"]), (start, stop), int(d["size_bytes"]), bool(d["delta"]))


@dataclass(frozen=True)
class MaterializedRef:
    """A materialized-state snapshot of one task at ``path`` (URL), ``size_bytes`` long.

    The snapshot holds every change with SQN < ``sqn``; the task's changelog handles
    start at ``sqn`` (FLIP-158, "Materializing state changes").

    Incremental (``parts`` not empty): the snapshot is the files ``parts``, applied in
    order; ``path`` is the last of them, ``size_bytes`` their total (the full
    materialized size) and ``written_bytes`` what this materialization wrote (the rest
    is reused, referenced again from earlier materializations). Without parts,
    ``path`` is one whole snapshot.
    """

    path: str
    sqn: int
    size_bytes: int
    parts: tuple[SnapshotPart, ...] = ()
    written_bytes: int = 0

    def paths(self) -> frozenset[str]:
        """Every file this snapshot needs."""
        return frozenset((self.path, *(p.path for p in self.parts)))

    @property
    def reused_bytes(self) -> int:
        """Bytes of files an earlier materialization wrote (0 without parts)."""
        return max(0, self.size_bytes - self.written_bytes) if self.parts else 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "sqn": self.sqn, "size_bytes": self.size_bytes}
        if self.parts:
            d["parts"] = [p.to_dict() for p in self.parts]
            d["written_bytes"] = self.written_bytes
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MaterializedRef:
        parts = d.get("parts") or ()
        if len(parts) > MAX_SNAPSHOT_PARTS:
            raise ValueError(f"{len(parts)} snapshot parts, at most {MAX_SNAPSHOT_PARTS}")
        return cls(
            path=str(d["path"]),
            sqn=int(d["sqn"]),
            size_bytes=int(d["size_bytes"]),
            parts=tuple(SnapshotPart.from_dict(p) for p in parts),
            written_bytes=int(d.get("written_bytes", 0)),
        )


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
    commit, phase one; Flink's FileSink);
    ``sync_s`` / ``async_s``: seconds of the checkpoint's synchronous phase at the
    task (barrier aligned to the persist started and the sink output staged) and of
    its asynchronous phase (to the persist durable, when the acknowledgement leaves;
    Flink's two checkpoint phases); 0 when not measured.

    Unaligned checkpoints (FLIP-76, "Unaligned checkpoints"; docs/design.md, Terms):

    ``channel_state``: handles of the records in flight at this checkpoint (FLIP-76
    input channel state: records that arrived on an input channel before its barrier
    but after the snapshot; output channel state: batches in the task's outboxes that
    the barrier overtook), written by the task's channel-state writer (log
    ``<job_id>-t<task>-a<attempt>-cs``) beside its state changelog. They cover this
    checkpoint's in-flight records only (not cumulative), are never replayed as state
    changes (restore processes those records again, before any new one) and keep their
    objects alive in the shared state registry exactly like ``changelog``; empty for
    an aligned checkpoint;
    ``unaligned``: the task took this checkpoint unaligned: at the first barrier, or
    after its alignment took longer than the aligned-checkpoint timeout;
    ``alignment_s``: seconds from the first barrier of this checkpoint on any input
    channel of the task to the last one (FLIP-76's alignment time);
    ``start_delay_s``: seconds from the task's receipt of the trigger to the first
    barrier on any of its input channels, on the task's clock (FLIP-76's checkpoint
    start delay);
    ``inflight_bytes``: bytes of in-flight records the task persisted for this
    checkpoint (FLIP-76's persisted channel state size); 0 when aligned.
    """

    task: int
    attempt: int
    records: int = 0
    materialized: MaterializedRef | None = None
    changelog: tuple[ChangelogHandle, ...] = ()
    key_groups: tuple[int, int] = (0, 0)
    splits: tuple[SplitState, ...] = ()
    committables: tuple[Committable, ...] = ()
    sync_s: float = 0.0
    async_s: float = 0.0
    channel_state: tuple[ChangelogHandle, ...] = ()
    unaligned: bool = False
    alignment_s: float = 0.0
    start_delay_s: float = 0.0
    inflight_bytes: int = 0

    @property
    def key_group_range(self) -> range:
        """``key_groups`` as a range."""
        return range(*self.key_groups)

    def referenced_paths(self) -> frozenset[str]:
        """Every DFS path this task state references: the objects of its changelog and
        channel-state segments, and its snapshot files."""
        paths: set[str] = set()
        for h in (*self.changelog, *self.channel_state):
            paths |= h.object_paths()
        if self.materialized is not None:
            paths |= self.materialized.paths()
        return frozenset(paths)

    def log_ids(self) -> frozenset[str]:
        """The id of every log this task state names: its state changelog writers' and
        its channel-state writer's (logs of the job's own writers)."""
        return frozenset(h.log_id for h in (*self.changelog, *self.channel_state))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; the unaligned-checkpoint fields only when they are not their
        defaults (an aligned checkpoint's form is as before them)."""
        d = self._base_dict()
        if self.channel_state:
            d["channel_state"] = [h.to_dict() for h in self.channel_state]
        if self.unaligned:
            d["unaligned"] = True
        for k in ("alignment_s", "start_delay_s", "inflight_bytes"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        return d

    def _base_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "attempt": self.attempt,
            "records": self.records,
            "key_groups": list(self.key_groups),
            "materialized": None if self.materialized is None else self.materialized.to_dict(),
            "changelog": [h.to_dict() for h in self.changelog],
            "splits": [s.as_record() for s in self.splits],
            "committables": [c.to_wire() for c in self.committables],
            "sync_s": self.sync_s,
            "async_s": self.async_s,
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
            sync_s=float(d.get("sync_s", 0.0)),
            async_s=float(d.get("async_s", 0.0)),
            channel_state=tuple(
                ChangelogHandle.from_dict(h) for h in _list(d.get("channel_state", ()))
            ),
            unaligned=_flag(d.get("unaligned", False), "unaligned"),
            alignment_s=float(d.get("alignment_s", 0.0)),
            start_delay_s=float(d.get("start_delay_s", 0.0)),
            inflight_bytes=int(d.get("inflight_bytes", 0)),
        )


def _list(x: Any) -> list[Any]:
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"channel_state: expected a list, got {type(x).__name__}")
    return list(x)


def _flag(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{what}: expected true or false, got {type(x).__name__}")
    return x


@dataclass(frozen=True)
class SplitLogRef:
    """The ids of the source splits finished by some completed checkpoint, written once
    to ``path`` (``count`` ids; coordinator/splitlog.py) and referenced by the
    checkpoints after it, whose metadata then names only the splits finished since:
    a compacted log, as Spark's ``sources/`` metadata log, so that metadata does not
    grow with the input. ``ids``: the ids, once read (None in a reference just decoded
    from metadata; :meth:`CheckpointStore.load` reads them)."""

    path: str
    count: int
    ids: frozenset[str] | None = field(default=None, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SplitLogRef:
        count = int(d["count"])
        if not 0 <= count <= MAX_COUNT:
            raise ValueError(f"split log of {count} ids")
        return cls(str(d["path"]), count)


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every task of ``attempt`` acknowledged.

    ``materialization_epoch``: the latest materialization epoch applied when it was
    triggered (0 = none); ``created_at``: wall-clock time (epoch seconds) when the last
    acknowledgement arrived; ``duration_s``: seconds from trigger to the last
    acknowledgement; ``tasks``: task index -> its acknowledged state;
    ``parallelism`` / ``max_parallelism``: tasks and key groups of the job when it was
    taken (a restore with another ``max_parallelism`` is refused); ``enumerator``: the
    split enumerator's snapshot at the trigger (FLIP-27) with the readers' split states
    of the checkpoint folded in (``EnumeratorState.resumed``; the tasks then carry
    none), None for a job without a source; ``finished_log``: where the finished split
    ids up to an earlier checkpoint are (the metadata names only those finished since;
    None: all are in the metadata); ``final``: the last checkpoint of a run that ended
    (input finished or a stop was requested).
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
    finished_log: SplitLogRef | None = field(default=None, hash=False)

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
        if self.finished_log is not None:
            paths.add(self.finished_log.path)
        return frozenset(paths)

    def resolved(self, ids: frozenset[str]) -> CompletedCheckpoint:
        """This checkpoint with the ids of its ``finished_log`` (read from its path)
        added to its enumerator's finished splits. Raises ValueError when their number
        is not the reference's count."""
        ref = self.finished_log
        if ref is None or self.enumerator is None:
            return self
        if len(ids) != ref.count:
            raise ValueError(f"split log {ref.path} holds {len(ids)} ids, not {ref.count}")
        enum = replace(self.enumerator, finished=self.enumerator.finished | ids)
        return replace(self, enumerator=enum, finished_log=replace(ref, ids=ids))

    def to_dict(self) -> dict[str, Any]:
        """The metadata (format :data:`METADATA_VERSION`, or
        :data:`METADATA_VERSION_ALIGNED` without channel state): with a ``finished_log``
        whose ids are known, the enumerator names only the splits finished beyond it."""
        enum = None if self.enumerator is None else self.enumerator.as_record()
        ref = self.finished_log
        if enum is not None and ref is not None:
            if ref.ids is None or not ref.ids <= self.enumerator.finished:  # type: ignore[union-attr]
                ref = None  # not usable here: every finished id in the metadata
            else:
                enum["finished"] = sorted(set(enum["finished"]) - ref.ids)
        channel_state = any(t.channel_state for t in self.tasks.values())
        return {
            "version": METADATA_VERSION if channel_state else METADATA_VERSION_ALIGNED,
            "checkpoint_id": self.checkpoint_id,
            "attempt": self.attempt,
            "materialization_epoch": self.materialization_epoch,
            "created_at": self.created_at,
            "duration_s": self.duration_s,
            "tasks": [self.tasks[k].to_dict() for k in sorted(self.tasks)],
            "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "enumerator": enum,
            "final": self.final,
            "finished_log": None if ref is None else ref.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompletedCheckpoint:
        version = int(d.get("version", METADATA_VERSION))
        if version not in METADATA_VERSIONS:
            raise ValueError(
                f"checkpoint metadata format version {version} is not known "
                f"(this reads {', '.join(map(str, METADATA_VERSIONS))})"
            )
        log = d.get("finished_log")
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
            finished_log=None if log is None else SplitLogRef.from_dict(log),
        )


# -- validation of task messages ---------------------------------------------------------


class Refusal(NamedTuple):
    """Why a task's message is refused: ``kind`` (a short metric label: ``path``,
    ``sqn``, ``bounds``, ``key_groups``...) and ``reason`` (a sentence)."""

    kind: str
    reason: str


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot be an object prefix (None if it can): it must end with
    ``/``, and hold no ``.``/``..`` component, no ``?``, ``#``, ``\\`` or control
    character."""
    if not prefix.endswith("/") or len(prefix) > MAX_PATH_CHARS:
        return f"object prefix {prefix!r} must end with '/'"
    path = prefix.split("://", 1)[-1]
    parts = path.split("/")[1:-1]
    bad = any(c in prefix for c in "?#\\") or any(ord(c) < 32 or c == "\x7f" for c in prefix)
    if bad or any(p in (".", "..") for p in parts):
        return f"object prefix {prefix!r} is not canonical"
    return None


def job_object_prefixes(store: ObjectStore, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The object prefixes of the job on ``store``: the canonical
    (``coordinator.cleanup.normalize``) ``<base>/changelog/`` and
    ``<base>/materialized/``, then ``extra`` (prefixes of nodes writing elsewhere; a
    URL with a scheme is taken as given, a plain path is normalized). Raises
    ValueError for an extra prefix that is not canonical."""
    own = [normalize(store, store.join(d)) for d in (CHANGELOG_DIR, SNAPSHOT_DIR)]
    more = [p if "://" in p else normalize(store, p) for p in extra]
    out = tuple(p.rstrip("/") + "/" for p in (*own, *more))
    for p in out:
        problem = prefix_problem(p)
        if problem is not None:
            raise ValueError(problem)
    return out


def path_problem(path: object, prefixes: Sequence[str]) -> str | None:
    """Why ``path`` is not an object path of this job (None if it is): it must start
    with one of ``prefixes`` (canonical, each ending in ``/``, see
    :func:`prefix_problem`) and continue with non-empty components of letters, digits
    and ``._=+-`` not starting with a dot, at most :data:`MAX_PATH_CHARS` in all. Such
    a path is its own canonical form (``coordinator.cleanup.normalize``) and cannot
    leave the prefix (no ``..``, no other scheme or bucket, no query or fragment)."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        return f"a path is a string of 1 to {MAX_PATH_CHARS} characters"
    for prefix in prefixes:
        if path.startswith(prefix):
            rest = path[len(prefix) :].split("/")
            if all(_COMPONENT.fullmatch(c) for c in rest):
                return None
            return f"path {path[:200]!r} is not canonical below {prefix!r}"
    return f"path {path[:200]!r} is outside this job's object prefixes"


def snapshot_problem(
    ref: MaterializedRef, prefixes: Sequence[str], owned: range | None = None
) -> Refusal | None:
    """Why a snapshot reference is refused (None if it is not): its path or a part's
    (:func:`path_problem`), an SQN beyond :data:`MAX_SQN`, a size beyond
    :data:`MAX_OBJECT_BYTES`, more than :data:`MAX_SNAPSHOT_PARTS` parts, or a path
    that is not its last part's, or (with ``owned``) a part's key groups outside
    ``owned``."""
    for path in (ref.path, *(p.path for p in ref.parts)):
        problem = path_problem(path, prefixes)
        if problem is not None:
            return Refusal("path", f"snapshot: {problem}")
    if not 0 <= ref.sqn <= MAX_SQN or not 0 <= ref.size_bytes <= MAX_OBJECT_BYTES:
        return Refusal("bounds", f"snapshot SQN {ref.sqn} or size {ref.size_bytes} out of range")
    if len(ref.parts) > MAX_SNAPSHOT_PARTS or not 0 <= ref.written_bytes <= MAX_OBJECT_BYTES:
        return Refusal("bounds", f"snapshot of {len(ref.parts)} parts or written size out of range")
    for part in ref.parts:
        start, stop = part.key_groups
        if not 0 <= start <= stop <= MAX_COUNT or not 0 <= part.size_bytes <= MAX_OBJECT_BYTES:
            return Refusal("bounds", f"snapshot part {part.key_groups} of {part.size_bytes} bytes")
        if owned is not None and not owned.start <= start <= stop <= owned.stop:
            return Refusal("key_groups", f"snapshot part {part.key_groups} outside {owned}")
    if ref.parts and ref.path != ref.parts[-1].path:
        return Refusal("path", "snapshot: the path is not its last part's")
    return None


def _segment_problem(
    s: SegmentRef, h: ChangelogHandle, prefixes: Sequence[str], kgs: range
) -> Refusal | None:
    if s.log_id != h.log_id or not 0 <= s.sqn_from <= s.sqn_to <= MAX_SQN:
        return Refusal("sqn", f"log {h.log_id!r}: a segment of SQN {s.sqn_from}..{s.sqn_to}")
    if min(s.offset, s.length) < 0 or s.offset + s.length > MAX_OBJECT_BYTES:
        return Refusal("bounds", f"log {h.log_id!r}: segment at {s.offset}+{s.length} bytes")
    if not 0 <= s.crc32 < 2**32:
        return Refusal("bounds", f"log {h.log_id!r}: segment CRC32 {s.crc32}")
    if len(s.key_groups) > len(kgs) or any(k not in kgs for k in s.key_groups):
        return Refusal("key_groups", f"log {h.log_id!r}: segment key groups outside {kgs}")
    problem = path_problem(s.path, prefixes)
    return None if problem is None else Refusal("path", problem)


def _handle_problem(h: ChangelogHandle, prefixes: Sequence[str], kgs: range) -> Refusal | None:
    lo, hi = h.sqn_range
    if not 0 < len(h.log_id) <= MAX_LOG_ID_CHARS:
        return Refusal("bounds", f"a log id of {len(h.log_id)} characters")
    if not 0 <= lo <= hi <= MAX_SQN:
        return Refusal("sqn", f"log {h.log_id[:64]!r}: SQN range {lo}..{hi}")
    last = -1
    for s in h.segments:
        if s.sqn_from < last:
            return Refusal("sqn", f"log {h.log_id[:64]!r}: segments overlap or out of order")
        last = s.sqn_to
        problem = _segment_problem(s, h, prefixes, kgs)
        if problem is not None:
            return problem
    return None


def checkpoint_problem(
    tc: TaskCheckpoint, prefixes: Sequence[str], owned: range, max_parallelism: int
) -> Refusal | None:
    """Why acknowledged state ``tc`` is refused (None if it is not): a count out of
    range, key groups ``[start, stop)`` not inside ``owned`` (the task's range; an
    empty range claims none) or segments with key groups outside them (outside
    ``[0, max_parallelism)`` when it claims none), SQN ranges that are not ordered
    (``from <= to``; a log's handles contiguous, its segments ordered and not
    overlapping), offsets and sizes out of ``[0, MAX_OBJECT_BYTES]``, or a path
    outside ``prefixes`` (:func:`path_problem`). Channel-state handles are checked as
    changelog handles, but need not be contiguous with any other handle and their
    segments may hold any key group of the job (output channel state is bound for
    other tasks' key groups); ``alignment_s`` and ``start_delay_s`` must lie in
    ``[0, MAX_PHASE_S]`` and ``inflight_bytes`` in ``[0, MAX_OBJECT_BYTES]``."""
    if not 0 <= tc.records <= MAX_COUNT:
        return Refusal("bounds", f"records {tc.records} out of range")
    if not (0 <= tc.sync_s <= MAX_PHASE_S and 0 <= tc.async_s <= MAX_PHASE_S):
        return Refusal("bounds", f"checkpoint phases {tc.sync_s} / {tc.async_s} s out of range")
    problem = _alignment_problem(tc)
    if problem is not None:
        return problem
    start, stop = tc.key_groups
    if not 0 <= start <= stop <= max_parallelism or (
        start < stop and not owned.start <= start <= stop <= owned.stop
    ):
        return Refusal("key_groups", f"key groups [{start}, {stop}) are not inside {owned}")
    kgs = range(start, stop) if start < stop else range(max_parallelism)
    if tc.materialized is not None:
        problem = snapshot_problem(tc.materialized, prefixes, kgs)
        if problem is not None:
            return problem
    ends: dict[str, int] = {}
    for h in tc.changelog:
        if ends.get(h.log_id, h.sqn_range[0]) != h.sqn_range[0]:
            return Refusal("sqn", f"log {h.log_id[:64]!r}: handles not contiguous")
        ends[h.log_id] = h.sqn_range[1]
        problem = _handle_problem(h, prefixes, kgs)
        if problem is not None:
            return problem
    for h in tc.channel_state:
        problem = _handle_problem(h, prefixes, range(max_parallelism))
        if problem is not None:
            return Refusal(problem.kind, f"channel state: {problem.reason}")
    return None


def _alignment_problem(tc: TaskCheckpoint) -> Refusal | None:
    """Why the unaligned-checkpoint figures of ``tc`` are refused (None if they are
    not); NaN is refused too."""
    for name in ("alignment_s", "start_delay_s"):
        value = getattr(tc, name)
        if not 0 <= value <= MAX_PHASE_S:
            return Refusal("bounds", f"{name} {value} s out of [0, {MAX_PHASE_S:.0f}]")
    if not 0 <= tc.inflight_bytes <= MAX_OBJECT_BYTES:
        return Refusal("bounds", f"inflight_bytes {tc.inflight_bytes} out of range")
    return None


def checkpoint_phases(checkpoint: CompletedCheckpoint) -> tuple[float, float]:
    """(synchronous, asynchronous) phase of ``checkpoint``, seconds: the longest of each
    at any task (:class:`TaskCheckpoint` ``sync_s``, ``async_s``); (0, 0) for none."""
    tasks = checkpoint.tasks.values()
    return max((t.sync_s for t in tasks), default=0.0), max((t.async_s for t in tasks), default=0.0)


def checkpoint_alignment(checkpoint: CompletedCheckpoint) -> tuple[float, float, int, bool]:
    """The unaligned-checkpoint figures of ``checkpoint`` (FLIP-76; :class:`TaskCheckpoint`
    ``alignment_s``, ``start_delay_s``, ``inflight_bytes``, ``unaligned``): the longest
    alignment at any task (seconds), the longest start delay (seconds), the in-flight
    bytes of all tasks together, and whether any task took it unaligned;
    (0, 0, 0, False) for none."""
    tasks = checkpoint.tasks.values()
    return (
        max((t.alignment_s for t in tasks), default=0.0),
        max((t.start_delay_s for t in tasks), default=0.0),
        sum(t.inflight_bytes for t in tasks),
        any(t.unaligned for t in tasks),
    )


def log_spans(tc: TaskCheckpoint) -> dict[str, tuple[int, int]]:
    """log id -> the SQN span ``(from, to)`` the state changelog handles of ``tc``
    cover. Channel-state handles are not included: their SQNs are not state SQNs (no
    materialization or truncation refers to them) and a checkpoint's channel state
    does not continue the previous one's."""
    spans: dict[str, tuple[int, int]] = {}
    for h in tc.changelog:
        lo, hi = h.sqn_range
        old = spans.get(h.log_id)
        spans[h.log_id] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return spans
