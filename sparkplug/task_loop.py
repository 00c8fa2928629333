"""The loop of one task: its source reader, its keyed operator and its sink writer on one
thread, driven by coordinator commands and exchange deliveries.

- Reader: reads assigned splits batch by batch (not while the exchange is
  back-pressured, nothing after a final barrier), applies the filter/map steps, keys
  each record and sends it to the task owning the key's key group. At a
  TriggerCheckpoint it records its split states and sends barrier ``cp`` on every
  channel; it reports splits read to their end (SplitsFinished).
- Operator: processes the records of every input channel with the user's function,
  a slice of at most ``PROCESS_SLICE`` seconds per round (received batches wait in a
  backlog of a bounded number of batches, so commands and barriers are never stuck
  behind a slow function); at its snapshot of ``cp`` (aligned: barrier ``cp`` on every
  channel; unaligned: the first barrier ``cp``, or the alignment timeout, FLIP-76;
  sparkplug/barriers.py) it starts the changelog's persist and stages the sink output,
  and goes on processing; once barrier ``cp`` arrived on every channel, the in-flight
  records of ``cp`` (unaligned) are persisted through the channel-state writer
  (sparkplug/channel_state.py); ``cp`` is acknowledged, with the reader's split states
  of ``cp``, once both are durable (sparkplug/acks.py: asynchronous checkpoints, at
  most ``TaskConfig.max_pending_acks`` waiting).
- Unaligned: while a checkpoint waits for barriers, the channels that owe it theirs
  are read ahead of the processing (their batches logged as its input channel state)
  up to ``TaskConfig.max_inflight_bytes`` in the backlog; beyond, they are read as the
  processing goes (nothing is dropped). The reader's barrier overtakes the batches it
  had queued (their output channel state). Restored in-flight records are processed
  before anything else.
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
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dstltree.client.collector import serving_collector
from dstltree.client.handle import ChangelogHandle
from dstltree.client.writer import ChangelogWriter
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import MaterializedRef, TaskCheckpoint
from dstltree.coordinator.task_link import TaskLink
from dstltree.sparkplug.acks import PendingAcks
from dstltree.sparkplug.barriers import BarriersComplete, TakeSnapshot
from dstltree.sparkplug.channel_state import input_change, output_change
from dstltree.sparkplug.exchange import Exchange, Records, encode_batch
from dstltree.sparkplug.keygroups import task_of_key
from dstltree.sparkplug.materialize import Materializer
from dstltree.sparkplug.pipeline import apply_steps, key_of
from dstltree.sparkplug.reading import SplitQueue, record_error
from dstltree.sparkplug.sinks.layout import Committable
from dstltree.sparkplug.sources.base import Record, SplitState
from dstltree.sparkplug.state_backend import KeyedStateBackend, ListState, MapState, ValueState
from dstltree.sparkplug.task import (
    Restored,
    TaskConfig,
    kill_if_channel_state_restorable,
    kill_if_drilled,
)
from dstltree.storage.store import ObjectStore

log = logging.getLogger(__name__)
RECEIVE_BATCHES = 16  # batches received ahead of the processing, at most
# Unaligned: what lies queued before a barrier is the checkpoint's in-flight data,
# overtaken (the outboxes, at most 16 batches a channel) or read ahead to reach the
# barrier: credit-based flow control keeps at most 8 batches a channel sent and not
# processed (reading ahead grants no credit), as Flink's credits bound its network
# buffers (FLIP-76); ZeroMQ's high-water mark leaves room for the grants
UNALIGNED_QUEUES: dict[str, int] = {"credits": 8, "hwm": 16, "max_outbox_batches": 16}
READ_AHEAD_BATCHES = 256  # batches an unaligned checkpoint's owing channels read per round
IDLE_WAIT = 0.005  # seconds a task with nothing to do waits for deliveries
ACK_WAIT = 0.001  # ... while an acknowledgement waits for its persist
PROCESS_SLICE = 0.01  # seconds of processing per round, at most (plus one chunk)
CHUNK = 32  # records processed between two looks at the clock


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


@dataclass(frozen=True)
class _Snapshot:
    """The snapshot of a checkpoint, taken; its acknowledgement waits for the barriers."""

    persisted: Future[ChangelogHandle] | None
    unaligned: bool
    start_delay_s: float
    sync_s: float
    records: int  # processed before the snapshot, since the job began


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
        channels: ChangelogWriter | None = None,
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
        # barriers of this attempt, the first one's id, whether one of them completed
        self.barriers = 0
        self._first_barrier: int | None = None
        self.completed_in_attempt = False
        self.sink = None if p.sink is None else p.sink.create_writer(task, cfg.attempt)
        self.out = _Output(self.sink)
        self.exchange = Exchange(
            task,
            cfg.parallelism,
            host=_interface(host),
            batch_records=cfg.batch_records,
            security=None if cfg.security is None else cfg.security.job,
            mode="unaligned" if cfg.checkpointing == "unaligned" else "aligned",
            aligned_timeout=cfg.aligned_checkpoint_timeout,
            **(UNALIGNED_QUEUES if cfg.checkpointing == "unaligned" else {}),
        )
        # the channel-state writer (unaligned checkpoints), its SQN after the last persist
        self.channels = channels
        self._cs_after = 0 if channels is None else channels.next_sqn()
        self._cs_key_group = backend.key_groups.start
        self.inflight = restored.inflight  # processed before anything else
        self.restored_inflight = len(restored.inflight)
        self._backlog: deque[Records | TakeSnapshot | BarriersComplete] = deque()
        self._offset = 0  # records of the backlog's first batch already processed
        self._backlog_bytes = 0  # frame bytes of the batches in the backlog
        self._triggered: dict[int, float] = {}  # checkpoint -> when its trigger came
        self._output: dict[int, list[bytes]] = {}  # output channel state before its snapshot
        self._snapshots: dict[int, _Snapshot] = {}  # taken, barriers still owed
        self._logging: int | None = None  # the checkpoint whose channel state is logged
        self._inflight_bytes: dict[int, int] = {}
        self._acked_inflight: dict[int, int] = {}  # in-flight bytes of acked checkpoints
        self._last_barrier: int | None = None
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
        if self.inflight:  # FLIP-76 "Recovery": first in the backlog, before any new record
            restored = Records(self.task, self.inflight, None, encode_batch(self.inflight))
            self._backlog.append(restored)
            self._backlog_bytes += len(restored.frame)
            self.inflight = []
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
        self._receive(busy)
        self._work()
        return False

    # -- receiving ---------------------------------------------------------------------
    def _receive(self, busy: bool) -> None:
        """Take deliveries into the backlog: the channels owing an unaligned checkpoint
        its barrier read ahead (bounded by bytes), the others up to a backlog of
        ``RECEIVE_BATCHES`` batches."""
        ex = self.exchange
        ahead = self._backlog_bytes < self.cfg.max_inflight_bytes
        if ex.barriers.unaligned and ahead:
            self._take(ex.receive_inflight(READ_AHEAD_BATCHES))
        if self._barrier_expected():  # unaligned: its own barrier leads its own channel
            self._take(ex.receive_own(1))
        room = max(0, RECEIVE_BATCHES - len(self._backlog))
        wait = 0.0 if busy or self._backlog or not room else ACK_WAIT if self.acks else IDLE_WAIT
        self._take(ex.receive(wait, room))

    def _barrier_expected(self) -> bool:
        """Unaligned: this task triggered a checkpoint (not the final one) whose
        snapshot is still to come: its barrier overtook everything on its own channel,
        one frame away whatever the backlog holds."""
        if self.cfg.checkpointing != "unaligned" or self.cfg.aligned_checkpoint_timeout > 0:
            return False
        return any(cp not in self._snapshots and cp != self.final for cp in self._triggered)

    def _take(self, items: list[Any]) -> None:
        for item in items:
            if isinstance(item, Records):
                if item.inflight is not None:
                    self._log(item.inflight, input_change(item.frame))
                self._backlog.append(item)
                self._backlog_bytes += len(item.frame)
            elif isinstance(item, TakeSnapshot) and item.unaligned:
                self._unaligned_snapshot(item)
            elif isinstance(item, BarriersComplete) and item.checkpoint_id in self._snapshots:
                self._complete(item)  # unaligned: its in-flight records are all logged
            else:  # aligned: in order with the records before it
                self._backlog.append(item)

    def _work(self, until_events: bool = False) -> None:
        """Process the backlog for ``PROCESS_SLICE`` seconds (aligned barrier events in
        their place); ``until_events``: until no barrier event is left in it."""
        deadline = time.monotonic() + PROCESS_SLICE
        backlog = self._backlog
        events = self._events_in_backlog() if until_events else 0
        while backlog and (events or not until_events):
            item = backlog[0]
            if isinstance(item, Records):
                if not self._process_batch(item, None if until_events else deadline):
                    return
                backlog.popleft()
                self._offset = 0
                self._backlog_bytes -= len(item.frame)
                self.exchange.consumed(item.channel)  # credit: its sender may send one more
            else:
                backlog.popleft()
                events -= 1
                if isinstance(item, TakeSnapshot):
                    self._snapshot(item.checkpoint_id, False, item.first_barrier_at)
                else:
                    self._complete(item)
            if not until_events and time.monotonic() >= deadline:
                return

    def _events_in_backlog(self) -> int:
        """Aligned barrier events waiting in the backlog behind records."""
        return sum(1 for i in self._backlog if not isinstance(i, Records))

    def _process_batch(self, batch: Records, deadline: float | None) -> bool:
        """Process the rest of ``batch`` (from ``_offset``) in chunks until ``deadline``;
        True when all of it is processed."""
        items = batch.items
        while self._offset < len(items):
            end = self._offset + CHUNK
            self._process(items[self._offset : end])
            self._offset = min(end, len(items))
            if deadline is not None and time.monotonic() >= deadline:
                return self._offset >= len(items)
        return True

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

    # -- checkpoints -------------------------------------------------------------------
    def _unaligned_snapshot(self, ev: TakeSnapshot) -> None:
        """FLIP-76: snapshot at once; what the backlog holds was sent before the
        barriers and is not in the snapshot: the checkpoint's channel state, with the
        output channel state its trigger left."""
        if self._events_in_backlog():
            self._work(until_events=True)  # an earlier aligned checkpoint comes first
        cp = ev.checkpoint_id
        self._snapshot(cp, True, ev.first_barrier_at)
        self._logging = cp
        for frame in self._output.pop(cp, ()):
            self._log(cp, output_change(frame))
        for n, item in enumerate(self._backlog):
            if isinstance(item, Records):
                frame = item.frame
                if n == 0 and self._offset:  # its first records are in the snapshot
                    frame = encode_batch(item.items[self._offset :])
                self._log(cp, input_change(frame))

    def _log(self, cp: int, change: bytes) -> None:
        """Log ``change`` as channel state of ``cp`` (the checkpoint being logged)."""
        if self.channels is None or self._logging != cp:
            raise RuntimeError(f"channel state of checkpoint {cp} while logging {self._logging}")
        self.channels.append(self._cs_key_group, change)
        self._inflight_bytes[cp] = self._inflight_bytes.get(cp, 0) + len(change)

    def _snapshot(self, cp: int, unaligned: bool, first_barrier_at: float) -> None:
        """The synchronous phase of ``cp``: start the changelog's persist (its SQN range
        ends here) and stage the sink output; the acknowledgement waits for
        :meth:`_complete`."""
        t0 = time.monotonic()
        writer = self.backend.writer
        future = None
        if writer is not None:
            future = writer.persist_durably(self.after_sqn, checkpoint_id=cp)
        if self.sink is not None:
            staged = self.sink.prepare_commit(cp)
            if staged is not None:
                self.uncommitted.append(staged)
        triggered = self._triggered.get(cp)
        delay = 0.0 if triggered is None else max(0.0, first_barrier_at - triggered)
        sync_s = round(time.monotonic() - t0, 6)  # microseconds: short metadata
        records = self.records_before + self.records  # in-flight ones come again on restore
        self._snapshots[cp] = _Snapshot(future, unaligned, round(delay, 6), sync_s, records)

    def _complete(self, ev: BarriersComplete) -> None:
        """Barrier ``cp`` arrived on every channel: persist its channel state and leave
        the acknowledgement to :class:`PendingAcks` (sent once both are durable)."""
        cp = ev.checkpoint_id
        snap = self._snapshots.pop(cp)
        channel = None
        if self.channels is not None:
            channel = self.channels.persist_durably(self._cs_after, checkpoint_id=cp)
            self._cs_after = self.channels.next_sqn()
        self._logging = None
        self._triggered.pop(cp, None)
        kgs = self.backend.key_groups
        state = TaskCheckpoint(
            self.task,
            self.cfg.attempt,
            snap.records,
            self.materialized,
            self.handles,
            (kgs.start, kgs.stop),
            self.barrier_states.pop(cp, ()),
            tuple(self.uncommitted),
            sync_s=snap.sync_s,
            unaligned=snap.unaligned,
            alignment_s=round(ev.alignment_s, 6),
            start_delay_s=snap.start_delay_s,
            inflight_bytes=self._inflight_bytes.pop(cp, 0),
        )
        self._acked_inflight[cp] = state.inflight_bytes
        self.acks.add(cp, state, snap.persisted, channel)

    def _send_ack(self, cp: int, state: TaskCheckpoint) -> None:
        assert self._link is not None
        self._link.ack_checkpoint(cp, state)
        if self.channels is not None and state.channel_state:  # durable: drop the copies
            self.channels.truncate(state.channel_state[-1].sqn_range[1])

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
            self._on_complete(cmd.checkpoint_id)
        elif isinstance(cmd, protocol.Finish | protocol.Fenced):
            return True
        elif isinstance(cmd, protocol.ErrorReply):
            log.warning("task %d: the coordinator rejected a message: %s", self.task, cmd.reason)
        return False

    def _on_complete(self, checkpoint_id: int) -> None:
        self.uncommitted = [c for c in self.uncommitted if c.checkpoint_id > checkpoint_id]
        first = self._first_barrier
        self.completed_in_attempt |= first is not None and checkpoint_id >= first
        inflight = self._acked_inflight.get(checkpoint_id, 0)
        self._acked_inflight = {c: b for c, b in self._acked_inflight.items() if c > checkpoint_id}
        restorable = checkpoint_id == self._last_barrier and inflight > 0
        kill_if_channel_state_restorable(self.cfg, self.task, self.barriers, restorable)

    def _barrier(self, cmd: protocol.TriggerCheckpoint) -> None:
        """The reader's part of a checkpoint: split states, then the barrier on every
        channel (unaligned: overtaking the batches queued here, whose output channel
        state is logged at the operator's snapshot of the checkpoint)."""
        cp = cmd.checkpoint_id
        kill_if_drilled(self.cfg, self.task, self.barriers, self.completed_in_attempt)
        self.barriers += 1
        self._last_barrier = cp
        self._first_barrier = cp if self._first_barrier is None else self._first_barrier
        self._triggered[cp] = time.monotonic()
        self.barrier_states[cp] = self.splits.states()
        overtaken = self.exchange.barrier(cp, aligned=cmd.final)  # the last one: aligned
        if overtaken and self._logging == cp:
            for frame in overtaken:
                self._log(cp, output_change(frame))
        elif overtaken:
            self._output[cp] = overtaken
        if cmd.final:
            self.final = cp

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
