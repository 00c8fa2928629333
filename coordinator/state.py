"""The coordinator as a pure state machine: ``handle(event) -> list[instruction]``.

No I/O and no clock: every event (coordinator/events.py) carries ``now`` (seconds,
monotonic), and every effect (sending a command, writing metadata, deleting objects) is
returned as an instruction for the service shell to carry out (the pattern of
dask/distributed's ``worker_state_machine``). Behaviour:

- At most one checkpoint in flight (FLIP-158, "At most 1 concurrent checkpoint"); the
  next is triggered ``checkpoint_interval`` seconds after the previous one completed or
  was aborted, and only once every task of the current attempt has said hello.
- When every task of the current attempt acknowledged, :class:`PersistCheckpoint`; when
  it is written, the checkpoint is registered in the :class:`SharedStateRegistry`, the
  oldest beyond ``retained_checkpoints`` are subsumed (:class:`DeleteCheckpoint`, then
  :class:`DeleteObjects` for the paths whose count dropped to zero).
- A checkpoint not acknowledged within ``checkpoint_timeout`` seconds is aborted; so is
  one whose metadata write failed.
- A materialization epoch every ``materialization_interval`` seconds, at most one at a
  time (FLIP-158, "Materializing state changes"); once every task reported its snapshot,
  each task is sent its ``protocol.ApplyMaterialization``. An epoch still incomplete when
  a new attempt starts, or after ``materialization_timeout`` seconds, is abandoned.
- Hellos, acknowledgements and reports from an older attempt are fenced (a
  ``protocol.Fenced`` reply) and otherwise ignored; anything else is rejected with a
  ``protocol.ErrorReply``.

:meth:`CoordinatorState.validate` checks the invariants (docs/design.md, Invariants);
a state built with ``validate=True`` checks them after every event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import singledispatchmethod

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointDeleted,
    CheckpointWritten,
    CleanOrphans,
    DeleteCheckpoint,
    DeleteFailed,
    DeleteObjects,
    Event,
    Instruction,
    MalformedMessage,
    MaterializationAbandoned,
    MaterializationApplied,
    MaterializationStarted,
    MessageFromTask,
    MessageIgnored,
    ObjectsDeleted,
    OrphansDeleted,
    PersistCheckpoint,
    Reply,
    SendToTask,
    Started,
    Tick,
    WriteFailed,
)
from dstltree.coordinator.registry import SharedStateRegistry


class InvariantError(RuntimeError):
    """A coordinator invariant does not hold; the message names it."""


@dataclass(frozen=True)
class CoordinatorConfig:
    """Intervals and timeouts in seconds; ``retained_checkpoints`` >= 1.
    Raises ValueError for a retention below 1, negative intervals, timeouts <= 0."""

    checkpoint_interval: float = 0.3
    materialization_interval: float = 5.0
    checkpoint_timeout: float = 10.0
    retained_checkpoints: int = 2
    materialization_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.retained_checkpoints < 1:
            raise ValueError("retained_checkpoints must be >= 1")
        if min(self.checkpoint_interval, self.materialization_interval) < 0:
            raise ValueError("intervals must be >= 0")
        if min(self.checkpoint_timeout, self.materialization_timeout) <= 0:
            raise ValueError("timeouts must be > 0")


@dataclass
class _Pending:
    checkpoint_id: int
    attempt: int
    num_tasks: int
    triggered_at: float
    epoch: int
    acks: dict[int, TaskCheckpoint] = field(default_factory=dict)
    completed: CompletedCheckpoint | None = None  # set while its metadata is written

    @property
    def persisting(self) -> bool:
        return self.completed is not None


@dataclass
class _Epoch:
    epoch: int
    attempt: int
    started_at: float
    reports: dict[int, MaterializedRef] = field(default_factory=dict)


class CoordinatorState:
    """All coordinator decisions. Feed events to :meth:`handle`; carry out what it
    returns. ``retained``: completed checkpoints loaded from DFS; checkpoints beyond
    retention are subsumed on :class:`Started`. ``validate``: run :meth:`validate`
    after every event (tests). Counters (``checkpoints_completed`` …,
    ``checkpoint_durations_s`` in seconds) are public."""

    def __init__(
        self,
        config: CoordinatorConfig,
        retained: Iterable[CompletedCheckpoint] = (),
        *,
        validate: bool = False,
    ) -> None:
        self.config = config
        self.retained: list[CompletedCheckpoint] = sorted(retained, key=lambda c: c.checkpoint_id)
        self.registry = SharedStateRegistry.rebuild(self.retained)
        last = self.latest
        self.next_checkpoint_id = 1 if last is None else last.checkpoint_id + 1
        self.applied_epoch = 0 if last is None else last.materialization_epoch
        self.next_epoch = self.applied_epoch + 1
        self.attempt: int | None = None
        self.num_tasks = 0
        self.now = 0.0
        self.wall: float | None = None
        self.started = False
        self._validate = validate
        self._peers: dict[int, dict[int, bytes]] = {}  # attempt -> task -> identity
        self._attempt_tasks: dict[int, int] = {}  # attempt -> its number of tasks
        self._restored = frozenset(c.checkpoint_id for c in self.retained)
        self._released: set[str] | None = set() if validate else None
        self._pending: _Pending | None = None
        self._epoch: _Epoch | None = None
        self._checkpoint_due = 0.0
        self._materialization_due = 0.0
        self.checkpoints_completed = 0
        self.checkpoints_aborted = 0
        self.checkpoint_durations_s: list[float] = []
        self.materializations_completed = 0
        self.materializations_abandoned = 0
        self.messages_fenced = 0
        self.messages_rejected = 0
        self.objects_deleted = 0
        self.orphans_deleted = 0
        self.stale_metadata_deleted = 0

    # -- queries -----------------------------------------------------------------------
    @property
    def latest(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint (the newest retained), or None."""
        return self.retained[-1] if self.retained else None

    def all_connected(self) -> bool:
        """Every task of the current attempt said hello."""
        peers = self._peers.get(self.attempt, {}) if self.attempt is not None else {}
        return self.attempt is not None and len(peers) >= self.num_tasks

    # -- entry -------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; returns the instructions to carry out, in order. Raises
        ValueError for an AttemptStarted that does not increase the attempt or has no
        tasks, InvariantError (with ``validate=True``) when an invariant breaks."""
        self.now = max(self.now, event.now)
        out = self._handle_event(event)
        if self._validate:
            self.validate()
        return out

    @singledispatchmethod
    def _handle_event(self, event: Event) -> list[Instruction]:
        raise TypeError(f"unknown event {event!r}")

    @_handle_event.register
    def _(self, ev: Tick) -> list[Instruction]:
        if ev.wall is not None:
            self.wall = ev.wall
        out = self._timeouts()
        if self.all_connected():
            out += self._maybe_trigger_checkpoint()
            out += self._maybe_trigger_materialization()
        return out

    @_handle_event.register
    def _(self, ev: Started) -> list[Instruction]:
        self.started = True
        out = self._subsume()
        out.append(CleanOrphans(self.registry.referenced()))
        return out

    @_handle_event.register
    def _(self, ev: AttemptStarted) -> list[Instruction]:
        if self.attempt is not None and ev.attempt <= self.attempt:
            raise ValueError(f"attempt {ev.attempt} does not follow attempt {self.attempt}")
        if ev.num_tasks < 1:
            raise ValueError("num_tasks must be >= 1")
        out: list[Instruction] = []
        if self._pending is not None and not self._pending.persisting:
            out += self._abort(f"attempt {ev.attempt} started")
        if self._epoch is not None:
            out += self._abandon(f"attempt {ev.attempt} started")
        self.attempt = ev.attempt
        self.num_tasks = ev.num_tasks
        self._attempt_tasks[ev.attempt] = ev.num_tasks
        self._peers = {a: p for a, p in self._peers.items() if a >= ev.attempt}
        early = self._peers.get(ev.attempt, {})
        self._peers[ev.attempt] = {t: i for t, i in early.items() if t < ev.num_tasks}
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        self._materialization_due = self.now + self.config.materialization_interval
        return out

    @_handle_event.register
    def _(self, ev: MessageFromTask) -> list[Instruction]:
        return self._handle_message(ev.message, ev.identity)

    @_handle_event.register
    def _(self, ev: MalformedMessage) -> list[Instruction]:
        return self._reject(ev.identity, ev.reason)

    @_handle_event.register
    def _(self, ev: CheckpointWritten) -> list[Instruction]:
        p = self._pending
        if p is None or p.completed is None or p.checkpoint_id != ev.checkpoint_id:
            return [MessageIgnored(-1, f"checkpoint {ev.checkpoint_id} was not being written")]
        cp = p.completed
        self._pending = None
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        duration = max(0.0, self.now - p.triggered_at)
        self.checkpoints_completed += 1
        self.checkpoint_durations_s.append(duration)
        self.registry.register(cp)
        self.retained.append(cp)
        return [CheckpointCompleted(cp, duration), *self._subsume()]

    @_handle_event.register
    def _(self, ev: WriteFailed) -> list[Instruction]:
        p = self._pending
        if p is None or not p.persisting or p.checkpoint_id != ev.checkpoint_id:
            return [MessageIgnored(-1, f"checkpoint {ev.checkpoint_id} was not being written")]
        p.completed = None
        return self._abort(f"write failed: {ev.reason}")

    @_handle_event.register
    def _(self, ev: CheckpointDeleted) -> list[Instruction]:
        return []

    @_handle_event.register
    def _(self, ev: ObjectsDeleted) -> list[Instruction]:
        self.objects_deleted += ev.deleted
        return []

    @_handle_event.register
    def _(self, ev: DeleteFailed) -> list[Instruction]:
        return []  # leftovers are stale metadata or orphans at the next start

    @_handle_event.register
    def _(self, ev: OrphansDeleted) -> list[Instruction]:
        self.orphans_deleted += ev.orphans
        self.stale_metadata_deleted += ev.stale_metadata
        return []

    # -- task messages -----------------------------------------------------------------
    @singledispatchmethod
    def _handle_message(self, message: protocol.Message, identity: bytes) -> list[Instruction]:
        return self._reject(identity, f"{type(message).__name__} is not a task message")

    @_handle_message.register
    def _(self, message: protocol.Hello, identity: bytes) -> list[Instruction]:
        task, attempt = message.task, message.attempt
        if self.attempt is not None and attempt > self.attempt:
            if task >= 0:  # early: kept for when its attempt starts
                self._peers.setdefault(attempt, {})[task] = identity
            return []
        stale = self._stale(task, attempt, identity)
        if stale is not None:
            return stale
        self._peers.setdefault(attempt, {})[task] = identity
        return []

    @_handle_message.register
    def _(self, message: protocol.Ack, identity: bytes) -> list[Instruction]:
        stale = self._stale(message.task, message.attempt, identity)
        if stale is not None:
            return stale
        p = self._pending
        if p is None or p.persisting or message.checkpoint_id != p.checkpoint_id:
            return [
                MessageIgnored(message.task, f"checkpoint {message.checkpoint_id} is not pending")
            ]
        tc = message.checkpoint
        if tc.task != message.task or tc.attempt != message.attempt:
            return [
                MessageIgnored(message.task, "acknowledged state names another task or attempt")
            ]
        p.acks[message.task] = tc
        if len(p.acks) < p.num_tasks:
            return []
        return [self._complete(p)]

    @_handle_message.register
    def _(self, message: protocol.Report, identity: bytes) -> list[Instruction]:
        stale = self._stale(message.task, message.attempt, identity)
        if stale is not None:
            return stale
        e = self._epoch
        if e is None or message.epoch != e.epoch:
            return [
                MessageIgnored(
                    message.task, f"materialization epoch {message.epoch} is not pending"
                )
            ]
        e.reports[message.task] = message.ref
        if len(e.reports) < self.num_tasks:
            return []
        self._epoch = None
        self.applied_epoch = e.epoch
        self.materializations_completed += 1
        self._materialization_due = self.now + self.config.materialization_interval
        refs = dict(sorted(e.reports.items()))
        sends = self._send_all(
            {t: protocol.ApplyMaterialization(e.epoch, r) for t, r in refs.items()}
        )
        return [MaterializationApplied(e.epoch, refs), *sends]

    def _stale(self, task: int, attempt: int, identity: bytes) -> list[Instruction] | None:
        """Fenced for an older attempt, ignored for an unknown task, else None."""
        if self.attempt is None or attempt < self.attempt:
            self.messages_fenced += 1
            return [Reply(identity, protocol.Fenced(attempt))]
        if attempt > self.attempt:
            return [MessageIgnored(task, f"attempt {attempt} has not started")]
        if not 0 <= task < self.num_tasks:
            return [MessageIgnored(task, f"task {task} outside 0..{self.num_tasks - 1}")]
        return None

    def _reject(self, identity: bytes | None, reason: str) -> list[Instruction]:
        self.messages_rejected += 1
        return [] if identity is None else [Reply(identity, protocol.ErrorReply(reason))]

    def _send_all(self, messages: dict[int, protocol.Command]) -> list[Instruction]:
        """Send ``messages[task]`` to every connected task of the current attempt."""
        peers = self._peers.get(self.attempt, {}) if self.attempt is not None else {}
        return [SendToTask(t, peers[t], m) for t, m in sorted(messages.items()) if t in peers]

    # -- checkpoints -------------------------------------------------------------------
    def _timeouts(self) -> list[Instruction]:
        out: list[Instruction] = []
        p = self._pending
        if (
            p is not None
            and not p.persisting
            and self.now - p.triggered_at >= self.config.checkpoint_timeout
        ):
            out += self._abort(f"timeout: {len(p.acks)}/{p.num_tasks} tasks acknowledged")
        e = self._epoch
        if e is not None and self.now - e.started_at >= self.config.materialization_timeout:
            out += self._abandon(f"timeout: {len(e.reports)}/{self.num_tasks} tasks reported")
        return out

    def _maybe_trigger_checkpoint(self) -> list[Instruction]:
        if self._pending is not None or self.now < self._checkpoint_due:
            return []
        assert self.attempt is not None
        cid = self.next_checkpoint_id
        self.next_checkpoint_id += 1
        self._pending = _Pending(cid, self.attempt, self.num_tasks, self.now, self.applied_epoch)
        return self._send_all({t: protocol.TriggerCheckpoint(cid) for t in range(self.num_tasks)})

    def _complete(self, p: _Pending) -> PersistCheckpoint:
        """Every task acknowledged ``p``: the record to write, naming the retained ids."""
        cp = CompletedCheckpoint(
            checkpoint_id=p.checkpoint_id,
            attempt=p.attempt,
            materialization_epoch=p.epoch,
            created_at=self.wall if self.wall is not None else self.now,
            duration_s=max(0.0, self.now - p.triggered_at),
            tasks=dict(sorted(p.acks.items())),
        )
        p.completed = cp
        ids = [c.checkpoint_id for c in self.retained]
        keep = ids[max(0, len(ids) - (self.config.retained_checkpoints - 1)) :]
        return PersistCheckpoint(cp, tuple(keep))

    def _subsume(self) -> list[Instruction]:
        """Release the oldest checkpoints beyond retention: metadata first, then the
        objects whose count dropped to zero (only the registry decides deletions)."""
        out: list[Instruction] = []
        while len(self.retained) > self.config.retained_checkpoints:
            old = self.retained.pop(0)
            out.append(DeleteCheckpoint(old.checkpoint_id))
            dropped = self.registry.unregister(old)
            if dropped:
                if self._released is not None:
                    self._released.update(dropped)
                out.append(DeleteObjects(tuple(dropped)))
        return out

    def _abort(self, reason: str) -> list[Instruction]:
        assert self._pending is not None
        cid = self._pending.checkpoint_id
        self._pending = None
        self.checkpoints_aborted += 1
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        return [CheckpointAborted(cid, reason)]

    # -- materialization ---------------------------------------------------------------
    def _maybe_trigger_materialization(self) -> list[Instruction]:
        if self._epoch is not None or self.now < self._materialization_due:
            return []
        assert self.attempt is not None
        epoch = self.next_epoch
        self._epoch = _Epoch(epoch, self.attempt, self.now)
        self.next_epoch += 1
        sends = self._send_all({t: protocol.Materialize(epoch) for t in range(self.num_tasks)})
        return [MaterializationStarted(epoch), *sends]

    def _abandon(self, reason: str) -> list[Instruction]:
        assert self._epoch is not None
        epoch = self._epoch.epoch
        self._epoch = None
        self.materializations_abandoned += 1
        self._materialization_due = self.now + self.config.materialization_interval
        return [MaterializationAbandoned(epoch, reason)]

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        """Check the coordinator's invariants; raises InvariantError naming the first
        that does not hold (docs/design.md, Invariants)."""
        self._check_pending()
        self._check_epoch()
        self._check_retained()
        self._check_registry()
        self._check_released()

    def _check_pending(self) -> None:
        p = self._pending
        if p is None:
            return
        _require(
            p.checkpoint_id < self.next_checkpoint_id
            and (self.latest is None or p.checkpoint_id > self.latest.checkpoint_id),
            "pending checkpoint: its id follows the latest and precedes the next",
        )
        _require(
            set(p.acks) <= set(range(p.num_tasks)),
            "pending checkpoint bounded: acks only from tasks of its attempt",
        )
        _require(
            all(tc.attempt == p.attempt and tc.task == t for t, tc in p.acks.items()),
            "stale acks never counted: every ack of the pending checkpoint is of its attempt",
        )
        _require(
            p.persisting or p.attempt == self.attempt,
            "stale acks never counted: an unwritten pending checkpoint is of the current attempt",
        )
        if p.completed is not None:
            self._check_complete(p.completed)

    def _check_epoch(self) -> None:
        e = self._epoch
        _require(self.applied_epoch < self.next_epoch, "applied epoch precedes the next epoch")
        if e is None:
            return
        _require(
            e.attempt == self.attempt and set(e.reports) <= set(range(self.num_tasks)),
            "pending materialization epoch: reports only from tasks of the current attempt",
        )
        _require(e.epoch > self.applied_epoch, "pending epoch follows the applied epoch")

    def _check_complete(self, cp: CompletedCheckpoint) -> None:
        """``cp`` has the state of every task of its attempt, each of that attempt."""
        _require(
            all(tc.attempt == cp.attempt and tc.task == t for t, tc in cp.tasks.items()),
            f"checkpoint {cp.checkpoint_id} complete: every acknowledgement is of its attempt",
        )
        if cp.checkpoint_id in self._restored:
            return  # written by an earlier coordinator; its task count is not known here
        n = self._attempt_tasks.get(cp.attempt)
        _require(
            n is not None and set(cp.tasks) == set(range(n)),
            f"checkpoint {cp.checkpoint_id} complete: an ack from every task of its attempt",
        )

    def _check_retained(self) -> None:
        ids = [c.checkpoint_id for c in self.retained]
        _require(ids == sorted(set(ids)), "retained checkpoints: distinct ids, oldest first")
        _require(
            not ids or ids[-1] < self.next_checkpoint_id,
            "the latest checkpoint is among the retained and precedes the next id",
        )
        _require(
            not self.started or len(ids) <= self.config.retained_checkpoints,
            f"at most {self.config.retained_checkpoints} retained checkpoints",
        )
        for cp in self.retained:
            self._check_complete(cp)

    def _check_registry(self) -> None:
        refs = Counter(p for cp in self.retained for p in cp.referenced_paths())
        _require(
            self.registry.counts() == dict(refs),
            "registry counts equal the references of the retained checkpoints",
        )
        _require(
            self.registry.registered_ids() == [c.checkpoint_id for c in self.retained],
            "the registry holds exactly the retained checkpoints",
        )

    def _check_released(self) -> None:
        if self._released is None:
            return
        live = self._released & self.registry.referenced()
        _require(not live, f"nothing deleted that a retained checkpoint references: {sorted(live)}")


def _require(ok: bool, invariant: str) -> None:
    if not ok:
        raise InvariantError(invariant)
