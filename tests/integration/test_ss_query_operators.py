"""Stateful operators Structured Streaming users run, through the tree, on ``local[4]``:
``dropDuplicates`` with a watermark and ``applyInPandasWithState``, each with the RocksDB
provider (changelog checkpointing on) and with the HDFS-backed provider.

Each case runs the query over three input files (one per batch, ``availableNow``),
unloads every state store of the JVM (as a restart on another executor would find
them: nothing cached), runs it again from its checkpoint over a fourth file, then reads
the state back with Spark's ``statestore`` data source. Sink and state must equal the
batch answer, no state store file may be under the checkpoint directory and none may
have been written plain.

One set of nodes, one bridge and one Spark session serve the module (the queries set
their provider before they start; Spark keeps it in the checkpoint's offset log).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.structured_streaming.configure import LocalServices
from tests.support.ss_session import (
    PROVIDERS,
    STATE_SUFFIXES,
    ss_session,
    start_tree,
    write_json_input,
)

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 120.0  # seconds for one availableNow run
SCHEMA = "id string, ts timestamp, k string, v long"


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    s = start_tree(tmp_path_factory.mktemp("tree"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def spark(services: LocalServices) -> Iterator[Any]:
    session = ss_session(socket=services.socket)
    try:
        yield session
    finally:
        session.stop()


def _write_input(folder: Path, n: int) -> None:
    """File ``n`` of the input: 24 rows over 9 ids, 3 event times and 4 keys; ids and
    times overlap between files (duplicates across batches), all within one hour (the
    watermark drops nothing)."""
    rows = [
        {"id": f"i{(i + n) % 9}", "ts": f"2026-01-01 00:0{i % 3}:00", "k": f"k{i % 4}", "v": i * n}
        for i in range(24)
    ]
    write_json_input(folder, n, rows)


def _dedup(df: Any) -> Any:
    return df.withWatermark("ts", "1 hour").dropDuplicates(["id", "ts"])


def _count_and_sum(key: tuple[str], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState's function: the running count and sum of ``v`` per key,
    kept in the group state; emits the key's new totals."""
    import pandas as pd

    n, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        total += int(pdf["v"].sum())
    state.update((n, total))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [total]})


def _pandas_state(df: Any) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    return df.groupBy("k").applyInPandasWithState(
        _count_and_sum, "k string, n long, s long", "n long, s long", "Update",
        GroupStateTimeout.NoTimeout,
    )  # fmt: skip


OPERATORS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "dropDuplicates": (_dedup, "append"),
    "applyInPandasWithState": (_pandas_state, "update"),
}


def _run(spark: Any, op: str, source: Path, checkpoint: Path, out: dict[int, list[tuple]]) -> None:
    """Run operator ``op`` over ``source`` from ``checkpoint`` until every file is
    processed (one per batch); each batch's rows land in ``out[batch id]`` (a batch
    replayed after a restart replaces its earlier delivery)."""
    build, mode = OPERATORS[op]

    def sink(batch: Any, batch_id: int) -> None:
        out[batch_id] = [tuple(r) for r in batch.collect()]

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    q = (
        build(stream)
        .writeStream.outputMode(mode)
        .foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()


def _expected(spark: Any, op: str, source: Path) -> set[tuple]:
    """The batch answer over every file of ``source``: the distinct (id, ts) pairs, or
    (k, count, sum) per key."""
    from pyspark.sql import functions as F

    df = spark.read.schema(SCHEMA).json(str(source))
    if op == "dropDuplicates":
        return {(r.id, r.ts) for r in df.select("id", "ts").distinct().collect()}
    rows = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s")).collect()
    return {tuple(r) for r in rows}


def _from_sink(op: str, out: dict[int, list[tuple]]) -> set[tuple]:
    """What the sink holds: every row delivered (dropDuplicates, no row twice), or each
    key's latest totals (applyInPandasWithState)."""
    if op == "dropDuplicates":
        rows = [(r[0], r[1]) for b in sorted(out) for r in out[b]]
        assert len(rows) == len(set(rows)), "a duplicate reached the sink"
        return set(rows)
    latest: dict[str, tuple] = {}
    for b in sorted(out):
        for r in out[b]:
            latest[r[0]] = tuple(r)
    return set(latest.values())


def _from_state(spark: Any, op: str, checkpoint: Path) -> set[tuple]:
    """The state read back with Spark's ``statestore`` data source (its own provider
    instance, which reads the newest committed version through the manager)."""
    rows = spark.read.format("statestore").load(str(checkpoint)).collect()
    if op == "dropDuplicates":
        return {(r.key.id, r.key.ts) for r in rows}
    return {(r.key.k, r.value.groupState.n, r.value.groupState.s) for r in rows}


def _unload_state_stores(spark: Any) -> None:
    """Unload every state store provider of this JVM (Spark's ``StateStore.stop()``),
    so that the next query loads its state back through the manager, as on a new
    executor."""
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()


def _state_files(checkpoint: Path) -> list[Path]:
    return [p for p in checkpoint.rglob("*") if p.is_file() and p.name.endswith(STATE_SUFFIXES)]


def _plain_state_files(spark: Any) -> int:
    return int(spark._jvm.io.dstltree.spark.DstlCheckpointFileManager.plainStateFiles())


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
@pytest.mark.parametrize("op", sorted(OPERATORS))
def test_operator_state_goes_through_the_tree_and_restarts(
    spark: Any, tmp_path: Path, op: str, provider: str
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for k, v in {
        **PROVIDERS[provider],
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",  # snapshots too
        "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
    }.items():
        spark.conf.set(k, v)
    for n in (1, 2, 3):
        _write_input(source, n)
    plain = _plain_state_files(spark)
    out: dict[int, list[tuple]] = {}
    _run(spark, op, source, checkpoint, out)
    assert sorted(out) == [0, 1, 2]
    assert _from_sink(op, out) == _expected(spark, op, source)

    _unload_state_stores(spark)
    _write_input(source, 4)
    _run(spark, op, source, checkpoint, out)  # restarted from its checkpoint
    assert sorted(out) == [0, 1, 2, 3]
    expected = _expected(spark, op, source)
    assert _from_sink(op, out) == expected
    assert _from_state(spark, op, checkpoint) == expected
    assert _state_files(checkpoint) == []
    assert _plain_state_files(spark) == plain
