"""The demo's checks on a local Spark session, without the job: the producer lands the
first flights, PlaneStats runs over them through the state stub in a shuffled order
(records reach a plane's task from several files in no fixed order), its rows become
committed sink files, and the Spark SQL batch answer must equal both the sink's latest
rows and the state; a visible duplicate, a missing sink and S3 URLs are checked too."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dstltree.demo.checks import (
    SINK_DDL,
    batch_stats,
    compare,
    read_parquet,
    sink_summary,
)
from dstltree.demo.flights import SINK_SCHEMA, STATS, PlaneStats, has_distance
from dstltree.demo.producer import FlightsProducer
from dstltree.sparkplug.sinks.layout import final_name
from dstltree.sparkplug.sources.files import FileSource
from dstltree.sparkplug.spark_session import spark_session
from dstltree.storage.store import ObjectStore
from tests.support.s3_server import S3Target
from tests.support.state_stub import run_function

pytestmark = pytest.mark.spark
LIMIT = 4000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", app="dstl-test-demo-parts")
    yield session
    session.stop()


@dataclass
class Simulated:
    """The job's outcome computed without the runtime."""

    state: dict[str, dict[Any, Any]]
    rows: list[dict[str, Any]]


def _simulate(landing: str, storage_options: dict[str, Any] | None = None) -> Simulated:
    source = FileSource(landing, format="parquet", storage_options=storage_options)
    reader = source.create_reader()
    records = [r for s in source.list_splits().splits for r in reader.read(s, 0)]
    keyed = [(r["tailnum"], r) for r in records if has_distance(r)]
    random.Random(20261123).shuffle(keyed)
    state, rows = run_function(PlaneStats(), keyed)
    return Simulated(state, rows)


def _commit_rows(store: ObjectStore, rows: list[dict[str, Any]], parts: int = 3) -> None:
    """``rows`` as committed part files (and a staged copy that readers must skip)."""
    size = -(-len(rows) // parts)
    for i in range(parts):
        _put(store, final_name(i + 1, 0, 0, "parquet"), rows[i * size : (i + 1) * size])
    _put(store, "_staging/attempt-000000/cp-000000000009-task-00000-x.parquet", rows[:50])


def _put(store: ObjectStore, name: str, rows: list[dict[str, Any]]) -> None:
    buf = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=SINK_SCHEMA), buf)
    store.put(store.join(name), buf.getvalue().to_pybytes())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Simulated]:
    root = tmp_path_factory.mktemp("demo")
    assert FlightsProducer(str(root / "landing"), limit_records=LIMIT).run()
    sim = _simulate(str(root / "landing"))
    _commit_rows(ObjectStore(str(root / "sink")), sim.rows)
    return root, sim


def test_batch_sink_and_state_agree(spark: Any, demo: tuple[Path, Simulated]) -> None:
    root, sim = demo
    batch = batch_stats(spark, str(root / "landing"), None)
    sink = sink_summary(spark, str(root / "sink"), None)
    assert batch.records == LIMIT == len(sim.rows)
    assert None in batch.stats and batch.stats == sim.state[STATS]
    assert sink.rows == LIMIT and sink.duplicate_rows == 0
    v = compare(batch, sink, sim.state)
    assert v["state_matches_batch"] and v["sink_matches_batch"], v["mismatched_keys"]
    assert v["keys"] == len(batch.stats) == len({r["tailnum"] for r in sim.rows})


def test_a_visible_duplicate_and_a_wrong_state_are_found(
    spark: Any, demo: tuple[Path, Simulated], tmp_path: Path
) -> None:
    root, sim = demo
    store = ObjectStore(str(tmp_path / "sink"))
    _commit_rows(store, sim.rows)
    _put(store, final_name(7, 0, 1, "parquet"), sim.rows[-2:])  # two rows visible twice
    sink = sink_summary(spark, str(tmp_path / "sink"), None)
    assert sink.rows == LIMIT + 2 and sink.duplicate_rows == 2
    key = sim.rows[0]["tailnum"]
    wrong = {**sim.state, STATS: {**sim.state[STATS], key: [0, 0, 0, 0, 0, "", ""]}}
    v = compare(batch_stats(spark, str(root / "landing"), None), sink, wrong)
    assert not v["state_matches_batch"] and not v["sink_matches_batch"]
    assert v["mismatched_keys"] == [key] and v["sink_duplicate_rows"] == 2


def test_a_missing_sink_reads_empty(spark: Any, tmp_path: Path) -> None:
    assert read_parquet(spark, str(tmp_path / "nothing"), SINK_DDL, None).count() == 0
    sink = sink_summary(spark, str(tmp_path / "nothing"), None)
    assert (sink.rows, sink.duplicate_rows, sink.latest) == (0, 0, {})


@pytest.mark.s3
def test_on_s3(spark: Any, s3: S3Target) -> None:
    landing, sink_url = f"{s3.base_url}/demo/landing", f"{s3.base_url}/demo/sink"
    assert FlightsProducer(landing, s3.storage_options, limit_records=1500).run()
    sim = _simulate(landing, s3.storage_options)
    _commit_rows(ObjectStore(sink_url, s3.storage_options), sim.rows)
    v = compare(
        batch_stats(spark, landing, s3.storage_options),
        sink_summary(spark, sink_url, s3.storage_options),
        sim.state,
    )
    assert v["state_matches_batch"] and v["sink_matches_batch"] and v["sink_rows"] == 1500
