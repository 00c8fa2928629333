"""The coordinator service on the Spark driver: a thin ZeroMQ shell around
:class:`dstltree.coordinator.state.CoordinatorState`.

One loop thread owns a ROUTER socket and the state machine: it ticks the state, turns
task frames (:mod:`dstltree.coordinator.protocol`) into events, and carries out the
instructions: sending commands to tasks (in the order the state returns them: an
assignment sent before a checkpoint trigger reaches its task first, one socket being
FIFO per peer) and handing storage work (commit records,
deletions of what the shared state registry released, split listings, sink commits)
to a :class:`dstltree.coordinator.storage_worker.StorageWorker`, whose answers come
back to the loop as events. The loop never waits on storage, except inside
:meth:`Coordinator.begin_attempt`. Other threads talk to it through
:meth:`Coordinator.begin_attempt`, :meth:`Coordinator.request_stop`,
:meth:`Coordinator.latest_checkpoint`, :meth:`Coordinator.statistics`,
:attr:`Coordinator.finished` / :meth:`Coordinator.wait_finished` and
:meth:`Coordinator.stop`.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import singledispatchmethod
from typing import Any, TypeVar

import zmq

from dstltree.client.errors import WireError
from dstltree.coordinator import events as ev
from dstltree.coordinator import protocol
from dstltree.coordinator import state as st
from dstltree.coordinator.checkpoint import CompletedCheckpoint, job_object_prefixes
from dstltree.coordinator.errors import CoordinatorError
from dstltree.coordinator.metrics import CoordinatorMetrics
from dstltree.coordinator.storage_worker import StorageWorker
from dstltree.coordinator.store import MAX_RECORDS_IN_FLIGHT, CheckpointStore, JobFencedError
from dstltree.coordinator.sweep import OrphanSweeper, SweepPolicy
from dstltree.security.curve import Curve, configure_server, register_refusal_metrics
from dstltree.sparkplug.sinks.sink import FileSink
from dstltree.sparkplug.sources.base import Source
from dstltree.storage.store import ObjectStore

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class CoordinatorStatistics:
    """Counters since start. Durations in seconds (trigger to metadata written).
    ``splits_discovered`` / ``listings_failed``: of the source's enumerator;
    ``sink_commits`` / ``sink_commits_failed`` / ``sink_files_committed``: of the
    sink's two-phase commit (files made visible, recoveries included);
    ``finished_checkpoint_id``: the final checkpoint once the run is over, else None.
    ``orphans_deleted`` counts the cleanup at start and the in-run sweeps
    (``orphan_sweeps``, the final one included); ``orphans_spared``: unreferenced
    files too young at the last cleanup; ``deletes_refused``: paths outside the job's
    prefix (or asked of a fenced driver) not deleted; ``shared_objects_kept``: released
    objects of nodes outside the job's folders kept because they hold segments of other
    logs (another job's) or an unreadable index; ``shared_orphans_deleted``: this run's
    orphans deleted there (``log_namespace``); ``pointer_versions_deleted``: old
    commit records (and an old layout's pointer versions and metadata);
    ``writes_fenced``: storage work refused because another driver took the job
    over (``fenced``: why, else None);
    ``materializations``: per applied epoch (seconds from its trigger to its
    application, snapshot bytes of every task, bytes written for it, the rest reused);
    ``checkpoint_phases_s``: per completed checkpoint, its longest synchronous and
    asynchronous phase at any task (seconds); ``checkpoint_intervals_s``: seconds from
    one trigger to the next (the interval achieved, one per trigger after the first);
    ``completion_requests``: per completed checkpoint, the storage requests on its
    completion path (from its last acknowledgement to its commit point: 1 when its
    conditional create succeeds at once); ``metadata_bytes``: per completed checkpoint,
    the bytes of its metadata as written; ``max_concurrent_checkpoints``: the bound on
    checkpoints in flight, ``checkpoints_in_flight_max`` the most seen at once;
    ``checkpoint_alignments``: per completed checkpoint, its longest alignment and start
    delay at any task (seconds), the in-flight bytes all tasks persisted with it, and
    whether a task took it unaligned (FLIP-76; ``checkpoint_alignment``)."""

    checkpoints_completed: int
    checkpoints_aborted: int
    checkpoint_durations_s: tuple[float, ...]
    materializations_completed: int
    materializations_abandoned: int
    objects_deleted: int
    orphans_deleted: int
    stale_metadata_deleted: int
    messages_fenced: int
    messages_rejected: int
    last_checkpoint_id: int | None
    last_materialization_epoch: int
    retained_checkpoint_ids: tuple[int, ...]
    attempt: int | None
    splits_discovered: int = 0
    listings_failed: int = 0
    sink_commits: int = 0
    sink_commits_failed: int = 0
    sink_files_committed: int = 0
    finished_checkpoint_id: int | None = None
    tasks_without_node: int = 0
    orphan_sweeps: int = 0
    orphans_spared: int = 0
    deletes_refused: int = 0
    shared_objects_kept: int = 0
    shared_orphans_deleted: int = 0
    pointer_versions_deleted: int = 0
    writes_fenced: int = 0
    fenced: str | None = None
    materializations: tuple[tuple[float, int, int], ...] = ()
    checkpoint_phases_s: tuple[tuple[float, float], ...] = ()
    checkpoint_alignments: tuple[tuple[float, float, int, bool], ...] = ()
    checkpoint_intervals_s: tuple[float, ...] = ()
    completion_requests: tuple[int, ...] = ()
    metadata_bytes: tuple[int, ...] = ()
    max_concurrent_checkpoints: int = 1
    checkpoints_in_flight_max: int = 0


class Coordinator:
    """Checkpoint coordinator for ``num_tasks`` tasks, checkpoints on ``store``.

    Intervals and timeouts are seconds. ``bind``: a ZeroMQ endpoint (``tcp://0.0.0.0:*``
    for every interface); ``.address`` is the endpoint tasks connect to: the bound port
    on ``advertise_host`` (the driver's host as executors reach it, Spark's
    ``spark.driver.host``) when given. Call :meth:`start` (blocking cleanup, then the loop
    thread) before launching tasks, then :meth:`begin_attempt` for every (re)start of
    the task stage. ``metrics_port``: serve Prometheus metrics (coordinator.metrics) on
    that loopback port (0 = a free one, see ``.metrics.url``); None (default) = off.

    ``source``: the job's source; its split enumerator (FLIP-27) lives here, lists
    splits every ``discovery_interval`` s off the loop and assigns them to the tasks
    (``AssignSplits``). ``sink``: the job's exactly-once sink; the coordinator commits
    its committables once a checkpoint is durable (then ``CheckpointComplete``) and
    recovers it at every attempt. ``max_parallelism``: key groups, recorded in every
    checkpoint. ``finish_when_source_done``: once the source is fully read the next
    checkpoint is final and the run ends (:attr:`finished`). ``commit_retry_interval``:
    seconds before a failed sink commit is tried again. ``extra_object_prefixes``:
    where nodes writing outside this job's ``<base>/changelog/`` and
    ``<base>/materialized/`` put objects; acknowledgements and reports naming any
    other path are refused. See coordinator/state.py. ``log_namespace``: this run's
    writers name their logs ``<log_namespace>-...``; then the orphan cleanups and sweeps
    also delete the job's unreferenced objects under ``extra_object_prefixes`` (of this
    run's namespace or of one of the logs its restored checkpoints name:
    coordinator/shared.py), never an object holding another log's segment.
    ``security``: CURVE with the per-job keys (``Curve.shared``, tasks connect with the
    same); None = plaintext (tests; the job layer defaults to CURVE).
    ``max_concurrent_checkpoints``: checkpoints in flight at most (Flink's
    ``maxConcurrentCheckpoints``): triggers follow ``checkpoint_interval`` while earlier
    checkpoints complete, in order, each with one conditional create
    (coordinator/state.py, coordinator/store.py).

    One driver per job: :meth:`start` claims the job's checkpoint pointer
    (coordinator/store.py); a driver started later on the same job prefix takes it
    over, and this one is fenced at its next pointer write: it writes and deletes
    nothing more, and :meth:`latest_checkpoint` / :meth:`begin_attempt` raise
    JobFencedError. Orphans (coordinator/sweep.py): unreferenced files are deleted at
    start and every ``sweep_interval`` s when older than ``orphan_grace`` s beyond the
    latest checkpoint's trigger, and all of them once the run is finished.
    """

    def __init__(
        self,
        store: ObjectStore,
        num_tasks: int,
        checkpoint_interval: float = 0.3,
        materialization_interval: float = 5.0,
        checkpoint_timeout: float = 10.0,
        retained_checkpoints: int = 2,
        bind: str = "tcp://127.0.0.1:*",
        *,
        materialization_timeout: float = 60.0,
        tick: float = 0.01,
        call_timeout: float = 30.0,
        metrics_port: int | None = None,
        source: Source | None = None,
        sink: FileSink | None = None,
        max_parallelism: int = 128,
        finish_when_source_done: bool = True,
        discovery_interval: float = 0.5,
        commit_retry_interval: float = 1.0,
        advertise_host: str | None = None,
        security: Curve | None = None,
        extra_object_prefixes: Sequence[str] = (),
        orphan_grace: float = 60.0,
        sweep_interval: float = 10.0,
        log_namespace: str | None = None,
        max_concurrent_checkpoints: int = st.DEFAULT_MAX_CONCURRENT_CHECKPOINTS,
    ) -> None:
        if num_tasks < 1:
            raise ValueError("num_tasks must be >= 1")
        self.store = store
        self.checkpoints = CheckpointStore(store)
        self.num_tasks = num_tasks
        self.source = source
        self.sink = sink
        self.config = st.CoordinatorConfig(
            checkpoint_interval,
            materialization_interval,
            checkpoint_timeout,
            retained_checkpoints,
            materialization_timeout,
            discovery_interval=discovery_interval,
            max_parallelism=max_parallelism,
            finish_when_source_done=finish_when_source_done,
            commit_retry_interval=commit_retry_interval,
            object_prefixes=job_object_prefixes(store, extra_object_prefixes),
            max_concurrent_checkpoints=max_concurrent_checkpoints,
            max_records_in_flight=MAX_RECORDS_IN_FLIGHT,
        )
        self._tick_ms = max(1, int(tick * 1000))
        self._call_timeout = call_timeout
        self._state = self._new_state([])
        self._lock = threading.RLock()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        policy = SweepPolicy(sweep_interval, orphan_grace)
        self._sweeper = OrphanSweeper(policy)
        self._storage = StorageWorker(
            store,
            self.checkpoints,
            sink=sink,
            orphan_grace=policy.grace,
            extra_prefixes=extra_object_prefixes,
            log_namespace=log_namespace,
        )
        self._storage.counters.listener = self._count_storage
        self.metrics = None if metrics_port is None else CoordinatorMetrics(metrics_port)
        self._ctx = zmq.Context()
        # the socket lives in the process's shared context, where the ZAP authenticator
        # runs (dstltree.security); the own context is only terminated at stop
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        configure_server(self._sock, security, "coordinator")
        if self.metrics is not None:  # dstl_auth_refusals_total{role}
            register_refusal_metrics(self.metrics.registry)
        self._sock.bind(bind)
        self.address = _connectable(self._sock.getsockopt_string(zmq.LAST_ENDPOINT), advertise_host)

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        """Blocking: claim the job (fencing an earlier driver of it), load the retained
        checkpoints, rebuild the shared state registry, subsume checkpoints beyond
        retention, delete orphans (data files under the job's prefix no retained
        checkpoint references, older than ``orphan_grace``) and stale metadata, then
        start the loop thread. Raises StorageError / CorruptCheckpointError /
        JobFencedError (nothing is deleted then)."""
        if self._thread is not None:
            raise CoordinatorError("coordinator already started")
        self.checkpoints.claim()
        retained = self.checkpoints.list_retained()
        if self._storage.shared is not None:  # earlier runs' orphans are the job's too
            self._storage.shared.add_namespaces(
                lid for cp in retained for tc in cp.tasks.values() for lid in tc.log_ids()
            )
        with self._lock:
            self._state = self._new_state(retained)
            for ins in self._state.handle(ev.Started(time.monotonic())):
                # Waited for: orphan cleanup is only safe before any task writes; only
                # its failure stops the start (leftovers of the others are cleaned later).
                cleanup = isinstance(ins, ev.CleanOrphans)
                if isinstance(ins, ev.StorageInstruction):
                    self._on_result(self._storage.call(ins, safely=not cleanup))
                else:
                    self._execute([ins])
        log.info(
            "coordinator at %s: %d retained checkpoints, %d orphans deleted",
            self.address,
            len(retained),
            self._state.orphans_deleted,
        )
        self._thread = threading.Thread(target=self._run, name="dstl-coordinator", daemon=True)
        self._thread.start()

    def _new_state(self, retained: list[CompletedCheckpoint]) -> st.CoordinatorState:
        return st.CoordinatorState(
            self.config, retained, source=self.source, commit_sink=self.sink is not None
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop thread (waiting at most ``timeout`` s), let queued storage work
        finish within what is left of ``timeout``, and close the socket."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                self._sweep(time.monotonic(), final_only=True)
            self._settle(deadline)
        self._storage.shutdown()
        self._sock.close(linger=0)
        self._ctx.term()
        if self.metrics is not None:
            self.metrics.close()

    def _settle(self, deadline: float, critical_only: bool = False) -> bool:
        """Carry queued storage work (and what its results start) to its end, waiting
        at most until ``deadline`` (monotonic s); True if nothing is left. Listings
        are not waited for; with ``critical_only`` only commit records and sink work
        are (StorageWorker.busy)."""
        while self._storage.wait_idle(deadline - time.monotonic(), critical_only):
            with self._lock:
                results = self._storage.results()
                for event in results:
                    self._on_result(event)
            if not results and not self._storage.busy(critical_only):
                return True
        return False

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- driver API --------------------------------------------------------------------
    def begin_attempt(
        self, attempt: int, num_tasks: int | None = None, timeout: float | None = None
    ) -> CompletedCheckpoint | None:
        """Start task-stage attempt ``attempt`` of ``num_tasks`` tasks (default: as
        before; strictly increasing attempts, older ones are fenced from now on);
        returns the latest completed checkpoint to restore from. Blocking, at most
        ``timeout`` s (default ``call_timeout``): commit records and sink work under way
        finish first (a checkpoint being written becomes the latest, or fails;
        deletions and sweeps go on beside the new attempt), the enumerator is
        rebuilt from the latest checkpoint, and with a sink the sink is recovered:
        every retained checkpoint's committables are committed again, oldest first
        (idempotent), then every other staged file is deleted (call this before the
        attempt's tasks write). Raises ValueError for a non-increasing attempt or a
        latest checkpoint whose reader states do not fit its enumerator snapshot,
        SinkCommitError / StorageError when the sink cannot be recovered (the attempt
        then triggers no checkpoint: begin another), CoordinatorError if the
        coordinator is not running (call start() first) or does not answer in time."""
        self._raise_if_fenced()
        n = self.num_tasks if num_tasks is None else num_tasks
        limit = self._call_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit

        def call() -> CompletedCheckpoint | None:
            if not self._settle(deadline, critical_only=True):
                raise CoordinatorError(f"storage work did not finish within {limit} s")
            self._tick()
            out = self._state.handle(ev.AttemptStarted(time.monotonic(), attempt, n))
            self.num_tasks = n
            self._execute_recovering(out)
            return self._state.latest

        return self._call(call, limit)

    def _execute_recovering(self, instructions: list[ev.Instruction]) -> None:
        """Carry out ``instructions``, a sink recovery among them synchronously; its
        failure is raised once the others are carried out."""
        error: Exception | None = None
        for ins in instructions:
            if not isinstance(ins, ev.RecoverSink):
                self._execute([ins])
                continue
            try:
                self._on_result(self._storage.call(ins, safely=False))
            except Exception as e:  # noqa: BLE001 - re-raised below
                error = e
                reason = f"{type(e).__name__}: {e}"
                self._execute(self._state.handle(ev.SinkRecoveryFailed(time.monotonic(), reason)))
        if error is not None:
            raise error

    def request_stop(self) -> None:
        """End the run: the next checkpoint is triggered at once (or right after the
        one in flight) and is final; :attr:`finished` is set once it is durable and
        committed. Returns at once (safe in a signal handler); before :meth:`start`
        it takes effect when the loop starts."""
        fut: Future[None] = Future()
        self._calls.put((self._apply_stop, fut))

    def _apply_stop(self) -> None:
        self._execute(self._state.handle(ev.StopRequested(time.monotonic())))

    @property
    def finished(self) -> CompletedCheckpoint | None:
        """The final checkpoint once the run is over (durable, its sink output
        committed, every task sent ``Finish``), else None."""
        with self._lock:
            return self._state.finished

    def wait_finished(self, timeout: float) -> CompletedCheckpoint | None:
        """Wait at most ``timeout`` s for :attr:`finished`; returns it (None if the
        run is not over by then)."""
        self._finished.wait(max(0.0, timeout))
        return self.finished

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint, or None. Raises JobFencedError once
        another driver took the job over (the driver's watch loop stops on it)."""
        self._raise_if_fenced()
        with self._lock:
            return self._state.latest

    def _raise_if_fenced(self) -> None:
        fenced = self.checkpoints.fenced
        if fenced is not None:
            raise JobFencedError(fenced.path, "this driver was fenced") from fenced

    def statistics(self) -> CoordinatorStatistics:
        """A snapshot of the counters."""
        with self._lock:
            s = self._state
            return CoordinatorStatistics(
                checkpoints_completed=s.checkpoints_completed,
                checkpoints_aborted=s.checkpoints_aborted,
                checkpoint_durations_s=tuple(s.checkpoint_durations_s),
                materializations=tuple(s.materializations),
                checkpoint_phases_s=tuple(s.checkpoint_phases_s),
                checkpoint_alignments=tuple(s.checkpoint_alignments),
                checkpoint_intervals_s=tuple(s.checkpoint_intervals_s),
                completion_requests=tuple(s.completion_requests),
                metadata_bytes=tuple(s.metadata_bytes),
                max_concurrent_checkpoints=s.config.max_concurrent_checkpoints,
                checkpoints_in_flight_max=s.in_flight_max,
                materializations_completed=s.materializations_completed,
                materializations_abandoned=s.materializations_abandoned,
                objects_deleted=s.objects_deleted,
                orphans_deleted=s.orphans_deleted,
                stale_metadata_deleted=s.stale_metadata_deleted,
                messages_fenced=s.messages_fenced,
                messages_rejected=s.messages_rejected,
                last_checkpoint_id=None if s.latest is None else s.latest.checkpoint_id,
                last_materialization_epoch=s.applied_epoch,
                retained_checkpoint_ids=tuple(c.checkpoint_id for c in s.retained),
                attempt=s.attempt,
                splits_discovered=0 if s.splits is None else s.splits.splits_discovered,
                listings_failed=0 if s.splits is None else s.splits.listings_failed,
                sink_commits=0 if s.commits is None else s.commits.commits_completed,
                sink_commits_failed=0 if s.commits is None else s.commits.commits_failed,
                sink_files_committed=0 if s.commits is None else s.commits.files_committed,
                finished_checkpoint_id=None if s.finished is None else s.finished.checkpoint_id,
                tasks_without_node=s.tasks_without_node,
                **self._storage_statistics(),
            )

    def _storage_statistics(self) -> dict[str, Any]:
        c = self._storage.counters.snapshot()
        fenced = self.checkpoints.fenced
        return {
            "orphan_sweeps": c["orphan_sweeps"],
            "orphans_spared": c["orphans_spared"],
            "deletes_refused": c["deletes_refused"],
            "shared_objects_kept": c["shared_objects_kept"],
            "shared_orphans_deleted": c["shared_orphans_deleted"],
            "pointer_versions_deleted": self.checkpoints.pointers_deleted,
            "writes_fenced": c["writes_fenced"],
            "fenced": None if fenced is None else str(fenced),
        }

    def _count_storage(self, name: str, n: int) -> None:
        """A storage worker count (its thread): the metric of refusals and fencing."""
        m = self.metrics
        if m is None:
            return
        if name == "deletes_refused":
            m.deletes_refused.inc(n)
        elif name == "writes_fenced":
            m.writes_fenced.inc(n)
        elif name == "shared_objects_kept":
            m.shared_objects_kept.inc(n)

    def _call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        t = self._thread
        if t is None or not t.is_alive():
            raise CoordinatorError("coordinator is not running: call start() first")
        limit = self._call_timeout if timeout is None else timeout
        fut: Future[T] = Future()
        self._calls.put((fn, fut))
        try:
            return fut.result(timeout=limit)
        except TimeoutError as e:
            raise CoordinatorError(f"coordinator did not answer in {limit} s") from e

    # -- loop --------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stopping.is_set():
            try:
                poller.poll(self._tick_ms)
                with self._lock:
                    self._tick()
                    self._drain_calls()
                    for result in self._storage.results():
                        self._on_result(result)
                    self._drain_socket()
                    self._tick()
                    self._sweep(time.monotonic())
            except zmq.ContextTerminated:
                return
            except Exception:  # noqa: BLE001 - the loop must keep serving
                log.exception("coordinator loop error")

    def _tick(self) -> None:
        self._execute(self._state.handle(ev.Tick(time.monotonic(), time.time())))

    def _sweep(self, now: float, *, final_only: bool = False) -> None:
        """Hand an orphan sweep to the storage worker when one is due (sweep.py)."""
        if self.checkpoints.fenced is not None:
            return
        ins = self._sweeper.next(self._state, now, final_only=final_only)
        if ins is not None:
            self._storage.submit(ins)

    def _drain_calls(self) -> None:
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def _drain_socket(self, limit: int = 1000) -> None:
        """Handle at most ``limit`` waiting frames (then the loop ticks again); the
        refusals among them go to the metrics by kind."""
        for _ in range(limit):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = _event_of(frames, time.monotonic())
            if event is not None:
                self._execute(self._state.handle(event))
        if self.metrics is not None:
            self.metrics.refusals(self._state.rejections)

    def _on_result(self, event: ev.Event) -> None:
        """An answer of the storage worker: metrics, then the state."""
        if self.metrics is not None:
            if isinstance(event, ev.ObjectsDeleted):
                self.metrics.objects_deleted.inc(event.deleted)
            elif isinstance(event, ev.OrphansDeleted):
                self.metrics.orphans_deleted.inc(event.orphans)
        self._execute(self._state.handle(event))

    # -- instructions ------------------------------------------------------------------
    def _execute(self, instructions: list[ev.Instruction]) -> None:
        if self.metrics is not None:
            self.metrics.tasks_without_node.set(self._state.tasks_without_node)
        for ins in instructions:
            if self.metrics is not None:
                _observe(self.metrics, ins)
            self._carry_out(ins)

    @singledispatchmethod
    def _carry_out(self, ins: ev.Instruction) -> None:
        raise TypeError(f"unknown instruction {ins!r}")

    @_carry_out.register
    def _(self, ins: ev.SendToTask) -> None:
        self._send(ins.identity, ins.message)

    @_carry_out.register
    def _(self, ins: ev.Reply) -> None:
        if isinstance(ins.message, protocol.ErrorReply):
            log.warning("rejected a message: %s", ins.message.reason)
        self._send(ins.identity, ins.message)

    @_carry_out.register(ev.PersistCheckpoint)
    @_carry_out.register(ev.DeleteCheckpoint)
    @_carry_out.register(ev.DeleteObjects)
    @_carry_out.register(ev.CleanOrphans)
    @_carry_out.register(ev.ListSplits)
    @_carry_out.register(ev.CommitSink)
    @_carry_out.register(ev.RecoverSink)
    @_carry_out.register(ev.WriteSplitLog)
    def _(self, ins: ev.StorageInstruction) -> None:
        self._storage.submit(ins)

    @_carry_out.register
    def _(self, ins: ev.RunFinished) -> None:
        log.info("run finished with checkpoint %d", ins.checkpoint.checkpoint_id)
        self._finished.set()

    @_carry_out.register(ev.CheckpointCompleted)
    @_carry_out.register(ev.CheckpointTriggered)
    @_carry_out.register(ev.MaterializationStarted)
    @_carry_out.register(ev.MaterializationApplied)
    def _(self, ins: ev.Instruction) -> None:
        log.debug("%s", ins)

    @_carry_out.register
    def _(self, ins: ev.CheckpointAborted) -> None:
        log.warning("checkpoint %d aborted: %s", ins.checkpoint_id, ins.reason)

    @_carry_out.register
    def _(self, ins: ev.MaterializationAbandoned) -> None:
        log.warning("materialization epoch %d abandoned: %s", ins.epoch, ins.reason)

    @_carry_out.register
    def _(self, ins: ev.MessageIgnored) -> None:
        log.debug("ignored a message of task %d: %s", ins.task, ins.reason)

    def _send(self, ident: bytes, msg: protocol.Message) -> None:
        try:
            self._sock.send_multipart([ident, protocol.dump(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as e:
            log.warning("could not send %s: %s", type(msg).__name__, e)


def _event_of(frames: Sequence[bytes], now: float) -> ev.Event | None:
    """The event of one ROUTER message (identity frame, then one message frame)."""
    if not frames:
        return None
    if len(frames) != 2:
        return ev.MalformedMessage(now, frames[0], f"expected 1 frame, got {len(frames) - 1}")
    ident, data = frames
    try:
        return ev.MessageFromTask(now, ident, protocol.load(data))
    except WireError as e:
        return ev.MalformedMessage(now, ident, str(e))


def _observe(m: CoordinatorMetrics, ins: ev.Instruction) -> None:
    """Metrics of one instruction."""
    if isinstance(ins, ev.CheckpointCompleted):
        m.checkpoint_completed(ins.checkpoint, ins.duration_s)
        m.checkpoint_committed(ins.requests, ins.metadata_bytes)
    elif isinstance(ins, ev.CheckpointTriggered):
        m.checkpoint_triggered(ins.interval_s, ins.in_flight)
    elif isinstance(ins, ev.CheckpointAborted):
        m.checkpoints_aborted.inc()
    elif isinstance(ins, ev.MaterializationStarted):
        m.materialization_started(ins.epoch)
    elif isinstance(ins, ev.MaterializationApplied):
        m.materialization_completed(ins.epoch, ins.refs)
    elif isinstance(ins, ev.MaterializationAbandoned):
        m.materialization_abandoned(ins.epoch)
    elif isinstance(ins, ev.Reply) and isinstance(ins.message, protocol.Fenced):
        m.messages_fenced.inc()
    elif isinstance(ins, ev.Reply):
        m.messages_rejected.inc()


def _connectable(endpoint: str, advertise_host: str | None = None) -> str:
    """The endpoint tasks connect to: the bound port on ``advertise_host`` if given, else
    the bound endpoint with a wildcard host replaced by this host's address."""
    if advertise_host:
        port = endpoint.rsplit(":", 1)[-1]
        return f"tcp://{advertise_host}:{port}"
    for wildcard in ("0.0.0.0", "*"):
        prefix = f"tcp://{wildcard}:"
        if endpoint.startswith(prefix):
            try:
                host = socket.gethostbyname(socket.gethostname())
            except OSError:
                host = "127.0.0.1"
            return f"tcp://{host}:{endpoint[len(prefix) :]}"
    return endpoint
