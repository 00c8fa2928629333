"""The demo's producer: every flight lands, one Parquet file per day in date order, one
schema, ``_SUCCESS`` last, no half-written file ever visible to a FileSource listing, a
stop or a failure that the caller sees. No timing is asserted."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from dstltree.demo import producer as producer_module
from dstltree.demo.producer import (
    LANDING_SCHEMA,
    MARKER,
    TOTAL_FLIGHTS,
    FlightsProducer,
    Pace,
    ProducerError,
    day_tables,
    flights_table,
    schedule,
)
from dstltree.sparkplug.sources.files import list_files


def test_the_table_holds_every_flight_in_landing_order() -> None:
    table = flights_table()
    assert table.num_rows == TOTAL_FLIGHTS
    assert table.schema == LANDING_SCHEMA
    assert table.column("tailnum").null_count == 2512  # flights without a tail number
    days, times = table.column("day").to_pylist(), table.column("event_time").to_pylist()
    keys = list(zip(days, times, strict=True))
    assert keys == sorted(keys)
    assert flights_table(100) == table.slice(0, 100)  # the first N rows of that order


def test_one_file_per_day_in_date_order() -> None:
    days = day_tables(flights_table())
    names = [name for name, _ in days]
    assert len(names) == 365 and names == sorted(names)
    assert names[0] == "flights-2013-01-01.parquet" and names[-1] == "flights-2013-12-31.parquet"
    assert sum(t.num_rows for _, t in days) == TOTAL_FLIGHTS
    for name, t in days:
        assert set(t.column("day").to_pylist()) == {name[len("flights-") : -len(".parquet")]}
    assert day_tables(flights_table(0)) == []


def test_schedule_spreads_records_evenly() -> None:
    assert schedule([3, 2, 5], 10.0) == [0.0, 0.3, 0.5]
    assert schedule([3, 2], 0.0) == [0.0, 0.0]
    assert schedule([], 5.0) == []
    assert Pace(records_per_second=50.0, duration_s=9.0).rate(1000) == 50.0
    assert Pace(duration_s=10.0).rate(1000) == 100.0
    assert Pace().rate(1000) == 0.0


def _spy_listing(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[tuple[str, list[str], bool]]:
    """Record, while each day file is being written (before its rename), what a
    FileSource listing of ``root`` sees: (file being written, split ids, complete)."""
    seen: list[tuple[str, list[str], bool]] = []
    real = pq.write_table

    def write_table(table: Any, where: Any, **kw: Any) -> None:
        real(table, where, **kw)
        listing = list_files(LocalFileSystem(), str(root))
        seen.append(
            (getattr(where, "name", str(where)), [s.id for s in listing.splits], listing.complete)
        )

    monkeypatch.setattr(producer_module, "pq", SimpleNamespace(write_table=write_table))
    return seen


def test_files_appear_complete_in_order_with_success_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "landing"
    seen = _spy_listing(monkeypatch, root)
    p = FlightsProducer(str(root), limit_records=5000)
    assert p.run() is True
    names = [name for name, _ in day_tables(flights_table(5000))]
    assert len(seen) == len(names) == p.files_written == p.total_files >= 5
    for i, (being_written, ids, complete) in enumerate(seen):
        assert Path(being_written).name == f".{names[i]}.inprogress"
        assert ids == names[:i]  # earlier days only, never the file being written
        assert not complete  # no _SUCCESS before the last file
    listing = list_files(LocalFileSystem(), str(root))
    assert [s.id for s in listing.splits] == names and listing.complete
    assert sorted(f.name for f in root.iterdir()) == sorted([*names, MARKER])
    for name in names:
        assert pq.read_schema(root / name).remove_metadata() == LANDING_SCHEMA
    assert sum(pq.read_metadata(root / n).num_rows for n in names) == p.records_written == 5000
    assert p.completed.is_set() and not p.failed.is_set()


def test_stop_ends_early_without_success(tmp_path: Path) -> None:
    p = FlightsProducer(str(tmp_path), pace=Pace(records_per_second=1.0), limit_records=3000)
    p.start()
    p.stop()
    assert p.join(timeout=30)
    assert not (tmp_path / MARKER).exists()
    assert p.files_written < p.total_files and not p.completed.is_set()
    p.raise_if_failed()  # a stop is not a failure


def test_a_failure_surfaces(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    p = FlightsProducer(str(blocker / "landing"), limit_records=2000).start()
    assert p.failed.wait(timeout=30)
    assert p.join(timeout=30)
    with pytest.raises(ProducerError, match="landing"):
        p.raise_if_failed()
    assert not p.completed.is_set()
