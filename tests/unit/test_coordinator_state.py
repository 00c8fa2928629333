"""The coordinator state machine: pure, driven by events, no I/O, no clock.

Every state here is built with ``validate=True``: its invariants are checked after
every event, and :func:`_feed` calls ``validate()`` once more."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import msgpack
import pytest

from dstltree.client.errors import WireError
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import MaterializedRef, TaskCheckpoint
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointDeleted,
    CheckpointWritten,
    CleanOrphans,
    DeleteCheckpoint,
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
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState, InvariantError
from dstltree.coordinator.testing import completed, handle, task_checkpoint
from tests.support.coordinator_events import without_notices

CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=10.0,
    checkpoint_timeout=5.0,
    retained_checkpoints=2,
    object_prefixes=("o/",),
)


def ident(task: int, attempt: int) -> bytes:
    return f"a{attempt}-t{task}".encode()


def hello(now: float, task: int, attempt: int) -> MessageFromTask:
    return MessageFromTask(now, ident(task, attempt), protocol.Hello(task, attempt))


def ack(
    now: float,
    task: int,
    attempt: int,
    cid: int,
    paths: Iterable[str] = (),
    snapshot: str | None = None,
    inflight: Iterable[str] = (),
) -> MessageFromTask:
    """Task ``task``'s ack of ``cid``: its state changes in ``paths``, and its in-flight
    records (channel state, log ``log-<task>-cs``) in ``inflight``: unaligned if any."""
    tc = task_checkpoint(task, attempt, paths, snapshot)
    inflight = list(inflight)
    if inflight:
        cs = (handle(f"log-{task}-cs", inflight, 100 * cid),)
        tc = replace(tc, channel_state=cs, unaligned=True, inflight_bytes=10 * len(inflight))
    return MessageFromTask(now, ident(task, attempt), protocol.Ack(task, attempt, cid, tc))


def report(now: float, task: int, attempt: int, epoch: int, ref: MaterializedRef) -> Event:
    return MessageFromTask(now, ident(task, attempt), protocol.Report(task, attempt, epoch, ref))


def triggers(cid: int, attempt: int, num_tasks: int) -> list[Instruction]:
    msg = protocol.TriggerCheckpoint(cid)
    return [SendToTask(t, ident(t, attempt), msg) for t in range(num_tasks)]


def completes(cid: int, attempt: int, num_tasks: int) -> list[Instruction]:
    msg = protocol.CheckpointComplete(cid)
    return [SendToTask(t, ident(t, attempt), msg) for t in range(num_tasks)]


def _feed(s: CoordinatorState, event: Event) -> list[Instruction]:
    out = without_notices(s.handle(event))
    s.validate()
    return out


def _started(
    num_tasks: int = 2, attempt: int = 0, cfg: CoordinatorConfig = CFG
) -> CoordinatorState:
    s = CoordinatorState(cfg, validate=True)
    assert _feed(s, Started(0.0)) == [CleanOrphans(frozenset())]
    assert _feed(s, AttemptStarted(0.0, attempt, num_tasks)) == []
    for t in range(num_tasks):
        assert _feed(s, hello(0.0, t, attempt)) == []
    return s


def _complete(
    s: CoordinatorState,
    now: float,
    paths: dict[int, list[str]],
    inflight: dict[int, list[str]] | None = None,
) -> list:
    """Trigger at ``now``, ack every task with ``paths[task]`` (and in-flight records in
    ``inflight[task]``), write at ``now + 0.1``; returns the instructions after the
    write, without the CheckpointCompleted notice and the CheckpointComplete sent to
    every task (no sink: right after the write)."""
    assert s.attempt is not None
    out = _feed(s, Tick(now))
    cid = s.next_checkpoint_id - 1
    assert out == triggers(cid, s.attempt, len(paths))
    persist: list = []
    for t, ps in paths.items():
        persist = _feed(s, ack(now, t, s.attempt, cid, ps, inflight=(inflight or {}).get(t, ())))
    assert len(persist) == 1 and isinstance(persist[0], PersistCheckpoint)
    done, *rest = _feed(s, CheckpointWritten(now + 0.1, cid))
    assert done == CheckpointCompleted(persist[0].checkpoint, pytest.approx(0.1))
    n = len(paths)
    assert rest[len(rest) - n :] == completes(cid, s.attempt, n)
    return rest[: len(rest) - n]


def test_no_trigger_until_every_task_said_hello() -> None:
    s = CoordinatorState(CFG, validate=True)
    assert _feed(s, Tick(5.0)) == []  # no attempt yet
    _feed(s, AttemptStarted(5.0, 0, 2))
    _feed(s, hello(5.0, 0, 0))
    assert _feed(s, Tick(7.0)) == []
    _feed(s, hello(7.0, 1, 0))
    # the first checkpoint one interval after the last task said hello
    assert _feed(s, Tick(7.9)) == []
    assert _feed(s, Tick(8.0)) == triggers(1, 0, 2)


def test_trigger_ack_persist_and_one_in_flight() -> None:
    s = _started()
    assert _feed(s, Tick(0.5)) == []  # interval not elapsed since attempt start
    assert _feed(s, Tick(1.0)) == triggers(1, 0, 2)
    assert _feed(s, Tick(2.5)) == []  # at most one checkpoint in flight
    assert _feed(s, ack(2.5, 0, 0, 1, ["o/a"])) == []
    (persist,) = _feed(s, ack(2.5, 1, 0, 1, ["o/b"]))
    assert isinstance(persist, PersistCheckpoint) and persist.retained == (1,)
    cp = persist.checkpoint
    assert cp.checkpoint_id == 1 and set(cp.tasks) == {0, 1}
    assert cp.referenced_paths() == {"o/a", "o/b"}
    assert cp.duration_s == pytest.approx(1.5)
    assert _feed(s, Tick(3.0)) == []  # still in flight while written
    assert _feed(s, CheckpointWritten(3.0, 1)) == [
        CheckpointCompleted(cp, pytest.approx(2.0)),
        *completes(1, 0, 2),
    ]
    assert s.checkpoints_completed == 1 and s.latest == cp
    assert s.checkpoint_durations_s == [pytest.approx(2.0)]
    assert s.registry.counts() == {"o/a": 1, "o/b": 1}
    # the next was due an interval after the trigger (2.0); with one in flight at
    # most it follows the completion at once (Flink's maxConcurrentCheckpoints 1)
    assert _feed(s, Tick(3.5)) == triggers(2, 0, 2)


def test_created_at_is_the_wall_clock_of_the_last_tick() -> None:
    s = _started(num_tasks=1)
    _feed(s, Tick(1.0, wall=1_700_000_000.0))
    (persist,) = _feed(s, ack(1.2, 0, 0, 1))
    assert persist.checkpoint.created_at == 1_700_000_000.0


def test_duplicate_acks_are_refused_and_late_acks_ignored() -> None:
    s = _started()
    _feed(s, Tick(1.0))
    _feed(s, ack(1.0, 0, 0, 1))
    (dup,) = _feed(s, ack(1.0, 0, 0, 1))  # the first one stays
    assert dup == Reply(ident(0, 0), protocol.ErrorReply("task 0 already acknowledged 1"))
    (bad,) = _feed(s, ack(1.0, 1, 0, 9))
    assert bad == Reply(ident(1, 0), protocol.ErrorReply("checkpoint 9 was never triggered"))
    (ign,) = _feed(s, ack(1.0, 5, 0, 1))
    assert ign == MessageIgnored(5, "task 5 outside 0..1")
    wrong = protocol.Ack(1, 0, 1, task_checkpoint(0, 0))  # names another task
    (ref,) = _feed(s, MessageFromTask(1.0, ident(1, 0), wrong))
    assert isinstance(ref, Reply) and "another task" in str(ref.message)
    assert s.checkpoints_completed == 0 and s.rejections == {
        "duplicate": 1,
        "checkpoint": 1,
        "identity": 1,
    }


def test_stale_attempt_is_fenced_and_a_second_attempt_continues() -> None:
    s = _started(attempt=0)
    _feed(s, Tick(1.0))
    _feed(s, ack(1.0, 0, 0, 1, ["o/a"]))
    # The attempt fails; attempt 1 starts: the pending checkpoint is aborted.
    assert _feed(s, AttemptStarted(2.0, 1, 2)) == [CheckpointAborted(1, "attempt 1 started")]
    fenced = protocol.Fenced(0)
    assert _feed(s, ack(2.0, 1, 0, 1)) == [Reply(ident(1, 0), fenced)]
    assert _feed(s, hello(2.0, 0, 0)) == [Reply(ident(0, 0), fenced)]
    ref = MaterializedRef("o/s", 1, 1)
    assert _feed(s, report(2.0, 0, 0, 1, ref)) == [Reply(ident(0, 0), fenced)]
    assert s.messages_fenced == 3
    with pytest.raises(ValueError):
        s.handle(AttemptStarted(2.0, 1, 2))
    # Tasks of attempt 1 connect; a new checkpoint id is used, acks of 0 never count.
    _feed(s, hello(2.0, 0, 1))
    _feed(s, hello(2.0, 1, 1))
    assert _feed(s, Tick(3.0)) == triggers(2, 1, 2)
    assert _feed(s, ack(3.0, 0, 0, 2)) == [Reply(ident(0, 0), fenced)]
    assert _feed(s, ack(3.0, 1, 0, 2)) == [Reply(ident(1, 0), fenced)]
    assert _feed(s, ack(3.0, 0, 1, 2, ["o/b"])) == []
    (persist,) = _feed(s, ack(3.0, 1, 1, 2, ["o/c"]))
    assert persist.checkpoint.attempt == 1
    assert {tc.attempt for tc in persist.checkpoint.tasks.values()} == {1}


def test_checkpoint_being_written_survives_a_new_attempt() -> None:
    s = _started(num_tasks=1)
    _feed(s, Tick(1.0))
    (persist,) = _feed(s, ack(1.0, 0, 0, 1, ["o/a"]))
    assert _feed(s, AttemptStarted(1.5, 1, 3)) == []  # not aborted: acks are complete
    done, *_ = _feed(s, CheckpointWritten(1.6, 1))
    assert done == CheckpointCompleted(persist.checkpoint, pytest.approx(0.6))
    assert s.latest == persist.checkpoint and s.attempt == 1


def test_hello_from_next_attempt_before_it_starts_is_kept() -> None:
    s = _started(num_tasks=1, attempt=0)
    assert _feed(s, hello(0.5, 0, 1)) == []
    assert _feed(s, hello(0.5, 4, 1)) == []  # outside the next attempt's tasks
    _feed(s, AttemptStarted(0.5, 1, 1))
    assert _feed(s, Tick(1.5)) == triggers(1, 1, 1)


def test_timeout_aborts_and_next_checkpoint_follows() -> None:
    s = _started()
    _feed(s, Tick(1.0))
    _feed(s, ack(1.0, 0, 0, 1))
    assert _feed(s, Tick(5.9)) == []
    assert _feed(s, Tick(6.0)) == [CheckpointAborted(1, "timeout: 1/2 tasks acknowledged")]
    assert s.checkpoints_aborted == 1
    # The late ack of the aborted checkpoint is ignored.
    assert _feed(s, ack(6.5, 1, 0, 1)) == [MessageIgnored(1, "checkpoint 1 is not pending")]
    assert _feed(s, Tick(7.0)) == triggers(2, 0, 2)


def test_write_failure_aborts_and_the_next_checkpoint_is_written() -> None:
    s = _started(num_tasks=1, cfg=CoordinatorConfig(1.0, 1000.0, 5.0, 2, object_prefixes=("o/",)))
    _feed(s, Tick(1.0))
    _feed(s, ack(1.0, 0, 0, 1, ["o/a"]))
    assert _feed(s, Tick(99.0)) == []  # no timeout while written
    assert _feed(s, WriteFailed(99.0, 1, "disk full")) == [
        CheckpointAborted(1, "write failed: disk full")
    ]
    assert s.latest is None and s.registry.counts() == {}
    (ign,) = _feed(s, CheckpointWritten(99.1, 1))  # a late answer changes nothing
    assert isinstance(ign, MessageIgnored) and s.latest is None
    assert _complete(s, 100.0, {0: ["o/a"]}) == []
    assert s.latest is not None and s.latest.checkpoint_id == 2


def test_retention_subsumes_and_deletes_unreferenced() -> None:
    s = _started()
    assert _complete(s, 1.0, {0: ["o/a"], 1: ["o/x"]}) == []
    assert _complete(s, 3.0, {0: ["o/a", "o/b"], 1: ["o/x"]}) == []
    # Checkpoint 3: task 0 materialized (a, b gone), task 1 still references x.
    out = _complete(s, 5.0, {0: ["o/snap0", "o/c"], 1: ["o/x", "o/y"]})
    assert out == [DeleteCheckpoint(1)]  # a is still in checkpoint 2
    out = _complete(s, 7.0, {0: ["o/snap0", "o/d"], 1: ["o/y", "o/z"]})
    logs = frozenset({"log-0", "log-1"})  # the job's writers (coordinator.testing)
    assert out == [DeleteCheckpoint(2), DeleteObjects(("o/a", "o/b"), logs)]  # x is in 3
    assert [c.checkpoint_id for c in s.retained] == [3, 4]
    counts = {"o/snap0": 2, "o/c": 1, "o/d": 1, "o/x": 1, "o/y": 2, "o/z": 1}
    assert s.registry.counts() == counts
    # The storage worker's answers: counted, nothing else changes.
    assert _feed(s, CheckpointDeleted(7.2, 2)) == []
    assert _feed(s, ObjectsDeleted(7.2, ("o/a", "o/b"), 2)) == []
    assert s.objects_deleted == 2


def test_objects_of_in_flight_records_live_exactly_while_a_retained_checkpoint_needs_them() -> None:
    """Channel state (FLIP-76) is not cumulative: checkpoint 1's in-flight records are
    referenced by checkpoint 1 alone, so their objects live until it is subsumed (also
    when no later checkpoint references them) and are deleted then, unless a retained
    checkpoint still references the object for its state changes."""
    s = _started()  # retains 2
    # checkpoint 1: task 0 unaligned, its in-flight records in an object of their own
    # and in one that checkpoint 2's state changes use too
    assert _complete(s, 1.0, {0: ["o/a"], 1: ["o/x"]}, {0: ["o/cs1", "o/m"]}) == []
    assert s.latest is not None
    assert s.latest.referenced_paths() == {"o/a", "o/x", "o/cs1", "o/m"}
    assert s.latest.tasks[0].unaligned and not s.latest.tasks[1].unaligned
    assert _complete(s, 3.0, {0: ["o/a", "o/m"], 1: ["o/x"]}, {1: ["o/cs2"]}) == []
    assert s.registry.counts() == {"o/a": 2, "o/x": 2, "o/m": 2, "o/cs1": 1, "o/cs2": 1}
    # checkpoint 3 subsumes 1: o/cs1 goes, o/m stays (checkpoint 2's state changes)
    out = _complete(s, 5.0, {0: ["o/a", "o/b"], 1: ["o/x"]})
    logs = frozenset({"log-0", "log-1", "log-0-cs", "log-1-cs"})  # the job's writers
    assert out == [DeleteCheckpoint(1), DeleteObjects(("o/cs1",), logs)]
    # checkpoint 4 subsumes 2: its in-flight object and o/m go
    out = _complete(s, 7.0, {0: ["o/a", "o/b"], 1: ["o/x"]})
    assert out == [DeleteCheckpoint(2), DeleteObjects(("o/cs2", "o/m"), logs)]
    assert s.registry.counts() == {"o/a": 2, "o/b": 2, "o/x": 2}


def test_a_sweep_spares_the_in_flight_records_of_a_pending_acknowledgement() -> None:
    s = _started()
    _complete(s, 1.0, {0: ["o/a"], 1: ["o/x"]}, {0: ["o/cs1"]})
    _feed(s, Tick(3.0, wall=1000.0))
    _feed(s, ack(3.0, 0, 0, 2, ["o/a"], inflight=["o/cs2"]))
    scope = s.sweep_scope()
    assert scope is not None and {"o/cs1", "o/cs2"} <= scope[0]


def test_persist_names_retained_ids() -> None:
    s = _started(num_tasks=1)
    _complete(s, 1.0, {0: ["o/a"]})
    _complete(s, 3.0, {0: ["o/a"]})
    _feed(s, Tick(5.0))
    (persist,) = _feed(s, ack(5.0, 0, 0, 3, ["o/a"]))
    assert persist.retained == (2, 3)  # with retention 2: checkpoint 1 is subsumed


def test_start_from_retained_continues_ids_subsumes_extras_and_cleans() -> None:
    retained = [completed(i, {0: [f"o/o{i}"]}) for i in (4, 5, 6)]
    s = CoordinatorState(CFG, retained, validate=True)
    assert s.next_checkpoint_id == 7
    assert _feed(s, Started(0.0)) == [
        DeleteCheckpoint(4),
        DeleteObjects(("o/o4",), frozenset({"log-0"})),
        CleanOrphans(frozenset({"o/o5", "o/o6"})),
    ]
    assert _feed(s, OrphansDeleted(0.1, 3, 1)) == []
    assert (s.orphans_deleted, s.stale_metadata_deleted) == (3, 1)


def test_materialization_epoch_applies_when_all_reported() -> None:
    s = _started()
    out = _feed(s, Tick(10.0))
    materialize = [SendToTask(t, ident(t, 0), protocol.Materialize(1)) for t in (0, 1)]
    assert out[-3:] == [MaterializationStarted(1), *materialize]
    assert not [i for i in _feed(s, Tick(25.0)) if isinstance(i, MaterializationStarted)]
    r0, r1 = MaterializedRef("o/s0", 7, 100), MaterializedRef("o/s1", 9, 200)
    assert _feed(s, report(25.0, 0, 0, 1, r0)) == []
    (bad,) = _feed(s, report(25.0, 1, 0, 2, r1))  # an epoch never started
    assert bad == Reply(ident(1, 0), protocol.ErrorReply("epoch 2 was never started"))
    # Every task reported, but neither acknowledged its changelog up to its snapshot's
    # SQN yet: nothing is applied (no task truncates what it has not acknowledged).
    assert _feed(s, report(25.0, 1, 0, 1, r1)) == []
    assert _feed(s, Tick(26.0)) == triggers(2, 0, 2)  # 1 timed out at 25.0
    assert _feed(s, _ack_to(26.0, 0, 2, 7)) == []
    persist, *applied = _feed(s, _ack_to(26.0, 1, 2, 9))
    assert isinstance(persist, PersistCheckpoint)
    assert applied == [
        MaterializationApplied(1, {0: r0, 1: r1}),
        SendToTask(0, ident(0, 0), protocol.ApplyMaterialization(1, r0)),
        SendToTask(1, ident(1, 0), protocol.ApplyMaterialization(1, r1)),
    ]
    assert s.materializations_completed == 1 and s.applied_epoch == 1
    # The next checkpoint records the applied epoch; the next epoch comes an interval later.
    _feed(s, CheckpointWritten(26.1, 2))
    assert _feed(s, Tick(27.1)) == triggers(3, 0, 2)
    _feed(s, _ack_to(27.1, 0, 3, 8, MaterializedRef("o/s0", 7, 100)))
    (persist,) = _feed(s, _ack_to(27.1, 1, 3, 10, MaterializedRef("o/s1", 9, 200)))
    assert persist.checkpoint.materialization_epoch == 1
    assert _feed(s, Tick(35.9)) == []  # applied at 26.0
    assert MaterializationStarted(2) in _feed(s, Tick(36.0))


def _ack_to(
    now: float, task: int, cid: int, to: int, snapshot: MaterializedRef | None = None
) -> MessageFromTask:
    """Task ``task`` of attempt 0 acknowledges its log up to SQN ``to`` (one object)."""
    lo = 0 if snapshot is None else snapshot.sqn
    tc = TaskCheckpoint(
        task, 0, 0, snapshot, (handle(f"log-{task}", [f"o/{cid}"] * (to - lo), lo),)
    )
    return MessageFromTask(now, ident(task, 0), protocol.Ack(task, 0, cid, tc))


def test_incomplete_epoch_is_abandoned_on_new_attempt_and_on_timeout() -> None:
    cfg = CoordinatorConfig(
        1.0, 10.0, 5.0, 2, materialization_timeout=20.0, object_prefixes=("o/",)
    )
    s = _started(cfg=cfg)
    assert MaterializationStarted(1) in _feed(s, Tick(10.0))
    _feed(s, report(10.0, 0, 0, 1, MaterializedRef("o/s0", 1, 1)))
    out = _feed(s, AttemptStarted(10.0, 1, 2))
    assert MaterializationAbandoned(1, "attempt 1 started") in out
    assert s.materializations_abandoned == 1
    _feed(s, hello(10.0, 0, 1))
    _feed(s, hello(10.0, 1, 1))
    # The abandoned epoch's report arrives late from the new attempt: ignored.
    (ign,) = _feed(s, report(10.0, 0, 1, 1, MaterializedRef("o/s0", 1, 1)))
    assert isinstance(ign, MessageIgnored)
    assert MaterializationStarted(2) in _feed(s, Tick(20.0))
    out = _feed(s, Tick(40.0))
    assert MaterializationAbandoned(2, "timeout: 0/2 tasks reported") in out


def test_non_task_and_malformed_messages_are_rejected() -> None:
    s = _started(num_tasks=1)
    out = _feed(s, MessageFromTask(0.5, b"peer", protocol.Materialize(1)))
    assert out == [Reply(b"peer", protocol.ErrorReply("Materialize is not a task message"))]
    out = _feed(s, MalformedMessage(0.5, b"peer", "undecodable"))
    assert out == [Reply(b"peer", protocol.ErrorReply("undecodable"))]
    assert s.messages_rejected == 2 and s.messages_fenced == 0


@dataclass(frozen=True)
class _Unknown:
    now: float


def test_unknown_event_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unknown event"):
        CoordinatorState(CFG).handle(_Unknown(0.0))  # type: ignore[arg-type]


def test_validate_names_the_broken_invariant() -> None:
    s = _started(num_tasks=1)
    _complete(s, 1.0, {0: ["o/a"]})
    s.registry.register(completed(99, {0: ["zzz"]}))  # a reference no checkpoint holds
    with pytest.raises(InvariantError, match="registry counts equal the references"):
        s.validate()

    s = _started(num_tasks=1)
    _feed(s, Tick(1.0))
    (pending,) = s._inflight.values()
    pending.acks[0] = task_checkpoint(0, 7)  # an ack of another attempt
    with pytest.raises(InvariantError, match="stale acks never counted"):
        s.validate()


def test_validate_catches_deleting_what_a_retained_checkpoint_references() -> None:
    s = _started(
        num_tasks=1,
        cfg=CoordinatorConfig(1.0, 100.0, 5.0, retained_checkpoints=1, object_prefixes=("o/",)),
    )
    _complete(s, 1.0, {0: ["o/a"]})
    deleted = DeleteObjects(("o/a",), frozenset({"log-0"}))
    assert _complete(s, 3.0, {0: ["o/b"]}) == [DeleteCheckpoint(1), deleted]
    # A task acknowledges an object already released: validation refuses the state.
    _feed(s, Tick(5.0))
    s.handle(ack(5.0, 0, 0, 3, ["o/a"]))
    with pytest.raises(InvariantError, match="nothing deleted"):
        s.handle(CheckpointWritten(5.1, 3))


def test_tasks_without_a_node_are_counted_per_attempt() -> None:
    s = CoordinatorState(CFG, validate=True)
    _feed(s, Started(0.0))
    _feed(s, AttemptStarted(0.0, 0, 3))
    for t in (0, 2):
        _feed(s, hello(0.0, t, 0))  # without a node endpoint
    node = protocol.Hello(1, 0, "tcp://127.0.0.2:7700")
    _feed(s, MessageFromTask(0.1, ident(1, 0), node))
    assert s.tasks_without_node == 2
    _feed(s, AttemptStarted(1.0, 1, 2))
    assert s.tasks_without_node == 0  # nobody of attempt 1 said hello yet
    _feed(s, MessageFromTask(1.1, ident(0, 1), protocol.Hello(0, 1, "")))
    assert s.tasks_without_node == 1


def test_a_hello_without_a_common_protocol_version_is_refused_naming_both() -> None:
    state = CoordinatorState(CFG)
    hello = protocol.Hello(0, 0, versions=(7, 8))
    out = state.handle(MessageFromTask(0.0, ident(0, 0), hello))
    replies = [i.message for i in out if isinstance(i, Reply)]
    assert len(replies) == 1 and isinstance(replies[0], protocol.ErrorReply)
    assert "task speaks [7, 8]" in replies[0].reason
    assert "coordinator speaks [1]" in replies[0].reason
    assert state.rejections["version"] == 1 and not state.all_connected()


def test_a_hello_names_its_versions_on_the_wire_and_an_old_one_means_version_1() -> None:
    frame = protocol.dump(protocol.Hello(3, 1, "tcp://127.0.0.1:5", (1, 2)))
    assert protocol.load(frame) == protocol.Hello(3, 1, "tcp://127.0.0.1:5", (1, 2))
    old = msgpack.packb({"t": "hello", "task": 3, "attempt": 1, "node": ""})
    assert protocol.load(old).versions == (1,)
    for bad in ([], ["1"], [0], [True], list(range(1, 20)), "1"):
        raw = msgpack.packb({"t": "hello", "task": 3, "attempt": 1, "v": bad})
        with pytest.raises(WireError):
            protocol.load(raw)
