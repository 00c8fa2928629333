"""The coordinator state machine: pure, driven by events, no I/O, no clock."""

from __future__ import annotations

import pytest

from coordinator.checkpoint import MaterializedRef
from coordinator.state import (
    AbandonMaterialization,
    AbortCheckpoint,
    ApplyMaterialization,
    AttemptStarted,
    CheckpointAck,
    CheckpointWritten,
    CoordinatorConfig,
    CoordinatorState,
    DeleteCheckpoint,
    DeleteObjects,
    Fenced,
    Ignored,
    MaterializationReport,
    PersistCheckpoint,
    TaskConnected,
    Tick,
    TriggerCheckpoint,
    TriggerMaterialization,
    WriteFailed,
)
from coordinator.testing import completed, task_checkpoint

CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=10.0,
    checkpoint_timeout=5.0,
    retained_checkpoints=2,
)


def _started(num_tasks: int = 2, attempt: int = 0, cfg: CoordinatorConfig = CFG):
    s = CoordinatorState(cfg)
    assert s.handle(AttemptStarted(attempt, num_tasks)) == []
    for t in range(num_tasks):
        assert s.handle(TaskConnected(t, attempt)) == []
    return s


def _complete(s: CoordinatorState, now: float, paths: dict[int, list[str]]) -> list:
    """Trigger at ``now``, ack every task with ``paths[task]``, write; returns the
    instructions after the write."""
    out = s.handle(Tick(now))
    trig = [i for i in out if isinstance(i, TriggerCheckpoint)]
    assert len(trig) == 1, out
    cid = trig[0].checkpoint_id
    persist: list = []
    for t, ps in paths.items():
        persist = s.handle(CheckpointAck(t, s.attempt, cid, task_checkpoint(t, s.attempt, ps)))
    assert len(persist) == 1 and isinstance(persist[0], PersistCheckpoint)
    s.handle(Tick(now + 0.1))
    return s.handle(CheckpointWritten(cid))


def test_no_trigger_until_every_task_said_hello() -> None:
    s = CoordinatorState(CFG)
    assert s.handle(Tick(5.0)) == []  # no attempt yet
    s.handle(AttemptStarted(0, 2))
    s.handle(TaskConnected(0, 0))
    assert s.handle(Tick(7.0)) == []
    s.handle(TaskConnected(1, 0))
    assert s.handle(Tick(7.1)) == [TriggerCheckpoint(1, 0)]


def test_trigger_ack_persist_and_one_in_flight() -> None:
    s = _started()
    assert s.handle(Tick(0.5)) == []  # interval not elapsed since attempt start
    assert s.handle(Tick(1.0)) == [TriggerCheckpoint(1, 0)]
    assert s.handle(Tick(2.5)) == []  # at most one checkpoint in flight
    assert s.handle(CheckpointAck(0, 0, 1, task_checkpoint(0, 0, ["a"]))) == []
    out = s.handle(CheckpointAck(1, 0, 1, task_checkpoint(1, 0, ["b"])))
    assert len(out) == 1 and isinstance(out[0], PersistCheckpoint)
    cp = out[0].checkpoint
    assert cp.checkpoint_id == 1 and set(cp.tasks) == {0, 1}
    assert cp.referenced_paths() == {"a", "b"}
    assert cp.duration_s == pytest.approx(1.5)
    assert s.handle(Tick(3.0)) == []  # still in flight while written
    assert s.handle(CheckpointWritten(1)) == []
    assert s.checkpoints_completed == 1 and s.latest == cp
    assert s.checkpoint_durations_s == [pytest.approx(2.0)]
    assert s.handle(Tick(3.5)) == []  # next interval starts at completion
    assert s.handle(Tick(4.0)) == [TriggerCheckpoint(2, 0)]


def test_duplicate_and_late_acks_are_ignored() -> None:
    s = _started()
    s.handle(Tick(1.0))
    s.handle(CheckpointAck(0, 0, 1, task_checkpoint(0, 0)))
    assert s.handle(CheckpointAck(0, 0, 1, task_checkpoint(0, 0))) == []  # replaces
    (ign,) = s.handle(CheckpointAck(1, 0, 9, task_checkpoint(1, 0)))
    assert isinstance(ign, Ignored)
    (ign,) = s.handle(CheckpointAck(5, 0, 1, task_checkpoint(5, 0)))
    assert isinstance(ign, Ignored)
    (ign,) = s.handle(CheckpointAck(1, 0, 1, task_checkpoint(0, 0)))  # names another task
    assert isinstance(ign, Ignored)


def test_stale_attempt_is_fenced() -> None:
    s = _started(attempt=0)
    s.handle(Tick(1.0))
    s.handle(CheckpointAck(0, 0, 1, task_checkpoint(0, 0, ["a"])))
    # The attempt fails; attempt 1 starts: the pending checkpoint is aborted.
    out = s.handle(AttemptStarted(1, 2))
    assert [type(i) for i in out] == [AbortCheckpoint]
    assert s.handle(CheckpointAck(1, 0, 1, task_checkpoint(1, 0))) == [Fenced(1, 0)]
    assert s.handle(TaskConnected(0, 0)) == [Fenced(0, 0)]
    assert s.handle(MaterializationReport(0, 0, 1, MaterializedRef("s", 1, 1))) == [Fenced(0, 0)]
    assert s.messages_fenced == 3
    with pytest.raises(ValueError):
        s.handle(AttemptStarted(1, 2))
    # Tasks of attempt 1 connect; a new checkpoint id is used.
    s.handle(TaskConnected(0, 1))
    s.handle(TaskConnected(1, 1))
    assert s.handle(Tick(2.1)) == [TriggerCheckpoint(2, 1)]


def test_hello_from_next_attempt_before_it_starts_is_kept() -> None:
    s = _started(num_tasks=1, attempt=0)
    assert s.handle(TaskConnected(0, 1)) == []
    s.handle(AttemptStarted(1, 1))
    assert s.handle(Tick(1.0)) == [TriggerCheckpoint(1, 1)]


def test_timeout_aborts_and_next_checkpoint_follows() -> None:
    s = _started()
    s.handle(Tick(1.0))
    s.handle(CheckpointAck(0, 0, 1, task_checkpoint(0, 0)))
    assert s.handle(Tick(5.9)) == []
    (abort,) = s.handle(Tick(6.0))
    assert isinstance(abort, AbortCheckpoint) and abort.checkpoint_id == 1
    assert "1/2" in abort.reason and s.checkpoints_aborted == 1
    # The late ack of the aborted checkpoint is ignored.
    (ign,) = s.handle(CheckpointAck(1, 0, 1, task_checkpoint(1, 0)))
    assert isinstance(ign, Ignored)
    assert s.handle(Tick(7.0)) == [TriggerCheckpoint(2, 0)]


def test_write_failure_aborts() -> None:
    s = _started(num_tasks=1)
    s.handle(Tick(1.0))
    (persist,) = s.handle(CheckpointAck(0, 0, 1, task_checkpoint(0, 0, ["a"])))
    (abort,) = s.handle(WriteFailed(1, "disk full"))
    assert abort == AbortCheckpoint(1, "write failed: disk full")
    assert s.latest is None and s.registry.counts() == {}


def test_retention_subsumes_and_deletes_unreferenced() -> None:
    s = _started()
    assert _complete(s, 1.0, {0: ["a"], 1: ["x"]}) == []
    assert _complete(s, 3.0, {0: ["a", "b"], 1: ["x"]}) == []
    # Checkpoint 3: task 0 materialized (a, b gone), task 1 still references x.
    out = _complete(s, 5.0, {0: ["snap0", "c"], 1: ["x", "y"]})
    assert out == [DeleteCheckpoint(1)]  # a is still in checkpoint 2
    out = _complete(s, 7.0, {0: ["snap0", "d"], 1: ["y"]})
    assert out == [DeleteCheckpoint(2), DeleteObjects(("a", "b"))]  # x is still in 3
    assert [c.checkpoint_id for c in s.retained] == [3, 4]
    assert s.registry.counts() == {"snap0": 2, "c": 1, "d": 1, "x": 1, "y": 2}
    live = s.retained[0].referenced_paths() | s.retained[1].referenced_paths()
    assert s.registry.referenced() == live


def test_persist_names_retained_ids() -> None:
    s = _started(num_tasks=1)
    _complete(s, 1.0, {0: ["a"]})
    _complete(s, 3.0, {0: ["a"]})
    s.handle(Tick(5.0))
    (persist,) = s.handle(CheckpointAck(0, 0, 3, task_checkpoint(0, 0, ["a"])))
    assert persist.retained == (2,)  # with retention 2: checkpoint 1 is subsumed


def test_restore_from_retained_continues_ids_and_subsumes_extras() -> None:
    retained = [completed(i, {0: [f"o{i}"]}) for i in (4, 5, 6)]
    s = CoordinatorState(CFG, retained)
    assert s.next_checkpoint_id == 7
    assert s.restore() == [DeleteCheckpoint(4), DeleteObjects(("o4",))]
    assert s.registry.referenced() == {"o5", "o6"}


def test_materialization_epoch_applies_when_all_reported() -> None:
    s = _started()
    out = s.handle(Tick(10.0))
    assert TriggerMaterialization(1, 0) in out
    assert not [i for i in s.handle(Tick(25.0)) if isinstance(i, TriggerMaterialization)]
    r0, r1 = MaterializedRef("s0", 7, 100), MaterializedRef("s1", 9, 200)
    assert s.handle(MaterializationReport(0, 0, 1, r0)) == []
    (ign,) = s.handle(MaterializationReport(1, 0, 2, r1))  # wrong epoch
    assert isinstance(ign, Ignored)
    out = s.handle(MaterializationReport(1, 0, 1, r1))
    assert out == [ApplyMaterialization(1, 0, {0: r0, 1: r1})]
    assert s.materializations_completed == 1 and s.applied_epoch == 1
    # The next checkpoint records the applied epoch; the next epoch comes an interval later.
    assert s.handle(Tick(26.0)) == [TriggerCheckpoint(2, 0)]  # 1 timed out meanwhile
    (persist,) = [
        i
        for t in (0, 1)
        for i in s.handle(CheckpointAck(t, 0, 2, task_checkpoint(t, 0, snapshot=f"s{t}")))
    ]
    assert persist.checkpoint.materialization_epoch == 1
    assert s.handle(Tick(34.9)) == []
    assert TriggerMaterialization(2, 0) in s.handle(Tick(35.0))


def test_incomplete_epoch_is_abandoned_on_new_attempt_and_on_timeout() -> None:
    cfg = CoordinatorConfig(1.0, 10.0, 5.0, 2, materialization_timeout=20.0)
    s = _started(cfg=cfg)
    assert TriggerMaterialization(1, 0) in s.handle(Tick(10.0))
    s.handle(MaterializationReport(0, 0, 1, MaterializedRef("s0", 1, 1)))
    out = s.handle(AttemptStarted(1, 2))
    assert AbandonMaterialization(1, "attempt 1 started") in out
    assert s.materializations_abandoned == 1
    s.handle(TaskConnected(0, 1))
    s.handle(TaskConnected(1, 1))
    # The abandoned epoch's report arrives late from the new attempt: ignored.
    (ign,) = s.handle(MaterializationReport(0, 1, 1, MaterializedRef("s0", 1, 1)))
    assert isinstance(ign, Ignored)
    assert TriggerMaterialization(2, 1) in s.handle(Tick(20.0))
    out = s.handle(Tick(40.0))
    assert [i for i in out if isinstance(i, AbandonMaterialization)][0].epoch == 2
