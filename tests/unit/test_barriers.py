"""CheckpointBarriers: which records belong to which checkpoint over P input channels,
aligned (Flink), unaligned (FLIP-76) and aligned with a timeout. Without I/O: time is
an argument."""

from __future__ import annotations

import pytest

from dstltree.sparkplug.barriers import (
    BarriersComplete,
    CheckpointBarriers,
    ExchangeError,
    TakeSnapshot,
)
from dstltree.storage.errors import DstlError

# -- aligned ------------------------------------------------------------------------------


def test_aligned_snapshot_when_every_channel_delivered_the_barrier() -> None:
    a = CheckpointBarriers(3)
    assert a.on_barrier(1, 5, now=1.0) == []
    assert a.blocked(1) and not a.blocked(0) and not a.blocked(2)
    assert a.pending == 5 and not a.unaligned
    assert a.inflight_for(0) is None and a.owing() == []
    assert a.on_barrier(0, 5, now=1.5) == []
    assert a.blocked(0) and a.blocked(1) and not a.blocked(2)
    assert a.on_barrier(2, 5, now=3.0) == [
        TakeSnapshot(5, unaligned=False, first_barrier_at=1.0),
        BarriersComplete(5, alignment_s=2.0),
    ]
    assert not any(a.blocked(c) for c in range(3))
    assert a.pending is None


def test_aligned_successive_checkpoints_and_a_single_channel() -> None:
    a = CheckpointBarriers(2)
    for cp in (1, 2, 7):
        assert a.on_barrier(1, cp, 0.0) == []
        assert [type(e) for e in a.on_barrier(0, cp, 0.0)] == [TakeSnapshot, BarriersComplete]
    one = CheckpointBarriers(1)
    assert one.on_barrier(0, 0, 0.0) == [TakeSnapshot(0, False, 0.0), BarriersComplete(0, 0.0)]
    assert not one.blocked(0)


def test_aligned_never_switches_without_a_timeout() -> None:
    a = CheckpointBarriers(2)
    a.on_barrier(0, 1, 0.0)
    assert a.on_time(1e9) == []
    assert a.blocked(0)


def test_barrier_going_backwards_is_refused() -> None:
    a = CheckpointBarriers(2)
    a.on_barrier(0, 3, 0.0)
    a.on_barrier(1, 3, 0.0)
    with pytest.raises(ExchangeError, match=r"channel 1: barrier 2 after barrier 3"):
        a.on_barrier(1, 2, 0.0)
    with pytest.raises(ExchangeError, match=r"channel 0: barrier 3 after barrier 3"):
        a.on_barrier(0, 3, 0.0)


def test_aligned_second_barrier_on_a_blocked_channel_is_refused() -> None:
    a = CheckpointBarriers(2)
    a.on_barrier(0, 1, 0.0)
    with pytest.raises(ExchangeError, match=r"channel 0: barrier 2 while blocked on checkpoint 1"):
        a.on_barrier(0, 2, 0.0)


def test_barrier_skipping_the_pending_checkpoint_is_refused() -> None:
    for mode in ("aligned", "unaligned"):
        a = CheckpointBarriers(3, mode)  # type: ignore[arg-type]
        a.on_barrier(0, 4, 0.0)
        with pytest.raises(ExchangeError, match=r"channel 2: barrier 5 while checkpoint 4"):
            a.on_barrier(2, 5, 0.0)


def test_errors_are_dstl_errors_and_bad_arguments_refused() -> None:
    assert issubclass(ExchangeError, DstlError)
    with pytest.raises(ValueError):
        CheckpointBarriers(0)
    with pytest.raises(ValueError, match="mode"):
        CheckpointBarriers(2, "eventually")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aligned_timeout"):
        CheckpointBarriers(2, "aligned", aligned_timeout=1.0)
    with pytest.raises(ValueError, match="aligned_timeout"):
        CheckpointBarriers(2, "unaligned", aligned_timeout=-1.0)
    with pytest.raises(IndexError):
        CheckpointBarriers(2).on_barrier(2, 1, 0.0)


# -- unaligned ----------------------------------------------------------------------------


def test_unaligned_snapshot_at_the_first_barrier_and_channel_state_until_the_last() -> None:
    u = CheckpointBarriers(3, "unaligned")
    assert u.inflight_for(0) is None  # nothing pending: records are just records
    assert u.on_barrier(1, 7, now=2.0) == [TakeSnapshot(7, unaligned=True, first_barrier_at=2.0)]
    assert u.unaligned and u.pending == 7
    # no channel is blocked; records of the channels still owing barrier 7 are its
    # input channel state, records after barrier 7 on channel 1 are not
    assert not any(u.blocked(c) for c in range(3))
    assert [u.inflight_for(c) for c in range(3)] == [7, None, 7]
    assert u.owing() == [0, 2]
    assert u.on_barrier(2, 7, now=2.5) == []
    assert [u.inflight_for(c) for c in range(3)] == [7, None, None]
    assert u.on_barrier(0, 7, now=4.0) == [BarriersComplete(7, alignment_s=2.0)]
    assert u.pending is None and not u.unaligned
    assert [u.inflight_for(c) for c in range(3)] == [None, None, None]


def test_unaligned_next_barrier_waits_for_the_pending_checkpoint() -> None:
    u = CheckpointBarriers(2, "unaligned")
    u.on_barrier(0, 1, 0.0)
    # channel 0 runs ahead: its barrier 2 is held, the channel blocked meanwhile
    assert u.on_barrier(0, 2, 0.1) == []
    assert u.blocked(0) and not u.blocked(1)
    assert u.inflight_for(1) == 1
    with pytest.raises(ExchangeError, match="while blocked"):
        u.on_barrier(0, 3, 0.2)
    # checkpoint 1 completes; the held barrier 2 starts checkpoint 2 at once
    assert u.on_barrier(1, 1, 0.5) == [
        BarriersComplete(1, 0.5),
        TakeSnapshot(2, unaligned=True, first_barrier_at=0.5),
    ]
    assert not u.blocked(0)
    assert u.pending == 2 and u.inflight_for(1) == 2 and u.inflight_for(0) is None
    assert u.on_barrier(1, 2, 0.6) == [BarriersComplete(2, pytest.approx(0.1))]


def test_unaligned_single_channel_completes_at_once() -> None:
    u = CheckpointBarriers(1, "unaligned")
    assert u.on_barrier(0, 3, 1.0) == [TakeSnapshot(3, True, 1.0), BarriersComplete(3, 0.0)]


# -- aligned, then unaligned after the timeout ------------------------------------------


def test_timeout_switches_a_slow_alignment_to_unaligned() -> None:
    t = CheckpointBarriers(3, "unaligned", aligned_timeout=0.5)
    assert t.on_barrier(0, 4, now=10.0) == []  # starts aligned
    assert t.blocked(0) and t.inflight_for(1) is None
    assert t.on_time(10.4) == []
    assert t.on_barrier(1, 4, now=10.45) == []
    assert t.on_time(10.5) == [TakeSnapshot(4, unaligned=True, first_barrier_at=10.0)]
    assert t.on_time(11.0) == []  # once
    # released; the channel still owing the barrier carries channel state
    assert not t.blocked(0) and not t.blocked(1)
    assert [t.inflight_for(c) for c in range(3)] == [None, None, 4]
    assert t.on_barrier(2, 4, now=12.0) == [BarriersComplete(4, 2.0)]
    # the next checkpoint starts aligned again and aligns before its timeout
    t.on_barrier(2, 5, 12.1)
    t.on_barrier(0, 5, 12.2)
    assert t.on_barrier(1, 5, 12.3) == [
        TakeSnapshot(5, False, 12.1),
        BarriersComplete(5, pytest.approx(0.2)),
    ]


def test_every_record_belongs_to_exactly_the_checkpoints_it_precedes() -> None:
    """A random interleaving of channels: a record is channel state of the pending
    checkpoint iff it precedes that checkpoint's barrier on its channel and comes after
    the snapshot."""
    import random

    rng = random.Random(7)
    for mode, timeout in (("aligned", 0.0), ("unaligned", 0.0), ("unaligned", 0.3)):
        channels = 3
        b = CheckpointBarriers(channels, mode, timeout)  # type: ignore[arg-type]
        streams = [[("r", c, i) for i in range(20)] for c in range(channels)]
        for s in streams:  # barriers 1..3 at random positions, in order
            cuts = sorted(rng.sample(range(1, 20), 3))
            for n, at in enumerate(reversed(cuts)):
                s.insert(at, ("b", 3 - n, 0))
        pos = [0] * channels
        seen_barrier = [0] * channels
        snapshot_taken: set[int] = set()
        now = 0.0
        while any(pos[c] < len(streams[c]) for c in range(channels)):
            now += 0.1
            for ev in b.on_time(now):
                snapshot_taken.add(ev.checkpoint_id)
            ready = [c for c in range(channels) if pos[c] < len(streams[c]) and not b.blocked(c)]
            assert ready, "no channel may be read: a deadlock"
            c = rng.choice(ready)
            kind, value, _ = streams[c][pos[c]]
            pos[c] += 1
            if kind == "b":
                for ev in b.on_barrier(c, value, now):
                    if isinstance(ev, TakeSnapshot):
                        snapshot_taken.add(ev.checkpoint_id)
                seen_barrier[c] = value
                continue
            owner = b.inflight_for(c)
            pending = b.pending
            if pending is not None and pending in snapshot_taken and seen_barrier[c] < pending:
                assert owner == pending  # sent before the barrier, not in the snapshot
            if owner is not None:
                assert owner in snapshot_taken  # after the snapshot ...
                assert seen_barrier[c] < owner  # ... and before its barrier on c
        assert b.pending is None and snapshot_taken == {1, 2, 3}


def test_a_barrier_demanding_alignment_is_aligned_in_unaligned_mode() -> None:
    """A run's final checkpoint: every record read before it is processed first."""
    for timeout in (0.0, 0.2):
        u = CheckpointBarriers(2, "unaligned", aligned_timeout=timeout)
        assert u.on_barrier(0, 9, 1.0, aligned=True) == []
        assert u.blocked(0) and u.inflight_for(1) is None
        assert u.on_time(100.0) == []  # never switches
        assert u.on_barrier(1, 9, 2.0, aligned=True) == [
            TakeSnapshot(9, False, 1.0),
            BarriersComplete(9, 1.0),
        ]


def test_a_held_barrier_keeps_its_demand_for_alignment() -> None:
    u = CheckpointBarriers(2, "unaligned")
    u.on_barrier(0, 1, 0.0)
    assert u.on_barrier(0, 2, 0.1, aligned=True) == []  # held behind checkpoint 1
    assert u.on_barrier(1, 1, 0.2) == [BarriersComplete(1, 0.2)]  # 2 starts aligned
    assert u.blocked(0) and u.pending == 2 and not u.unaligned
