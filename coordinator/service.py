"""The coordinator service on the Spark driver: a thin ZeroMQ shell around
:class:`coordinator.state.CoordinatorState`.

One thread owns a ROUTER socket and the state machine: it ticks the state, receives
task messages (:mod:`coordinator.protocol`), and carries out the instructions: sending
commands to tasks, writing checkpoint metadata through :class:`CheckpointStore`, and
deleting what the shared state registry released. Other threads talk to it through
:meth:`Coordinator.begin_attempt`, :meth:`Coordinator.latest_checkpoint`,
:meth:`Coordinator.statistics` and :meth:`Coordinator.stop`.
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
from typing import Any, TypeVar

import zmq

from client.errors import WireError
from client.storage import ObjectStore
from coordinator import protocol
from coordinator import state as st
from coordinator.checkpoint import CompletedCheckpoint
from coordinator.cleanup import find_orphans
from coordinator.errors import CoordinatorError
from coordinator.metrics import CoordinatorMetrics
from coordinator.store import CheckpointStore

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class CoordinatorStatistics:
    """Counters since start. Durations in seconds (trigger to metadata written)."""

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


class Coordinator:
    """Checkpoint coordinator for ``num_tasks`` tasks, checkpoints on ``store``.

    Intervals and timeouts are seconds. ``bind``: a ZeroMQ endpoint; ``.address`` is
    the endpoint tasks connect to. Call :meth:`start` (blocking cleanup, then the loop
    thread) before launching tasks, then :meth:`begin_attempt` for every (re)start of
    the task stage. ``metrics_port``: serve Prometheus metrics (coordinator.metrics) on
    that loopback port (0 = a free one, see ``.metrics.url``); None (default) = off.
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
    ) -> None:
        if num_tasks < 1:
            raise ValueError("num_tasks must be >= 1")
        self.store = store
        self.checkpoints = CheckpointStore(store)
        self.num_tasks = num_tasks
        self.config = st.CoordinatorConfig(
            checkpoint_interval,
            materialization_interval,
            checkpoint_timeout,
            retained_checkpoints,
            materialization_timeout,
        )
        self._tick_ms = max(1, int(tick * 1000))
        self._call_timeout = call_timeout
        self._state = st.CoordinatorState(self.config)
        self._lock = threading.RLock()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._peers: dict[tuple[int, int], bytes] = {}
        self._objects_deleted = 0
        self._orphans_deleted = 0
        self._stale_deleted = 0
        self._rejected = 0
        self.metrics = None if metrics_port is None else CoordinatorMetrics(metrics_port)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        self._sock.bind(bind)
        self.address = _connectable(self._sock.getsockopt_string(zmq.LAST_ENDPOINT))

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        """Blocking: load the retained checkpoints, rebuild the shared state registry,
        subsume checkpoints beyond retention, delete orphans (data files no retained
        checkpoint references) and stale metadata, then start the loop thread.
        Raises StorageError / CorruptCheckpointError (nothing is deleted then)."""
        if self._thread is not None:
            raise CoordinatorError("coordinator already started")
        retained = self.checkpoints.list_retained()
        with self._lock:
            self._state = st.CoordinatorState(self.config, retained)
            self._execute(self._state.restore())
            orphans = find_orphans(self.store, self._state.registry.referenced())
            deleted = len(self.store.delete(orphans))
            self._orphans_deleted += deleted
            if self.metrics is not None:
                self.metrics.orphans_deleted.inc(deleted)
            self._stale_deleted += len(self.store.delete(self.checkpoints.stale_files()))
        log.info(
            "coordinator at %s: %d retained checkpoints, %d orphans deleted",
            self.address,
            len(retained),
            len(orphans),
        )
        self._thread = threading.Thread(target=self._run, name="dstl-coordinator", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop thread (waiting at most ``timeout`` s) and close the socket."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._sock.close(linger=0)
        self._ctx.term()
        if self.metrics is not None:
            self.metrics.close()

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- driver API --------------------------------------------------------------------
    def begin_attempt(
        self, attempt: int, num_tasks: int | None = None
    ) -> CompletedCheckpoint | None:
        """Start task-stage attempt ``attempt`` (strictly increasing; older attempts are
        fenced from now on); returns the latest completed checkpoint to restore from.
        Raises ValueError for a non-increasing attempt, CoordinatorError if the coordinator
        is not running (call start() first) or does not answer within call_timeout s."""
        n = self.num_tasks if num_tasks is None else num_tasks

        def call() -> CompletedCheckpoint | None:
            self._execute(self._state.handle(st.Tick(time.monotonic(), time.time())))
            self._execute(self._state.handle(st.AttemptStarted(attempt, n)))
            self.num_tasks = n
            self._peers = {k: v for k, v in self._peers.items() if k[0] >= attempt}
            return self._state.latest

        return self._call(call)

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint, or None."""
        with self._lock:
            return self._state.latest

    def statistics(self) -> CoordinatorStatistics:
        """A snapshot of the counters."""
        with self._lock:
            s = self._state
            return CoordinatorStatistics(
                checkpoints_completed=s.checkpoints_completed,
                checkpoints_aborted=s.checkpoints_aborted,
                checkpoint_durations_s=tuple(s.checkpoint_durations_s),
                materializations_completed=s.materializations_completed,
                materializations_abandoned=s.materializations_abandoned,
                objects_deleted=self._objects_deleted,
                orphans_deleted=self._orphans_deleted,
                stale_metadata_deleted=self._stale_deleted,
                messages_fenced=s.messages_fenced,
                messages_rejected=self._rejected,
                last_checkpoint_id=None if s.latest is None else s.latest.checkpoint_id,
                last_materialization_epoch=s.applied_epoch,
                retained_checkpoint_ids=tuple(c.checkpoint_id for c in s.retained),
                attempt=s.attempt,
            )

    def _call(self, fn: Callable[[], T]) -> T:
        t = self._thread
        if t is None or not t.is_alive():
            raise CoordinatorError("coordinator is not running: call start() first")
        fut: Future[T] = Future()
        self._calls.put((fn, fut))
        try:
            return fut.result(timeout=self._call_timeout)
        except TimeoutError as e:
            raise CoordinatorError(f"coordinator did not answer in {self._call_timeout} s") from e

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
                    for _ in range(1000):
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_frames(frames)
                    self._tick()
            except zmq.ContextTerminated:
                return
            except Exception:  # noqa: BLE001 - the loop must keep serving
                log.exception("coordinator loop error")

    def _tick(self) -> None:
        self._execute(self._state.handle(st.Tick(time.monotonic(), time.time())))

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

    def _on_frames(self, frames: Sequence[bytes]) -> None:
        if len(frames) != 2:
            self._reject(frames[0] if frames else None, f"expected 1 frame, got {len(frames) - 1}")
            return
        ident, data = frames
        try:
            msg = protocol.load(data)
        except WireError as e:
            self._reject(ident, str(e))
            return
        if isinstance(msg, protocol.Hello):
            if msg.task >= 0:
                self._peers[(msg.attempt, msg.task)] = ident
            event: st.Event = st.TaskConnected(msg.task, msg.attempt)
        elif isinstance(msg, protocol.Ack):
            event = st.CheckpointAck(msg.task, msg.attempt, msg.checkpoint_id, msg.checkpoint)
        elif isinstance(msg, protocol.Report):
            event = st.MaterializationReport(msg.task, msg.attempt, msg.epoch, msg.ref)
        else:
            self._reject(ident, f"{type(msg).__name__} is not a task message")
            return
        self._execute(self._state.handle(event), origin=ident)

    def _reject(self, ident: bytes | None, reason: str) -> None:
        self._rejected += 1
        if self.metrics is not None:
            self.metrics.messages_rejected.inc()
        log.warning("rejected a message: %s", reason)
        if ident is not None:
            self._send(ident, protocol.ErrorReply(reason))

    def _send(self, ident: bytes, msg: protocol.Message) -> None:
        try:
            self._sock.send_multipart([ident, protocol.dump(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as e:
            log.warning("could not send %s: %s", type(msg).__name__, e)

    def _send_tasks(
        self, attempt: int, msg: protocol.Message | dict[int, protocol.Message]
    ) -> None:
        """Send ``msg`` (or ``msg[task]``) to every connected task of ``attempt``."""
        for task in range(self._state.num_tasks):
            ident = self._peers.get((attempt, task))
            m = msg.get(task) if isinstance(msg, dict) else msg
            if ident is not None and m is not None:
                self._send(ident, m)

    # -- instructions ------------------------------------------------------------------
    def _execute(self, instructions: list[st.Instruction], origin: bytes | None = None) -> None:
        for ins in instructions:
            if self.metrics is not None:
                self._observe(ins)
            if isinstance(ins, st.TriggerCheckpoint):
                self._send_tasks(ins.attempt, protocol.TriggerCheckpoint(ins.checkpoint_id))
            elif isinstance(ins, st.TriggerMaterialization):
                self._send_tasks(ins.attempt, protocol.Materialize(ins.epoch))
            elif isinstance(ins, st.ApplyMaterialization):
                per_task: dict[int, protocol.Message] = {
                    t: protocol.ApplyMaterialization(ins.epoch, ref) for t, ref in ins.refs.items()
                }
                self._send_tasks(ins.attempt, per_task)
            elif isinstance(ins, st.PersistCheckpoint):
                self._persist(ins)
            elif isinstance(ins, st.DeleteCheckpoint):
                try:
                    self.checkpoints.delete(ins.checkpoint_id)
                except Exception:  # noqa: BLE001 - a leftover is stale metadata at start
                    log.exception("could not delete checkpoint %d", ins.checkpoint_id)
            elif isinstance(ins, st.DeleteObjects):
                try:
                    deleted = len(self.store.delete(ins.paths))
                    self._objects_deleted += deleted
                    if self.metrics is not None:
                        self.metrics.objects_deleted.inc(deleted)
                except Exception:  # noqa: BLE001 - leftovers are orphans at next start
                    log.exception("could not delete %d objects", len(ins.paths))
            elif isinstance(ins, st.Fenced):
                if origin is not None:
                    self._send(origin, protocol.Fenced(ins.attempt))
            elif isinstance(ins, st.AbortCheckpoint):
                log.warning("checkpoint %d aborted: %s", ins.checkpoint_id, ins.reason)
            elif isinstance(ins, st.AbandonMaterialization):
                log.warning("materialization epoch %d abandoned: %s", ins.epoch, ins.reason)
            elif isinstance(ins, st.Ignored):
                log.debug("ignored a message of task %d: %s", ins.task, ins.reason)

    def _observe(self, ins: st.Instruction) -> None:
        """Metrics of one instruction (checkpoint completion is observed in _persist)."""
        m = self.metrics
        assert m is not None
        if isinstance(ins, st.TriggerMaterialization):
            m.materialization_started(ins.epoch)
        elif isinstance(ins, st.ApplyMaterialization):
            m.materialization_completed(ins.epoch, ins.refs)
        elif isinstance(ins, st.AbandonMaterialization):
            m.materialization_abandoned(ins.epoch)
        elif isinstance(ins, st.AbortCheckpoint):
            m.checkpoints_aborted.inc()
        elif isinstance(ins, st.Fenced):
            m.messages_fenced.inc()

    def _persist(self, ins: st.PersistCheckpoint) -> None:
        cid = ins.checkpoint.checkpoint_id
        t0 = time.monotonic()
        try:
            self.checkpoints.add(ins.checkpoint, ins.retained)
        except Exception as e:  # noqa: BLE001 - any failure aborts the checkpoint
            log.exception("writing checkpoint %d failed", cid)
            self._execute(self._state.handle(st.WriteFailed(cid, f"{type(e).__name__}: {e}")))
            return
        write_s = time.monotonic() - t0
        self._execute(self._state.handle(st.Tick(time.monotonic(), time.time())))
        completed = self._state.checkpoints_completed
        self._execute(self._state.handle(st.CheckpointWritten(cid)))
        if self.metrics is not None and self._state.checkpoints_completed > completed:
            # trigger to last ack (in the record) plus the metadata write
            self.metrics.checkpoint_completed(ins.checkpoint, ins.checkpoint.duration_s + write_s)


def _connectable(endpoint: str) -> str:
    """Replace a wildcard host in a bound endpoint by this host's address."""
    for wildcard in ("0.0.0.0", "*"):
        prefix = f"tcp://{wildcard}:"
        if endpoint.startswith(prefix):
            try:
                host = socket.gethostbyname(socket.gethostname())
            except OSError:
                host = "127.0.0.1"
            return f"tcp://{host}:{endpoint[len(prefix) :]}"
    return endpoint
