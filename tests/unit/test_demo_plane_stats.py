"""The demo's keyed function on a stub of the state API (tests/support/state_stub.py):
per-plane sums with null delays skipped, the latest flight by (event_time, origin, dest)
whatever the arrival order, route counts in map state, one row per record that fits the
sink's schema, the null tail number as one key."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa

from dstltree.demo.flights import (
    ROUTES,
    SINK_COLUMNS,
    SINK_SCHEMA,
    STATS,
    PlaneStats,
    fold,
    has_distance,
    route_of,
    stats_row,
)
from tests.support.state_stub import run_function


def _flight(t: int, origin: str, dest: str, dep: int | None, arr: int | None, dist: int) -> dict:
    return {
        "event_time": t,
        "origin": origin,
        "dest": dest,
        "dep_delay": dep,
        "arr_delay": arr,
        "distance": dist,
    }


FLIGHTS = [
    ("N1", _flight(100, "JFK", "LAX", 5, 10, 2475)),
    ("N1", _flight(300, "LAX", "JFK", None, None, 2475)),  # cancelled: delays null
    (None, _flight(200, "EWR", "ORD", -3, None, 719)),
    ("N1", _flight(300, "EWR", "BOS", 1, -2, 200)),  # same hour as LAX-JFK, sorts first
    (None, _flight(50, "LGA", "ATL", 7, 8, 762)),
    ("N2", _flight(10, "JFK", "LAX", 0, 0, 2475)),
]
WANT_STATS = {
    "N1": [3, 6, 8, 5150, 300, "LAX", "JFK"],
    None: [2, 4, 8, 1481, 200, "EWR", "ORD"],
    "N2": [1, 0, 0, 2475, 10, "JFK", "LAX"],
}
WANT_ROUTES = {
    "N1": {"JFK-LAX": 1, "LAX-JFK": 1, "EWR-BOS": 1},
    None: {"EWR-ORD": 1, "LGA-ATL": 1},
    "N2": {"JFK-LAX": 1},
}


def test_state_and_rows() -> None:
    states, rows = run_function(PlaneStats(), FLIGHTS)
    assert states[STATS] == WANT_STATS
    assert states[ROUTES] == WANT_ROUTES
    assert len(rows) == len(FLIGHTS)
    assert [r["flights"] for r in rows if r["tailnum"] == "N1"] == [1, 2, 3]
    assert rows[-1] == dict(zip(SINK_COLUMNS, ["N2", 1, 0, 0, 2475, 10, "JFK", "LAX"], strict=True))
    assert pa.Table.from_pylist(rows, schema=SINK_SCHEMA).num_rows == len(rows)


def test_the_state_does_not_depend_on_arrival_order() -> None:
    for order in itertools.permutations(FLIGHTS):
        states, rows = run_function(PlaneStats(), order)
        assert states[STATS] == WANT_STATS
        assert states[ROUTES] == WANT_ROUTES
        latest = {}
        for r in rows:  # the row with the most flights of each plane is its final state
            if r["flights"] > latest.get(r["tailnum"], {"flights": 0})["flights"]:
                latest[r["tailnum"]] = r
        assert {k: [r[c] for c in SINK_COLUMNS[1:]] for k, r in latest.items()} == WANT_STATS


def test_fold_and_helpers() -> None:
    first = fold(None, _flight(7, "A", "B", None, None, 10))
    assert first == [1, 0, 0, 10, 7, "A", "B"]
    older = fold(first, _flight(6, "Z", "Z", 1, 2, 5))
    assert older == [2, 1, 2, 15, 7, "A", "B"]  # an older flight does not move "last"
    assert first == [1, 0, 0, 10, 7, "A", "B"]  # fold returns a new list
    assert route_of(_flight(0, "JFK", "SFO", 0, 0, 1)) == "JFK-SFO"
    assert stats_row(None, first)["tailnum"] is None
    assert has_distance({"distance": 17}) and not has_distance({"distance": 0})


def test_restored_lists_continue() -> None:
    """State values come back from msgpack as lists; the function continues from them."""
    states, _ = run_function(PlaneStats(), FLIGHTS[:2])
    resumed: Any = states[STATS]["N1"]
    assert fold(resumed, FLIGHTS[3][1]) == WANT_STATS["N1"]
