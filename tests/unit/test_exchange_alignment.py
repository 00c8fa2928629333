"""BarrierAligner: Flink aligned checkpoints over P input channels, without I/O."""

from __future__ import annotations

import pytest

from dstltree.sparkplug.exchange import BarrierAligner, ExchangeError
from dstltree.storage.errors import DstlError


def test_aligns_when_every_channel_delivered_the_barrier() -> None:
    a = BarrierAligner(3)
    assert a.on_barrier(1, 5) is None
    assert a.blocked(1) and not a.blocked(0) and not a.blocked(2)
    assert a.pending == 5
    assert a.on_barrier(0, 5) is None
    assert a.blocked(0) and a.blocked(1) and not a.blocked(2)
    assert a.on_barrier(2, 5) == 5
    assert not any(a.blocked(c) for c in range(3))
    assert a.pending is None


def test_successive_checkpoints() -> None:
    a = BarrierAligner(2)
    for cp in (1, 2, 7):
        assert a.on_barrier(1, cp) is None
        assert a.on_barrier(0, cp) == cp


def test_single_channel_aligns_at_once() -> None:
    a = BarrierAligner(1)
    assert a.on_barrier(0, 0) == 0
    assert not a.blocked(0)
    assert a.on_barrier(0, 1) == 1


def test_barrier_going_backwards_is_refused() -> None:
    a = BarrierAligner(2)
    a.on_barrier(0, 3)
    assert a.on_barrier(1, 3) == 3
    with pytest.raises(ExchangeError, match=r"channel 1: barrier 2 after barrier 3"):
        a.on_barrier(1, 2)
    with pytest.raises(ExchangeError, match=r"channel 0: barrier 3 after barrier 3"):
        a.on_barrier(0, 3)


def test_second_barrier_on_a_blocked_channel_is_refused() -> None:
    a = BarrierAligner(2)
    a.on_barrier(0, 1)
    with pytest.raises(ExchangeError, match=r"channel 0: barrier 2 while blocked on checkpoint 1"):
        a.on_barrier(0, 2)


def test_other_checkpoint_while_aligning_is_refused() -> None:
    a = BarrierAligner(3)
    a.on_barrier(0, 4)
    with pytest.raises(ExchangeError, match=r"channel 2: barrier 5 while aligning checkpoint 4"):
        a.on_barrier(2, 5)


def test_errors_are_dstl_errors_and_bad_sizes_refused() -> None:
    assert issubclass(ExchangeError, DstlError)
    with pytest.raises(ValueError):
        BarrierAligner(0)
    with pytest.raises(IndexError):
        BarrierAligner(2).on_barrier(2, 1)
