"""The coordinator state as the driver of the sink's two-phase commit: recovery at
every attempt before any trigger, a commit once a checkpoint is durable and
CheckpointComplete only after it, failed commits retried (with the next checkpoint or
on a timer) and never skipped, Finish only once the final checkpoint is committed."""

from __future__ import annotations

import pytest

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import CompletedCheckpoint, TaskCheckpoint
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointCompleted,
    CheckpointWritten,
    CommitFailed,
    CommitSink,
    Instruction,
    MessageIgnored,
    PersistCheckpoint,
    RecoverSink,
    RunFinished,
    SendToTask,
    SinkCommitted,
    SinkRecovered,
    SinkRecoveryFailed,
    Started,
    StopRequested,
    Tick,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState, InvariantError
from dstltree.sparkplug.sinks.layout import Committable
from tests.support.coordinator_events import ack, committable, feed, hello, ident, sends

CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=100.0,
    checkpoint_timeout=5.0,
    commit_retry_interval=2.0,
)


def _retained(cid: int, *cs: Committable) -> CompletedCheckpoint:
    tasks = {0: TaskCheckpoint(0, 0, committables=cs)}
    return CompletedCheckpoint(cid, 0, 0, 0.0, 0.0, tasks, 1, 128)


def _running() -> CoordinatorState:
    """Attempt 0 (one task) started at 0.0, the sink recovered, the task connected."""
    s = CoordinatorState(CFG, commit_sink=True, validate=True)
    feed(s, Started(0.0))
    (recover,) = feed(s, AttemptStarted(0.0, 0, 1))
    assert isinstance(recover, RecoverSink)
    feed(s, SinkRecovered(0.0, 0, 0), hello(0.0, 0, 0))
    return s


def _durable(s: CoordinatorState, now: float, *cs: Committable) -> list[Instruction]:
    """Trigger at ``now``, ack with ``cs``, write; returns the write's instructions
    without the CheckpointCompleted notice."""
    (trigger,) = feed(s, Tick(now))
    assert isinstance(trigger, SendToTask)
    assert isinstance(trigger.message, protocol.TriggerCheckpoint)
    cid = trigger.message.checkpoint_id
    (persist,) = feed(s, ack(now, 0, 0, cid, committables=cs))
    assert isinstance(persist, PersistCheckpoint)
    done, *rest = feed(s, CheckpointWritten(now, cid))
    assert isinstance(done, CheckpointCompleted)
    return rest


def _complete(cid: int) -> SendToTask:
    return SendToTask(0, ident(0, 0), protocol.CheckpointComplete(cid))


def test_an_attempt_starts_with_the_recovery_of_the_sink_and_no_trigger_before() -> None:
    c1, c2, c3 = committable(1, 0), committable(2, 0), committable(2, 1)
    s = CoordinatorState(CFG, [_retained(2, c2, c3), _retained(1, c1)], commit_sink=True)
    feed(s, Started(0.0))
    assert feed(s, AttemptStarted(0.0, 0, 1)) == [
        RecoverSink((CommitSink(1, (c1,)), CommitSink(2, (c2, c3))), (c1, c2, c3))
    ]
    feed(s, hello(0.0, 0, 0))
    assert feed(s, Tick(5.0)) == []  # the sink is being recovered
    feed(s, SinkRecoveryFailed(5.0, "StorageError: down"))
    assert feed(s, Tick(9.0)) == []  # still not recovered: begin another attempt
    (recover,) = feed(s, AttemptStarted(9.0, 1, 1))
    assert isinstance(recover, RecoverSink)
    assert feed(s, hello(9.0, 0, 1), SinkRecovered(9.1, 3, 2)) == []
    assert s.commits is not None and s.commits.committed_through == 2
    assert s.commits.files_committed == 3
    out = feed(s, Tick(10.0))
    assert sends(out, protocol.TriggerCheckpoint) == {0: protocol.TriggerCheckpoint(3)}


def test_checkpoint_complete_only_after_the_commit() -> None:
    s = _running()
    c1 = committable(1, 0)
    assert _durable(s, 1.0, c1) == [CommitSink(1, (c1,))]
    assert feed(s, Tick(2.0)) != []  # the next checkpoint is triggered meanwhile
    assert feed(s, SinkCommitted(2.1, 1, 1)) == [_complete(1)]
    assert s.commits is not None and s.commits.committed_through == 1
    (ign,) = feed(s, SinkCommitted(2.2, 1, 0))  # a stray answer
    assert isinstance(ign, MessageIgnored)


def test_a_failed_commit_is_retried_with_the_next_checkpoint_and_on_a_timer() -> None:
    s = _running()
    c1, c2 = committable(1, 0), committable(2, 0)
    assert _durable(s, 1.0, c1) == [CommitSink(1, (c1,))]
    assert feed(s, CommitFailed(1.1, 1, "StorageError: down")) == []
    assert feed(s, Tick(2.0)) == [  # the retry is due at 3.1; checkpoint 2 is due
        SendToTask(0, ident(0, 0), protocol.TriggerCheckpoint(2))
    ]
    # Checkpoint 2 is durable: one commit of both (the task carried c1 again).
    assert _durable_acked(s, 2.0, 2, c1, c2) == [CommitSink(2, (c1, c2))]
    assert feed(s, CommitFailed(2.1, 2, "StorageError: down")) == []
    assert feed(s, Tick(4.0)) == [  # checkpoints go on; the retry is due at 4.1
        SendToTask(0, ident(0, 0), protocol.TriggerCheckpoint(3))
    ]
    assert feed(s, Tick(4.1)) == [CommitSink(2, (c1, c2))]
    assert feed(s, SinkCommitted(4.2, 2, 2)) == [_complete(2)]
    assert s.commits is not None
    assert (s.commits.commits_failed, s.commits.commits_completed) == (2, 1)


def _durable_acked(s: CoordinatorState, now: float, cid: int, *cs: Committable) -> list:
    (persist,) = feed(s, ack(now, 0, 0, cid, committables=cs))
    assert isinstance(persist, PersistCheckpoint)
    _, *rest = feed(s, CheckpointWritten(now, cid))
    return rest


def test_a_commit_in_flight_covers_only_what_it_carried() -> None:
    s = _running()
    c1, c2 = committable(1, 0), committable(2, 0)
    assert _durable(s, 1.0, c1) == [CommitSink(1, (c1,))]
    assert _durable(s, 2.0, c2) == []  # one commit at a time
    assert feed(s, SinkCommitted(2.1, 1, 1)) == [_complete(1), CommitSink(2, (c2,))]
    assert feed(s, SinkCommitted(2.2, 2, 1)) == [_complete(2)]


def test_finish_only_once_the_final_checkpoint_is_committed() -> None:
    s = _running()
    feed(s, StopRequested(0.5))
    c1 = committable(1, 0)
    (persist,) = feed(s, ack(0.6, 0, 0, 1, committables=(c1,)))
    assert isinstance(persist, PersistCheckpoint) and persist.checkpoint.final
    done, commit = feed(s, CheckpointWritten(0.7, 1))
    assert commit == CommitSink(1, (c1,))
    assert s.finished is None and feed(s, Tick(9.0)) == []  # over: nothing triggered
    feed(s, CommitFailed(9.1, 1, "StorageError: down"))
    assert s.finished is None
    assert feed(s, Tick(11.1)) == [commit]
    assert feed(s, SinkCommitted(11.2, 1, 1)) == [
        _complete(1),
        RunFinished(persist.checkpoint),
        SendToTask(0, ident(0, 0), protocol.Finish(1)),
    ]
    assert s.finished == persist.checkpoint


def test_a_recovery_commits_a_durable_checkpoint_whose_commit_failed() -> None:
    s = _running()
    c1 = committable(1, 0)
    _durable(s, 1.0, c1)
    feed(s, CommitFailed(1.1, 1, "x"))
    (recover,) = feed(s, AttemptStarted(1.5, 1, 1))
    assert recover == RecoverSink((CommitSink(1, (c1,)),), (c1,))
    assert feed(s, Tick(9.0)) == []  # no retry of its own while the sink recovers
    feed(s, SinkRecovered(9.1, 1, 0))
    assert s.commits is not None and s.commits.pending == []
    assert s.commits.committed_through == 1


def test_validate_refuses_checkpoint_complete_before_its_commit() -> None:
    s = _running()
    _durable(s, 1.0, committable(1, 0))
    s.complete_sent = 1
    with pytest.raises(InvariantError, match="no CheckpointComplete before its commit"):
        s.validate()


def test_a_recovery_covers_the_commit_in_flight() -> None:
    s = _running()
    c1 = committable(1, 0)
    assert _durable(s, 1.0, c1) == [CommitSink(1, (c1,))]
    (recover,) = feed(s, AttemptStarted(1.5, 1, 1))
    assert recover == RecoverSink((CommitSink(1, (c1,)),), (c1,))
    assert feed(s, SinkRecovered(1.6, 0, 0)) == []
    assert s.commits is not None and s.commits.in_flight is None
    (ign,) = feed(s, SinkCommitted(1.7, 1, 1))  # the late answer of the covered commit
    assert isinstance(ign, MessageIgnored)


def test_committables_of_committed_checkpoints_are_not_committed_again() -> None:
    s = _running()
    c1, c2 = committable(1, 0), committable(2, 0)
    assert _durable(s, 1.0, c1) == [CommitSink(1, (c1,))]
    assert feed(s, SinkCommitted(1.1, 1, 1)) == [_complete(1)]
    # The task acknowledged 2 before it heard of that commit: it still carries c1.
    assert _durable(s, 2.0, c1, c2) == [CommitSink(2, (c2,))]
