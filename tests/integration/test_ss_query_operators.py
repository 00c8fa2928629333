"""Every stateful operator Spark has, through the tree, on ``local[4]`` (issue 45):
streaming aggregation, ``dropDuplicates``, ``dropDuplicatesWithinWatermark``, a
stream-stream join (four state stores per partition), session windows,
``applyInPandasWithState`` and ``transformWithStateInPandas`` (three column families
and processing-time timers), each with the RocksDB provider (changelog checkpointing on
and off, state checkpoint format versions 1 and 2) and with the HDFS-backed provider
(format 1; ``transformWithState`` needs RocksDB).

Each case runs the query over three input files (one per batch, ``availableNow``); a
Python worker of the sink's stage dies in the middle of batch 1 (Spark runs the task
again); the newest commit is deleted (the checkpoint a driver crash leaves between the
batch's state files and its commit); every state store of the JVM is unloaded; then
the query runs again from its checkpoint over a fourth file, with another worker dying
in the middle of its last batch. Sink and state (read back with Spark's ``statestore``
data source) must equal the batch answer, no state store file may be under the
checkpoint directory and none may have been written plain.

``make test`` runs a subset (every operator on RocksDB with changelog checkpointing,
format 1, and one operator on each other provider setting); the whole matrix is marked
``ss_matrix``: ``.venv/bin/python -m pytest -q -m ss_matrix
tests/integration/test_ss_query_operators.py``.

One set of nodes, one bridge and one Spark session serve the module (the queries set
their provider before they start; Spark keeps it in the checkpoint's offset log).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dstltree.structured_streaming.configure import LocalServices
from tests.support.ss_faults import arm, die_once_filter, drop_last_commit
from tests.support.ss_session import (
    HDFS,
    ROCKSDB,
    STATE_SUFFIXES,
    ss_session,
    start_tree,
    write_json_input,
)

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 120.0  # seconds for one availableNow run
SCHEMA = "id string, ts timestamp, k string, v long"

_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
_FORMAT = "spark.sql.streaming.stateStore.checkpointFormatVersion"


def _rocksdb(changelog: bool, version: int) -> dict[str, str]:
    return {_PROVIDER: ROCKSDB, _CHANGELOG: str(changelog).lower(), _FORMAT: str(version)}


#: every provider setting; each sets every key (the module's session is shared)
PROVIDERS: dict[str, dict[str, str]] = {
    "rocksdb-changelog-v1": _rocksdb(True, 1),
    "rocksdb-changelog-v2": _rocksdb(True, 2),
    "rocksdb-snapshots-v1": _rocksdb(False, 1),
    "rocksdb-snapshots-v2": _rocksdb(False, 2),
    "hdfs": {_PROVIDER: HDFS, _CHANGELOG: "false", _FORMAT: "1"},
}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    s = start_tree(tmp_path_factory.mktemp("tree"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def spark(services: LocalServices) -> Iterator[Any]:
    # local[4, 4]: a task may fail 3 times (plain local[4] fails the job at the first)
    session = ss_session(master="local[4,4]", socket=services.socket)
    try:
        yield session
    finally:
        session.stop()


def _write_input(folder: Path, n: int) -> None:
    """File ``n`` of the input: 24 rows, over 24 of 40 ids (6 new ones each file, the
    others seen before), 4 keys (each in every file), event times in minutes
    ``10n .. 10n+2`` (a session per key and file; all within the watermark's hour)."""
    rows = [
        {
            "id": f"i{(i + 6 * n) % 40}",
            "ts": f"2026-01-01 00:{10 * n + i % 3:02d}:00",
            "k": f"k{i % 4}",
            "v": i * n + 1,
        }
        for i in range(24)
    ]
    write_json_input(folder, n, rows)
    # the file source takes files in modification time order: one second apart
    os.utime(folder / f"part-{n}.json", (1_700_000_000 + n, 1_700_000_000 + n))


# --- the operators -----------------------------------------------------------------------


def _read(spark: Any, source: Path) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))


def _aggregation(spark: Any, source: Path) -> Any:
    from pyspark.sql import functions as F

    return _read(spark, source).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))


def _dedup(spark: Any, source: Path) -> Any:
    return _read(spark, source).withWatermark("ts", "1 hour").dropDuplicates(["id", "k"])


def _dedup_within(spark: Any, source: Path) -> Any:
    return _read(spark, source).withWatermark("ts", "1 hour").dropDuplicatesWithinWatermark(["id"])


def _join(spark: Any, source: Path) -> Any:
    """Rows of keys k0, k1 (left) joined on ``id`` with rows of k2, k3 (right), from two
    file sources over the same folder; no watermark, so both sides keep every row."""
    from pyspark.sql import functions as F

    left = _read(spark, source).where(F.col("k") < "k2").select("id", F.col("v").alias("lv"))
    right = _read(spark, source).where(F.col("k") >= "k2")
    right = right.select(F.col("id").alias("rid"), F.col("v").alias("rv"))
    return left.join(right, F.col("id") == F.col("rid")).select("id", "lv", "rv")


def _sessions(spark: Any, source: Path) -> Any:

    df = _read(spark, source).withWatermark("ts", "1 hour")
    return _session_agg(df)


def _session_agg(df: Any) -> Any:
    from pyspark.sql import functions as F

    out = df.groupBy(F.session_window("ts", "5 minutes").alias("w"), "k")
    out = out.agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    return out.select("k", F.col("w.start").alias("start"), F.col("w.end").alias("end"), "n", "s")


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


def _pandas_state(spark: Any, source: Path) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    return _read(spark, source).groupBy("k").applyInPandasWithState(
        _count_and_sum, "k string, n long, s long", "n long, s long", "Update",
        GroupStateTimeout.NoTimeout,
    )  # fmt: skip


def _processor() -> Any:
    """A ``StatefulProcessor`` with three state variables (RocksDB column families):
    ``totals`` (value: count and sum of ``v``), ``ids`` (map: id -> rows seen) and
    ``fired`` (value: timers fired). Each batch with input for a key registers an
    event-time timer 1 ms past the batch's watermark; the watermark (delay 0) passes it
    in the next batch (the last file's in the no-data batch after it), which emits the
    key's count of fired timers (a ``timer`` row). Processing-time timers are not used:
    with them an ``availableNow`` query runs no-data batches without end (pyspark
    4.3.0; it died of a ``StackOverflowError`` after a minute, without the tree too)."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class Totals(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.totals = handle.getValueState("totals", "n long, s long")
            self.ids = handle.getMapState("ids", "id string", "c long")
            self.fired = handle.getValueState("fired", "t long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            n, s = self.totals.get() if self.totals.exists() else (0, 0)
            for pdf in rows:
                n += len(pdf)
                s += int(pdf["v"].sum())
                for i in pdf["id"]:
                    c = self.ids.getValue((i,)) if self.ids.containsKey((i,)) else (0,)
                    self.ids.updateValue((i,), (c[0] + 1,))
            self.totals.update((n, s))
            self.handle.registerTimer(timerValues.getCurrentWatermarkInMs() + 1)
            yield pd.DataFrame({"k": [key[0]], "kind": ["input"], "n": [n], "s": [s]})

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[Any]:
            t = (self.fired.get()[0] if self.fired.exists() else 0) + 1
            self.fired.update((t,))
            yield pd.DataFrame({"k": [key[0]], "kind": ["timer"], "n": [t], "s": [0]})

        def close(self) -> None:
            pass

    return Totals()


def _transform(spark: Any, source: Path) -> Any:
    df = _read(spark, source).withWatermark("ts", "0 seconds")
    return df.groupBy("k").transformWithStateInPandas(
        _processor(), "k string, kind string, n long, s long", "Update", "EventTime"
    )


def _batch(spark: Any, source: Path) -> Any:
    return spark.read.schema(SCHEMA).json(str(source))


def _totals(spark: Any, source: Path) -> set[tuple]:
    from pyspark.sql import functions as F

    df = _batch(spark, source).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    return {tuple(r) for r in df.collect()}


def _latest(out: dict[int, list[tuple]], width: int = 3) -> set[tuple]:
    """Each key's newest row (update mode): first field the key."""
    latest: dict[Any, tuple] = {}
    for b in sorted(out):
        for r in out[b]:
            latest[r[0]] = tuple(r[:width])
    return set(latest.values())


def _statestore(spark: Any, checkpoint: Path, **options: str) -> list[Any]:
    """The newest committed state, read by Spark's ``statestore`` data source (its own
    provider instance, which reads through the manager)."""
    reader = spark.read.format("statestore")
    for k, v in options.items():
        reader = reader.option(k, v)
    return list(reader.load(str(checkpoint)).collect())


@dataclass(frozen=True)
class Operator:
    """A streaming query's operator and how to check it against the batch answer."""

    build: Callable[[Any, Path], Any]  # (spark, source folder) -> streaming DataFrame
    mode: str
    sink: Callable[[dict[int, list[tuple]]], Any]  # the sink's rows by batch -> answer
    answer: Callable[[Any, Path], Any]  # (spark, source) -> the batch answer
    state: Callable[[Any, Path], Any]  # (spark, checkpoint) -> the state's answer
    state_answer: Callable[[Any, Path], Any]  # (spark, source) -> what the state holds
    rocksdb_only: bool = False


def _agg_state(spark: Any, ckpt: Path) -> set[tuple]:
    return {(r.key.k, *r.value) for r in _statestore(spark, ckpt)}


def _dedup_answer(spark: Any, source: Path) -> set[tuple]:
    return {tuple(r) for r in _batch(spark, source).select("id", "k").distinct().collect()}


def _dedup_sink(out: dict[int, list[tuple]]) -> set[tuple]:
    pairs = [(r[0], r[2]) for b in sorted(out) for r in out[b]]  # (id, k) of (id, ts, k, v)
    assert len(pairs) == len(set(pairs)), "a duplicate reached the sink"
    return set(pairs)


def _dedup_state(spark: Any, ckpt: Path) -> set[tuple]:
    return {(r.key.id, r.key.k) for r in _statestore(spark, ckpt)}


def _ids_once(out: dict[int, list[tuple]]) -> set[str]:
    ids = [r[0] for b in sorted(out) for r in out[b]]
    assert len(ids) == len(set(ids)), "an id reached the sink twice"
    return set(ids)


def _ids(spark: Any, source: Path) -> set[str]:
    return {r.id for r in _batch(spark, source).select("id").distinct().collect()}


def _join_sink(out: dict[int, list[tuple]]) -> Counter[tuple]:
    return Counter(tuple(r) for b in sorted(out) for r in out[b])


def _join_answer(spark: Any, source: Path) -> Counter[tuple]:
    from pyspark.sql import functions as F

    df = _batch(spark, source)
    left = df.where(F.col("k") < "k2").select("id", F.col("v").alias("lv"))
    right = df.where(F.col("k") >= "k2").select(F.col("id").alias("rid"), F.col("v").alias("rv"))
    joined = left.join(right, F.col("id") == F.col("rid")).select("id", "lv", "rv")
    return Counter(tuple(r) for r in joined.collect())


def _join_state(spark: Any, ckpt: Path) -> dict[str, Counter[tuple]]:
    """Both sides' rows, from their stores (``joinSide``: Spark reads the side's
    ``keyToNumValues`` and ``keyWithIndexToValue`` stores together)."""
    return {
        side: Counter(tuple(r.value) for r in _statestore(spark, ckpt, joinSide=side))
        for side in ("left", "right")
    }


def _join_state_answer(spark: Any, source: Path) -> dict[str, Counter[tuple]]:
    from pyspark.sql import functions as F

    df = _batch(spark, source)
    left = df.where(F.col("k") < "k2").select("id", "v")
    right = df.where(F.col("k") >= "k2").select("id", "v")
    return {
        "left": Counter(tuple(r) for r in left.collect()),
        "right": Counter(tuple(r) for r in right.collect()),
    }


def _last_batch(out: dict[int, list[tuple]]) -> set[tuple]:
    """Complete mode: the newest batch holds the whole result."""
    return {tuple(r) for r in out[max(out)]}


def _sessions_answer(spark: Any, source: Path) -> set[tuple]:
    return {tuple(r) for r in _session_agg(_batch(spark, source)).collect()}


def _sessions_state(spark: Any, ckpt: Path) -> set[tuple]:
    """The session window state: per key, its sessions (window, count and sum buffers)."""
    rows = _statestore(spark, ckpt)
    return {
        (r.key.k, r.value.session_window.start, r.value.session_window.end)
        + (r.value["count"], r.value["sum"])
        for r in rows
    }


def _group_state(spark: Any, ckpt: Path) -> set[tuple]:
    return {(r.key.k, r.value.groupState.n, r.value.groupState.s) for r in _statestore(spark, ckpt)}


def _transform_sink(out: dict[int, list[tuple]]) -> tuple[set[tuple], set[tuple]]:
    """Each key's newest totals and its newest count of fired timers."""
    inputs = {b: [r for r in rows if r[1] == "input"] for b, rows in out.items()}
    timers = {b: [r for r in rows if r[1] == "timer"] for b, rows in out.items()}
    return (
        {(r[0], r[2], r[3]) for r in _latest(inputs, 4)},
        {(r[0], r[2]) for r in _latest(timers, 4)},
    )


def _batches_per_key(spark: Any, source: Path) -> set[tuple]:
    from pyspark.sql import functions as F

    files = _batch(spark, source).select("k", F.input_file_name().alias("f")).distinct()
    return {tuple(r) for r in files.groupBy("k").count().collect()}


def _transform_answer(spark: Any, source: Path) -> tuple[set[tuple], set[tuple]]:
    """Totals per key; one timer fired per key and batch with its input (one file a batch)."""
    return _totals(spark, source), _batches_per_key(spark, source)


def _transform_state(spark: Any, ckpt: Path) -> dict[str, Any]:
    """Every state variable (column family) and the timers still registered."""
    read = _statestore
    return {
        "totals": {
            (r.key.k, r.value.n, r.value.s) for r in read(spark, ckpt, stateVarName="totals")
        },
        "fired": {(r.key.k, r.value.t) for r in read(spark, ckpt, stateVarName="fired")},
        "ids": {
            (r.key.k, r.user_map_key.id, r.user_map_value.c)
            for r in read(spark, ckpt, stateVarName="ids")
        },
        "timers": len(read(spark, ckpt, readRegisteredTimers="true")),
    }


def _transform_state_answer(spark: Any, source: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    ids = _batch(spark, source).groupBy("k", "id").agg(F.count("*"))
    return {
        "totals": _totals(spark, source),
        "fired": _batches_per_key(spark, source),
        "ids": {tuple(r) for r in ids.collect()},
        "timers": 0,  # every timer fired (the last ones in the closing no-data batch)
    }


OPERATORS: dict[str, Operator] = {
    "aggregation": Operator(_aggregation, "update", _latest, _totals, _agg_state, _totals),
    "dropDuplicates": Operator(
        _dedup, "append", _dedup_sink, _dedup_answer, _dedup_state, _dedup_answer
    ),
    "dropDuplicatesWithinWatermark": Operator(
        _dedup_within,
        "append",
        _ids_once,
        _ids,
        lambda spark, ckpt: {r.key.id for r in _statestore(spark, ckpt)},
        _ids,
    ),  # fmt: skip
    "streamStreamJoin": Operator(
        _join, "append", _join_sink, _join_answer, _join_state, _join_state_answer
    ),
    "sessionWindow": Operator(
        _sessions, "complete", _last_batch, _sessions_answer, _sessions_state, _sessions_answer
    ),
    "applyInPandasWithState": Operator(
        _pandas_state, "update", _latest, _totals, _group_state, _totals
    ),
    "transformWithStateInPandas": Operator(
        _transform,
        "update",
        _transform_sink,
        _transform_answer,
        _transform_state,
        _transform_state_answer,
        rocksdb_only=True,
    ),  # fmt: skip
}

# --- running a case ----------------------------------------------------------------------


def _run(
    spark: Any, op: str, source: Path, checkpoint: Path, markers: Path, out: dict[int, list[tuple]]
) -> None:
    """Run operator ``op`` over ``source`` from ``checkpoint`` until every file is
    processed (one per batch); each batch's rows land in ``out[batch id]`` (a batch
    replayed after a restart replaces its earlier delivery). The sink's stage (the one
    that writes the state) goes through :func:`die_once_filter`."""
    build, mode = OPERATORS[op].build, OPERATORS[op].mode
    die_once = die_once_filter(markers)

    def sink(batch: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = batch.filter(die_once(F.lit(batch_id))).collect()
        out[batch_id] = [tuple(r) for r in rows]

    q = (
        build(spark, source)
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


def _read_state(spark: Any, operator: Operator, checkpoint: Path) -> Any:
    """``operator.state`` read back; when Spark cannot load it, an AssertionError that
    names what the manager lists under ``state/`` and the newest commits (the evidence
    a rare failure needs)."""
    try:
        return operator.state(spark, checkpoint)
    except Exception as e:  # noqa: BLE001 - any load failure gets the evidence attached
        commits = sorted(
            int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()
        )
        newest = (checkpoint / "commits" / str(commits[-1])).read_text() if commits else ""
        listing = _manager_listing(spark, checkpoint / "state")
        raise AssertionError(
            f"state not readable: {str(e).splitlines()[0]}\ncommits {commits}, newest:\n"
            f"{newest}\nthe manager lists:\n" + "\n".join(listing)
        ) from e


def _manager_listing(spark: Any, folder: Path, depth: int = 4) -> list[str]:
    """Every file below ``folder`` as the checkpoint file manager lists it (through the
    bridge's view): ``relative path length``."""
    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(str(folder))
    manager = jvm.io.dstltree.spark.DstlCheckpointFileManager(
        root, spark._jsc.hadoopConfiguration()
    )
    out: list[str] = []
    todo = [(root, 0)]
    while todo:
        d, level = todo.pop()
        for st in manager.list(d):
            rel = str(st.getPath()).split(str(folder), 1)[-1]
            if st.isDirectory() and level < depth:
                todo.append((st.getPath(), level + 1))
            else:
                out.append(f"{rel} {st.getLen()}")
    return sorted(out)


def _unload_state_stores(spark: Any) -> None:
    """Unload every state store provider of this JVM (Spark's ``StateStore.stop()``),
    so that the next query loads its state back through the manager, as on a new
    executor."""
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()


def _state_files(checkpoint: Path) -> list[Path]:
    return [p for p in checkpoint.rglob("*") if p.is_file() and p.name.endswith(STATE_SUFFIXES)]


def _plain_state_files(spark: Any) -> int:
    return int(spark._jvm.io.dstltree.spark.DstlCheckpointFileManager.plainStateFiles())


def _cases() -> Iterator[Any]:
    """Every (operator, provider) pair Spark supports; the default run keeps each
    operator once, every provider setting at least once (a case takes 30 to 60 s)."""
    default = {
        ("aggregation", "rocksdb-changelog-v2"),
        ("dropDuplicates", "hdfs"),
        ("dropDuplicatesWithinWatermark", "rocksdb-snapshots-v1"),
        ("streamStreamJoin", "rocksdb-changelog-v1"),
        ("sessionWindow", "rocksdb-snapshots-v2"),
        ("applyInPandasWithState", "rocksdb-changelog-v1"),
        ("transformWithStateInPandas", "rocksdb-changelog-v1"),
    }
    for op in OPERATORS:
        for provider in PROVIDERS:
            if OPERATORS[op].rocksdb_only and PROVIDERS[provider][_PROVIDER] != ROCKSDB:
                continue
            marks = [] if (op, provider) in default else [pytest.mark.ss_matrix, pytest.mark.slow]
            yield pytest.param(op, provider, marks=marks, id=f"{op}-{provider}")


@pytest.mark.parametrize(("op", "provider"), list(_cases()))
def test_operator_state_goes_through_the_tree_and_restarts(
    spark: Any, tmp_path: Path, op: str, provider: str
) -> None:
    """Two faults, both deterministic (no timing decides where they strike):

    - a Python worker of the stage that writes the state dies (``os._exit``) on its
      first row of batch 1 and of the restarted run's batch of the fourth file (a marker
      file, renamed
      by exactly one task): its task fails after the operator above it wrote some or all
      of its partition's state files for the batch, and Spark runs it again, which
      writes them again (the bridge replaces them);
    - the newest ``commits/<N>`` is deleted after the first run (N is 2, or a later
      no-data batch a watermark's move made run): what Spark finds after
      its driver died between the batch's state files and its commit (stopping the query
      mid-batch instead would depend on timing). The restarted query runs batch N again
      from version N's state, over the files the bridge already holds for N + 1.

    Between the runs every state store of the JVM is unloaded, so the restart reads its
    state back through the manager and the bridge, as a new executor would.
    """
    operator = OPERATORS[op]
    source, checkpoint, markers = tmp_path / "in", tmp_path / "ckpt", tmp_path / "markers"
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
    fired = arm(markers, 1)
    _run(spark, op, source, checkpoint, markers, out)
    assert fired.exists(), "no task of batch 1 died"
    assert sorted(out) == list(range(len(out))) and len(out) >= 3  # + no-data batches
    assert operator.sink(out) == operator.answer(spark, source)

    last = drop_last_commit(checkpoint)
    _unload_state_stores(spark)
    _write_input(source, 4)
    fired = arm(markers, last + 1)  # the batch of file 4, after batch `last` again
    _run(spark, op, source, checkpoint, markers, out)  # restarted from its checkpoint
    assert fired.exists(), f"no task of batch {last + 1} died"
    assert sorted(out) == list(range(len(out))) and len(out) >= last + 2
    assert operator.sink(out) == operator.answer(spark, source)
    assert _read_state(spark, operator, checkpoint) == operator.state_answer(spark, source)
    assert _state_files(checkpoint) == []
    assert _plain_state_files(spark) == plain
