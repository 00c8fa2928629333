"""Unaligned checkpoints (FLIP-76) end to end: the sessions job (tests/support/
sessions_job.py) on a real local Spark session, its keyed function slow on one task
(a sleepy task: 1 ms per record there), the source unthrottled, so the job
runs back-pressured and its checkpoints persist in-flight records. Killed hard during
back-pressure (a task; separately a node of the tree) and restarted, and restarted
with another parallelism (4 -> 2) from an unaligned checkpoint: state and sink equal the batch
result, no row twice, and the restored in-flight records were processed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.coordinator.store import CheckpointStore
from dstltree.demo.node_kill import NodeKill
from dstltree.sparkplug import CrashDrill, FileSink, FileSource, StreamingJob
from dstltree.sparkplug.job import JobFailedError
from dstltree.sparkplug.spark_session import spark_session
from dstltree.storage.store import ObjectStore
from tests.e2e.test_streaming_jobs import MAX_P, _check
from tests.support.sessions_job import Sessions, read_events, write_files

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TOPOLOGY = Path(__file__).resolve().parents[2] / "deploy" / "local.yaml"


class SleepySessions(Sessions):
    """Sessions, slow on task 0: 1 ms per record, as FLIP-76's sleepy map; the others
    at full speed."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.sleepy = ctx.task == 0

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        if self.sleepy:
            time.sleep(0.001)
        super().process(key, record, out)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[4]", app="dstl-test-unaligned")
    yield session
    session.stop()


def _job(spark: Any, tmp: Path, parallelism: int, **options: Any) -> StreamingJob:
    job = StreamingJob(
        spark,
        name="sessions",
        checkpoint_dir=str(tmp / "checkpoints"),
        parallelism=parallelism,
        max_parallelism=MAX_P,
        checkpoint_interval=0.3,
        materialization_interval=1.0,
        checkpointing="unaligned",
        batch_records=64,
        **options,
    )
    (
        job.source(FileSource(str(tmp / "in"), format="json"))
        .filter(lambda r: r["page"] != "")
        .key_by("user")
        .process(SleepySessions())
        .sink(FileSink(str(tmp / "out"), format="parquet"))
    )
    return job


def _input(tmp: Path) -> None:
    write_files(tmp / "in", files=8, per_file=1200, seed=36)
    (tmp / "in" / "_SUCCESS").touch()


def _unaligned_with_inflight(result: Any) -> int:
    """Checkpoints of the run taken unaligned with in-flight bytes persisted."""
    figures = result.run.stats.checkpoint_alignments
    return sum(1 for _, _, inflight, unaligned in figures if unaligned and inflight > 0)


def _restored_inflight(result: Any) -> int:
    return sum(t["restored_inflight"] for t in result.run.tasks)


@pytest.mark.timeout(600)
def test_task_killed_during_backpressure(spark: Any, tmp_path: Path) -> None:
    _input(tmp_path)
    drill = CrashDrill(task=1, after_checkpoints=4, with_channel_state=True)
    job = _job(spark, tmp_path, 3, crash_drill=drill)
    result = job.run(until="end")
    assert result.recoveries == 1 and result.finished
    assert _unaligned_with_inflight(result) >= 3
    assert _restored_inflight(result) > 0  # the recovery processed channel state first
    # each record counted once: a checkpoint counts the records of its snapshot, the
    # in-flight ones again when they are processed after the restore
    assert result.records == len(read_events(tmp_path / "in"))
    _check(tmp_path)


@pytest.mark.timeout(600)
def test_node_killed_during_backpressure(spark: Any, tmp_path: Path) -> None:
    _input(tmp_path)
    kill = NodeKill(after_checkpoints=4)
    job = _job(spark, tmp_path, 4, topology=str(TOPOLOGY), progress=kill.hook)
    result = job.run(until="end")
    assert kill.killed is not None, "no node was killed"
    assert result.finished
    assert _unaligned_with_inflight(result) >= 3
    _check(tmp_path)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("before", "after"), [(4, 2)])
def test_rescaled_from_an_unaligned_checkpoint(
    spark: Any, tmp_path: Path, before: int, after: int
) -> None:
    _input(tmp_path)
    drill = CrashDrill(task=0, after_checkpoints=4)
    with pytest.raises(JobFailedError):  # killed hard, no second attempt
        _job(spark, tmp_path, before, crash_drill=drill, max_attempts=1).run(until="end")
    latest = CheckpointStore(ObjectStore(str(tmp_path / "checkpoints" / "sessions"))).load_latest()
    assert latest is not None and not latest.final and latest.parallelism == before
    assert any(t.unaligned and t.channel_state for t in latest.tasks.values())
    result = _job(spark, tmp_path, after).run(until="end")
    assert result.rescaled_from == before and result.finished
    assert _restored_inflight(result) > 0
    _check(tmp_path)


@pytest.mark.timeout(600)
def test_aligned_checkpoint_timeout_switches_and_recovers(spark: Any, tmp_path: Path) -> None:
    """Checkpoints start aligned and switch to unaligned after 50 ms of alignment (the
    slow task's queue takes longer): some are switched, the result stays exact after a
    task killed hard."""
    _input(tmp_path)
    drill = CrashDrill(task=2, after_checkpoints=4)
    job = _job(spark, tmp_path, 3, crash_drill=drill, aligned_checkpoint_timeout=0.05)
    result = job.run(until="end")
    assert result.recoveries == 1 and result.finished
    figures = result.run.stats.checkpoint_alignments
    assert any(unaligned for *_, unaligned in figures), "no checkpoint switched"
    assert any(alignment >= 0.05 for alignment, *_ in figures)
    _check(tmp_path)
