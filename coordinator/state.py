"""The coordinator as a pure state machine: ``handle(event) -> list[instruction]``.

No I/O and no clock: time arrives with :class:`Tick` events (seconds, monotonic), and
every effect (sending a command, writing metadata, deleting objects) is returned as an
instruction for the service shell to carry out (the pattern of dask/distributed's
``worker_state_machine``). Behaviour:

- At most one checkpoint in flight (FLIP-158, "At most 1 concurrent checkpoint"); the
  next is triggered ``checkpoint_interval`` seconds after the previous one completed or
  was aborted, and only once every task of the current attempt has said hello.
- When every task of the current attempt acknowledged, :class:`PersistCheckpoint`; when
  it is written, the checkpoint is registered in the :class:`SharedStateRegistry`, the
  oldest beyond ``retained_checkpoints`` are subsumed (:class:`DeleteCheckpoint`, then
  :class:`DeleteObjects` for the paths whose count dropped to zero).
- A checkpoint not acknowledged within ``checkpoint_timeout`` seconds is aborted.
- A materialization epoch every ``materialization_interval`` seconds, at most one at a
  time (FLIP-158, "Materializing state changes"); once every task reported its snapshot,
  :class:`ApplyMaterialization`. An epoch still incomplete when a new attempt starts,
  or after ``materialization_timeout`` seconds, is abandoned.
- Hellos, acknowledgements and reports from an older attempt are fenced
  (:class:`Fenced`) and otherwise ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from coordinator.registry import SharedStateRegistry

# -- events ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passes: ``now`` in monotonic seconds; ``wall`` epoch seconds (for records)."""

    now: float
    wall: float | None = None


@dataclass(frozen=True)
class AttemptStarted:
    """Attempt ``attempt`` (strictly increasing) of ``num_tasks`` tasks begins."""

    attempt: int
    num_tasks: int


@dataclass(frozen=True)
class TaskConnected:
    """Task ``task`` of ``attempt`` said hello (commands can now reach it)."""

    task: int
    attempt: int


@dataclass(frozen=True)
class CheckpointAck:
    task: int
    attempt: int
    checkpoint_id: int
    checkpoint: TaskCheckpoint


@dataclass(frozen=True)
class MaterializationReport:
    task: int
    attempt: int
    epoch: int
    ref: MaterializedRef


@dataclass(frozen=True)
class CheckpointWritten:
    """The metadata and pointer of ``checkpoint_id`` are on DFS."""

    checkpoint_id: int


@dataclass(frozen=True)
class WriteFailed:
    checkpoint_id: int
    reason: str


Event = (
    Tick
    | AttemptStarted
    | TaskConnected
    | CheckpointAck
    | MaterializationReport
    | CheckpointWritten
    | WriteFailed
)

# -- instructions ----------------------------------------------------------------------


@dataclass(frozen=True)
class TriggerCheckpoint:
    """Send checkpoint ``checkpoint_id`` to every task of ``attempt``."""

    checkpoint_id: int
    attempt: int


@dataclass(frozen=True)
class TriggerMaterialization:
    """Ask every task of ``attempt`` to materialize its state for ``epoch``."""

    epoch: int
    attempt: int


@dataclass(frozen=True)
class ApplyMaterialization:
    """Every task reported for ``epoch``: send each its ref; tasks truncate their writers
    before ``refs[task].sqn`` and reference that snapshot from now on."""

    epoch: int
    attempt: int
    refs: dict[int, MaterializedRef] = field(hash=False)


@dataclass(frozen=True)
class AbandonMaterialization:
    epoch: int
    reason: str


@dataclass(frozen=True)
class PersistCheckpoint:
    """Write ``checkpoint`` (metadata, then pointer naming ``retained`` ids as well)."""

    checkpoint: CompletedCheckpoint
    retained: tuple[int, ...]


@dataclass(frozen=True)
class AbortCheckpoint:
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class DeleteCheckpoint:
    """Delete the metadata of a subsumed checkpoint (before its objects)."""

    checkpoint_id: int


@dataclass(frozen=True)
class DeleteObjects:
    """Delete these object paths: no retained checkpoint references them any more."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class Fenced:
    """A message from ``task`` of stale ``attempt`` was ignored; tell the sender."""

    task: int
    attempt: int


@dataclass(frozen=True)
class Ignored:
    """A message that is not stale but does not apply (unknown task, late ack)."""

    task: int
    reason: str


Instruction = (
    TriggerCheckpoint
    | TriggerMaterialization
    | ApplyMaterialization
    | AbandonMaterialization
    | PersistCheckpoint
    | AbortCheckpoint
    | DeleteCheckpoint
    | DeleteObjects
    | Fenced
    | Ignored
)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Intervals and timeouts in seconds; ``retained_checkpoints`` >= 1."""

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
    returns. ``retained``: completed checkpoints loaded from DFS (oldest first).
    Counters (``checkpoints_completed`` …, ``checkpoint_durations_s``) are public."""

    def __init__(
        self, config: CoordinatorConfig, retained: Iterable[CompletedCheckpoint] = ()
    ) -> None:
        self.config = config
        self.retained: list[CompletedCheckpoint] = sorted(retained, key=lambda c: c.checkpoint_id)
        self.registry = SharedStateRegistry.rebuild(self.retained)
        last = self.retained[-1] if self.retained else None
        self.next_checkpoint_id = 1 if last is None else last.checkpoint_id + 1
        self.applied_epoch = 0 if last is None else last.materialization_epoch
        self.next_epoch = self.applied_epoch + 1
        self.attempt: int | None = None
        self.num_tasks = 0
        self.now = 0.0
        self.wall: float | None = None
        self._hellos: dict[int, set[int]] = {}
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

    # -- queries -----------------------------------------------------------------------
    @property
    def latest(self) -> CompletedCheckpoint | None:
        return self.retained[-1] if self.retained else None

    @property
    def pending_checkpoint_id(self) -> int | None:
        return None if self._pending is None else self._pending.checkpoint_id

    @property
    def pending_epoch(self) -> int | None:
        return None if self._epoch is None else self._epoch.epoch

    def all_connected(self) -> bool:
        if self.attempt is None:
            return False
        return len(self._hellos.get(self.attempt, ())) >= self.num_tasks

    # -- transitions -------------------------------------------------------------------
    def restore(self) -> list[Instruction]:
        """Subsume retained checkpoints beyond retention (e.g. after lowering it)."""
        return self._subsume()

    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; returns the instructions to carry out, in order.
        Raises ValueError for an AttemptStarted that does not increase the attempt."""
        if isinstance(event, Tick):
            return self._tick(event)
        if isinstance(event, AttemptStarted):
            return self._attempt_started(event)
        if isinstance(event, TaskConnected):
            return self._connected(event)
        if isinstance(event, CheckpointAck):
            return self._ack(event)
        if isinstance(event, MaterializationReport):
            return self._report(event)
        if isinstance(event, CheckpointWritten):
            return self._written(event)
        if isinstance(event, WriteFailed):
            return self._write_failed(event)
        raise TypeError(f"unknown event {event!r}")

    def _tick(self, ev: Tick) -> list[Instruction]:
        self.now = max(self.now, ev.now)
        self.wall = ev.wall
        out: list[Instruction] = []
        p = self._pending
        timed_out = p is not None and self.now - p.triggered_at >= self.config.checkpoint_timeout
        if p is not None and not p.persisting and timed_out:
            out += self._abort(f"timeout: {len(p.acks)}/{self.num_tasks} tasks acknowledged")
        e = self._epoch
        if e is not None and self.now - e.started_at >= self.config.materialization_timeout:
            out += self._abandon(f"timeout: {len(e.reports)}/{self.num_tasks} tasks reported")
        if self.attempt is None or not self.all_connected():
            return out
        if self._pending is None and self.now >= self._checkpoint_due:
            cid = self.next_checkpoint_id
            self.next_checkpoint_id += 1
            self._pending = _Pending(cid, self.attempt, self.now, self.applied_epoch)
            out.append(TriggerCheckpoint(cid, self.attempt))
        if self._epoch is None and self.now >= self._materialization_due:
            self._epoch = _Epoch(self.next_epoch, self.attempt, self.now)
            self.next_epoch += 1
            out.append(TriggerMaterialization(self._epoch.epoch, self.attempt))
        return out

    def _attempt_started(self, ev: AttemptStarted) -> list[Instruction]:
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
        self._hellos = {a: t for a, t in self._hellos.items() if a >= ev.attempt}
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        self._materialization_due = self.now + self.config.materialization_interval
        return out

    def _stale(self, task: int, attempt: int) -> list[Instruction] | None:
        """Fenced for an older attempt, Ignored for an unknown task, else None."""
        if self.attempt is None or attempt < self.attempt:
            self.messages_fenced += 1
            return [Fenced(task, attempt)]
        if attempt > self.attempt:
            return [Ignored(task, f"attempt {attempt} has not started")]
        if not 0 <= task < self.num_tasks:
            return [Ignored(task, f"task {task} outside 0..{self.num_tasks - 1}")]
        return None

    def _connected(self, ev: TaskConnected) -> list[Instruction]:
        if self.attempt is not None and ev.attempt > self.attempt:
            self._hellos.setdefault(ev.attempt, set()).add(ev.task)  # early, kept
            return []
        stale = self._stale(ev.task, ev.attempt)
        if stale is not None:
            return stale
        self._hellos.setdefault(ev.attempt, set()).add(ev.task)
        return []

    def _ack(self, ev: CheckpointAck) -> list[Instruction]:
        stale = self._stale(ev.task, ev.attempt)
        if stale is not None:
            return stale
        p = self._pending
        if p is None or p.persisting or ev.checkpoint_id != p.checkpoint_id:
            return [Ignored(ev.task, f"checkpoint {ev.checkpoint_id} is not pending")]
        tc = ev.checkpoint
        if tc.task != ev.task or tc.attempt != ev.attempt:
            return [Ignored(ev.task, "acknowledged state names another task or attempt")]
        p.acks[ev.task] = tc
        if len(p.acks) < self.num_tasks:
            return []
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
        return [PersistCheckpoint(cp, tuple(keep))]

    def _written(self, ev: CheckpointWritten) -> list[Instruction]:
        p = self._pending
        if p is None or not p.persisting or p.checkpoint_id != ev.checkpoint_id:
            return [Ignored(-1, f"checkpoint {ev.checkpoint_id} was not being written")]
        cp = p.completed
        assert cp is not None
        self._pending = None
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        self.checkpoints_completed += 1
        self.checkpoint_durations_s.append(max(0.0, self.now - p.triggered_at))
        self.registry.register(cp)
        self.retained.append(cp)
        return self._subsume()

    def _subsume(self) -> list[Instruction]:
        out: list[Instruction] = []
        while len(self.retained) > self.config.retained_checkpoints:
            old = self.retained.pop(0)
            out.append(DeleteCheckpoint(old.checkpoint_id))
            dropped = self.registry.unregister(old)
            if dropped:
                out.append(DeleteObjects(tuple(dropped)))
        return out

    def _write_failed(self, ev: WriteFailed) -> list[Instruction]:
        p = self._pending
        if p is None or not p.persisting or p.checkpoint_id != ev.checkpoint_id:
            return [Ignored(-1, f"checkpoint {ev.checkpoint_id} was not being written")]
        p.completed = None
        return self._abort(f"write failed: {ev.reason}")

    def _abort(self, reason: str) -> list[Instruction]:
        assert self._pending is not None
        cid = self._pending.checkpoint_id
        self._pending = None
        self.checkpoints_aborted += 1
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        return [AbortCheckpoint(cid, reason)]

    def _report(self, ev: MaterializationReport) -> list[Instruction]:
        stale = self._stale(ev.task, ev.attempt)
        if stale is not None:
            return stale
        e = self._epoch
        if e is None or ev.epoch != e.epoch:
            return [Ignored(ev.task, f"materialization epoch {ev.epoch} is not pending")]
        e.reports[ev.task] = ev.ref
        if len(e.reports) < self.num_tasks:
            return []
        self._epoch = None
        self.applied_epoch = e.epoch
        self.materializations_completed += 1
        self._materialization_due = self.now + self.config.materialization_interval
        return [ApplyMaterialization(e.epoch, e.attempt, dict(sorted(e.reports.items())))]

    def _abandon(self, reason: str) -> list[Instruction]:
        assert self._epoch is not None
        epoch = self._epoch.epoch
        self._epoch = None
        self.materializations_abandoned += 1
        self._materialization_due = self.now + self.config.materialization_interval
        return [AbandonMaterialization(epoch, reason)]
