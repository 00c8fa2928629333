"""The pure heartbeat timing (client/liveness.py): pings every interval, a silence
after the timeout reported once, the caller's own stalls not held against the peer,
refusals hold everything until their retry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.liveness import PeerLiveness, check_timing


def test_timings_are_checked() -> None:
    check_timing(0.1, 0.1)
    with pytest.raises(ValueError, match="ping_interval"):
        check_timing(0.0, 1.0)
    with pytest.raises(ValueError, match="liveness_timeout"):
        check_timing(0.2, 0.1)
    with pytest.raises(ValueError, match="liveness_timeout"):
        PeerLiveness(0.0, 0.5, 0.2)


def test_pings_go_every_interval_with_rising_sequence_numbers() -> None:
    a = PeerLiveness(10.0, 0.1, 0.5)
    assert a.ping(10.0) == 1
    assert a.ping(10.05) is None
    assert a.ping(10.1) == 2
    assert a.ping(10.15) is None
    assert a.ping(10.2) == 3
    assert a.next_deadline() == pytest.approx(10.3)


def test_a_peer_silent_for_the_timeout_is_reported_once_and_comes_back() -> None:
    a = PeerLiveness(0.0, 0.1, 0.5)
    assert a.state == "unknown"
    assert a.heard(0.05) is True  # unknown -> alive
    assert a.heard(0.1) is False  # still alive: nothing new
    t = 0.1
    while t < 0.6:
        assert not a.silent(t)
        t = round(t + 0.1, 6)
    assert a.silent(0.61) is True
    assert a.state == "silent" and not a.alive
    assert not a.silent(0.7) and not a.silent(5.0)  # reported once
    assert a.heard(5.05) is True and a.alive


def test_the_caller_s_own_stall_is_not_the_peer_s_silence() -> None:
    """A loop that did not run for 5 s (its process was stopped) reads its peer's
    answers before it judges the peer: the 5 s are not counted."""
    a = PeerLiveness(0.0, 0.1, 0.5)
    a.heard(0.0)
    assert not a.silent(0.1)
    assert not a.silent(5.1)  # stalled from 0.1 to 5.1: only one interval counts
    assert not a.silent(5.2) and not a.silent(5.3) and not a.silent(5.35)
    assert a.silent(5.42)  # 0.1 + 0.1 + 0.32 of the caller's own running time


def test_a_lost_connection_is_silent_without_a_second_report() -> None:
    a = PeerLiveness(0.0, 0.1, 0.5)
    a.heard(0.0)
    a.lost(0.1)
    assert a.state == "silent"
    assert not a.silent(1.0)
    assert a.ping(1.0) is not None  # pings go on: they tell when it is back
    assert a.heard(1.05) is True


def test_a_refusal_holds_pings_and_signs_of_life_until_its_retry() -> None:
    a = PeerLiveness(0.0, 0.1, 0.5)
    a.heard(0.0)
    a.refuse(0.1, retry_after=2.0)
    assert a.state == "refused"
    assert a.ping(0.2) is None and a.heard(0.3) is False and not a.silent(1.5)
    assert a.next_deadline() == pytest.approx(2.1)
    assert not a.retry_due(2.0)
    assert a.retry_due(2.1) is True and a.state == "unknown"
    assert not a.retry_due(2.2)  # once
    assert a.ping(2.1) is not None
    t = 2.1
    while not a.silent(t):  # the silence counts from the retry
        t += 0.05
    assert 2.1 + 0.5 - 1e-9 <= t <= 2.1 + 0.55


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.001, 0.1), st.booleans()),  # (step <= interval, heard?)
        min_size=1,
        max_size=200,
    )
)
def test_silent_exactly_when_nothing_was_heard_for_the_timeout(
    steps: list[tuple[float, bool]],
) -> None:
    """Called at least once per interval (the shells' polls), the peer is reported
    silent only once ``timeout`` passed since its last sign of life, and no later than
    at the first call after that."""
    interval, timeout = 0.1, 0.5
    a = PeerLiveness(0.0, interval, timeout)
    now, last = 0.0, 0.0
    reported = False
    for step, heard in steps:
        now += step
        if heard:
            a.heard(now)
            last, reported = now, False
        silent = a.silent(now)
        overdue = now - last >= timeout
        if silent:
            assert overdue and not reported
            reported = True
        else:
            assert not overdue or reported
        a.ping(now)
        assert a.next_deadline() > now  # the caller need not wake before it
