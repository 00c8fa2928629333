"""The down mark of a writer's only node, driven bare (client/backoff.py): one doubling
per silent try, not per expired item; an ack ends the mark at once; answers to pings end
it after the hold-down; a refusal is not ended by answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstltree.client.backoff import NodeBackoff


def _backoff() -> NodeBackoff:
    return NodeBackoff(retry_after=5.0, max_retry_after=60.0, hold_down=5.0, gap=1.0)


def test_items_of_one_outage_double_the_mark_once() -> None:
    b = _backoff()
    # 200 items sent over 2 s before the node went silent expire over 2 s of loop turns
    began = [b.expired(sent_at=t / 100, now=10.0 + t / 100) for t in range(200)]
    assert began.count(True) == 1
    assert b.down(11.99) and b.down_until == 15.0 and b.down_for == 10.0
    b.validate()


def test_each_silent_try_doubles_up_to_the_cap() -> None:
    b = _backoff()
    marks = []
    now = 0.0
    for _ in range(6):
        sent = b.down_until if b.down_until > now else now  # tried when the mark ran out
        now = sent + 10.0  # its ack timeout passed
        assert b.expired(sent, now)
        marks.append(b.down_until - now)
        b.validate()
    assert marks == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]


def test_an_ack_ends_the_mark_and_the_doubling() -> None:
    b = _backoff()
    b.expired(0.0, 10.0)
    b.expired(16.0, 26.0)  # a second silent try: 10 s mark
    assert b.down(27.0)
    assert b.acked(27.0)
    assert not b.down(27.0) and b.down_for == 5.0
    b.validate()


def test_ping_replies_end_the_mark_after_the_hold_down_without_a_gap() -> None:
    b = NodeBackoff(retry_after=30.0, max_retry_after=60.0, hold_down=2.0, gap=1.0)
    b.expired(0.0, 10.0)  # down until 40
    assert not any(b.heard(10.0 + i * 0.5) for i in range(4))  # 10.0 .. 11.5
    assert not b.heard(13.0)  # a gap of 1.5 s: counting starts again at 13
    assert not b.heard(14.5 - 0.6) and not b.heard(14.5)
    assert b.heard(15.0)  # answered 13 .. 15 with gaps under 1 s
    assert not b.down(15.0)
    assert b.down_for == 60.0  # nothing was acknowledged: the next mark stays doubled
    b.validate()


def test_answers_before_the_mark_do_not_count_toward_its_end() -> None:
    b = _backoff()
    for i in range(20):
        b.heard(i * 0.5)  # 0 .. 9.5: answered pings all along
    b.expired(0.0, 10.0)
    assert not b.heard(10.2)
    assert b.down(10.2)


def test_a_refusal_is_not_ended_by_answers() -> None:
    b = _backoff()
    b.refused(1.0)
    assert not b.acked(2.0) and not any(b.heard(2.0 + i * 0.5) for i in range(20))
    assert b.down(5.9) and not b.down(6.0)


def test_bad_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="retry_after and gap"):
        NodeBackoff(retry_after=0.0, max_retry_after=1.0)
    assert NodeBackoff(retry_after=5.0, max_retry_after=1.0).max_retry_after == 5.0


@given(
    st.lists(
        st.tuples(st.sampled_from(["expired", "acked", "heard", "refused"]), st.floats(0, 5)),
        max_size=60,
    )
)
def test_any_sequence_keeps_the_invariants(events: list[tuple[str, float]]) -> None:
    b = _backoff()
    now = 0.0
    for kind, step in events:
        now += step
        if kind == "expired":
            b.expired(max(0.0, now - 3.0), now)
        else:
            getattr(b, kind)(now)
        b.validate()
        assert b.down_until <= now + b.max_retry_after
