"""SegmentFuture: the semantics of concurrent.futures.Future that uploads rely on, with
no object the cycle collector tracks until a callback or a waiter needs one."""

from __future__ import annotations

import gc
import logging
import threading
from concurrent.futures import Future, InvalidStateError

import pytest

from dstltree.client.futures import SegmentFuture
from tests.support.waiting import wait_until


def test_result_and_callbacks_in_order_on_the_completing_thread() -> None:
    f: SegmentFuture[int] = SegmentFuture()
    seen: list[tuple[str, int, str]] = []
    for name in ("a", "b"):
        f.add_done_callback(
            lambda g, n=name: seen.append((n, g.result(), threading.current_thread().name))
        )
    assert not f.done() and not f.cancelled()
    t = threading.Thread(target=f.set_result, args=(7,), name="completer")
    t.start()
    t.join(10)
    assert f.done() and f.result() == 7 and f.exception() is None
    assert seen == [("a", 7, "completer"), ("b", 7, "completer")]
    f.add_done_callback(lambda g: seen.append(("late", g.result(), "")))  # runs at once
    assert seen[-1] == ("late", 7, "")


def test_exception_is_raised_by_result_and_returned_by_exception() -> None:
    f: SegmentFuture[int] = SegmentFuture()
    f.set_exception(OSError("disk gone"))
    assert isinstance(f.exception(), OSError)
    with pytest.raises(OSError, match="disk gone"):
        f.result()
    assert "raised OSError" in repr(f)


def test_set_twice_raises_invalid_state_and_keeps_the_first_outcome() -> None:
    f: SegmentFuture[int] = SegmentFuture()
    f.set_result(1)
    with pytest.raises(InvalidStateError):
        f.set_result(2)
    with pytest.raises(InvalidStateError):
        f.set_exception(ValueError())
    assert f.result() == 1


def test_a_failing_callback_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    f: SegmentFuture[int] = SegmentFuture()
    ran: list[int] = []

    def boom(_: SegmentFuture[int]) -> None:
        raise RuntimeError("callback bug")

    f.add_done_callback(boom)
    f.add_done_callback(lambda g: ran.append(g.result()))
    with caplog.at_level(logging.ERROR, logger="dstltree.client"):
        f.set_result(3)
    assert ran == [3]
    assert "exception calling callback" in caplog.text


def test_result_times_out_then_a_waiter_is_woken_by_the_result() -> None:
    f: SegmentFuture[str] = SegmentFuture()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        f.exception(timeout=0)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(f.result(timeout=30)))
    waiter.start()
    wait_until(lambda: f._event is not None, timeout=10)  # the waiter is blocked on it
    f.set_result("ok")
    waiter.join(10)
    assert got == ["ok"]


def _race_callbacks_with_completion() -> list[int]:
    f: SegmentFuture[int] = SegmentFuture()
    calls: list[int] = []
    go = threading.Barrier(2)

    def complete() -> None:
        go.wait(10)
        f.set_result(1)

    t = threading.Thread(target=complete)
    t.start()
    go.wait(10)
    for i in range(5):
        f.add_done_callback(lambda _g, i=i: calls.append(i))
    t.join(10)
    return calls


def test_callbacks_added_while_it_completes_run_exactly_once() -> None:
    """A writer adds its callback while the I/O thread may already resolve the future."""
    for _ in range(200):
        assert sorted(_race_callbacks_with_completion()) == [0, 1, 2, 3, 4]


def test_allocates_nothing_the_cycle_collector_tracks_until_needed() -> None:
    """The reason for the class: a Future holds a Condition, its bound methods, a deque
    and two lists, all tracked; a SegmentFuture holds none of its own but a list once
    it has two callbacks."""

    def tracked(obj: object) -> list[object]:
        return [o for o in gc.get_referents(obj) if gc.is_tracked(o) and o is not type(obj)]

    f: SegmentFuture[int] = SegmentFuture()
    assert tracked(f) == []

    def first(_: object) -> None: ...

    def second(_: object) -> None: ...

    f.add_done_callback(first)
    assert tracked(f) == [first]  # the one callback, no list
    f.add_done_callback(second)
    assert tracked(f) == [[first, second]]
    f.set_result(1)
    assert tracked(f) == []  # the callbacks are dropped once called
    assert len(tracked(Future())) >= 3
