"""The writer's choice among its nodes (client/failover.py): move on a lost connection,
return to the preferred node only after its probe stayed up for the hold-down."""

from __future__ import annotations

import pytest

from dstltree.client.failover import NodePreference


def test_a_lost_connection_moves_to_the_next_node() -> None:
    p = NodePreference(("a", "b", "c"), hold_down=5.0)
    assert p.address == "a" and p.probe_target() is None
    assert p.lost(now=10.0) == 1 and p.address == "b"
    assert p.lost(now=11.0) == 2 and p.address == "c"
    # all down: the next one in order anyway (a is still held down until 15)
    assert p.lost(now=12.0) == 0 and p.address == "a"
    assert p.all_down(now=12.0) and not p.all_down(now=15.0)  # a's hold-down is over


def test_after_the_hold_down_the_preferred_node_is_chosen_again_on_a_loss() -> None:
    p = NodePreference(("a", "b", "c"), hold_down=5.0)
    p.lost(now=0.0)  # -> b
    assert p.lost(now=6.0) == 0, "a's hold-down is over: the most preferred node"


def test_return_only_after_the_probe_stayed_up_for_the_hold_down() -> None:
    p = NodePreference(("a", "b"), hold_down=2.0)
    p.lost(now=0.0)
    assert p.probe_target() == 0
    p.probe_seen(True, now=1.0)
    assert p.should_return(now=2.5) is None, "a is held down until 2"
    assert p.should_return(now=2.9) is None, "the probe is up for 1.9 s only"
    assert p.should_return(now=3.0) == 0 and p.address == "a"
    assert p.probe_target() is None


def test_a_flapping_node_restarts_the_hold_down() -> None:
    p = NodePreference(("a", "b"), hold_down=2.0)
    p.lost(now=0.0)
    p.probe_seen(True, now=2.0)
    p.probe_seen(False, now=3.0)
    p.probe_seen(True, now=3.5)
    assert p.should_return(now=5.0) is None
    assert p.should_return(now=5.5) == 0


def test_a_single_node_stays() -> None:
    p = NodePreference(("a",))
    assert p.lost(now=0.0) is None and p.address == "a" and p.probe_target() is None


@pytest.mark.parametrize(
    ("addresses", "hold_down", "match"),
    [((), 1.0, "at least one"), (("a", "a"), 1.0, "repeat"), (("a",), -1.0, "hold_down")],
)
def test_bad_preferences_are_refused(
    addresses: tuple[str, ...], hold_down: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        NodePreference(addresses, hold_down)
