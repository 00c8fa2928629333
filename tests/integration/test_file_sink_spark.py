"""Spark reads only committed part files of a file sink: ``spark.read.parquet(url)``
and ``spark.read.json(url)`` skip ``_staging`` (Hadoop's hidden-path rule for names
starting with ``_`` or ``.``), whatever staged or in-progress files lie there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.sparkplug.sinks import FileSink
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from dstltree.sparkplug.spark_session import spark_session

    session = spark_session("local[1]", "file-sink-test")
    try:
        yield session
    finally:
        session.stop()


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_spark_reads_committed_files_only(spark: Any, tmp_path: Path, fmt: str) -> None:
    sink = FileSink(str(tmp_path / "out"), fmt, batch_rows=2)
    with sink.create_writer(0, 0) as w:
        for i in range(5):
            w.write({"id": i, "name": f"n{i}"})
        committed = w.prepare_commit(1)
        for i in range(5, 9):
            w.write({"id": i, "name": f"n{i}"})
        w.prepare_commit(2)  # staged, never committed
        in_progress = sink.create_writer(1, 1)
        for i in range(9, 12):
            in_progress.write({"id": i, "name": f"n{i}"})
    assert committed is not None
    sink.create_committer().commit([committed])
    staging = tmp_path / "out" / "_staging"
    wait_until(lambda: len([p for p in staging.rglob("*") if p.is_file()]) == 2)
    df = getattr(spark.read, fmt)(sink.url)
    assert sorted(r["id"] for r in df.collect()) == [0, 1, 2, 3, 4]
    in_progress.close()
