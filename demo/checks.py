"""The demo's checks: the same per-plane statistics computed by Spark SQL over the
landing files (the batch answer), compared key by key with the job's exactly-once
output and with the state restored from its latest checkpoint.

- batch: :func:`batch_stats` reads every landing file and aggregates with ``GROUP BY
  tailnum`` (nulls form one group, the job's None key); the latest flight is
  ``max(struct(event_time, origin, dest))``, the job's order.
- sink: :func:`sink_summary` reads the committed output, counts rows and duplicates
  (rows whose (tailnum, flights) appears more than once: each is a row made visible
  twice) and takes each plane's latest row (the most flights).
- state: :func:`compare` takes the restored state as a dict (``restore_all``'s
  shape), so the comparison is testable without a job.

Spark reads local URLs itself; other stores (``s3://``, ...) are read with pyarrow
through fsspec and handed to Spark, since the session has no S3 connector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pa_ds
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from dstltree.demo.flights import ROUTES, SINK_SCHEMA, STATS, Stats

LANDING_DDL = (
    "tailnum STRING, event_time BIGINT, origin STRING, dest STRING, "
    "dep_delay BIGINT, arr_delay BIGINT, distance BIGINT"
)
SINK_DDL = ", ".join(
    f"{f.name} {'STRING' if f.type == pa.string() else 'BIGINT'}" for f in SINK_SCHEMA
)
#: the job's filter, in SQL (dstltree.demo.flights.has_distance)
KEEP = "distance > 0"

BATCH_SQL = f"""
SELECT tailnum,
       count(*) AS flights,
       CAST(coalesce(sum(dep_delay), 0) AS BIGINT) AS dep_delay_sum,
       CAST(coalesce(sum(arr_delay), 0) AS BIGINT) AS arr_delay_sum,
       CAST(sum(distance) AS BIGINT) AS distance_sum,
       max(struct(event_time, origin, dest)) AS last
FROM landing WHERE {KEEP} GROUP BY tailnum
"""
ROUTES_SQL = f"""
SELECT tailnum, concat(origin, '-', dest) AS route, count(*) AS n
FROM landing WHERE {KEEP} GROUP BY tailnum, origin, dest
"""
LATEST_SQL = """
SELECT tailnum, max(struct(flights, dep_delay_sum, arr_delay_sum, distance_sum,
                           last_time, last_origin, last_dest)) AS latest
FROM sink GROUP BY tailnum
"""
DUPLICATES_SQL = """
SELECT CAST(coalesce(sum(n - 1), 0) AS BIGINT) AS extra
FROM (SELECT count(*) AS n FROM sink GROUP BY tailnum, flights HAVING count(*) > 1)
"""


@dataclass(frozen=True)
class BatchStats:
    """The batch answer: ``stats`` tailnum -> stats list (dstltree.demo.flights),
    ``routes`` tailnum -> {"ORIGIN-DEST": flights}, ``records`` rows kept by the
    filter (= rows the job must emit)."""

    stats: dict[Any, Stats]
    routes: dict[Any, dict[str, int]]
    records: int


@dataclass(frozen=True)
class SinkSummary:
    """The committed output: ``rows``, ``duplicate_rows`` (rows beyond the first of
    each (tailnum, flights)), ``latest`` tailnum -> stats list of its latest row."""

    rows: int
    duplicate_rows: int
    latest: dict[Any, Stats]


def read_parquet(spark: Any, url: str, ddl: str, storage_options: dict[str, Any] | None) -> Any:
    """A Spark DataFrame of columns ``ddl`` from every visible Parquet file below
    ``url`` (names starting with ``_`` or ``.`` skipped); empty when there is none.
    Raises what Spark or the filesystem raises for unreadable files."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    if isinstance(fs, LocalFileSystem):
        if not fs.exists(path):
            return spark.createDataFrame([], ddl)
        return spark.read.schema(ddl).parquet(path)
    schema = spark.createDataFrame([], ddl).schema
    if not fs.exists(path):
        return spark.createDataFrame([], schema)
    table = pa_ds.dataset(path, filesystem=fs, format="parquet").to_table(columns=schema.names)
    return spark.createDataFrame(table, schema)


def batch_stats(spark: Any, landing_url: str, storage_options: dict[str, Any] | None) -> BatchStats:
    """The batch answer from the landing files under ``landing_url`` (module
    docstring)."""
    read_parquet(spark, landing_url, LANDING_DDL, storage_options).createOrReplaceTempView(
        "landing"
    )
    stats = {
        r["tailnum"]: [
            r["flights"],
            r["dep_delay_sum"],
            r["arr_delay_sum"],
            r["distance_sum"],
            *r["last"],
        ]
        for r in spark.sql(BATCH_SQL).collect()
    }
    routes: dict[Any, dict[str, int]] = {}
    for r in spark.sql(ROUTES_SQL).collect():
        routes.setdefault(r["tailnum"], {})[r["route"]] = r["n"]
    return BatchStats(stats, routes, sum(s[0] for s in stats.values()))


def sink_summary(spark: Any, sink_url: str, storage_options: dict[str, Any] | None) -> SinkSummary:
    """Rows, duplicates and each plane's latest row of the committed output under
    ``sink_url`` (module docstring)."""
    sink = read_parquet(spark, sink_url, SINK_DDL, storage_options)
    sink.createOrReplaceTempView("sink")
    rows = sink.count()
    extra = spark.sql(DUPLICATES_SQL).collect()[0]["extra"]
    latest = {r["tailnum"]: list(r["latest"]) for r in spark.sql(LATEST_SQL).collect()}
    return SinkSummary(rows, int(extra), latest)


def mismatched(actual: dict[Any, Any], expected: dict[Any, Any]) -> list[Any]:
    """Keys whose values differ or that one side lacks (lists and tuples compare
    equal by content), sorted with None first."""
    keys = set(actual) | set(expected)
    return sort_keys(k for k in keys if _plain(actual.get(k)) != _plain(expected.get(k)))


def sort_keys(keys: Any) -> list[Any]:
    """Keys sorted by their text, None first (keys of mixed types sort too)."""
    return sorted(keys, key=lambda k: (k is not None, str(k)))


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def compare(
    batch: BatchStats, sink: SinkSummary, restored: dict[str, dict[Any, Any]]
) -> dict[str, Any]:
    """The report's verdicts. ``restored``: state name -> key -> value, as
    ``restore_all`` returns it ({} when there is no checkpoint). Returns
    ``state_matches_batch`` (both states equal the batch for every key),
    ``sink_matches_batch`` (every plane's latest row equals the batch, the row count
    equals the records, no duplicates), ``sink_rows``, ``sink_duplicate_rows``,
    ``mismatched_keys`` (at most 50, None first) and ``keys`` (planes in the batch)."""
    state_bad = set(mismatched(restored.get(STATS, {}), batch.stats))
    state_bad |= set(mismatched(restored.get(ROUTES, {}), batch.routes))
    sink_bad = set(mismatched(sink.latest, batch.stats))
    sink_ok = not sink_bad and sink.rows == batch.records and sink.duplicate_rows == 0
    return {
        "state_matches_batch": not state_bad,
        "sink_matches_batch": sink_ok,
        "sink_rows": sink.rows,
        "sink_duplicate_rows": sink.duplicate_rows,
        "mismatched_keys": sort_keys(state_bad | sink_bad)[:50],
        "keys": len(batch.stats),
    }
