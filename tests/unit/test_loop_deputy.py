"""The loop deputy on its own: it serves a loop's turns while the owner is busy in a
blocking call for longer than ``after_s``, hands the loop back when the owner returns,
and never serves a short call."""

from __future__ import annotations

import threading

import pytest

from dstltree.aggregator.deputy import LoopDeputy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class _Loop:
    """A loop whose turn waits (like a poll) until woken or 1 s passed."""

    def __init__(self) -> None:
        self.turns_by: list[str] = []
        self.woken = threading.Event()
        self.fail = False

    def turn(self) -> None:
        self.turns_by.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("turn failed")
        self.woken.wait(1.0)
        self.woken.clear()

    def wake(self) -> None:
        self.woken.set()


class _Owner:
    """The owner's thread, busy for the deputy until :meth:`release` (at most 20 s)."""

    def __init__(self, deputy: LoopDeputy) -> None:
        self._released = threading.Event()

        def busy() -> None:
            with deputy.busy():
                self._released.wait(20)

        self.thread = threading.Thread(target=busy)
        self.thread.start()

    def release(self) -> None:
        self._released.set()
        self.thread.join(10)


def test_a_long_busy_call_is_served_and_the_loop_handed_back() -> None:
    loop = _Loop()
    deputy = LoopDeputy("deputy", loop.turn, loop.wake, after_s=0.01)
    try:
        owner = _Owner(deputy)
        wait_until(lambda: len(loop.turns_by) >= 2, timeout=10)
        assert deputy.serving and deputy.takeovers == 1
        assert set(loop.turns_by) == {"deputy"}
        owner.release()
        # the owner's return woke the waiting turn: the deputy lets go of the loop
        assert deputy.turn.acquire(timeout=10)
        deputy.turn.release()
        assert not deputy.serving and deputy.takeovers == 1 and deputy.failure is None
    finally:
        deputy.close()


def test_a_short_busy_call_is_never_served() -> None:
    loop = _Loop()
    deputy = LoopDeputy("deputy", loop.turn, loop.wake, after_s=30.0)
    try:
        for _ in range(100):
            with deputy.busy():
                pass
        assert deputy.takeovers == 0 and loop.turns_by == []
    finally:
        deputy.close()
    assert deputy._thread is not None and not deputy._thread.is_alive()


def test_a_failing_turn_is_kept_for_the_owner() -> None:
    loop = _Loop()
    loop.fail = True
    deputy = LoopDeputy("deputy", loop.turn, loop.wake, after_s=0.01)
    try:
        owner = _Owner(deputy)
        wait_until(lambda: deputy.failure is not None, timeout=10)
        assert str(deputy.failure) == "turn failed" and loop.turns_by == ["deputy"]
        assert not deputy.serving
        owner.release()
    finally:
        deputy.close()


def test_an_idle_deputy_sleeps_until_the_next_busy_call() -> None:
    """After ``idle_s`` without busy calls the deputy waits without a timeout; the next
    long call still wakes it and is served."""
    loop = _Loop()
    deputy = LoopDeputy("deputy", loop.turn, loop.wake, after_s=0.01, idle_s=0.0)
    try:
        with deputy.busy():
            pass
        wait_until(lambda: deputy._asleep, timeout=10)
        owner = _Owner(deputy)
        wait_until(lambda: deputy.takeovers == 1, timeout=10)
        owner.release()
    finally:
        deputy.close()


def test_after_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="after_s"):
        LoopDeputy("deputy", lambda: None, lambda: None, after_s=0)
