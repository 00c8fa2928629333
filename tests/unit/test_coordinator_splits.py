"""The coordinator state with a source (FLIP-27 split enumerator): discovery off the
loop, assignment once every task said hello, finished splits, the final checkpoint at
the end of the input or after a stop request, Finish, and the enumerator restored
(and rescaled) from a checkpoint. Every state validates its invariants after every
event."""

from __future__ import annotations

import pytest

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import CompletedCheckpoint, TaskCheckpoint
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointWritten,
    Instruction,
    ListingFailed,
    ListSplits,
    PersistCheckpoint,
    Reply,
    RunFinished,
    SendToTask,
    SplitsListed,
    Started,
    StopRequested,
    Tick,
    WriteFailed,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.sparkplug.sources import EnumeratorState, MemorySource, Split, SplitState
from tests.support.coordinator_events import (
    ack,
    assigned,
    committable,
    feed,
    finished,
    hello,
    ident,
    of_type,
    sends,
)

CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=100.0,
    checkpoint_timeout=5.0,
    discovery_interval=0.5,
    max_parallelism=64,
)


def _source(*ids: str, done: bool = True) -> MemorySource:
    return MemorySource({i: [{"i": n} for n in range(3)] for i in ids}, finished=done)


def triggers(cid: int, attempt: int, num_tasks: int, final: bool = False) -> list[Instruction]:
    msg = protocol.TriggerCheckpoint(cid, final)
    return [SendToTask(t, ident(t, attempt), msg) for t in range(num_tasks)]


def _list(s: CoordinatorState, now: float) -> list[Instruction]:
    """Tick at ``now`` (a listing must be due) and answer the listing at once."""
    out = feed(s, Tick(now))
    (ls,) = of_type(out, ListSplits)
    assert isinstance(ls, ListSplits)
    return out + feed(s, SplitsListed(now, ls.enumerator.list_splits()))


def _running(
    src: MemorySource, num_tasks: int, cfg: CoordinatorConfig = CFG
) -> tuple[CoordinatorState, list[Instruction]]:
    """Attempt 0 started at 0.0, its splits listed, every task connected; returns the
    state and the instructions of the hellos (the first assignment)."""
    s = CoordinatorState(cfg, source=src, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, num_tasks))
    _list(s, 0.0)
    return s, feed(s, *(hello(0.0, t, 0) for t in range(num_tasks)))


def _checkpoint(s: CoordinatorState, now: float, splits: dict[int, list[SplitState]]) -> list:
    """Every task acks the pending checkpoint; returns the instructions of the write."""
    assert s.attempt is not None
    cid = s.next_checkpoint_id - 1
    out = feed(s, *(ack(now, t, s.attempt, cid, ss) for t, ss in splits.items()))
    (persist,) = out
    assert isinstance(persist, PersistCheckpoint)
    return feed(s, CheckpointWritten(now, cid))


def test_splits_are_assigned_once_every_task_said_hello() -> None:
    s = CoordinatorState(CFG, source=_source("a", "b", "c"), validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 2))
    (ls,) = feed(s, Tick(0.0))
    assert isinstance(ls, ListSplits)
    assert feed(s, Tick(0.7)) == []  # never two listings at a time
    assert feed(s, SplitsListed(0.8, ls.enumerator.list_splits())) == []  # no task yet
    assert feed(s, hello(0.9, 0, 0)) == []
    out = feed(s, hello(0.9, 1, 0))
    assert assigned(out) == {0: [("a", 0), ("c", 0)], 1: [("b", 0)]}
    assert s.splits is not None and s.splits.splits_discovered == 3
    assert feed(s, Tick(1.8)) == []  # the first checkpoint an interval after the last hello
    assert feed(s, Tick(1.9)) == triggers(1, 0, 2)  # the listing was complete: no more
    assert not of_type(feed(s, Tick(9.0)), ListSplits)


def test_discovery_every_interval_after_failures_and_ordered_with_triggers() -> None:
    src = _source("a", done=False)
    s = CoordinatorState(CFG, source=src, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 1))
    assert feed(s, hello(0.0, 0, 0)) == []  # nothing listed yet
    assert of_type(feed(s, Tick(0.0)), ListSplits)
    assert feed(s, ListingFailed(0.1, "SourceError: cannot list")) == []
    assert s.splits is not None and s.splits.listings_failed == 1
    assert feed(s, Tick(0.5)) == []  # retried an interval after the failure
    assert assigned(_list(s, 0.6)) == {0: [("a", 0)]}
    src.add_split("b", [{"i": 0}])
    assert feed(s, Tick(1.0)) == triggers(1, 0, 1)  # its snapshot: only a is assigned
    out = _list(s, 1.1)
    assert assigned(out) == {0: [("b", 0)]}  # sent after the trigger, so after its barrier
    done, *_ = _checkpoint(s, 1.2, {0: [SplitState(Split("a"), 1)]})
    assert isinstance(done, CheckpointCompleted)
    snap = done.checkpoint.enumerator
    # the readers' states folded into the snapshot: a resumes at offset 1
    assert snap is not None and not snap.assigned and not snap.complete
    assert snap.pending == (SplitState(Split("a"), 1),)
    assert all(not tc.splits for tc in done.checkpoint.tasks.values())
    src.finish()
    (ls,) = of_type(feed(s, Tick(1.6)), ListSplits)  # an interval after the last answer
    assert isinstance(ls, ListSplits)
    assert not of_type(feed(s, Tick(2.5)), ListSplits)  # still outstanding
    assert feed(s, SplitsListed(2.6, ls.enumerator.list_splits())) == []
    assert s.splits.enumerator is not None and s.splits.enumerator.listing_complete()
    assert not of_type(feed(s, Tick(5.0), Tick(9.0)), ListSplits)  # complete: no more


@pytest.mark.parametrize("when_done", [True, False])
def test_finished_input_makes_the_next_checkpoint_final_then_finish(when_done: bool) -> None:
    cfg = CoordinatorConfig(1.0, 100.0, 5.0, finish_when_source_done=when_done)
    s, first = _running(_source("a", "b"), 2, cfg)
    assert assigned(first) == {0: [("a", 0)], 1: [("b", 0)]}
    assert feed(s, Tick(1.0)) == triggers(1, 0, 2)  # splits are still being read
    assert feed(s, finished(1.1, 0, 0, "a"), finished(1.1, 1, 0, "b")) == []
    a, b = SplitState(Split("a"), 3, True), SplitState(Split("b"), 3, True)
    out = _checkpoint(s, 1.2, {0: [a], 1: [b]})
    assert not of_type(out, RunFinished)
    assert sends(out, protocol.CheckpointComplete) == {
        0: protocol.CheckpointComplete(1),
        1: protocol.CheckpointComplete(1),
    }
    # the input is read: the final checkpoint goes at the next tick, not an interval
    # (1.0 s) after the last one; without finishing, the next one waits its interval
    assert feed(s, Tick(1.25)) == (triggers(2, 0, 2, final=True) if when_done else [])
    if not when_done:
        assert feed(s, Tick(2.2)) == triggers(2, 0, 2)
    out = _checkpoint(s, 2.3, {0: [a], 1: [b]})
    if not when_done:
        assert s.finished is None and not of_type(out, RunFinished)
        return
    cp = out[0].checkpoint
    assert cp.final and s.finished == cp
    assert out[-3:] == [
        RunFinished(cp),
        SendToTask(0, ident(0, 0), protocol.Finish(2)),
        SendToTask(1, ident(1, 0), protocol.Finish(2)),
    ]
    assert feed(s, Tick(50.0), Tick(200.0)) == []  # nothing triggered once over
    # A later attempt (a task died after Finish) is told at once.
    feed(s, AttemptStarted(300.0, 1, 1))
    assert feed(s, hello(300.0, 0, 1)) == [SendToTask(0, ident(0, 1), protocol.Finish(2))]
    out = feed(s, hello(300.0, 0, 1))  # a second hello is refused; told once
    assert not of_type(out, SendToTask) and s.rejections == {"hello": 1}


def test_splits_finished_that_do_not_fit_are_rejected() -> None:
    s, _ = _running(_source("a", "b"), 2)
    out = feed(s, finished(0.1, 1, 0, "a"))  # a is task 0's
    assert out == [
        Reply(
            ident(1, 0),
            protocol.ErrorReply("splits finished: split 'a' is not assigned to reader 1"),
        )
    ]
    (reply,) = feed(s, finished(0.1, 0, 0, "zzz"))
    assert isinstance(reply, Reply) and isinstance(reply.message, protocol.ErrorReply)
    assert feed(s, finished(0.1, 0, 0, "a"), finished(0.1, 0, 0, "a")) == []  # idempotent
    assert s.messages_rejected == 2
    feed(s, AttemptStarted(0.2, 1, 2))
    assert feed(s, finished(0.2, 1, 0, "b")) == [Reply(ident(1, 0), protocol.Fenced(0))]
    plain = CoordinatorState(CFG, validate=True)  # no source
    feed(plain, AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0))
    (reply,) = feed(plain, finished(0.0, 0, 0, "a"))
    assert reply == Reply(ident(0, 0), protocol.ErrorReply("this job has no source"))


def test_stop_request_triggers_a_final_checkpoint_at_once_or_after_the_pending() -> None:
    s = CoordinatorState(CFG, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 2), hello(0.0, 0, 0), hello(0.0, 1, 0))
    assert feed(s, StopRequested(0.2)) == triggers(1, 0, 2, final=True)
    s = CoordinatorState(CFG, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 2), hello(0.0, 0, 0), hello(0.0, 1, 0))
    assert feed(s, Tick(1.0)) == triggers(1, 0, 2)
    assert feed(s, StopRequested(1.1)) == []  # one checkpoint at a time
    out = _checkpoint(s, 1.2, {0: [], 1: []})
    assert not out[0].checkpoint.final
    assert feed(s, Tick(1.2)) == triggers(2, 0, 2, final=True)  # not an interval later
    out = _checkpoint(s, 1.3, {0: [], 1: []})
    assert s.finished is not None and s.finished.checkpoint_id == 2
    assert out[-2:] == [SendToTask(t, ident(t, 0), protocol.Finish(2)) for t in range(2)]


def test_an_aborted_final_checkpoint_is_followed_by_another_final_one() -> None:
    s = CoordinatorState(CFG, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0))
    assert feed(s, StopRequested(0.1)) == triggers(1, 0, 1, final=True)
    # the next final one a checkpoint interval (1.0 s) later: a lasting failure costs
    # one attempt per interval, not one per tick
    assert feed(s, Tick(6.0)) == [CheckpointAborted(1, "timeout: 0/1 tasks acknowledged")]
    assert feed(s, Tick(6.5)) == []
    assert feed(s, Tick(7.0)) == triggers(2, 0, 1, final=True)
    feed(s, ack(7.1, 0, 0, 2))
    assert feed(s, WriteFailed(7.2, 2, "disk full")) == [
        CheckpointAborted(2, "write failed: disk full")
    ]
    assert feed(s, Tick(7.2)) == []
    assert feed(s, Tick(8.2)) == triggers(3, 0, 1, final=True)
    _checkpoint(s, 8.3, {0: []})
    assert s.finished is not None and s.finished.checkpoint_id == 3


def _restorable() -> CompletedCheckpoint:
    """Checkpoint 4 of attempt 0 (2 tasks): a assigned to reader 0 (read to offset 3
    since), b to reader 1 (finished since), c finished, d pending."""
    snap = EnumeratorState(
        pending=(SplitState(Split("d")),),
        assigned={"a": (0, SplitState(Split("a"))), "b": (1, SplitState(Split("b"), 2))},
        finished=frozenset({"c"}),
        complete=True,
    )
    tasks = {
        0: TaskCheckpoint(0, 0, splits=(SplitState(Split("a"), 3),)),
        1: TaskCheckpoint(1, 0, splits=(SplitState(Split("b"), 5, True),)),
    }
    return CompletedCheckpoint(4, 0, 0, 0.0, 0.0, tasks, 2, 64, snap)


@pytest.mark.parametrize("num_tasks", [1, 2, 3])
def test_enumerator_restored_from_a_checkpoint_with_reader_states(num_tasks: int) -> None:
    s = CoordinatorState(CFG, [_restorable()], source=_source("a", "b", "c", "d"), validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 1, num_tasks))
    out = feed(s, *(hello(0.0, t, 1) for t in range(num_tasks)))
    expected = {0: [("a", 3), ("d", 0)]} if num_tasks == 1 else {0: [("a", 3)], 1: [("d", 0)]}
    assert assigned(out) == expected
    assert not of_type(feed(s, Tick(0.5)), ListSplits)  # restored complete: no listing
    assert feed(s, Tick(1.0)) == triggers(5, 1, num_tasks)


def test_rescaled_attempt_reassigns_the_unfinished_splits() -> None:
    s, first = _running(_source("s0", "s1", "s2", "s3", "s4"), 2)
    assert assigned(first) == {
        0: [("s0", 0), ("s2", 0), ("s4", 0)],
        1: [("s1", 0), ("s3", 0)],
    }
    feed(s, finished(0.5, 0, 0, "s0"))
    feed(s, Tick(1.0))
    st = {sid: SplitState(Split(sid), off) for sid, off in [("s2", 1), ("s1", 2), ("s3", 0)]}
    reader0 = [SplitState(Split("s0"), 3, True), st["s2"], SplitState(Split("s4"))]
    done, *_ = _checkpoint(s, 1.1, {0: reader0, 1: [st["s1"], st["s3"]]})
    cp = done.checkpoint
    assert (cp.parallelism, cp.max_parallelism, cp.final) == (2, 64, False)
    assert cp.enumerator is not None and cp.enumerator.finished == {"s0"}
    feed(s, finished(1.2, 1, 0, "s1"))  # after the checkpoint: read again after restore
    feed(s, AttemptStarted(2.0, 1, 3))
    out = feed(s, *(hello(2.0, t, 1) for t in range(3)))
    # the splits started before the cut resume at their offsets; those no reader had
    # started were left out of the checkpoint (Source.relists) and are listed again
    assert cp.enumerator.pending == (st["s1"], st["s2"]) and not cp.enumerator.complete
    assert assigned(out) == {0: [("s1", 2)], 1: [("s2", 1)]}
    assert assigned(_list(s, 2.0)) == {0: [("s4", 0)], 2: [("s3", 0)]}
    assert feed(s, Tick(3.0)) == triggers(2, 1, 3)


def test_acks_whose_split_states_do_not_fit_the_snapshot_are_rejected() -> None:
    s, _ = _running(_source("a", "b"), 2)
    feed(s, Tick(1.0))
    (reply,) = feed(s, ack(1.0, 0, 0, 1, [SplitState(Split("zzz"), 1)]))
    assert isinstance(reply, Reply) and isinstance(reply.message, protocol.ErrorReply)
    assert "unknown split 'zzz'" in reply.message.reason
    (reply,) = feed(s, ack(1.0, 0, 0, 1, committables=[committable(1, 1)]))  # task 1's
    assert isinstance(reply, Reply) and "another task" in str(reply.message)
    feed(s, ack(1.0, 0, 0, 1, [SplitState(Split("a"), 2)]))
    (persist,) = feed(s, ack(1.0, 1, 0, 1, [SplitState(Split("b"), 1)]))
    assert isinstance(persist, PersistCheckpoint)
