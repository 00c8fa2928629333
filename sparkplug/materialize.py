"""Materialization of one task's keyed state: incremental, in the background, in files
per key group that later materializations share.

Why this design (docs/architecture.md, "Materialization"): state values are already
held serialized (msgpack bytes, as RocksDB holds them), so capturing a key group is a
walk over its keys, not a deep copy; and the backend tracks the keys written since
each key group's last capture, so an incremental capture packs only those.

- **Synchronous part** (:meth:`Materializer.begin`, at the coordinator's Materialize):
  the writer's next SQN is recorded (the snapshot holds every change below it) and the
  key groups to capture are frozen; nothing is copied or packed yet.
- **In the background of the task loop** (:meth:`Materializer.step`, between batches):
  a few frozen key groups are packed at a time, within a time budget. A record that
  writes to a frozen key group first captures that group (copy-on-write at key group
  granularity, Flink's heap backend takes a snapshot version per entry), so the
  capture is exactly the state at the SQN. Packed groups are gathered into files of
  about ``target_bytes`` and written by upload threads (I/O releases the GIL).
  Memory: the packed groups not yet written (at most ``max_uploads`` files plus one
  being filled, and the groups a burst of writes captured early), never a second
  copy of the whole state.
- **Incremental** (FLINK-7449's incremental checkpoints; FLIP-151): a key group is
  written whole the first time, then as deltas of the keys written since (a removed
  key recorded as removed), until its deltas outgrow ``compact_ratio`` times its last
  whole size or number ``max_deltas``; then it is written whole again. The reference
  (:class:`~dstltree.coordinator.checkpoint.MaterializedRef`) lists every file still
  needed, old ones included: the shared state registry counts references per file
  and deletes a file once no retained checkpoint names it.
- **Applied** (:meth:`Materializer.applied`): the coordinator applied the reported
  reference; it becomes the base of the next materialization. A materialization
  started before the last one was applied replaces it (its keys are captured again).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dstltree.coordinator.checkpoint import MaterializedRef, SnapshotPart
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore

__all__ = ["MaterializationStats", "Materializer"]

MiB = 1024 * 1024


@dataclass
class _Layout:
    """The files of a materialization and, per key group, what holds it: its whole
    state's size, its deltas' total size and count, and the files holding it."""

    parts: list[SnapshotPart] = field(default_factory=list)
    whole_bytes: dict[int, int] = field(default_factory=dict)
    delta_bytes: dict[int, int] = field(default_factory=dict)
    deltas: dict[int, int] = field(default_factory=dict)
    files: dict[int, list[str]] = field(default_factory=dict)

    def copy(self) -> _Layout:
        return _Layout(
            list(self.parts),
            dict(self.whole_bytes),
            dict(self.delta_bytes),
            dict(self.deltas),
            {kg: list(f) for kg, f in self.files.items()},
        )


@dataclass(frozen=True)
class MaterializationStats:
    """One materialization: ``sync_s`` seconds the task stopped for it, ``duration_s``
    from its start to its reference, ``written_bytes`` / ``reused_bytes`` / ``files``
    written, ``whole_groups`` and ``delta_groups`` captured."""

    epoch: int
    sync_s: float
    duration_s: float
    written_bytes: int
    reused_bytes: int
    files: int
    whole_groups: int
    delta_groups: int


class _Build:
    """A materialization under way: what is left to capture, captured and written."""

    def __init__(self, epoch: int, sqn: int, layout: _Layout, todo: dict[int, bool]) -> None:
        self.epoch, self.sqn, self.layout = epoch, sqn, layout
        self.todo = todo  # key group -> whole (True) or delta, ascending
        self.taken: dict[int, set[bytes]] = {}  # the dirty keys each capture took
        self.copied: dict[int, tuple[bool, list[list[Any]]]] = {}  # captured, not packed
        self.buffers: dict[bool, list[tuple[int, bytes]]] = {True: [], False: []}
        self.buffered = {True: 0, False: 0}
        self.uploads: list[tuple[Future[int], SnapshotPart, list[int]]] = []
        self.started = time.monotonic()
        self.sync_s = 0.0
        self.whole = self.delta = 0


class Materializer:
    """Materializes ``backend`` into ``store`` for one task (module docstring).
    ``target_bytes``: bytes per file; ``budget_s``: packing time per :meth:`step`;
    ``max_uploads``: files being written before :meth:`step` stops packing."""

    def __init__(
        self,
        store: ObjectStore,
        backend: KeyedStateBackend,
        target_bytes: int = 8 * MiB,
        budget_s: float = 0.002,
        max_uploads: int = 4,
        compact_ratio: float = 1.0,
        max_deltas: int = 8,
    ) -> None:
        self.store, self.backend = store, backend
        self.target_bytes, self.budget_s, self.max_uploads = target_bytes, budget_s, max_uploads
        self.compact_ratio, self.max_deltas = compact_ratio, max_deltas
        self.base = _Layout()  # of the last applied materialization
        self._build: _Build | None = None
        # built, reported, not applied yet: its reference, layout and captured keys
        self._done: tuple[MaterializedRef, _Layout, dict[int, set[bytes]]] | None = None
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="dstl-materialize")
        self.last: MaterializationStats | None = None
        backend.on_frozen_write = self._capture
        backend.track_changes()

    @property
    def running(self) -> bool:
        """A materialization is being captured or written."""
        return self._build is not None

    def close(self) -> None:
        """Stop the upload threads (waiting for running uploads)."""
        self._pool.shutdown(wait=True)

    # -- the synchronous part ---------------------------------------------------------
    def begin(self, epoch: int) -> None:
        """Start materialization ``epoch`` at the writer's next SQN (a running one is
        abandoned: its keys will be captured again). Raises RuntimeError without a
        changelog writer."""
        t0 = time.monotonic()
        writer = self.backend.writer
        if writer is None:
            raise RuntimeError("materialization needs the task's changelog writer")
        if self._build is not None:
            self._abandon()
        if self._done is not None:  # reported, never applied: its keys are dirty again
            self._give_back(self._done[2])
            self._done = None
        sqn = writer.next_sqn()
        todo = self._plan()
        self.backend.freeze(todo)
        self._build = _Build(epoch, sqn, self.base.copy(), todo)
        self._build.sync_s = time.monotonic() - t0

    def _plan(self) -> dict[int, bool]:
        """Key group -> captured whole (never captured in the base, or its deltas have
        grown too large) or as a delta (keys written since), for every group that
        needs a capture."""
        b, base = self.backend, self.base
        dirty = set(b.dirty_groups())
        todo: dict[int, bool] = {}
        for kg in b.key_groups:
            whole = kg not in base.whole_bytes
            if whole and kg not in dirty and not b.has_state(kg):
                continue  # never held anything
            if not whole and kg not in dirty:
                continue
            grown = base.delta_bytes.get(kg, 0) > self.compact_ratio * base.whole_bytes.get(kg, 0)
            todo[kg] = whole or grown or base.deltas.get(kg, 0) >= self.max_deltas
        return todo

    # -- in the background ------------------------------------------------------------
    def step(self) -> MaterializedRef | None:
        """Pack frozen key groups for up to ``budget_s``, start uploads of full files,
        and return the reference once everything is written (then None again until
        the next :meth:`begin`). Raises the upload's StorageError if a file cannot be
        written (the task fails and is recovered)."""
        build = self._build
        if build is None:
            return None
        deadline = time.monotonic() + self.budget_s
        while True:
            if build.copied:  # first what writes to frozen groups captured meanwhile
                self._pack(build, next(iter(build.copied)))
            elif build.todo and self._inflight(build) < self.max_uploads:
                self._capture(next(iter(build.todo)))
            else:
                break
            if time.monotonic() >= deadline:
                break
        if not build.todo and not build.copied:
            for whole in (True, False):
                if build.buffers[whole]:
                    self._write(build, whole)
        if build.todo or build.copied or self._inflight(build):
            return None
        return self._finish(build)

    def run_now(self, epoch: int = 0) -> MaterializedRef:
        """Materialize synchronously (a rescaled task's first snapshot) and take the
        result as the base at once."""
        self.begin(epoch)
        ref = None
        while ref is None:
            ref = self.step()
            b = self._build
            if ref is None and b is not None and not b.todo and not b.copied:
                for fut, _, _ in b.uploads:
                    fut.result()
        self.applied(ref)
        return ref

    def _capture(self, kg: int) -> None:
        """Capture key group ``kg`` of the running materialization (also called by the
        backend before a write to a frozen group: copy-on-write); packed later."""
        build = self._build
        assert build is not None
        whole = build.todo.pop(kg)
        entries, keys = self.backend.capture_group(kg, whole)
        build.taken[kg] = keys
        build.copied[kg] = (whole, entries)
        if whole:
            build.whole += 1
        else:
            build.delta += 1

    def _pack(self, build: _Build, kg: int) -> None:
        """Encode captured key group ``kg`` into the buffer of its kind; a buffer that
        reached ``target_bytes`` starts being written."""
        whole, entries = build.copied.pop(kg)
        blob = self.backend.pack_group(entries)
        layout = build.layout
        if whole:
            layout.whole_bytes[kg] = len(blob)
            layout.delta_bytes[kg] = layout.deltas[kg] = 0
            layout.files[kg] = []
        if not blob:
            return
        if not whole:
            layout.delta_bytes[kg] = layout.delta_bytes.get(kg, 0) + len(blob)
            layout.deltas[kg] = layout.deltas.get(kg, 0) + 1
        build.buffers[whole].append((kg, blob))
        build.buffered[whole] += len(blob)
        self._write_full(build)

    def _write_full(self, build: _Build) -> None:
        """Start writing each kind of buffered groups that reached ``target_bytes``."""
        for whole in (True, False):
            if build.buffered[whole] >= self.target_bytes:
                self._write(build, whole)

    def _write(self, build: _Build, whole: bool) -> None:
        """Start writing the buffered groups of one kind as one file."""
        groups = sorted(build.buffers[whole])
        build.buffers[whole], build.buffered[whole] = [], 0
        data = self.backend.part(groups, delta=not whole)
        path = self.store.new_snapshot_path()
        kgs = [kg for kg, _ in groups]
        part = SnapshotPart(path, (kgs[0], kgs[-1] + 1), len(data), delta=not whole)
        build.uploads.append((self._pool.submit(self._put, path, data), part, kgs))

    def _put(self, path: str, data: bytes) -> int:
        self.store.put(path, data)
        return len(data)

    @staticmethod
    def _inflight(build: _Build) -> int:
        return sum(1 for fut, _, _ in build.uploads if not fut.done())

    def _finish(self, build: _Build) -> MaterializedRef:
        """Every file is written: the reference naming every file still needed."""
        layout = build.layout
        written = 0
        for fut, part, kgs in build.uploads:
            written += fut.result()  # raises the upload's error
            layout.parts.append(part)
            for kg in kgs:
                layout.files.setdefault(kg, []).append(part.path)
        if not layout.parts:  # no state at all: one empty file names the snapshot
            empty = self.backend.part([], delta=False)
            path = self.store.new_snapshot_path()
            self.store.put(path, empty)
            start = self.backend.key_groups.start
            layout.parts.append(SnapshotPart(path, (start, start), len(empty)))
            written += len(empty)
        needed = {p for files in layout.files.values() for p in files}
        layout.parts = [p for p in layout.parts if p.path in needed] or layout.parts[-1:]
        total = sum(p.size_bytes for p in layout.parts)
        ref = MaterializedRef(layout.parts[-1].path, build.sqn, total, tuple(layout.parts), written)
        self._done = (ref, layout, build.taken)
        self._build = None
        self.last = MaterializationStats(
            build.epoch,
            build.sync_s,
            time.monotonic() - build.started,
            written,
            total - written,
            len(build.uploads),
            build.whole,
            build.delta,
        )
        return ref

    # -- applied or abandoned ---------------------------------------------------------
    def applied(self, ref: MaterializedRef) -> None:
        """The coordinator applied ``ref``: if it is the last one built here, its
        layout is the base of the next materialization."""
        if self._done is not None and self._done[0] == ref:
            self.base = self._done[1]
            self._done = None

    def _abandon(self) -> None:
        """Drop the running materialization: the keys it captured are dirty again, the
        groups it froze are thawed (its files, never referenced, are orphans for the
        registry's sweep)."""
        build = self._build
        assert build is not None
        self._give_back(build.taken)
        self.backend.thaw(build.todo)
        self._build = None

    def _give_back(self, taken: dict[int, set[bytes]]) -> None:
        for kg, keys in taken.items():
            self.backend.mark_dirty(kg, keys)
