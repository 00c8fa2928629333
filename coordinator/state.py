"""The coordinator as a pure state machine: ``handle(event) -> list[instruction]``.

No I/O and no clock: every event (coordinator/events.py) carries ``now`` (seconds,
monotonic), and every effect (sending a command, writing metadata, deleting objects) is
returned as an instruction for the service shell to carry out (the pattern of
dask/distributed's ``worker_state_machine``). Behaviour:

- Overlapping checkpoints (Flink's ``maxConcurrentCheckpoints``): a checkpoint is
  triggered ``checkpoint_interval`` seconds after the previous trigger while fewer than
  ``max_concurrent_checkpoints`` are in flight (triggered, not yet written or aborted),
  and only once every task of the current attempt has said hello (the first one an
  interval after the last hello: a task says hello once it takes barriers); after an
  abort the next waits an interval from the abort.
- Completion in checkpoint order, one request on the completion path: when every task
  of the current attempt acknowledged a checkpoint and every older one in flight is
  written or aborted, :class:`PersistCheckpoint` (one commit record,
  coordinator/store.py); checkpoints that became ready together complete in one
  record; up to ``max_records_in_flight`` records are created at once (pipelined),
  each carrying the checkpoints of the records before it still in flight, confirmed
  in creation order (a failed record's checkpoints complete with a later one, and are
  aborted only when no later record carries them). When it is
  written, each is registered in the :class:`SharedStateRegistry` and the oldest beyond
  ``retained_checkpoints`` are subsumed (:class:`DeleteCheckpoint`, then
  :class:`DeleteObjects` for the paths whose count dropped to zero): off the completion
  path, never delaying a trigger.
- A checkpoint not acknowledged within ``checkpoint_timeout`` seconds is aborted, alone
  (later ones go on); so are the checkpoints of a record whose write failed.
- A materialization epoch every ``materialization_interval`` seconds, at most one at a
  time (FLIP-158, "Materializing state changes"); once every task reported its snapshot,
  each task is sent its ``protocol.ApplyMaterialization``. An epoch still incomplete when
  a new attempt starts, or after ``materialization_timeout`` seconds, is abandoned.
- Hellos, acknowledgements and reports from an older attempt are fenced (a
  ``protocol.Fenced`` reply) and otherwise ignored; anything else is rejected with a
  ``protocol.ErrorReply``.
- Trust: the state believes nothing it did not make. The first Hello of a (task,
  attempt) binds the task to the ROUTER identity it came on; a second Hello for it (from
  any identity, its own included: a link says hello once), or from an identity bound
  to another task, is refused. Acks, reports and ``SplitsFinished`` of a task are
  refused unless they come from its bound identity. An acknowledgement is refused
  unless every path is canonical under ``config.object_prefixes``
  (:func:`dstltree.coordinator.checkpoint.checkpoint_problem`), its SQN ranges are
  ordered and do not move backwards from what this task acknowledged before in the
  attempt or from the restored checkpoint, its key groups are inside the task's range,
  its counts and sizes are bounded, and it answers a checkpoint that was triggered; a
  second ack of one task for one checkpoint is refused. A report is refused unless its
  epoch was started, its path is canonical and its SQN does not move backwards; its
  ``ApplyMaterialization`` (which makes tasks truncate their changelog) is sent only
  once every task of the attempt reported and each report's SQN is within what that
  task acknowledged (else the epoch waits for acks, or times out). Every refusal is an
  ``ErrorReply`` (when the sender is known), counted in ``messages_rejected`` and, by
  kind, in ``rejections``; a refused message changes nothing.
- Deletion: only the :class:`SharedStateRegistry` decides what is deleted.
  :class:`DeleteObjects` names only paths it released (no retained checkpoint
  references them any more), and of those only paths under ``config.object_prefixes``
  (others are kept and counted in ``deletions_refused``), with the log ids of the job's
  writers, state changelogs and channel-state logs (FLIP-76) alike (an object of a node
  shared with other jobs is deleted only if each of its segments is of one of them:
  the storage worker reads its index); no path taken from a task's message is ever
  deleted directly (not on abort, not on a refused ack), and
  :class:`CleanOrphans` deletes by listing, sparing what the registry references.
- Source (FLIP-27 split enumerator, coordinator/splits.py): the enumerator is rebuilt
  at every attempt from the latest completed checkpoint; a :class:`ListSplits` every
  ``discovery_interval`` seconds adds new splits. Pending splits are assigned
  (``protocol.AssignSplits``) once every task of the attempt said hello and after each
  listing and ``protocol.SplitsFinished``. The enumerator's snapshot is taken when a
  checkpoint is triggered; an assignment sent before the trigger is an earlier
  instruction, so it reaches its task before that task's barrier (one socket, FIFO).
- Sink (two-phase commit, coordinator/commits.py): once a checkpoint is durable its
  committables are committed (:class:`CommitSink`), then every task is sent
  ``protocol.CheckpointComplete``; a failed commit is retried, never skipped. Every
  attempt starts with :class:`RecoverSink` and triggers no checkpoint before it is
  answered. Without a sink, ``CheckpointComplete`` follows the metadata write.
- End of a run: with ``finish_when_source_done``, once the enumerator is finished, and
  after :class:`StopRequested`, the next checkpoint is triggered at once (or right
  after the checkpoint in flight), not an interval later, and is final
  (``TriggerCheckpoint(final=True)``). An aborted final checkpoint is followed by
  another final one a checkpoint interval later (a failure that lasts costs one
  attempt per interval, as during the run). When a final checkpoint is durable and
  committed, every task is sent ``protocol.Finish`` (and so is every task of a later
  attempt once connected), :attr:`CoordinatorState.finished` is set and nothing is
  triggered any more.

:meth:`CoordinatorState.validate` checks the invariants (docs/design.md, Invariants);
a state built with ``validate=True`` checks them after every event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import singledispatchmethod

from dstltree.client.errors import WireError
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import (
    CompletedCheckpoint,
    MaterializedRef,
    Refusal,
    SplitLogRef,
    TaskCheckpoint,
    checkpoint_alignment,
    checkpoint_phases,
    checkpoint_problem,
    log_spans,
    path_problem,
    prefix_problem,
    snapshot_problem,
)
from dstltree.coordinator.commits import SinkCommits
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointDeleted,
    CheckpointTriggered,
    CheckpointWritten,
    CleanOrphans,
    CommitFailed,
    DeleteCheckpoint,
    DeleteFailed,
    DeleteObjects,
    Event,
    Instruction,
    ListingFailed,
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
    RunFinished,
    SendToTask,
    SinkCommitted,
    SinkRecovered,
    SinkRecoveryFailed,
    SplitLogFailed,
    SplitLogWritten,
    SplitsListed,
    Started,
    StopRequested,
    Tick,
    WriteFailed,
    WriteSplitLog,
)
from dstltree.coordinator.registry import SharedStateRegistry
from dstltree.coordinator.splitlog import COMPACT_AFTER
from dstltree.coordinator.splits import SourceSplits
from dstltree.coordinator.store import MAX_RECORDS_IN_FLIGHT
from dstltree.coordinator.wallclock import WallClock
from dstltree.sparkplug.keygroups import key_group_range
from dstltree.sparkplug.sources.base import EnumeratorState, Source

#: Checkpoints in flight at most unless a job says otherwise: on the FLIP-158 S3 model a
#: checkpoint takes about 1 s from trigger to commit record (persist, then one
#: conditional create), so a 0.3 s interval needs 4 in flight; 5 leaves room for the
#: tail (BENCHMARKS.md, "Checkpoints on object stores").
DEFAULT_MAX_CONCURRENT_CHECKPOINTS = 5


class InvariantError(RuntimeError):
    """A coordinator invariant does not hold; the message names it."""


@dataclass(frozen=True)
class CoordinatorConfig:
    """Intervals and timeouts in seconds; ``retained_checkpoints`` >= 1.
    ``discovery_interval``: seconds between split listings; ``max_parallelism``: key
    groups of the job (recorded in every checkpoint); ``finish_when_source_done``: the
    run ends (a final checkpoint) once the source's enumerator is finished;
    ``commit_retry_interval``: seconds before a failed sink commit is tried again;
    ``max_concurrent_checkpoints``: checkpoints in flight at most (Flink's
    ``maxConcurrentCheckpoints``; 1 here, the service and jobs default to
    :data:`DEFAULT_MAX_CONCURRENT_CHECKPOINTS`); ``max_records_in_flight``: commit
    records created at once (pipelined; 1 here, the service uses
    ``store.MAX_RECORDS_IN_FLIGHT``). ``object_prefixes``: the only places
    paths of acknowledgements and reports may name, canonical URLs ending in ``/``
    (``checkpoint.job_object_prefixes``: the job's ``<base>/changelog/`` and
    ``<base>/materialized/``, plus those of nodes writing elsewhere); empty: no path
    is accepted. Raises ValueError for a retention, ``max_parallelism`` or
    ``max_concurrent_checkpoints`` below 1, negative intervals, timeouts <= 0, a
    prefix that is not canonical."""

    checkpoint_interval: float = 0.3
    materialization_interval: float = 5.0
    checkpoint_timeout: float = 10.0
    retained_checkpoints: int = 2
    materialization_timeout: float = 60.0
    discovery_interval: float = 0.5
    max_parallelism: int = 128
    finish_when_source_done: bool = True
    commit_retry_interval: float = 1.0
    object_prefixes: tuple[str, ...] = ()
    max_concurrent_checkpoints: int = 1
    max_records_in_flight: int = 1

    def __post_init__(self) -> None:
        if self.max_concurrent_checkpoints < 1:
            raise ValueError("max_concurrent_checkpoints must be >= 1")
        if not 1 <= self.max_records_in_flight <= MAX_RECORDS_IN_FLIGHT:
            raise ValueError(f"max_records_in_flight must be in 1..{MAX_RECORDS_IN_FLIGHT}")
        for prefix in self.object_prefixes:
            problem = prefix_problem(prefix)
            if problem is not None:
                raise ValueError(problem)
        if self.retained_checkpoints < 1:
            raise ValueError("retained_checkpoints must be >= 1")
        if self.max_parallelism < 1:
            raise ValueError("max_parallelism must be >= 1")
        intervals = (
            self.checkpoint_interval,
            self.materialization_interval,
            self.discovery_interval,
            self.commit_retry_interval,
        )
        if min(intervals) < 0:
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
    final: bool = False
    enumerator: EnumeratorState | None = None  # the snapshot taken at the trigger
    acks: dict[int, TaskCheckpoint] = field(default_factory=dict)
    ready_at: float | None = None  # when the last task acknowledged
    completed: CompletedCheckpoint | None = None  # set while its record is written

    @property
    def persisting(self) -> bool:
        return self.completed is not None

    @property
    def ready(self) -> bool:
        return self.ready_at is not None


@dataclass
class _Record:
    """A commit record being created: ``ids``, every checkpoint it completes (those of
    the records before it still in flight, then its own); ``outcome``: None while in
    flight, then the CheckpointWritten or WriteFailed that answered it."""

    ids: tuple[int, ...]
    outcome: CheckpointWritten | WriteFailed | None = None

    @property
    def newest(self) -> int:
        return self.ids[-1]


@dataclass
class _Epoch:
    epoch: int
    attempt: int
    started_at: float
    reports: dict[int, MaterializedRef] = field(default_factory=dict)


def _materialized(e: _Epoch, now: float) -> tuple[float, int, int]:
    """(seconds, snapshot bytes, bytes written) of applied epoch ``e``: a snapshot
    without parts was written whole."""
    size = sum(r.size_bytes for r in e.reports.values())
    written = sum(r.written_bytes if r.parts else r.size_bytes for r in e.reports.values())
    return max(0.0, now - e.started_at), size, written


class CoordinatorState:
    """All coordinator decisions. Feed events to :meth:`handle`; carry out what it
    returns. ``retained``: completed checkpoints loaded from DFS; checkpoints beyond
    retention are subsumed on :class:`Started`. ``source``: the job's source (its
    enumerator is built at every :class:`AttemptStarted`), None for none.
    ``commit_sink``: the job has a sink whose committables the coordinator commits.
    ``validate``: run :meth:`validate` after every event (tests). Counters
    (``checkpoints_completed`` …, ``checkpoint_durations_s`` in seconds) are public;
    :attr:`finished` is the final checkpoint once the run is over."""

    def __init__(
        self,
        config: CoordinatorConfig,
        retained: Iterable[CompletedCheckpoint] = (),
        *,
        source: Source | None = None,
        commit_sink: bool = False,
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
        self.clock = WallClock()  # a jump of the wall clock pauses in-run sweeps
        self.started = False
        self.splits = None if source is None else SourceSplits(source, config.discovery_interval)
        self.commits = SinkCommits(config.commit_retry_interval) if commit_sink else None
        self.stop_requested = False
        self.final_written: CompletedCheckpoint | None = None  # durable, maybe not committed
        self.finished: CompletedCheckpoint | None = None
        self.complete_sent = 0  # the newest checkpoint id sent as CheckpointComplete
        self._validate = validate
        self._peers: dict[int, dict[int, bytes]] = {}  # attempt -> task -> identity
        self._without_node: dict[int, set[int]] = {}  # attempt -> tasks with no node
        self._attempt_tasks: dict[int, int] = {}  # attempt -> its number of tasks
        self._restored = frozenset(c.checkpoint_id for c in self.retained)
        self._released: set[str] | None = set() if validate else None
        self._inflight: dict[int, _Pending] = {}  # triggered, not written or aborted
        self._records: list[_Record] = []  # commit records in flight, in creation order
        self._last_trigger: float | None = None
        # the split log checkpoints reference (coordinator/splitlog.py), and the wall
        # clock (epoch s) when a new one was asked for, while it is written
        self._split_log: SplitLogRef | None = None if last is None else last.finished_log
        self._split_log_asked: float | None = None
        self._epoch: _Epoch | None = None
        self._checkpoint_due = 0.0
        self._aborted_last = False  # the last checkpoint triggered was aborted
        self._materialization_due = 0.0
        self._finish_sent: set[bytes] = set()  # identities sent protocol.Finish
        # What tasks of the current attempt acknowledged: task -> log id -> SQN span,
        # and the spans of the checkpoint the attempt restored from (log id -> span).
        self._logs: dict[int, dict[str, tuple[int, int]]] = {}
        self._restored_logs: dict[str, tuple[int, int]] = {}
        self._acked_to: dict[int, int] = {}  # task -> highest SQN it acknowledged
        # channel-state logs (FLIP-76) of the restored checkpoint and of this attempt's
        # acknowledgements: the job's own, but with no SQN span to keep (not replayed)
        self._channel_logs: set[str] = set()
        self._applied_sqn: dict[int, int] = {}  # task -> SQN of its applied snapshot
        # The dispatchers, bound once (a singledispatchmethod builds a wrapper on every
        # attribute access: a flood of messages would pay for it each time).
        self._on_event = self._handle_event
        self._on_message = self._handle_message
        self._init_counters()

    def _init_counters(self) -> None:
        self.checkpoints_completed = 0
        self.checkpoints_aborted = 0
        self.checkpoint_durations_s: list[float] = []
        self.checkpoint_phases_s: list[tuple[float, float]] = []  # (sync, async) per checkpoint
        # per checkpoint: (alignment s, start delay s, in-flight bytes, unaligned)
        self.checkpoint_alignments: list[tuple[float, float, int, bool]] = []
        self.checkpoint_intervals_s: list[float] = []  # trigger to trigger
        self.completion_requests: list[int] = []  # per completed checkpoint
        self.metadata_bytes: list[int] = []  # per completed checkpoint
        self.in_flight_max = 0
        self.materializations_completed = 0
        self.materializations_abandoned = 0
        # per applied epoch: (seconds from its trigger to its application, bytes of
        # every task's snapshot, bytes written for it; the rest was reused)
        self.materializations: list[tuple[float, int, int]] = []
        self.messages_fenced = 0
        self.messages_rejected = 0
        self.rejections: Counter[str] = Counter()  # refusal kind -> messages
        self.deletions_refused = 0  # released paths outside the object prefixes, kept
        self.objects_deleted = 0
        self.orphans_deleted = 0
        self.stale_metadata_deleted = 0

    # -- queries -----------------------------------------------------------------------
    @property
    def latest(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint (the newest retained), or None."""
        return self.retained[-1] if self.retained else None

    @property
    def tasks_without_node(self) -> int:
        """Tasks of the current attempt that said hello without an aggregator node
        (their changelog goes straight to the DFS)."""
        if self.attempt is None:
            return 0
        return len(self._without_node.get(self.attempt, set()))

    @property
    def _writing(self) -> tuple[int, ...]:
        """Ids of the checkpoints whose commit record is being written (ascending)."""
        return tuple(c for c, p in self._inflight.items() if p.persisting)

    def in_flight(self) -> list[int]:
        """Ids of the checkpoints in flight (triggered, not written or aborted), ascending."""
        return list(self._inflight)

    def acks_of(self, checkpoint_id: int) -> dict[int, TaskCheckpoint]:
        """task -> its acknowledgement of checkpoint ``checkpoint_id`` in flight (a
        copy; empty for a checkpoint not in flight)."""
        p = self._inflight.get(checkpoint_id)
        return {} if p is None else dict(p.acks)

    def all_connected(self) -> bool:
        """Every task of the current attempt said hello."""
        peers = self._peers.get(self.attempt, {}) if self.attempt is not None else {}
        return self.attempt is not None and len(peers) >= self.num_tasks

    def sweep_scope(self) -> tuple[frozenset[str], float | None] | None:
        """What an orphan sweep may delete now (coordinator/sweep.py): the paths to
        spare (referenced by a retained checkpoint, a pending acknowledgement or
        report) and the wall-clock time (epoch seconds) before which an unreferenced
        file can no longer become referenced: the trigger of the latest checkpoint
        (a live task's files written before it are named by it or garbage), or that
        of a pending materialization epoch if earlier. The time is None (any age) once
        the run is finished and every task was sent Finish; then only what a retained
        checkpoint references is spared (a materialization left pending at the end is
        never applied). None when no sweep is safe: no checkpoint or wall clock yet, an
        applied epoch no checkpoint names, or a wall clock that jumped during the run
        (coordinator/wallclock.py)."""
        peers = self._peers.get(self.attempt, {}) if self.attempt is not None else {}
        done = self.finished is not None and self.all_connected()
        if done and all(i in self._finish_sent for i in peers.values()):
            return frozenset(self.registry.referenced()), None
        keep = set(self.registry.referenced())
        if self._split_log is not None:
            keep.add(self._split_log.path)
        for pending in self._inflight.values():
            keep.update(p for tc in pending.acks.values() for p in tc.referenced_paths())
        if self._epoch is not None:
            keep.update(p for r in self._epoch.reports.values() for p in r.paths())
        last = self.latest
        if last is None or self.wall is None or self.applied_epoch > last.materialization_epoch:
            return None
        if self.clock.jumped:
            return None
        cutoff = last.created_at - last.duration_s
        if self._epoch is not None:
            cutoff = min(cutoff, self.wall - (self.now - self._epoch.started_at))
        if self._split_log_asked is not None:
            cutoff = min(cutoff, self._split_log_asked)
        return frozenset(keep), cutoff

    # -- entry -------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; returns the instructions to carry out, in order. Raises
        ValueError for an AttemptStarted that does not increase the attempt or has no
        tasks, InvariantError (with ``validate=True``) when an invariant breaks."""
        self.now = max(self.now, event.now)
        out = self._on_event(event)
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
            self.clock.observe(ev.now, ev.wall)
        out = self._timeouts()
        if self.splits is not None and not self._over():
            out += self.splits.maybe_list(self.now)
        if self.commits is not None:
            out += self.commits.retry(self.now)
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
        enumerator = None if self.splits is None else self.splits.restored(self.latest)
        out: list[Instruction] = []
        for cid in [c for c, p in self._inflight.items() if not p.persisting]:
            out += self._abort(cid, f"attempt {ev.attempt} started")
        if self._epoch is not None:
            out += self._abandon(f"attempt {ev.attempt} started")
        self.attempt = ev.attempt
        self.num_tasks = ev.num_tasks
        self._attempt_tasks[ev.attempt] = ev.num_tasks
        self._peers = {a: p for a, p in self._peers.items() if a >= ev.attempt}
        early = self._peers.get(ev.attempt, {})
        self._peers[ev.attempt] = {t: i for t, i in early.items() if t < ev.num_tasks}
        self._without_node = {
            a: {t for t in ts if a > ev.attempt or t < ev.num_tasks}
            for a, ts in self._without_node.items()
            if a >= ev.attempt
        }
        self._logs, self._acked_to, self._applied_sqn = {}, {}, {}
        last = self.latest
        self._restored_logs = {} if last is None else _restored_spans(last)
        self._channel_logs = set() if last is None else _channel_logs(last)
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        self._materialization_due = self.now + self.config.materialization_interval
        if self.splits is not None and enumerator is not None:
            self.splits.rebuild(enumerator, self.now)
        if self.commits is not None:
            out.append(self.commits.recover(self.retained))
        return out + self._on_connected()

    @_handle_event.register
    def _(self, ev: StopRequested) -> list[Instruction]:
        self.stop_requested = True
        return self._maybe_trigger_checkpoint() if self.all_connected() else []

    @_handle_event.register
    def _(self, ev: MessageFromTask) -> list[Instruction]:
        return self._on_message(ev.message, ev.identity)

    @_handle_event.register
    def _(self, ev: MalformedMessage) -> list[Instruction]:
        return self._reject(ev.identity, ev.reason)

    @_handle_event.register
    def _(self, ev: CheckpointWritten) -> list[Instruction]:
        return self._answered(ev)

    def _answered(self, ev: CheckpointWritten | WriteFailed) -> list[Instruction]:
        """A commit record was created or failed: confirm the records in creation
        order (a record answered before an older one waits for it)."""
        record = next(
            (r for r in self._records if r.newest == ev.checkpoint_id and r.outcome is None),
            None,
        )
        if record is None:
            return [MessageIgnored(-1, f"checkpoint {ev.checkpoint_id} was not being written")]
        record.outcome = ev
        out: list[Instruction] = []
        while self._records and self._records[0].outcome is not None:
            r = self._records.pop(0)
            if isinstance(r.outcome, CheckpointWritten):
                out += self._written(r.outcome, [i for i in r.ids if i in self._inflight])
            elif not self._records:  # failed, and no later record carries its checkpoints
                assert r.outcome is not None
                out += self._write_failed(r.outcome.reason)
        return out + self._maybe_persist()

    def _write_failed(self, reason: str) -> list[Instruction]:
        """The last record in flight failed: abort every checkpoint being written."""
        out: list[Instruction] = []
        for cid in self._writing:
            self._inflight[cid].completed = None
            out += self._abort(cid, f"write failed: {reason}")
        return out

    def _written(self, ev: CheckpointWritten, batch: list[int]) -> list[Instruction]:
        """The checkpoints ``batch`` (ascending) are durable with ``ev``'s record."""
        done: list[CompletedCheckpoint] = []
        out: list[Instruction] = []
        for cid in batch:
            p = self._inflight.pop(cid)
            assert p.completed is not None
            cp = p.completed
            duration = max(0.0, self.now - p.triggered_at)
            self.checkpoints_completed += 1
            self.checkpoint_durations_s.append(duration)
            self.checkpoint_phases_s.append(checkpoint_phases(cp))
            self.checkpoint_alignments.append(checkpoint_alignment(cp))
            size = dict(ev.metadata_bytes).get(cid, 0)
            self.completion_requests.append(ev.requests)
            self.metadata_bytes.append(size)
            self.registry.register(cp)
            self.retained.append(cp)
            if cp.final:
                self.final_written = cp
            done.append(cp)
            out.append(CheckpointCompleted(cp, duration, ev.requests, size))
        if not done:
            return out
        out += self._subsume()
        out += self._committed(done) if self.commits is None else self.commits.durable(*done)
        return out + self._maybe_compact(done[-1])

    def _without_unstarted(self, e: EnumeratorState) -> EnumeratorState:
        """``e`` without the pending splits no reader started (offset 0), marked not
        complete, when the source lists every split again after a restore
        (``Source.relists``): a backlog of files costs no metadata."""
        if self.splits is None or not self.splits.source.relists:
            return e
        started = tuple(s for s in e.pending if s.offset > 0)
        if len(started) == len(e.pending):
            return e
        return replace(e, pending=started, complete=False)

    def _maybe_compact(self, cp: CompletedCheckpoint) -> list[Instruction]:
        """A new split log of ``cp``'s finished splits when it names
        ``COMPACT_AFTER`` or more beyond the current one and none is being written."""
        if cp.enumerator is None or cp.final or self._split_log_asked is not None:
            return []  # after the final checkpoint no checkpoint would reference it
        ids = cp.enumerator.finished
        base = self._split_log.ids if self._split_log is not None else None
        if len(ids - (base or frozenset())) < COMPACT_AFTER:
            return []
        self._split_log_asked = self.wall if self.wall is not None else 0.0
        return [WriteSplitLog(frozenset(ids))]

    @_handle_event.register
    def _(self, ev: WriteFailed) -> list[Instruction]:
        return self._answered(ev)

    @_handle_event.register
    def _(self, ev: SplitLogWritten) -> list[Instruction]:
        if self._split_log_asked is None:
            return [MessageIgnored(-1, "no split log was being written")]
        self._split_log_asked = None
        self._split_log = SplitLogRef(ev.path, len(ev.ids), frozenset(ev.ids))
        return []

    @_handle_event.register
    def _(self, ev: SplitLogFailed) -> list[Instruction]:
        self._split_log_asked = None  # asked again at the next checkpoint
        return []

    @_handle_event.register
    def _(self, ev: SinkCommitted) -> list[Instruction]:
        c = self.commits
        if c is None or c.in_flight != ev.checkpoint_id:
            return [MessageIgnored(-1, f"no commit of checkpoint {ev.checkpoint_id} runs")]
        out = self._committed(c.committed(ev.checkpoint_id, ev.files))
        return out + c.next_commit()

    @_handle_event.register
    def _(self, ev: CommitFailed) -> list[Instruction]:
        c = self.commits
        if c is None or c.in_flight != ev.checkpoint_id:
            return [MessageIgnored(-1, f"no commit of checkpoint {ev.checkpoint_id} runs")]
        c.failed(self.now)
        return []

    @_handle_event.register
    def _(self, ev: SinkRecovered) -> list[Instruction]:
        c = self.commits
        if c is None or c.recovering is None:
            return [MessageIgnored(-1, "no sink recovery runs")]
        out = self._committed(c.recovered(ev.files))
        return out + c.next_commit()

    @_handle_event.register
    def _(self, ev: SinkRecoveryFailed) -> list[Instruction]:
        return []  # the attempt stays blocked: no checkpoint before a recovery

    @_handle_event.register
    def _(self, ev: SplitsListed) -> list[Instruction]:
        if self.splits is None or not self.splits.listing:
            return [MessageIgnored(-1, "no listing was outstanding")]
        self.splits.listed(self.now, ev.listing)
        return self._assign()

    @_handle_event.register
    def _(self, ev: ListingFailed) -> list[Instruction]:
        if self.splits is None or not self.splits.listing:
            return [MessageIgnored(-1, "no listing was outstanding")]
        self.splits.failed(self.now)
        return []

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
        return self._reject(identity, f"{type(message).__name__} is not a task message", "type")

    @_handle_message.register
    def _(self, message: protocol.Hello, identity: bytes) -> list[Instruction]:
        try:
            protocol.negotiate(message.versions)
        except WireError as e:
            return self._reject(identity, str(e), "version")
        task, attempt = message.task, message.attempt
        if self.attempt is not None and attempt > self.attempt:
            # early: kept for when its attempt starts (the next attempt only, bounded)
            if attempt != self.attempt + 1 or not 0 <= task < self.config.max_parallelism:
                return [MessageIgnored(task, f"attempt {attempt} has not started")]
            return self._bind(message, identity) or []
        stale = self._stale(task, attempt, identity)
        if stale is not None:
            return stale
        was_running = self.all_connected()
        rejected = self._bind(message, identity)
        if rejected is not None:
            return rejected
        if not was_running and self.all_connected():
            # the first checkpoint of an attempt one interval after its last task runs
            # (Flink's initial delay): a checkpoint at once would hold no changes
            self._checkpoint_due = max(
                self._checkpoint_due, self.now + self.config.checkpoint_interval
            )
        return self._on_connected()

    def _bind(self, message: protocol.Hello, identity: bytes) -> list[Instruction] | None:
        """Bind the task of ``message`` to ``identity`` (None), or refuse a second
        Hello of that task and attempt, or one from an identity bound to another task."""
        task, attempt = message.task, message.attempt
        peers = self._peers.setdefault(attempt, {})
        bound = peers.get(task)
        if bound is not None:
            whose = "this" if bound == identity else "another"
            reason = f"task {task} of attempt {attempt} already said hello on {whose} connection"
            return self._reject(identity, reason, "hello")
        if identity in peers.values():
            return self._reject(identity, "this connection is bound to another task", "hello")
        peers[task] = identity
        without = self._without_node.setdefault(attempt, set())
        (without.discard if message.node else without.add)(task)
        return None

    def _sender(self, task: int, attempt: int, identity: bytes) -> list[Instruction] | None:
        """None if ``identity`` is the bound connection of ``task`` of the current
        attempt; else what to answer: fenced or ignored (:meth:`_stale`), or refused."""
        stale = self._stale(task, attempt, identity)
        if stale is not None:
            return stale
        bound = self._peers.get(attempt, {}).get(task)
        if bound is None:
            return self._reject(identity, f"task {task} has not said hello", "identity")
        if bound != identity:
            return self._reject(identity, f"task {task} is bound to another connection", "identity")
        return None

    @_handle_message.register
    def _(self, message: protocol.SplitsFinished, identity: bytes) -> list[Instruction]:
        refused = self._sender(message.task, message.attempt, identity)
        if refused is not None:
            return refused
        if self.splits is None:
            return self._reject(identity, "this job has no source", "splits")
        try:
            self.splits.finish(message.task, message.split_ids)
        except ValueError as e:
            return self._reject(identity, f"splits finished: {e}", "splits")
        return self._assign()

    @_handle_message.register
    def _(self, message: protocol.Ack, identity: bytes) -> list[Instruction]:
        task, cid = message.task, message.checkpoint_id
        refused = self._sender(task, message.attempt, identity)
        if refused is not None:
            return refused
        if cid >= self.next_checkpoint_id:
            return self._reject(identity, f"checkpoint {cid} was never triggered", "checkpoint")
        p = self._inflight.get(cid)
        if p is None or p.ready:
            return [MessageIgnored(task, f"checkpoint {cid} is not pending")]
        if task in p.acks:
            return self._reject(identity, f"task {task} already acknowledged {cid}", "duplicate")
        problem = self._ack_refusal(p, message)
        if problem is not None:
            return self._reject(identity, f"checkpoint {cid}: {problem.reason}", problem.kind)
        tc = message.checkpoint
        p.acks[task] = tc
        known = self._logs.setdefault(task, {})
        for log, span in log_spans(tc).items():
            known[log] = span
            self._acked_to[task] = max(self._acked_to.get(task, 0), span[1])
        self._channel_logs.update(h.log_id for h in tc.channel_state)
        out: list[Instruction] = []
        if len(p.acks) == p.num_tasks:
            p.ready_at = self.now
            out += self._maybe_persist()
        return out + self._maybe_apply()

    def _ack_refusal(self, p: _Pending, message: protocol.Ack) -> Refusal | None:
        """Why ``message`` cannot be part of ``p`` (None if it can)."""
        tc = message.checkpoint
        if tc.task != message.task or tc.attempt != message.attempt:
            return Refusal("identity", "acknowledged state names another task or attempt")
        mp = self.config.max_parallelism
        owned = key_group_range(message.task, p.num_tasks, mp) if p.num_tasks <= mp else range(0)
        problem = checkpoint_problem(tc, self.config.object_prefixes, owned, mp)
        if problem is not None:
            return problem
        known = self._logs.get(message.task, {})
        for log, (lo, hi) in log_spans(tc).items():
            before = known.get(log) or self._restored_logs.get(log)
            if before is not None and (lo < before[0] or hi < before[1]):
                return Refusal("sqn", f"log {log[:64]!r}: SQN {lo}..{hi} moves back from {before}")
        other = _ack_problem(p, tc)
        return None if other is None else Refusal("state", other)

    @_handle_message.register
    def _(self, message: protocol.Report, identity: bytes) -> list[Instruction]:
        task, epoch = message.task, message.epoch
        refused = self._sender(task, message.attempt, identity)
        if refused is not None:
            return refused
        if epoch >= self.next_epoch:
            return self._reject(identity, f"epoch {epoch} was never started", "epoch")
        e = self._epoch
        if e is None or epoch != e.epoch:
            return [MessageIgnored(task, f"materialization epoch {epoch} is not pending")]
        if task in e.reports:
            return self._reject(identity, f"task {task} already reported {epoch}", "duplicate")
        mp, n = self.config.max_parallelism, self.num_tasks
        owned = key_group_range(task, n, mp) if n <= mp else range(mp)
        problem = snapshot_problem(message.ref, self.config.object_prefixes, owned)
        if problem is not None:
            return self._reject(identity, f"epoch {epoch}: {problem.reason}", problem.kind)
        if message.ref.sqn < self._applied_sqn.get(task, 0):
            reason = f"epoch {epoch}: snapshot SQN {message.ref.sqn} moves back"
            return self._reject(identity, reason, "sqn")
        e.reports[task] = message.ref
        return self._maybe_apply()

    def _maybe_apply(self) -> list[Instruction]:
        """Apply the pending epoch once every task reported and each report's SQN is
        within what its task acknowledged (so no task truncates what it has not
        acknowledged as durable)."""
        e = self._epoch
        if e is None or len(e.reports) < self.num_tasks:
            return []
        if any(r.sqn > self._acked_to.get(t, 0) for t, r in e.reports.items()):
            return []
        self._epoch = None
        self.applied_epoch = e.epoch
        self.materializations_completed += 1
        self.materializations.append(_materialized(e, self.now))
        self._materialization_due = self.now + self.config.materialization_interval
        refs = dict(sorted(e.reports.items()))
        self._applied_sqn.update({t: r.sqn for t, r in refs.items()})
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

    def _reject(
        self, identity: bytes | None, reason: str, kind: str = "malformed"
    ) -> list[Instruction]:
        """Refuse a message: counted (``messages_rejected``, ``rejections[kind]``),
        answered with an ErrorReply when the sender is known; nothing else changes."""
        self.messages_rejected += 1
        self.rejections[kind] += 1
        return [] if identity is None else [Reply(identity, protocol.ErrorReply(reason))]

    def _send_all(self, messages: dict[int, protocol.Command]) -> list[SendToTask]:
        """Send ``messages[task]`` to every connected task of the current attempt."""
        peers = self._peers.get(self.attempt, {}) if self.attempt is not None else {}
        return [SendToTask(t, peers[t], m) for t, m in sorted(messages.items()) if t in peers]

    def _send_each(self, message: protocol.Command) -> list[SendToTask]:
        """Send ``message`` to every connected task of the current attempt."""
        return self._send_all({t: message for t in range(self.num_tasks)})

    # -- splits, commits, the end of the run -------------------------------------------
    def _over(self) -> bool:
        """A final checkpoint is durable: nothing is triggered, listed or assigned."""
        return self.final_written is not None or self.finished is not None

    def _on_connected(self) -> list[Instruction]:
        """After a hello or a new attempt: once every task is connected, assign the
        pending splits, or, when the run is over, tell the tasks not told yet."""
        if not self.all_connected():
            return []
        if self.finished is None:
            return self._assign()
        msg = protocol.Finish(self.finished.checkpoint_id)
        sends = [i for i in self._send_each(msg) if i.identity not in self._finish_sent]
        self._finish_sent.update(i.identity for i in sends)
        return list(sends)

    def _assign(self) -> list[Instruction]:
        """Send every pending split to a reader, once every task is connected."""
        if self.splits is None or self._over() or not self.all_connected():
            return []
        assignment = self.splits.assign(self.num_tasks)
        return [
            *self._send_all({t: protocol.AssignSplits(tuple(s)) for t, s in assignment.items()})
        ]

    def _committed(self, done: list[CompletedCheckpoint]) -> list[Instruction]:
        """``done`` (oldest first) are durable and committed: CheckpointComplete of the
        newest to every task; Finish when one of them is final."""
        if not done:
            return []
        newest = done[-1].checkpoint_id
        out: list[Instruction] = []
        if newest > self.complete_sent:
            self.complete_sent = newest
            out += self._send_each(protocol.CheckpointComplete(newest))
        final = [c for c in done if c.final]
        if final and self.finished is None:
            self.finished = final[-1]
            out.append(RunFinished(final[-1]))
            out += self._on_connected()
        return out

    def _final_wanted(self) -> bool:
        """The next checkpoint triggered is final: a stop was requested, or the source
        is done and the run ends with it."""
        done = self.splits is not None and self.splits.is_finished()
        return self.stop_requested or (self.config.finish_when_source_done and done)

    # -- checkpoints -------------------------------------------------------------------
    def _timeouts(self) -> list[Instruction]:
        out: list[Instruction] = []
        late = [
            p
            for p in self._inflight.values()
            if not p.ready and self.now - p.triggered_at >= self.config.checkpoint_timeout
        ]
        for p in late:
            reason = f"timeout: {len(p.acks)}/{p.num_tasks} tasks acknowledged"
            out += self._abort(p.checkpoint_id, reason)
        if late:
            out += self._maybe_persist()
        e = self._epoch
        if e is not None and self.now - e.started_at >= self.config.materialization_timeout:
            out += self._abandon(f"timeout: {len(e.reports)}/{self.num_tasks} tasks reported")
        return out

    def _maybe_trigger_checkpoint(self) -> list[Instruction]:
        """Trigger the next checkpoint when due (at once after a stop request), with
        the enumerator's snapshot; none while ``max_concurrent_checkpoints`` are in
        flight or a final one is, while the sink recovers, or once the run is over."""
        if self._over() or len(self._inflight) >= self.config.max_concurrent_checkpoints:
            return []
        if any(p.final for p in self._inflight.values()):
            return []
        if self.commits is not None and self.commits.recovering is not None:
            return []
        at_once = self._final_wanted() and not self._aborted_last  # the run ends soon
        if self.now < self._checkpoint_due and not at_once:
            return []
        assert self.attempt is not None
        self._aborted_last = False
        cid = self.next_checkpoint_id
        self.next_checkpoint_id += 1
        final = self._final_wanted()
        snapshot = None if self.splits is None else self.splits.snapshot()
        self._inflight[cid] = _Pending(
            cid, self.attempt, self.num_tasks, self.now, self.applied_epoch, final, snapshot
        )
        interval = None if self._last_trigger is None else self.now - self._last_trigger
        if interval is not None:
            self.checkpoint_intervals_s.append(interval)
        self._last_trigger = self.now
        self._checkpoint_due = self.now + self.config.checkpoint_interval
        self.in_flight_max = max(self.in_flight_max, len(self._inflight))
        notice = CheckpointTriggered(cid, interval, len(self._inflight))
        return [notice, *self._send_each(protocol.TriggerCheckpoint(cid, final))]

    def _maybe_persist(self) -> list[Instruction]:
        """Write the oldest checkpoints in flight that every task acknowledged and no
        record holds yet, in one record, while fewer than ``max_records_in_flight``
        are being created (pipelined): the record carries the checkpoints of the
        records before it in flight too, so it stands alone if they fail. Completion
        stays in checkpoint order (a ready checkpoint waits for every older one)."""
        if len(self._records) >= self.config.max_records_in_flight:
            return []
        carried: list[CompletedCheckpoint] = []
        batch: list[_Pending] = []
        for p in self._inflight.values():  # ascending ids: inserted in trigger order
            if p.completed is not None:  # in a record in flight: carried along
                carried.append(p.completed)
                continue
            if not p.ready:
                break
            batch.append(p)
        if not batch:
            return []
        cps = [*carried, *(self._complete(p) for p in batch)]
        ids = [c.checkpoint_id for c in self.retained] + [c.checkpoint_id for c in cps]
        keep = ids[max(0, len(ids) - self.config.retained_checkpoints) :]
        self._records.append(_Record(tuple(c.checkpoint_id for c in cps)))
        return [PersistCheckpoint(cps[-1], tuple(keep), tuple(cps[:-1]))]

    def _complete(self, p: _Pending) -> CompletedCheckpoint:
        """Every task acknowledged ``p``: the record of it (kept while written)."""
        ready = p.ready_at if p.ready_at is not None else self.now
        acks = dict(sorted(p.acks.items()))
        enumerator = p.enumerator
        if enumerator is not None:  # the readers' states folded in: tasks carry none
            enumerator = enumerator.resumed(s for tc in acks.values() for s in tc.splits)
            acks = {t: replace(tc, splits=()) for t, tc in acks.items()}
            enumerator = self._without_unstarted(enumerator)
        log = self._split_log
        if log is not None and (
            enumerator is None or log.ids is None or not log.ids <= enumerator.finished
        ):
            log = None
        cp = CompletedCheckpoint(
            checkpoint_id=p.checkpoint_id,
            attempt=p.attempt,
            materialization_epoch=p.epoch,
            created_at=round(self.wall - (self.now - ready) if self.wall is not None else ready, 6),
            duration_s=round(max(0.0, ready - p.triggered_at), 6),
            tasks=acks,
            parallelism=p.num_tasks,
            max_parallelism=self.config.max_parallelism,
            enumerator=enumerator,
            final=p.final,
            finished_log=log,
        )
        p.completed = cp
        return cp

    def _subsume(self) -> list[Instruction]:
        """Release the oldest checkpoints beyond retention: metadata first, then the
        objects whose count dropped to zero (only the registry decides deletions),
        of those only paths under the object prefixes (the rest is kept, counted)."""
        out: list[Instruction] = []
        while len(self.retained) > self.config.retained_checkpoints:
            old = self.retained.pop(0)
            out.append(DeleteCheckpoint(old.checkpoint_id))
            released = self.registry.unregister(old)
            prefixes = self.config.object_prefixes
            dropped = [p for p in released if path_problem(p, prefixes) is None]
            self.deletions_refused += len(released) - len(dropped)
            if dropped:
                if self._released is not None:
                    self._released.update(dropped)
                out.append(DeleteObjects(tuple(dropped), self._job_logs(old)))
        return out

    def _job_logs(self, released: CompletedCheckpoint) -> frozenset[str]:
        """The log ids this job's writers own as far as this coordinator knows: those
        of ``released``, of the retained checkpoints, of this attempt's acknowledgements
        and of the restored checkpoint, state changelogs and channel-state logs alike
        (a shared object holding a segment of any other log is kept: it may be another
        job's)."""
        logs = set(self._restored_logs) | self._channel_logs
        for spans in self._logs.values():
            logs.update(spans)
        for cp in (released, *self.retained):
            for tc in cp.tasks.values():
                logs.update(tc.log_ids())
        return frozenset(logs)

    def _abort(self, cid: int, reason: str) -> list[Instruction]:
        """Abort checkpoint ``cid`` alone (later ones in flight go on); the next trigger
        waits an interval from now."""
        del self._inflight[cid]
        self.checkpoints_aborted += 1
        self._checkpoint_due = max(self._checkpoint_due, self.now + self.config.checkpoint_interval)
        self._aborted_last = cid == self.next_checkpoint_id - 1
        return [CheckpointAborted(cid, reason)]

    # -- materialization ---------------------------------------------------------------
    def _maybe_trigger_materialization(self) -> list[Instruction]:
        if self._epoch is not None or self.now < self._materialization_due:
            return []
        if self._over() or any(p.final for p in self._inflight.values()):
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
        self.clock.validate()
        self._check_pending()
        self._check_epoch()
        self._check_retained()
        self._check_registry()
        self._check_released()
        self._check_splits()
        self._check_commits()

    def _check_pending(self) -> None:
        ids = list(self._inflight)
        _require(
            ids == sorted(ids) and len(ids) <= self.config.max_concurrent_checkpoints,
            "checkpoints in flight: ascending ids, at most max_concurrent_checkpoints",
        )
        _require(
            list(self._writing) == ids[: len(self._writing)],
            "completion in order: the records being written hold the oldest in flight",
        )
        held = {i for r in self._records for i in r.ids if i in self._inflight}
        _require(
            held == set(self._writing) and len(self._records) <= self.config.max_records_in_flight,
            "every checkpoint being written is in a record in flight, within the bound",
        )
        for p in self._inflight.values():
            self._check_one_pending(p)

    def _check_one_pending(self, p: _Pending) -> None:
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
        outside = [p for p in cp.referenced_paths() if path_problem(p, self.config.object_prefixes)]
        _require(
            not outside,
            f"checkpoint {cp.checkpoint_id} references only paths under the object prefixes: "
            f"{sorted(outside)[:3]}",
        )
        n = self._attempt_tasks.get(cp.attempt)
        _require(
            n is not None and set(cp.tasks) == set(range(n)) and cp.parallelism == n,
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

    def _check_splits(self) -> None:
        if self.splits is None:
            return
        broken = self.splits.violation(self.num_tasks)
        _require(broken is None, str(broken))

    def _check_commits(self) -> None:
        f = self.finished
        _require(
            f is None or (f.final and self.final_written is not None),
            "the run finishes with a durable final checkpoint",
        )
        c = self.commits
        if c is None:
            _require(
                self.latest is None or self.complete_sent <= self.latest.checkpoint_id,
                "no CheckpointComplete before its checkpoint is durable",
            )
            return
        _require(
            self.complete_sent <= c.committed_through,
            "no CheckpointComplete before its commit",
        )
        _require(
            f is None or f.checkpoint_id <= c.committed_through,
            "the run finishes only once its final checkpoint is committed",
        )
        ids = [cp.checkpoint_id for cp in c.pending]
        _require(
            ids == sorted(set(ids)) and all(i > c.committed_through for i in ids),
            "checkpoints awaiting their commit: distinct, oldest first, none committed",
        )
        _require(
            c.in_flight is None or c.in_flight in ids,
            "a running commit is of a durable checkpoint awaiting its commit",
        )


def _ack_problem(p: _Pending, tc: TaskCheckpoint) -> str | None:
    """Why an acknowledgement cannot be part of ``p`` (None if it can): a committable
    of another task or attempt, or reader split states that do not fit the
    enumerator snapshot of the trigger (the checkpoint could not be restored)."""
    if any(c.task != tc.task or c.attempt != tc.attempt for c in tc.committables):
        return "a committable of another task or attempt"
    if tc.splits and p.enumerator is None:
        return "split states, but the job has no source"
    if p.enumerator is not None:
        try:
            p.enumerator.resumed(tc.splits)
        except ValueError as e:
            return f"split states do not fit the enumerator: {e}"
    return None


def _require(ok: bool, invariant: str) -> None:
    if not ok:
        raise InvariantError(invariant)


def _channel_logs(cp: CompletedCheckpoint) -> set[str]:
    """The channel-state log ids of every task of ``cp``."""
    return {h.log_id for tc in cp.tasks.values() for h in tc.channel_state}


def _restored_spans(cp: CompletedCheckpoint) -> dict[str, tuple[int, int]]:
    """log id -> SQN span of every task's handles in ``cp`` (the restored position)."""
    spans: dict[str, tuple[int, int]] = {}
    for tc in cp.tasks.values():
        for log, (lo, hi) in log_spans(tc).items():
            old = spans.get(log)
            spans[log] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return spans
