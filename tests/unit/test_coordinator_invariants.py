"""Hypothesis drives the coordinator state with random event sequences (ticks, new
attempts, hellos, acks of current and stale attempts, write results, reports) and checks
its invariants after every step: the registry counts equal the references of the
retained checkpoints; nothing deleted is still referenced; acks of a stale attempt never
complete a checkpoint."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointWritten,
    CommitFailed,
    DeleteObjects,
    Event,
    Instruction,
    ListingFailed,
    MessageFromTask,
    PersistCheckpoint,
    Reply,
    SinkCommitted,
    SinkRecovered,
    SinkRecoveryFailed,
    SplitsListed,
    Started,
    StopRequested,
    Tick,
    WriteFailed,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.testing import handle
from dstltree.sparkplug.sources import MemorySource

CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=3.0,
    checkpoint_timeout=4.0,
    retained_checkpoints=2,
    materialization_timeout=6.0,
    object_prefixes=("o/",),
)
POOL = [f"o/obj-{i}" for i in range(8)]


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = self.make_state()
        self.now = 0.0
        self.attempt = -1
        self.num_tasks: dict[int, int] = {}
        self.deleted: set[str] = set()
        self.persisting: PersistCheckpoint | None = None
        self.fresh = 0
        self.sqn: dict[int, int] = {}  # task -> next SQN its log acknowledges from
        self.feed(Started(0.0))

    def make_state(self) -> CoordinatorState:
        return CoordinatorState(CFG, validate=True)

    def feed(self, event: Event) -> list[Instruction]:
        out = self.s.handle(event)  # validate=True: validate() ran after the event
        for ins in out:
            if isinstance(ins, DeleteObjects):
                self.deleted.update(ins.paths)
            if isinstance(ins, PersistCheckpoint):
                self.persisting = ins
        return out

    # -- rules -------------------------------------------------------------------------
    @rule(dt=st.floats(0.0, 3.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick(self.now))

    @rule(num_tasks=st.integers(1, 3))
    def new_attempt(self, num_tasks: int) -> None:
        self.attempt += 1
        self.num_tasks[self.attempt] = num_tasks
        self.feed(AttemptStarted(self.now, self.attempt, num_tasks))

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data())
    def hello(self, data: st.DataObject) -> None:
        attempt = data.draw(st.integers(0, self.attempt), label="attempt")
        task = data.draw(st.integers(0, self.num_tasks[attempt] - 1), label="task")
        out = self.feed(self._message(task, attempt, protocol.Hello(task, attempt)))
        self._fenced_if_stale(task, attempt, out)

    @precondition(lambda self: self.attempt >= 0)
    @rule()
    def connect_all(self) -> None:
        for t in range(self.num_tasks[self.attempt]):
            self.feed(self._message(t, self.attempt, protocol.Hello(t, self.attempt)))

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        attempt = data.draw(st.integers(0, self.attempt), label="attempt")
        task = data.draw(st.integers(0, self.num_tasks[attempt] - 1), label="task")
        self._ack(data, task, attempt)

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data(), stale=st.booleans())
    def every_task_acks(self, data: st.DataObject, stale: bool) -> None:
        """All tasks of the current (or, if ``stale``, the previous) attempt ack."""
        attempt = max(0, self.attempt - 1) if stale else self.attempt
        for task in range(self.num_tasks[attempt]):
            self._ack(data, task, attempt)

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data())
    def checkpoint_round(self, data: st.DataObject) -> None:
        """A whole round: connect, wait an interval, every task acks, written."""
        self.connect_all()
        self.tick(CFG.checkpoint_interval)
        self.every_task_acks(data, stale=False)
        if self.persisting is not None:
            self.write_result(ok=True)

    def _ack(self, data: st.DataObject, task: int, attempt: int) -> None:
        pending = self.s.next_checkpoint_id - 1
        ids = st.one_of(st.just(pending), st.integers(1, pending + 1))
        cid = data.draw(ids, label="checkpoint")
        live = [p for p in POOL if p not in self.deleted]
        paths = (
            data.draw(st.lists(st.sampled_from(live), max_size=3), label="paths") if live else []
        )
        if data.draw(st.booleans(), label="new object"):
            self.fresh += 1
            paths.append(f"o/new-{self.fresh}")
        lo = self.sqn.get(task, 0)
        self.sqn[task] = lo + len(paths)  # SQNs never move back, across attempts too
        tc = TaskCheckpoint(task, attempt, 0, None, (handle(f"log-{task}", paths, lo),))
        out = self.feed(self._message(task, attempt, protocol.Ack(task, attempt, cid, tc)))
        self._fenced_if_stale(task, attempt, out)

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data())
    def report(self, data: st.DataObject) -> None:
        task = data.draw(st.integers(0, self.num_tasks[self.attempt] - 1), label="task")
        epoch = data.draw(st.integers(1, self.s.next_epoch), label="epoch")
        ref = MaterializedRef(f"o/snap-{epoch}-{task}", 0, 1)
        msg = protocol.Report(task, self.attempt, epoch, ref)
        self.feed(self._message(task, self.attempt, msg))

    @precondition(lambda self: self.persisting is not None)
    @rule(ok=st.booleans())
    def write_result(self, ok: bool) -> None:
        assert self.persisting is not None
        cid = self.persisting.checkpoint.checkpoint_id
        self.persisting = None
        self.now += 0.01
        self.feed(CheckpointWritten(self.now, cid) if ok else WriteFailed(self.now, cid, "x"))

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def registry_counts_equal_references_of_retained(self) -> None:
        refs = Counter(p for cp in self.s.retained for p in cp.referenced_paths())
        assert self.s.registry.counts() == dict(refs)

    @invariant()
    def nothing_deleted_is_still_referenced(self) -> None:
        live = set().union(*(cp.referenced_paths() for cp in self.s.retained))
        assert not (self.deleted & live)

    @invariant()
    def completed_checkpoints_hold_one_ack_per_task_of_their_attempt(self) -> None:
        for cp in self.s.retained:
            self._check_complete(cp)
        if self.persisting is not None:
            self._check_complete(self.persisting.checkpoint)

    # -- helpers -----------------------------------------------------------------------
    def _message(self, task: int, attempt: int, msg: protocol.Message) -> MessageFromTask:
        return MessageFromTask(self.now, f"{attempt}/{task}".encode(), msg)

    def _fenced_if_stale(self, task: int, attempt: int, out: list[Instruction]) -> None:
        """A message of an older attempt gets exactly one Fenced reply, nothing else."""
        if attempt < self.attempt:
            identity = self._message(task, attempt, protocol.Hello(task, attempt)).identity
            assert out == [Reply(identity, protocol.Fenced(attempt))]

    def _check_complete(self, cp: CompletedCheckpoint) -> None:
        assert set(cp.tasks) == set(range(self.num_tasks[cp.attempt]))
        assert all(tc.attempt == cp.attempt for tc in cp.tasks.values())


CoordinatorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_coordinator_invariants = CoordinatorMachine.TestCase


class SourceSinkMachine(CoordinatorMachine):
    """The same with a source (splits listed, assigned, finished; more added until
    the source finishes) and a sink (recoveries and commits that succeed or fail),
    and stop requests: validate() also checks that a split is never both assigned and
    finished, no CheckpointComplete precedes its commit, and the run finishes only
    with a durable, committed final checkpoint."""

    def make_state(self) -> CoordinatorState:
        self.source = MemorySource({f"s{i}": [{"i": i}] for i in range(4)}, finished=False)
        self.added = 0
        return CoordinatorState(CFG, source=self.source, commit_sink=True, validate=True)

    @precondition(lambda self: self.s.splits is not None and self.s.splits.listing)
    @rule(ok=st.booleans())
    def answer_listing(self, ok: bool) -> None:
        listing = self.source.list_splits()
        self.feed(SplitsListed(self.now, listing) if ok else ListingFailed(self.now, "x"))

    @rule(finish=st.booleans())
    def more_splits(self, finish: bool) -> None:
        if self.source.finished:
            return
        self.added += 1
        self.source.add_split(f"n{self.added}", [{"i": 0}])
        if finish:
            self.source.finish()

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data())
    def splits_finished(self, data: st.DataObject) -> None:
        """A task finishes splits: mostly its own, sometimes another's or unknown."""
        e = self.s.splits.enumerator if self.s.splits is not None else None
        n = self.num_tasks[self.attempt]
        pairs = [(t, x.split.id) for t in range(n) for x in e.assigned_to(t)] if e else []
        task, sid = data.draw(st.sampled_from(pairs or [(0, "none")]), label="split")
        if data.draw(st.booleans(), label="someone else"):
            task = data.draw(st.integers(0, n - 1), label="task")
        msg = protocol.SplitsFinished(task, self.attempt, (sid,))
        self.feed(self._message(task, self.attempt, msg))

    @precondition(lambda self: self.s.commits is not None and self.s.commits.in_flight)
    @rule(ok=st.booleans())
    def commit_result(self, ok: bool) -> None:
        assert self.s.commits is not None and self.s.commits.in_flight is not None
        cid = self.s.commits.in_flight
        self.now += 0.01
        self.feed(SinkCommitted(self.now, cid, 1) if ok else CommitFailed(self.now, cid, "x"))

    @precondition(lambda self: self.s.commits is not None and self.s.commits.recovering is not None)
    @rule(ok=st.booleans())
    def recovery_result(self, ok: bool) -> None:
        self.feed(SinkRecovered(self.now, 0, 0) if ok else SinkRecoveryFailed(self.now, "x"))

    @precondition(lambda self: self.attempt >= 0)
    @rule(data=st.data())
    def checkpoint_round(self, data: st.DataObject) -> None:
        """A whole round, the sink recovered and splits listed first, committed after."""
        c = self.s.commits
        if c is not None and c.recovering is not None:
            self.recovery_result(ok=True)
        if self.s.splits is not None and self.s.splits.listing:
            self.answer_listing(ok=True)
        super().checkpoint_round(data)
        if c is not None and c.in_flight is not None:
            self.commit_result(ok=True)

    @rule()
    def stop(self) -> None:
        self.feed(StopRequested(self.now))

    @invariant()
    def finished_run_is_final_and_committed(self) -> None:
        f = self.s.finished
        c = self.s.commits
        assert f is None or (f.final and c is not None and f.checkpoint_id <= c.committed_through)


SourceSinkMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None
)
test_coordinator_invariants_with_source_and_sink = SourceSinkMachine.TestCase
