"""The loop of one task: its source reader, its keyed operator and its sink writer on one
thread, driven by coordinator commands and exchange deliveries.

- Reader: reads assigned splits batch by batch (not while the exchange is
  back-pressured, nothing after a final barrier), applies the filter/map steps, keys
  each record and sends it to the task owning the key's key group. At a
  TriggerCheckpoint it records its split states and sends barrier ``cp`` on every
  channel; it reports splits read to their end (SplitsFinished).
- Operator: processes the records of every input channel with the user's function;
  when barrier ``cp`` arrived on all channels (aligned), starts the changelog's persist,
  stages the sink output and goes on processing; ``cp`` is acknowledged, with the
  reader's split states of ``cp``, once the persist is durable (sparkplug/acks.py:
  asynchronous checkpoints, at most ``TaskConfig.max_pending_acks`` waiting).
- Materialization: a Materialize command starts it (its synchronous part); every round
  of the loop packs a few key groups and writes them in the background
  (sparkplug/materialize.py); it is reported once written.
- Commands: AssignSplits, TriggerCheckpoint, Materialize, ApplyMaterialization,
  CheckpointComplete (stop carrying committables), Finish (return), Fenced (return).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from dstltree.client.collector import serving_collector
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import MaterializedRef, TaskCheckpoint
from dstltree.coordinator.task_link import TaskLink
from dstltree.sparkplug.acks import PendingAcks
from dstltree.sparkplug.exchange import Aligned, Exchange
from dstltree.sparkplug.keygroups import task_of_key
from dstltree.sparkplug.materialize import Materializer
from dstltree.sparkplug.pipeline import apply_steps, key_of
from dstltree.sparkplug.reading import SplitQueue, record_error
from dstltree.sparkplug.sinks.layout import Committable
from dstltree.sparkplug.sources.base import Record, SplitState
from dstltree.sparkplug.state_backend import KeyedStateBackend, ListState, MapState, ValueState
from dstltree.sparkplug.task import Restored, TaskConfig, kill_if_drilled
from dstltree.storage.store import ObjectStore

log = logging.getLogger(__name__)
IDLE_WAIT = 0.005  # seconds a task with nothing to do waits for deliveries
ACK_WAIT = 0.001  # ... while an acknowledgement waits for its persist


def _interface(host: str) -> str:
    """An address to bind the exchange on: ``host`` as an IP (names resolved)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


class _Context:
    """The RuntimeContext a KeyedProcessFunction opens with."""

    def __init__(self, backend: KeyedStateBackend, task: int, parallelism: int, attempt: int):
        self._backend = backend
        self.task, self.parallelism, self.attempt = task, parallelism, attempt

    def value_state(self, name: str) -> ValueState:
        return self._backend.value_state(name)

    def map_state(self, name: str) -> MapState:
        return self._backend.map_state(name)

    def list_state(self, name: str) -> ListState:
        return self._backend.list_state(name)


class _Output:
    """The Collector: rows go to the sink writer (or are counted without a sink)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.rows = 0

    def emit(self, row: dict[str, Any]) -> None:
        self.rows += 1
        if self.writer is not None:
            self.writer.write(row)


class TaskLoop:
    """One task attempt's loop (module docstring). ``host``: the executor's host, where
    the exchange binds. ``run`` returns the records its keyed operator processed in
    this attempt."""

    def __init__(
        self,
        cfg: TaskConfig,
        task: int,
        store: ObjectStore,
        backend: KeyedStateBackend,
        restored: Restored,
        host: str = "127.0.0.1",
    ) -> None:
        p = cfg.pipeline
        self.cfg, self.task, self.store, self.backend = cfg, task, store, backend
        self.materialized = restored.materialized
        self.handles = restored.handles
        self.records_before = restored.records
        self.records = 0
        # SQNs of this attempt's writer (a restored snapshot's SQN is the old writer's,
        # except for the fresh snapshot of a rescale, taken at this writer's SQN 0)
        self.after_sqn = 0
        self.splits = SplitQueue(p.source.create_reader())
        self.barrier_states: dict[int, tuple[SplitState, ...]] = {}
        self.final: int | None = None
        self.uncommitted: list[Committable] = []
        self.sink = None if p.sink is None else p.sink.create_writer(task, cfg.attempt)
        self.out = _Output(self.sink)
        self.exchange = Exchange(
            task,
            cfg.parallelism,
            host=_interface(host),
            batch_records=cfg.batch_records,
            security=None if cfg.security is None else cfg.security.job,
        )
        self._steps, self._key, self._fn = p.steps, p.key_by, p.function
        self._link: TaskLink | None = None
        self._rate_start: float | None = None
        self.acks = PendingAcks(self._send_ack, cfg.max_pending_acks, cfg.ack_timeout * 3)
        self.materializer = None if backend.writer is None else Materializer(store, backend)
        self._epoch = 0  # of the materialization running
        self.max_gap_s = 0.0  # the longest time between two batches processed
        self.materialization_sync_s = 0.0  # the longest synchronous part of one
        self._last_batch: float | None = None
        self._first_batch: float | None = None

    # -- driving -----------------------------------------------------------------------
    def connect(self, gather: Any) -> None:
        """Connect the exchange to every task's (``gather``: Spark's barrier allGather
        of the addresses) and open the function: after it the task takes barriers at
        once, so it says hello to the coordinator only then (a checkpoint triggered
        during the gather would count the tasks' start-up as its duration; Flink, too,
        triggers only when every task runs)."""
        import json

        addresses = [json.loads(a) for a in gather(json.dumps(self.exchange.addresses))]
        self.exchange.connect(addresses)
        assert self._fn is not None
        self._fn.open(_Context(self.backend, self.task, self.cfg.parallelism, self.cfg.attempt))

    def run(self, link: TaskLink) -> int:
        """Loop until Finish, taking commands from ``link`` (after :meth:`connect`)."""
        self._link = link
        # what exists now (the restored state's containers, Spark's worker, the
        # libraries) lives as long as the task: the collector's full collections leave
        # it unscanned, so one does not stall the loop for tens of milliseconds, and
        # young collections come 20,000 allocations apart (client/collector.py)
        with serving_collector():
            self._loop(link)
        return self.records

    def _loop(self, link: TaskLink) -> None:
        assert self._fn is not None
        try:
            while not self._step(link):
                pass
            self._fn.close()
        finally:
            if self.materializer is not None:
                self.materializer.close()
            self.exchange.close()
            if self.sink is not None:
                self.sink.close()

    def _step(self, link: TaskLink) -> bool:
        """One round: commands, a batch of reading, deliveries. True when finished."""
        for cmd in link.poll():
            if self._command(cmd):
                return True
        self.acks.send_ready()
        self._materialize_step()
        busy = self._read()
        self.exchange.flush()
        wait = 0.0 if busy else ACK_WAIT if self.acks else IDLE_WAIT
        for item in self.exchange.receive(wait):
            if isinstance(item, Aligned):
                self._checkpoint(item.checkpoint_id)
            else:
                self._process(item.items)
        return False

    # -- reader ------------------------------------------------------------------------
    def _read(self) -> bool:
        """Read one batch if allowed; True if it read (more may follow at once)."""
        if self.final is not None or self.splits.idle or self.exchange.backpressured:
            return False
        limit = self._allowed()
        if limit <= 0:
            return False
        done = self.splits.read(limit, self._route)
        if done and self._link is not None:
            self._link.splits_finished(tuple(done))
        return True

    def _allowed(self) -> int:
        """Records the reader may read now: a batch, or fewer under ``source_rate``
        (records per second per reader, 0 = unlimited; a token bucket from the first
        read)."""
        rate = self.cfg.source_rate
        if rate <= 0:
            return self.cfg.batch_records
        now = time.monotonic()
        if self._rate_start is None:
            self._rate_start = now
        budget = int((now - self._rate_start) * rate) + 1 - self.splits.consumed
        return min(self.cfg.batch_records, budget)

    def _route(self, record: Record, location: str, row: int) -> None:
        try:
            rec = apply_steps(self._steps, record)
            if rec is None:
                return
            assert self._key is not None
            key = key_of(self._key, rec)
            target = task_of_key(key, self.cfg.parallelism, self.cfg.max_parallelism)
        except Exception as e:  # noqa: BLE001 - named by file and row, then raised
            raise record_error(location, row, e) from e
        self.exchange.send(target, key, rec)

    # -- operator ----------------------------------------------------------------------
    def _process(self, items: list[tuple[Any, Record]]) -> None:
        fn, backend, out = self._fn, self.backend, self.out
        assert fn is not None
        for key, record in items:
            backend.set_current_key(key)
            fn.process(key, record, out)
        self.records += len(items)
        now = time.monotonic()
        if self._last_batch is None:
            self._first_batch = now
        elif now - self._last_batch > self.max_gap_s:
            self.max_gap_s = now - self._last_batch
        self._last_batch = now

    def _checkpoint(self, cp: int) -> None:
        """Barrier ``cp`` aligned, the synchronous phase: start the changelog's persist
        (its SQN range ends here), stage the sink output, and leave the acknowledgement
        to :class:`PendingAcks` (sent once the persist is durable)."""
        t0 = time.monotonic()
        writer = self.backend.writer
        future = None
        if writer is not None:
            future = writer.persist_durably(self.after_sqn, checkpoint_id=cp)
        if self.sink is not None:
            staged = self.sink.prepare_commit(cp)
            if staged is not None:
                self.uncommitted.append(staged)
        kgs = self.backend.key_groups
        state = TaskCheckpoint(
            self.task,
            self.cfg.attempt,
            self.records_before + self.records,
            self.materialized,
            self.handles,
            (kgs.start, kgs.stop),
            self.barrier_states.pop(cp, ()),
            tuple(self.uncommitted),
            sync_s=round(time.monotonic() - t0, 6),  # microseconds: short metadata
        )
        self.acks.add(cp, state, future)

    def _send_ack(self, cp: int, state: TaskCheckpoint) -> None:
        assert self._link is not None
        self._link.ack_checkpoint(cp, state)

    @property
    def busy_s(self) -> float:
        """Seconds from the first batch of records processed to the last (0: none)."""
        if self._first_batch is None or self._last_batch is None:
            return 0.0
        return self._last_batch - self._first_batch

    # -- commands ----------------------------------------------------------------------
    def _command(self, cmd: protocol.Command) -> bool:
        """Carry out one command; True when the task must return."""
        if isinstance(cmd, protocol.AssignSplits):
            self.splits.assign(cmd.states)
        elif isinstance(cmd, protocol.TriggerCheckpoint):
            self._barrier(cmd)
        elif isinstance(cmd, protocol.Materialize):
            self._materialize(cmd.epoch)
        elif isinstance(cmd, protocol.ApplyMaterialization):
            self._apply(cmd.ref)
        elif isinstance(cmd, protocol.CheckpointComplete):
            self.uncommitted = [c for c in self.uncommitted if c.checkpoint_id > cmd.checkpoint_id]
        elif isinstance(cmd, protocol.Finish | protocol.Fenced):
            return True
        elif isinstance(cmd, protocol.ErrorReply):
            log.warning("task %d: the coordinator rejected a message: %s", self.task, cmd.reason)
        return False

    def _barrier(self, cmd: protocol.TriggerCheckpoint) -> None:
        kill_if_drilled(self.cfg, self.task, cmd.checkpoint_id)
        self.barrier_states[cmd.checkpoint_id] = self.splits.states()
        self.exchange.barrier(cmd.checkpoint_id)
        if cmd.final:
            self.final = cmd.checkpoint_id

    def _materialize(self, epoch: int) -> None:
        """Materialization ``epoch``: its synchronous part only (sparkplug/materialize.py);
        the loop packs and writes it between batches and reports it when written."""
        if self.materializer is None:
            return
        self._epoch = epoch
        t0 = time.monotonic()
        self.materializer.begin(epoch)
        self.materialization_sync_s = max(self.materialization_sync_s, time.monotonic() - t0)

    def _materialize_step(self) -> None:
        m = self.materializer
        if m is None or not m.running:
            return
        ref = m.step()
        if ref is not None:
            assert self._link is not None
            self._link.report_materialization(self._epoch, ref)

    def _apply(self, ref: MaterializedRef) -> None:
        writer = self.backend.writer
        if writer is None or self.materializer is None:
            return
        self.materializer.applied(ref)
        self.materialized, self.handles, self.after_sqn = ref, (), ref.sqn
        writer.truncate(ref.sqn)
