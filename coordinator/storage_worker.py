"""The coordinator's storage work, off its event loop.

One worker thread (a ``concurrent.futures.ThreadPoolExecutor`` of one) carries out the
storage instructions of coordinator/events.py in the order they were submitted, so a
checkpoint's metadata and pointer are written before subsumed metadata is deleted, and
that before its objects, and a sink commit (``SinkCommitter.commit``) or recovery runs
after the metadata it depends on. Split listings (``SplitEnumerator.list_splits``) run
on a second thread of their own, so a slow listing never delays a checkpoint. Each
instruction is answered by one event stamped with the monotonic clock when it
finished; the loop collects them with :meth:`results`. Nothing here touches the
coordinator state (``list_splits`` does not change the enumerator).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import singledispatchmethod

from dstltree.coordinator.cleanup import find_orphans
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
    SplitsListed,
    StorageInstruction,
    WriteFailed,
)
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug.sinks.committer import SinkCommitter
from dstltree.sparkplug.sinks.sink import FileSink
from dstltree.storage.store import ObjectStore

log = logging.getLogger(__name__)


class StorageWorker:
    """Runs storage instructions on ``store`` / ``checkpoints`` (and ``sink``'s
    committer, if given) in one thread, in order; listings in a second thread.
    ``clock``: seconds, monotonic (stamps the answering events)."""

    def __init__(
        self,
        store: ObjectStore,
        checkpoints: CheckpointStore,
        clock: Callable[[], float] = time.monotonic,
        sink: FileSink | None = None,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.sink = sink
        self._committer: SinkCommitter | None = None
        self._clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dstl-coordinator-io")
        self._lister = ThreadPoolExecutor(1, thread_name_prefix="dstl-coordinator-list")
        self._results: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding: set[Future[None]] = set()

    # -- asynchronous (the loop) -------------------------------------------------------
    def submit(self, instruction: StorageInstruction) -> None:
        """Queue ``instruction``; its answering event shows up in :meth:`results`
        (failures as WriteFailed, DeleteFailed, ListingFailed, CommitFailed or
        SinkRecoveryFailed, never as an exception). A ListSplits runs on the listing
        thread and is not waited for by :meth:`busy` / :meth:`wait_idle`."""
        if isinstance(instruction, ListSplits):
            self._lister.submit(self._work, instruction)
            return
        fut = self._executor.submit(self._work, instruction)
        with self._lock:
            self._outstanding.add(fut)
        fut.add_done_callback(self._done)

    def results(self) -> list[Event]:
        """The events answered since the last call, in completion order (no waiting)."""
        out: list[Event] = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def busy(self) -> bool:
        """Instructions (other than listings) are queued or running."""
        with self._lock:
            return bool(self._outstanding)

    def wait_idle(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for what is queued now; True if it finished."""
        with self._lock:
            pending = set(self._outstanding)
        return not wait(pending, timeout=max(0.0, timeout)).not_done

    def shutdown(self) -> None:
        """Cancel what has not started; a running instruction finishes in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._lister.shutdown(wait=False, cancel_futures=True)

    def _work(self, instruction: StorageInstruction) -> None:
        self._results.put(self.run_safely(instruction))

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            self._outstanding.discard(fut)

    # -- synchronous (start) -----------------------------------------------------------
    def call(self, instruction: StorageInstruction, *, safely: bool = True) -> Event:
        """Run ``instruction`` in the worker and wait for its event. ``safely=False``
        re-raises a storage failure (StorageError, CorruptCheckpointError) instead."""
        fn = self.run_safely if safely else self.run
        return self._executor.submit(fn, instruction).result()

    def run_safely(self, instruction: StorageInstruction) -> Event:
        """:meth:`run`, with a failure answered by its event: WriteFailed (a checkpoint
        write), ListingFailed, CommitFailed, SinkRecoveryFailed, or DeleteFailed
        (anything else)."""
        try:
            return self.run(instruction)
        except Exception as e:  # noqa: BLE001 - every failure becomes an event
            reason = f"{type(e).__name__}: {e}"
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
            return DeleteFailed(now, _describe(instruction), reason)

    @singledispatchmethod
    def run(self, instruction: StorageInstruction) -> Event:
        """Carry out one storage instruction; returns its event. Raises StorageError."""
        raise TypeError(f"not a storage instruction: {instruction!r}")

    @run.register
    def _(self, instruction: PersistCheckpoint) -> Event:
        self.checkpoints.add(instruction.checkpoint, instruction.retained)
        return CheckpointWritten(self._clock(), instruction.checkpoint.checkpoint_id)

    @run.register
    def _(self, instruction: DeleteCheckpoint) -> Event:
        self.checkpoints.delete(instruction.checkpoint_id)
        return CheckpointDeleted(self._clock(), instruction.checkpoint_id)

    @run.register
    def _(self, instruction: DeleteObjects) -> Event:
        deleted = len(self.store.delete(instruction.paths))
        return ObjectsDeleted(self._clock(), instruction.paths, deleted)

    @run.register
    def _(self, instruction: CleanOrphans) -> Event:
        orphans = len(self.store.delete(find_orphans(self.store, instruction.referenced)))
        stale = len(self.store.delete(self.checkpoints.stale_files()))
        return OrphansDeleted(self._clock(), orphans, stale)

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


def _describe(instruction: StorageInstruction) -> str:
    if isinstance(instruction, DeleteCheckpoint):
        return f"metadata of checkpoint {instruction.checkpoint_id}"
    if isinstance(instruction, DeleteObjects):
        return f"{len(instruction.paths)} objects"
    return "orphan cleanup"
