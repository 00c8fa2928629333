"""The chaos benchmark's pure parts (bench/chaos.py): the faults option, the cases of
a run, and a stop's detection time (from its SIGSTOP to the first move away from the
node while it was stopped)."""

from __future__ import annotations

import pytest

from dstltree.bench.chaos import ChaosResult, _detections, _Stop, cases, parse_faults


def test_faults_are_parsed_in_a_fixed_order_and_unknown_ones_refused() -> None:
    assert parse_faults("stops,kills") == ("kills", "stops")
    assert parse_faults(" stops ") == ("stops",)
    for bad in ("", "kills,naps", ","):
        with pytest.raises(ValueError, match="kills, stops"):
            parse_faults(bad)


def test_the_cases_are_named_after_the_faults() -> None:
    assert [c[0] for c in cases(("kills", "stops"))] == [
        "dag, no faults",
        "dag, kills and stops",
        "tree, kills and stops",
    ]
    assert cases(("stops",))[2] == ("tree, stops", False, True)


def test_a_stop_is_detected_by_the_first_move_away_from_it_while_it_lasted() -> None:
    stops = [
        _Stop("a", "tcp://a", 100.0, 103.0),
        _Stop("root", "tcp://r", 200.0, 201.0),
        _Stop("b", "tcp://b", 300.0, None),  # still stopped at the end of the run
    ]
    left = [
        (100.4, "tcp://a", 50.0),
        (100.2, "tcp://a", 50.0),  # the first one, listed out of order
        (100.1, "tcp://a", 100.05),  # came to it after the stop: not a detection
        (99.0, "tcp://a", 50.0),  # before the stop: another fault
        (150.0, "tcp://r", 50.0),
        (201.5, "tcp://r", 50.0),  # after the stop ended: not this stop's
        (300.3, "tcp://b", 0.0),
    ]
    r = ChaosResult("x", 1.0)
    _detections(stops, left, "root", r)
    assert (r.stops, r.root_stops, r.undetected) == (3, 1, 1)
    assert r.detections == pytest.approx([0.2, 0.3])
    assert r.detect_p50_s == pytest.approx(0.25) and r.detect_max_s == pytest.approx(0.3)


def test_network_faults_are_known_and_put_the_nodes_on_hosts_of_their_own() -> None:
    from dstltree.bench.chaos import ChaosSettings

    assert parse_faults("oneway,partitions,kills") == ("kills", "partitions", "oneway")
    assert ChaosSettings(faults=("kills", "oneway")).netns
    assert not ChaosSettings(faults=("kills", "stops")).netns


def test_a_network_fault_is_chosen_among_nodes_not_busy() -> None:
    import random

    from dstltree.bench.chaos import DAG
    from dstltree.bench.chaos_net import choose

    rng = random.Random(3)
    for _ in range(200):
        cut = choose("partitions", rng, DAG, {"a", "b1"}, (1.0, 10.0))
        assert cut is not None and cut.node not in {"a", "b1"} and 1.0 <= cut.seconds <= 10.0
        one = choose("oneway", rng, DAG, {"a"}, (1.0, 2.0))
        assert one is not None and one.node != "root" and one.parent == DAG[one.node][0]
        assert "a" not in (one.node, one.parent)  # neither end busy
    assert choose("partitions", rng, DAG, set(DAG), (1.0, 2.0)) is None
    assert choose("oneway", rng, {"root": [], "a": ["root"]}, {"root"}, (1.0, 2.0)) is None


def test_faults_are_counted_by_kind_and_the_one_way_cuts_have_their_own_median() -> None:
    faults = [
        _Stop("a", "tcp://a", 100.0, 103.0, kind="partitions"),
        _Stop("root", "tcp://r", 200.0, 205.0, kind="partitions"),
        _Stop("a1", "tcp://a", 300.0, 302.0, kind="oneway"),  # detected by leaving a
        _Stop("b1", "tcp://b", 400.0, 402.0, kind="oneway"),
    ]
    left = [(100.5, "tcp://a", 0.0), (300.1, "tcp://a", 0.0), (400.3, "tcp://b", 0.0)]
    r = ChaosResult("x", 1.0)
    _detections(faults, left, "root", r)
    assert (r.stops, r.partitions, r.root_partitions, r.oneways) == (0, 2, 1, 2)
    assert r.undetected == 1  # nobody left the root while it was cut off
    assert r.oneway_p50_s == pytest.approx(0.2)
