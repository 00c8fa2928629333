"""The coordinator's storage work, off its event loop.

Thread pools (``concurrent.futures.ThreadPoolExecutor``), each carrying out its share
of the storage instructions of coordinator/events.py:

- **the completion path**, :data:`~dstltree.coordinator.store.MAX_RECORDS_IN_FLIGHT`
  threads: commit records (``PersistCheckpoint``), one conditional create each
  (coordinator/store.py), created at once (their sequence numbers reserved in the
  order the loop queues them), and nothing else, so no cleanup, sink commit or
  listing ever queues in front of a checkpoint's commit point;
- **deletions**, :data:`DELETE_THREADS` threads: subsumed records
  (``DeleteCheckpoint``), released objects (``DeleteObjects``) and split logs
  (``WriteSplitLog``, coordinator/splitlog.py), in parallel: on an object store every
  deletion is a request of its own (~0.3 s), a few per checkpoint, so one thread
  would fall behind a 0.3 s interval;
- **sweeps**, one thread: the orphan cleanup at start and the in-run sweeps, one at a
  time;
- **the sink**, one thread: commits (``SinkCommitter.commit``) and recoveries, in order;
- **listings**, one thread (``SplitEnumerator.list_splits``).

The state issues a deletion or a sink commit only once the record it depends on is
written (its ``CheckpointWritten`` came back), so running them on other threads keeps
every order that matters: a record before what it subsumes is deleted, a record
before the sink output it makes committable becomes visible. Each instruction is
answered by one event stamped with the monotonic clock when it finished; the loop
collects them with :meth:`results`. Nothing here touches the coordinator state
(``list_splits`` does not change the enumerator).

Deletions are confined to the job's prefix: a path outside ``<job>/changelog/``,
``<job>/materialized/``, ``<job>/checkpoints/`` (and the configured extra prefixes) is
refused and counted, never deleted. Orphan cleanups (at start: files older than
``orphan_grace`` seconds; in-run sweeps: older than the instruction's cutoff) list
first, then check this driver still owns the job (coordinator/store.py fencing), then
delete what they listed: a driver that took the job over after the listing is seen by
the check, and its files are written after its claim, so none of them is deleted. A
fenced driver deletes nothing any more. Every deletion and refusal is counted in
:class:`StorageCounters`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields, replace
from functools import singledispatchmethod

from dstltree.coordinator.cleanup import OrphanScan, scan_orphans, within_job
from dstltree.coordinator.events import (
    CheckpointDeleted,
    CheckpointWritten,
    CleanOrphans,
    CommitFailed,
    CommitSink,
    DeleteCheckpoint,
    DeleteFailed,
    DeleteObjects,
    Event,
    ListingFailed,
    ListSplits,
    ObjectsDeleted,
    OrphansDeleted,
    PersistCheckpoint,
    RecoverSink,
    SinkCommitted,
    SinkRecovered,
    SinkRecoveryFailed,
    SplitLogFailed,
    SplitLogWritten,
    SplitsListed,
    StorageInstruction,
    SweepOrphans,
    WriteFailed,
    WriteSplitLog,
)
from dstltree.coordinator.shared import SharedOrphans, object_log_ids
from dstltree.coordinator.splitlog import SPLIT_LOG_SUFFIX, encode_split_log
from dstltree.coordinator.store import MAX_RECORDS_IN_FLIGHT, CheckpointStore, JobFencedError
from dstltree.sparkplug.sinks.committer import SinkCommitter
from dstltree.sparkplug.sinks.sink import FileSink
from dstltree.storage.store import SNAPSHOT_DIR, ObjectStore

log = logging.getLogger(__name__)

#: Threads deleting subsumed records and released objects (module docstring).
DELETE_THREADS = 8

#: What the worker carries out: the state's storage instructions and the sweeps.
WorkerInstruction = StorageInstruction | SweepOrphans


@dataclass
class StorageCounters:
    """Counts of the storage worker since start: ``deletes_refused`` (paths outside
    the job's prefix, or asked of a fenced driver), ``shared_objects_kept`` (released
    objects outside the job's own folders kept because a segment in them is of a log
    not the job's, or their index could not be read), ``shared_orphans_deleted``
    (unreferenced objects of this run under shared nodes' prefixes, coordinator/shared.py,
    deleted by the cleanups and sweeps), ``orphans_spared`` (unreferenced
    files too young at the last cleanup or sweep), ``orphan_sweeps`` (in-run sweeps
    carried out, the final one included), ``writes_fenced`` (checkpoint writes and
    cleanups refused because another driver took the job over). ``listener(name,
    n)`` is called on each count (metrics)."""

    deletes_refused: int = 0
    shared_objects_kept: int = 0
    shared_orphans_deleted: int = 0
    orphans_spared: int = 0
    orphan_sweeps: int = 0
    writes_fenced: int = 0
    listener: Callable[[str, int], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``; ``orphans_spared`` is set, not added."""
        with self._lock:
            value = n if name == "orphans_spared" else getattr(self, name) + n
            setattr(self, name, value)
        if self.listener is not None and n:
            self.listener(name, n)

    def snapshot(self) -> dict[str, int]:
        """The counters by name."""
        with self._lock:
            return {
                f.name: getattr(self, f.name)
                for f in fields(self)
                if not f.name.startswith("_") and f.name != "listener"
            }


class StorageWorker:
    """Runs storage instructions on ``store`` / ``checkpoints`` (and ``sink``'s
    committer, if given) in one thread, in order; listings in a second thread.
    ``clock``: seconds, monotonic (stamps the answering events); ``wall``: epoch
    seconds (the cutoff of the cleanup at start). ``orphan_grace``: seconds; the
    cleanup at start spares unreferenced files younger than that. ``extra_prefixes``:
    URL prefixes outside the job's folders where deletions are allowed too (nodes
    writing elsewhere). ``log_namespace``: this run's writers name their logs
    ``<log_namespace>-...``; with ``extra_prefixes``, the orphan cleanups and sweeps
    delete this run's orphans there too (:class:`SharedOrphans`), and a released object
    there goes when each of its segments is of a log the release names or of this run."""

    def __init__(
        self,
        store: ObjectStore,
        checkpoints: CheckpointStore,
        clock: Callable[[], float] = time.monotonic,
        sink: FileSink | None = None,
        *,
        orphan_grace: float = 60.0,
        extra_prefixes: Sequence[str] = (),
        wall: Callable[[], float] = time.time,
        log_namespace: str | None = None,
    ) -> None:
        if orphan_grace < 0:
            raise ValueError("orphan_grace must be >= 0 seconds")
        self.store = store
        self.checkpoints = checkpoints
        self.sink = sink
        self.orphan_grace = orphan_grace
        self.extra_prefixes = tuple(extra_prefixes)
        self.shared = (
            SharedOrphans(store, self.extra_prefixes, log_namespace)
            if log_namespace and self.extra_prefixes
            else None
        )
        self.counters = StorageCounters()
        self._wall = wall
        self._committer: SinkCommitter | None = None
        self._clock = clock
        self._committing = ThreadPoolExecutor(
            MAX_RECORDS_IN_FLIGHT, thread_name_prefix="dstl-coordinator-commit"
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dstl-coordinator-sweep")
        self._deleting = ThreadPoolExecutor(
            DELETE_THREADS, thread_name_prefix="dstl-coordinator-delete"
        )
        self._sweep_deletes = ThreadPoolExecutor(
            DELETE_THREADS, thread_name_prefix="dstl-coordinator-sweep-delete"
        )
        self._sinking = ThreadPoolExecutor(1, thread_name_prefix="dstl-coordinator-sink")
        self._lister = ThreadPoolExecutor(1, thread_name_prefix="dstl-coordinator-list")
        self._results: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding: set[Future[None]] = set()
        self._critical: set[Future[None]] = set()  # commit records and sink work

    # -- asynchronous (the loop) -------------------------------------------------------
    def submit(self, instruction: WorkerInstruction) -> None:
        """Queue ``instruction``; its answering event shows up in :meth:`results`
        (failures as WriteFailed, DeleteFailed, ListingFailed, CommitFailed or
        SinkRecoveryFailed, never as an exception). A ListSplits runs on the listing
        thread and is not waited for by :meth:`busy` / :meth:`wait_idle`."""
        if isinstance(instruction, ListSplits):
            self._lister.submit(self._work, instruction)
            return
        if isinstance(instruction, PersistCheckpoint) and instruction.seq is None:
            try:  # reserved here, in the order the loop queues records
                instruction = replace(instruction, seq=self.checkpoints.reserve())
            except Exception as e:  # noqa: BLE001 - answered as a failed write
                reason = f"{type(e).__name__}: {e}"
                self._results.put(
                    WriteFailed(self._clock(), instruction.checkpoint.checkpoint_id, reason)
                )
                return
        fut = self._pool(instruction).submit(self._work, instruction)
        with self._lock:
            self._outstanding.add(fut)
            if isinstance(instruction, PersistCheckpoint | CommitSink | RecoverSink):
                self._critical.add(fut)
        fut.add_done_callback(self._done)

    def results(self) -> list[Event]:
        """The events answered since the last call, in completion order (no waiting)."""
        out: list[Event] = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def busy(self, critical_only: bool = False) -> bool:
        """Instructions (other than listings) are queued or running; with
        ``critical_only`` only commit records and sink work count (a new attempt
        waits for those; deletions, split logs and sweeps may go on beside it)."""
        with self._lock:
            return bool(self._critical if critical_only else self._outstanding)

    def wait_idle(self, timeout: float, critical_only: bool = False) -> bool:
        """Wait at most ``timeout`` seconds for what is queued now (``critical_only``:
        see :meth:`busy`); True if it finished."""
        with self._lock:
            pending = set(self._critical if critical_only else self._outstanding)
        return not wait(pending, timeout=max(0.0, timeout)).not_done

    def shutdown(self) -> None:
        """Cancel what has not started; a running instruction finishes in the background."""
        pools = (self._committing, self._deleting, self._executor, self._sinking, self._lister)
        for pool in (*pools, self._sweep_deletes):
            pool.shutdown(wait=False, cancel_futures=True)

    def _pool(self, instruction: WorkerInstruction) -> ThreadPoolExecutor:
        """The thread of ``instruction`` (module docstring)."""
        if isinstance(instruction, PersistCheckpoint):
            return self._committing
        if isinstance(instruction, CommitSink | RecoverSink):
            return self._sinking
        if isinstance(instruction, ListSplits):
            return self._lister
        if isinstance(instruction, DeleteCheckpoint | DeleteObjects | WriteSplitLog):
            return self._deleting
        return self._executor

    def _work(self, instruction: WorkerInstruction) -> None:
        self._results.put(self.run_safely(instruction))

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            self._outstanding.discard(fut)
            self._critical.discard(fut)

    # -- synchronous (start) -----------------------------------------------------------
    def call(self, instruction: WorkerInstruction, *, safely: bool = True) -> Event:
        """Run ``instruction`` in the worker and wait for its event. ``safely=False``
        re-raises a storage failure (StorageError, CorruptCheckpointError) instead."""
        fn = self.run_safely if safely else self.run
        return self._pool(instruction).submit(fn, instruction).result()

    def run_safely(self, instruction: WorkerInstruction) -> Event:
        """:meth:`run`, with a failure answered by its event: WriteFailed (a checkpoint
        write), ListingFailed, CommitFailed, SinkRecoveryFailed, or DeleteFailed
        (anything else)."""
        try:
            return self.run(instruction)
        except Exception as e:  # noqa: BLE001 - every failure becomes an event
            reason = f"{type(e).__name__}: {e}"
            if isinstance(e, JobFencedError):
                self.counters.add("writes_fenced")
            log.exception("coordinator storage: %s failed", type(instruction).__name__)
            now = self._clock()
            if isinstance(instruction, PersistCheckpoint):
                return WriteFailed(now, instruction.checkpoint.checkpoint_id, reason)
            if isinstance(instruction, ListSplits):
                return ListingFailed(now, reason)
            if isinstance(instruction, CommitSink):
                return CommitFailed(now, instruction.checkpoint_id, reason)
            if isinstance(instruction, RecoverSink):
                return SinkRecoveryFailed(now, reason)
            if isinstance(instruction, WriteSplitLog):
                return SplitLogFailed(now, reason)
            return DeleteFailed(now, _describe(instruction), reason)

    @singledispatchmethod
    def run(self, instruction: WorkerInstruction) -> Event:
        """Carry out one storage instruction; returns its event. Raises StorageError."""
        raise TypeError(f"not a storage instruction: {instruction!r}")

    @run.register
    def _(self, instruction: PersistCheckpoint) -> Event:
        done = self.checkpoints.commit(
            instruction.checkpoints, instruction.retained, instruction.seq
        )
        sizes = tuple(sorted(done.metadata_bytes.items()))
        cid = instruction.checkpoint.checkpoint_id
        return CheckpointWritten(self._clock(), cid, done.requests, sizes)

    @run.register
    def _(self, instruction: DeleteCheckpoint) -> Event:
        self.checkpoints.delete(instruction.checkpoint_id)
        return CheckpointDeleted(self._clock(), instruction.checkpoint_id)

    @run.register
    def _(self, instruction: DeleteObjects) -> Event:
        paths = [
            p
            for p in self._allowed(instruction.paths)
            if within_job(self.store, p) or self._only_of(p, instruction.logs)
        ]
        deleted = len(self.store.delete(paths))
        return ObjectsDeleted(self._clock(), instruction.paths, deleted)

    def _only_of(self, url: str, logs: frozenset[str]) -> bool:
        """Whether every segment of the object ``url`` (outside the job's own folders:
        a shared node's) is of one of ``logs``, by its index (two range reads); False,
        counted in ``shared_objects_kept``, when one is not or the index is unreadable
        (the object is kept: another job may need it)."""
        markers = () if self.shared is None else self.shared.markers
        found = object_log_ids(self.store, url) or []
        mine = bool(found) and all(g in logs or g.startswith(markers) for g in found)
        if not mine:
            self.counters.add("shared_objects_kept")
        return mine

    @run.register
    def _(self, instruction: CleanOrphans) -> Event:
        cutoff = self._wall() - self.orphan_grace
        return self._clean(instruction.referenced, cutoff)

    @run.register
    def _(self, instruction: SweepOrphans) -> Event:
        event = self._clean(instruction.referenced, instruction.cutoff)
        self.counters.add("orphan_sweeps")
        return event

    def _clean(self, referenced: frozenset[str], cutoff: float | None) -> OrphansDeleted:
        """List, check ownership, then delete what was listed (see the module
        docstring). Raises JobFencedError, StorageError."""
        scan = scan_orphans(self.store, referenced, cutoff)
        shared = OrphanScan((), ()) if self.shared is None else self.shared.scan(referenced, cutoff)
        stale = self.checkpoints.stale_files(cutoff)
        self.checkpoints.verify_owner()
        orphans = self._delete_all(self._allowed(scan.orphans))
        in_shared = self._delete_all(self._allowed(shared.orphans))
        deleted_stale = self._delete_all(self._allowed(stale))
        self.counters.add("orphans_spared", len(scan.spared) + len(shared.spared))
        self.counters.add("shared_orphans_deleted", in_shared)
        return OrphansDeleted(self._clock(), orphans + in_shared, deleted_stale)

    def _delete_all(self, paths: Sequence[str]) -> int:
        """Delete ``paths`` on :data:`DELETE_THREADS` threads (one request each on an
        object store); returns how many were deleted. Raises StorageError."""
        if len(paths) <= 1:
            return len(self.store.delete(paths))
        chunks = [list(paths[i::DELETE_THREADS]) for i in range(DELETE_THREADS)]
        done = [self._sweep_deletes.submit(self.store.delete, c) for c in chunks if c]
        return sum(len(f.result()) for f in done)

    def _allowed(self, paths: Sequence[str]) -> list[str]:
        """``paths`` under the job's prefix; the others (all, once fenced) are refused
        and counted."""
        if self.checkpoints.fenced is not None:
            self.counters.add("deletes_refused", len(paths))
            return []
        ok = [p for p in paths if within_job(self.store, p, self.extra_prefixes)]
        refused = len(paths) - len(ok)
        if refused:
            log.warning("refused to delete %d paths outside the job's prefix", refused)
            self.counters.add("deletes_refused", refused)
        return ok

    @run.register
    def _(self, instruction: WriteSplitLog) -> Event:
        oid = uuid.uuid4().hex
        path = self.store.join(SNAPSHOT_DIR, oid[:2], f"{oid}{SPLIT_LOG_SUFFIX}")
        self.store.put(path, encode_split_log(instruction.ids))
        return SplitLogWritten(self._clock(), path, instruction.ids)

    @run.register
    def _(self, instruction: ListSplits) -> Event:
        listing = instruction.enumerator.list_splits()
        return SplitsListed(self._clock(), listing)

    @run.register
    def _(self, instruction: CommitSink) -> Event:
        made = self.committer().commit(instruction.committables)
        return SinkCommitted(self._clock(), instruction.checkpoint_id, len(made))

    @run.register
    def _(self, instruction: RecoverSink) -> Event:
        committer = self.committer()
        made = 0
        for commit in instruction.commits:
            made += len(committer.commit(commit.committables))
        cleaned = len(committer.cleanup(instruction.keep, keep_attempts=()))
        return SinkRecovered(self._clock(), made, cleaned)

    def committer(self) -> SinkCommitter:
        """The sink's committer (created on first use). Raises RuntimeError without a
        sink."""
        if self.sink is None:
            raise RuntimeError("a sink instruction, but the coordinator has no sink")
        if self._committer is None:
            self._committer = self.sink.create_committer()
        return self._committer


def _describe(instruction: WorkerInstruction) -> str:
    if isinstance(instruction, DeleteCheckpoint):
        return f"metadata of checkpoint {instruction.checkpoint_id}"
    if isinstance(instruction, DeleteObjects):
        return f"{len(instruction.paths)} objects"
    if isinstance(instruction, SweepOrphans):
        return "orphan sweep"
    return "orphan cleanup"
