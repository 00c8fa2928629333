"""Overlapping checkpoints in the bare coordinator state (Flink's
maxConcurrentCheckpoints): triggers follow the interval while earlier checkpoints are
in flight, up to the bound; completion in checkpoint order, several ready checkpoints in
one commit record; a timeout or a failed write aborts only what it concerns. Every
state validates its invariants after every event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dstltree.coordinator import protocol
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointTriggered,
    CheckpointWritten,
    PersistCheckpoint,
    Started,
    Tick,
    WriteFailed,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.testing import task_checkpoint
from tests.support.coordinator_events import feed, hello, message, of_type, sends

CFG = CoordinatorConfig(
    checkpoint_interval=0.3,
    materialization_interval=100.0,
    checkpoint_timeout=5.0,
    retained_checkpoints=2,
    object_prefixes=("o/",),
    max_concurrent_checkpoints=3,
)


def _running(num_tasks: int = 2, cfg: CoordinatorConfig = CFG) -> CoordinatorState:
    s = CoordinatorState(cfg, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, num_tasks))
    feed(s, *(hello(0.0, t, 0) for t in range(num_tasks)))
    return s


def _ack(now: float, task: int, cid: int) -> list:
    tc = task_checkpoint(task, 0, [f"o/c{cid}-t{task}"])
    return [message(now, task, 0, protocol.Ack(task, 0, cid, tc))]


def _triggered(out: list) -> list[int]:
    return sorted({m.checkpoint_id for m in sends(out, protocol.TriggerCheckpoint).values()})


def test_triggers_follow_the_interval_up_to_the_bound_with_notices() -> None:
    s = _running()
    notices = []
    for now in (0.3, 0.6, 0.9, 1.2, 1.5):
        out = s.handle(Tick(now))
        notices += of_type(out, CheckpointTriggered)
    # three in flight at most: 1, 2, 3 at 0.3, 0.6, 0.9; none at 1.2 and 1.5
    assert notices == [
        CheckpointTriggered(1, None, 1),
        CheckpointTriggered(2, pytest.approx(0.3), 2),
        CheckpointTriggered(3, pytest.approx(0.3), 3),
    ]
    assert s.in_flight() == [1, 2, 3] and s.in_flight_max == 3
    assert s.checkpoint_intervals_s == [pytest.approx(0.3)] * 2


def test_completion_in_order_and_ready_checkpoints_share_one_record() -> None:
    s = _running()
    for now in (0.3, 0.6, 0.9):
        feed(s, Tick(now))
    # checkpoint 2 is acknowledged first: it waits for 1
    assert feed(s, *_ack(1.0, 0, 2), *_ack(1.0, 1, 2)) == []
    assert feed(s, *_ack(1.1, 0, 1)) == []
    (persist,) = feed(s, *_ack(1.1, 1, 1))
    assert isinstance(persist, PersistCheckpoint)
    assert [c.checkpoint_id for c in persist.checkpoints] == [1, 2]
    assert persist.retained == (1, 2)
    # 3 becomes ready while that record is written: it waits for the next record
    assert feed(s, *_ack(1.2, 0, 3), *_ack(1.2, 1, 3)) == []
    out = feed(s, CheckpointWritten(1.4, 2, requests=1, metadata_bytes=((1, 900), (2, 910))))
    done = of_type(out, CheckpointCompleted)
    assert [d.checkpoint.checkpoint_id for d in done] == [1, 2]  # type: ignore[attr-defined]
    assert [d.duration_s for d in done] == [pytest.approx(1.1), pytest.approx(0.8)]  # type: ignore[attr-defined]
    (next_record,) = of_type(out, PersistCheckpoint)
    assert next_record.checkpoint.checkpoint_id == 3 and next_record.retained == (2, 3)  # type: ignore[attr-defined]
    assert s.completion_requests == [1, 1] and s.metadata_bytes == [900, 910]
    # Triggers went on at the interval while all that completed.
    assert _triggered(feed(s, Tick(1.5))) == [4]


def test_a_timeout_aborts_only_its_checkpoint() -> None:
    s = _running()
    feed(s, Tick(0.3), Tick(0.6))
    feed(s, *_ack(0.7, 0, 2), *_ack(0.7, 1, 2))  # 2 is ready, waiting for 1
    out = feed(s, Tick(5.3))  # 1 times out (triggered at 0.3): 2 completes on its own
    assert of_type(out, CheckpointAborted) == [
        CheckpointAborted(1, "timeout: 0/2 tasks acknowledged")
    ]
    (persist,) = of_type(out, PersistCheckpoint)
    assert [c.checkpoint_id for c in persist.checkpoints] == [2]  # type: ignore[attr-defined]
    assert s.checkpoints_aborted == 1 and s.in_flight() == [2]


def test_a_failed_record_aborts_its_checkpoints_and_later_ones_go_on() -> None:
    s = _running()
    feed(s, Tick(0.3), Tick(0.6), Tick(0.9))
    feed(s, *_ack(1.0, 0, 1), *_ack(1.0, 1, 1))  # record of 1 under way
    feed(s, *_ack(1.0, 0, 2), *_ack(1.0, 1, 2))
    out = feed(s, WriteFailed(1.1, 1, "StorageError: injected"))
    assert of_type(out, CheckpointAborted) == [
        CheckpointAborted(1, "write failed: StorageError: injected")
    ]
    (persist,) = of_type(out, PersistCheckpoint)
    assert persist.checkpoint.checkpoint_id == 2  # type: ignore[attr-defined]
    feed(s, CheckpointWritten(1.2, 2))
    assert s.latest is not None and s.latest.checkpoint_id == 2
    assert s.in_flight() == [3]


def test_a_new_attempt_aborts_what_is_in_flight_but_the_record_being_written() -> None:
    s = _running()
    feed(s, Tick(0.3), Tick(0.6))
    feed(s, *_ack(0.7, 0, 1), *_ack(0.7, 1, 1))  # 1 is being written
    out = feed(s, AttemptStarted(0.8, 1, 2))
    assert of_type(out, CheckpointAborted) == [CheckpointAborted(2, "attempt 1 started")]
    assert s.in_flight() == [1]
    feed(s, CheckpointWritten(0.9, 1))
    assert s.latest is not None and s.latest.checkpoint_id == 1


def test_max_concurrent_checkpoints_is_validated() -> None:
    with pytest.raises(ValueError, match="max_concurrent_checkpoints"):
        CoordinatorConfig(max_concurrent_checkpoints=0)


PIPE = replace(CFG, max_concurrent_checkpoints=5, max_records_in_flight=3)


def _three_records(s: CoordinatorState) -> list[PersistCheckpoint]:
    """Checkpoints 1, 2, 3 ready one after the other, each while the records before
    it are in flight: three records, each carrying the ones before it."""
    for now in (0.3, 0.6, 0.9):
        feed(s, Tick(now))
    records = []
    for cid in (1, 2, 3):
        (persist,) = feed(s, *_ack(1.0 + cid, 0, cid), *_ack(1.0 + cid, 1, cid))
        assert isinstance(persist, PersistCheckpoint)
        records.append(persist)
    return records


def test_pipelined_records_carry_the_ones_in_flight_and_confirm_in_order() -> None:
    s = _running(cfg=PIPE)
    r1, r2, r3 = _three_records(s)
    assert [[c.checkpoint_id for c in r.checkpoints] for r in (r1, r2, r3)] == [
        [1],
        [1, 2],
        [1, 2, 3],
    ]
    assert (r1.retained, r2.retained, r3.retained) == ((1,), (1, 2), (2, 3))
    feed(s, Tick(5.0))
    assert s.in_flight() == [1, 2, 3, 4]  # triggers go on; a fourth record would wait
    # record 3 and 2 are answered before record 1: nothing completes yet
    assert of_type(feed(s, CheckpointWritten(5.1, 3)), CheckpointCompleted) == []
    assert of_type(feed(s, CheckpointWritten(5.1, 2)), CheckpointCompleted) == []
    out = feed(s, CheckpointWritten(5.2, 1))
    done = of_type(out, CheckpointCompleted)
    assert [d.checkpoint.checkpoint_id for d in done] == [1, 2, 3]
    assert s.checkpoints_completed == 3 and [c.checkpoint_id for c in s.retained] == [2, 3]


def test_a_failed_record_s_checkpoints_complete_with_a_later_one() -> None:
    s = _running(cfg=PIPE)
    _three_records(s)
    out = feed(s, WriteFailed(5.0, 1, "boom"))
    assert of_type(out, CheckpointAborted) == [] and of_type(out, CheckpointCompleted) == []
    feed(s, WriteFailed(5.1, 2, "boom"))
    out = feed(s, CheckpointWritten(5.2, 3))
    assert [d.checkpoint.checkpoint_id for d in of_type(out, CheckpointCompleted)] == [1, 2, 3]
    assert s.checkpoints_aborted == 0


def test_when_the_last_record_fails_every_checkpoint_being_written_is_aborted() -> None:
    s = _running(cfg=PIPE)
    _three_records(s)
    feed(s, CheckpointWritten(5.0, 1))
    feed(s, WriteFailed(5.1, 3, "boom"))  # waits for record 2
    out = feed(s, WriteFailed(5.2, 2, "boom"))
    assert [a.checkpoint_id for a in of_type(out, CheckpointAborted)] == [2, 3]
    assert s.checkpoints_completed == 1 and s.in_flight() == []
    # the next ready checkpoint gets a record of its own
    feed(s, Tick(5.6))
    (persist,) = feed(s, *_ack(5.7, 0, 4), *_ack(5.7, 1, 4))
    assert [c.checkpoint_id for c in persist.checkpoints] == [4]


def test_max_records_in_flight_is_validated() -> None:
    with pytest.raises(ValueError, match="max_records_in_flight"):
        CoordinatorConfig(max_records_in_flight=0)
    with pytest.raises(ValueError, match="max_records_in_flight"):
        CoordinatorConfig(max_records_in_flight=99)
