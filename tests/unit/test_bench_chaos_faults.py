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
