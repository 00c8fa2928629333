"""Asynchronous checkpoints: acknowledgements wait for their persist, in order."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from dstltree.client.errors import PersistError
from dstltree.client.handle import ChangelogHandle
from dstltree.coordinator.checkpoint import TaskCheckpoint
from dstltree.sparkplug.acks import PendingAcks


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _acks(limit: int = 2, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    sent: list[tuple[int, TaskCheckpoint]] = []
    clock = _Clock()
    acks = PendingAcks(lambda cp, st: sent.append((cp, st)), limit, timeout, clock)
    return acks, sent, clock


def _handle(lo: int, hi: int) -> ChangelogHandle:
    return ChangelogHandle("w", (lo, hi), ())


def test_an_ack_waits_for_its_persist_and_carries_its_handle() -> None:
    acks, sent, _ = _acks()
    f: Future[ChangelogHandle] = Future()
    old = _handle(0, 3)
    acks.add(1, TaskCheckpoint(0, 0, changelog=(old,)), f)
    assert sent == [] and len(acks) == 1, "the task goes on while the persist runs"
    assert acks.send_ready() == 0
    f.set_result(_handle(3, 7))
    assert acks.send_ready() == 1
    ((cp, state),) = sent
    assert cp == 1 and state.changelog == (old, _handle(3, 7))


def test_acks_go_in_checkpoint_order_even_when_a_later_persist_ends_first() -> None:
    acks, sent, _ = _acks(limit=3)
    first: Future[ChangelogHandle] = Future()
    second: Future[ChangelogHandle] = Future()
    acks.add(1, TaskCheckpoint(0, 0), first)
    acks.add(2, TaskCheckpoint(0, 0), second)
    second.set_result(_handle(5, 9))
    assert acks.send_ready() == 0 and sent == []
    first.set_result(_handle(0, 5))
    assert acks.send_ready() == 2
    assert [cp for cp, _ in sent] == [1, 2]


def test_without_a_changelog_the_ack_goes_at_once() -> None:
    acks, sent, _ = _acks()
    acks.add(4, TaskCheckpoint(0, 0, records=9), None)
    assert sent == [(4, TaskCheckpoint(0, 0, records=9))] and len(acks) == 0


def test_beyond_the_limit_add_blocks_on_the_oldest() -> None:
    acks, sent, _ = _acks(limit=1, timeout=0.05)
    done: Future[ChangelogHandle] = Future()
    pending: Future[ChangelogHandle] = Future()
    acks.add(1, TaskCheckpoint(0, 0), pending)
    pending.set_result(_handle(0, 1))  # completes before the next barrier's add returns
    acks.add(2, TaskCheckpoint(0, 0), done)
    assert [cp for cp, _ in sent] == [1] and len(acks) == 1
    with pytest.raises(TimeoutError):  # the oldest never completes: back-pressure ends in a timeout
        acks.add(3, TaskCheckpoint(0, 0), Future())


def test_a_failed_persist_fails_the_task() -> None:
    acks, sent, _ = _acks()
    f: Future[ChangelogHandle] = Future()
    acks.add(1, TaskCheckpoint(0, 0), f)
    f.set_exception(PersistError("upload failed"))
    with pytest.raises(PersistError):
        acks.send_ready()
    assert sent == []


def test_a_persist_past_its_deadline_fails_the_task() -> None:
    acks, _, clock = _acks(timeout=2.0)
    acks.add(1, TaskCheckpoint(0, 0), Future())
    clock.now = 1.9
    assert acks.send_ready() == 0
    clock.now = 2.1
    with pytest.raises(TimeoutError, match="checkpoint 1"):
        acks.send_ready()


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        PendingAcks(lambda cp, st: None, limit=0)


def test_an_ack_carries_its_asynchronous_phase() -> None:
    """From the end of the synchronous phase (``add``) to the persist durable."""
    acks, sent, clock = _acks()
    clock.now = 10.0
    f: Future[ChangelogHandle] = Future()
    acks.add(1, TaskCheckpoint(0, 0, sync_s=0.002), f)
    clock.now = 10.25
    f.set_result(_handle(0, 1))
    acks.send_ready()
    ((_, state),) = sent
    assert state.sync_s == 0.002 and state.async_s == pytest.approx(0.25)


@pytest.mark.parametrize("phases", [(-1.0, 0.0), (0.0, float("nan")), (0.0, float("inf"))])
def test_impossible_checkpoint_phases_are_refused(phases: tuple[float, float]) -> None:
    from dstltree.coordinator.checkpoint import checkpoint_problem

    tc = TaskCheckpoint(0, 0, sync_s=phases[0], async_s=phases[1])
    problem = checkpoint_problem(tc, ["file:///x/"], range(0, 4), 4)
    assert problem is not None and problem.kind == "bounds"
    assert TaskCheckpoint.from_dict(TaskCheckpoint(0, 0, sync_s=0.5).to_dict()).sync_s == 0.5


def _channel(lo: int, hi: int, length: int) -> ChangelogHandle:
    from dstltree.client.handle import SegmentRef
    from dstltree.client.segment import SegmentMeta

    meta = SegmentMeta("w-cs", lo, hi, (0,), length, 0)
    return ChangelogHandle("w-cs", (lo, hi), (SegmentRef(meta, "mem://o", 0),))


def test_an_unaligned_ack_waits_for_its_channel_state_too() -> None:
    acks, sent, _ = _acks()
    state: Future[ChangelogHandle] = Future()
    channel: Future[ChangelogHandle] = Future()
    acks.add(4, TaskCheckpoint(0, 0, unaligned=True), state, channel)
    state.set_result(_handle(0, 2))
    assert acks.send_ready() == 0, "the in-flight records are not durable yet"
    channel.set_result(_channel(0, 1, 40))
    assert acks.send_ready() == 1
    ((cp, ack),) = sent
    assert cp == 4 and ack.changelog == (_handle(0, 2),)
    assert ack.channel_state == (_channel(0, 1, 40),)


def test_an_empty_channel_state_is_not_referenced() -> None:
    acks, sent, _ = _acks()
    empty: Future[ChangelogHandle] = Future()
    empty.set_result(_channel(3, 3, 0))  # a marker: nothing was in flight
    acks.add(5, TaskCheckpoint(0, 0), None, empty)
    assert sent and sent[0][1].channel_state == ()


def test_a_failed_channel_state_persist_fails_the_task() -> None:
    acks, _, _ = _acks()
    channel: Future[ChangelogHandle] = Future()
    channel.set_exception(PersistError("upload failed"))
    with pytest.raises(PersistError):
        acks.add(6, TaskCheckpoint(0, 0), None, channel)
