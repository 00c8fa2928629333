"""A user's job on the public API (tests/support/sessions_job.py), on a real local Spark
session: exactly-once state and sink with a task killed hard at a random checkpoint,
files landing while the job runs, rescaling 4 -> 2 and 2 -> 4 from a checkpoint taken
by a graceful stop, incremental materializations through a kill and rescaling 4 -> 2
-> 4 without orphans, a changed max_parallelism refused, and a bad record failing the job
with its file and row."""

from __future__ import annotations

import random
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from dstltree.client.reader import read_exact, read_index
from dstltree.coordinator.cleanup import list_data_files, scan_orphans
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug import CrashDrill, FileSink, FileSource, StreamingJob
from dstltree.sparkplug.job import JobFailedError
from dstltree.sparkplug.restore import RescaleError, restore_all
from dstltree.sparkplug.sinks import read_committed
from dstltree.sparkplug.spark_session import spark_session
from dstltree.storage.store import ObjectStore
from tests.support.sessions_job import Sessions, expected, read_events, write_files
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]
MAX_P = 32


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[4]", app="dstl-test-jobs")
    yield session
    session.stop()


def _job(spark: Any, tmp: Path, parallelism: int, **options: Any) -> StreamingJob:
    fmt = options.pop("fmt", "json")
    job = StreamingJob(
        spark,
        name="sessions",
        checkpoint_dir=str(tmp / "checkpoints"),
        parallelism=parallelism,
        max_parallelism=options.pop("max_parallelism", MAX_P),
        checkpoint_interval=0.1,
        materialization_interval=0.5,
        **options,
    )
    (
        job.source(FileSource(str(tmp / "in"), format=fmt))
        .filter(lambda r: r["page"] != "")
        .key_by("user")
        .process(Sessions())
        .sink(FileSink(str(tmp / "out"), format="parquet"))
    )
    return job


def _check(tmp: Path) -> None:
    events = read_events(tmp / "in")
    want = expected(events)
    store = ObjectStore(str(tmp / "checkpoints" / "sessions"))
    latest = CheckpointStore(store).load_latest()
    assert latest is not None and latest.final
    state = restore_all(store, latest, MAX_P)
    assert state["count"] == want["count"]
    assert state["pages"] == want["pages"]
    for user, recent in state["recent"].items():
        assert 1 <= len(recent) <= 3 and set(recent) <= set(want["pages"][user])
    rows = read_committed(str(tmp / "out")).to_pylist()
    seqs = Counter((r["user"], r["seq"]) for r in rows)
    assert max(seqs.values()) == 1, "a row is visible twice"
    per_user = Counter(r["user"] for r in rows)
    assert dict(per_user) == want["count"], "every event's row is visible once"


def test_exactly_once_with_a_task_killed_at_a_random_checkpoint(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(20261123)
    write_files(tmp_path / "in", files=12, per_file=300, seed=1)
    (tmp_path / "in" / "_SUCCESS").touch()
    drill = CrashDrill(task=rng.randrange(3), after_checkpoints=rng.randrange(2, 6))
    job = _job(spark, tmp_path, 3, crash_drill=drill, source_rate=1000.0, compression="zstd")
    result = job.run(until="end")
    assert result.recoveries == 1 and result.finished
    assert result.source_files == 12
    _check(tmp_path)  # restored through zstd-compressed segments, no setting on read
    assert "zstd" in _segment_codecs(ObjectStore(str(tmp_path / "checkpoints" / "sessions")))


def _segment_codecs(store: ObjectStore) -> set[str]:
    """The codecs named in the headers of every segment of the job's changelog objects
    ("none" for a segment stored as it is)."""
    codecs = set()
    for url in list_data_files(store):
        if "/changelog/" not in url or url.endswith(".tmp"):
            continue
        for ref in read_index(store, url):
            raw = read_exact(store, url, ref.offset, ref.length)
            (hlen,) = struct.unpack_from("!I", raw)
            codecs.add(msgpack.unpackb(raw[4 : 4 + hlen]).get("codec", "none"))
    return codecs


def test_files_landing_while_the_job_runs(spark: Any, tmp_path: Path) -> None:
    write_files(tmp_path / "in", files=2, per_file=200, seed=2, fmt="csv")
    job = _job(spark, tmp_path, 2, fmt="csv")
    landed = threading.Event()

    def land() -> None:
        for n in range(2, 8):
            write_files(tmp_path / "in", files=1, per_file=200, seed=10 + n, start=n, fmt="csv")
        (tmp_path / "in" / "_SUCCESS").touch()
        landed.set()

    producer = threading.Thread(target=land)
    producer.start()
    result = job.run(until="end")
    producer.join(timeout=30)
    assert landed.is_set() and result.finished and result.source_files == 8
    _check(tmp_path)


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4)])
def test_rescaling_from_a_stopped_run(spark: Any, tmp_path: Path, before: int, after: int) -> None:
    write_files(tmp_path / "in", files=10, per_file=400, seed=3)
    first = _job(spark, tmp_path, before, batch_records=32, source_rate=500.0)
    stopped = first.run(until=1.5)
    assert stopped.finished and stopped.rescaled_from is None
    (tmp_path / "in" / "_SUCCESS").touch()
    second = _job(spark, tmp_path, after)
    result = second.run(until="end")
    assert result.rescaled_from == before and result.finished
    assert stopped.records + result.records == len(read_events(tmp_path / "in"))
    _check(tmp_path)


def test_a_changed_max_parallelism_is_refused(spark: Any, tmp_path: Path) -> None:
    write_files(tmp_path / "in", files=2, per_file=50, seed=4)
    (tmp_path / "in" / "_SUCCESS").touch()
    _job(spark, tmp_path, 2).run(until="end")
    with pytest.raises(RescaleError, match="max_parallelism"):
        _job(spark, tmp_path, 2, max_parallelism=64).run(until="end")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"page": "home"}\n{"page": "cart"}\n', r"events-0001\.json, row 0: KeyError: .*user"),
        ('{"user": "a", "page": "home"}\n{"user": "b", "page": \n', r"events-0001\.json, row 1"),
    ],
    ids=["key-column-missing", "unreadable-row"],
)
def test_a_bad_record_fails_the_job_naming_file_and_row(
    spark: Any, tmp_path: Path, content: str, message: str
) -> None:
    write_files(tmp_path / "in", files=1, per_file=20, seed=5)
    (tmp_path / "in" / "events-0001.json").write_text(content)
    (tmp_path / "in" / "_SUCCESS").touch()
    with pytest.raises(JobFailedError, match=message):
        _job(spark, tmp_path, 2).run(until="end")


def test_stop_ends_a_run_without_end_with_a_final_checkpoint(spark: Any, tmp_path: Path) -> None:
    write_files(tmp_path / "in", files=3, per_file=100, seed=6)  # no _SUCCESS: never ends
    job = _job(spark, tmp_path, 2)
    box: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: box.update(result=job.run(until=None)))
    runner.start()
    store = ObjectStore(str(tmp_path / "checkpoints" / "sessions"))

    def all_read() -> bool:
        latest = CheckpointStore(store).load_latest()
        return latest is not None and sum(t.records for t in latest.tasks.values()) == 300

    wait_until(all_read, timeout=120, interval=0.1)
    job.stop()
    runner.join(timeout=120)
    assert not runner.is_alive() and box["result"].finished
    _check(tmp_path)


def test_incremental_materializations_through_a_kill_and_rescaling_4_2_4(
    spark: Any, tmp_path: Path
) -> None:
    """Materializations every 0.5 s reuse earlier files (incremental), survive a hard
    kill and two rescalings, and leave no file no retained checkpoint references."""
    write_files(tmp_path / "in", files=12, per_file=400, seed=5)
    slow = {"batch_records": 32, "source_rate": 500.0}
    drill = CrashDrill(task=1, after_checkpoints=4)
    first: list[StreamingJob] = []

    def after_the_kill(driver: Any) -> None:  # checkpoint 5 kills: stop 3 later
        if len(driver.observed.checkpoint_ids) >= 8:
            first[0].stop()

    first.append(_job(spark, tmp_path, 4, crash_drill=drill, progress=after_the_kill, **slow))
    runs = [first[0].run(until=None)]
    second: list[StreamingJob] = []

    def after_two_materializations(driver: Any) -> None:  # (on a busy machine: later)
        if driver.coord.statistics().materializations_completed >= 2:
            second[0].stop()

    second.append(_job(spark, tmp_path, 2, progress=after_two_materializations, **slow))
    runs.append(second[0].run(until=60.0))
    (tmp_path / "in" / "_SUCCESS").touch()
    runs.append(_job(spark, tmp_path, 4).run(until="end"))
    assert runs[0].recoveries == 1 and runs[2].finished
    assert [r.rescaled_from for r in runs] == [None, 4, 2]
    assert sum(r.records for r in runs) == len(read_events(tmp_path / "in"))
    _check(tmp_path)
    epochs = [m for r in runs for m in r.run.stats.materializations]
    assert any(written < size for _, size, written in epochs), "no file was reused"
    store = ObjectStore(str(tmp_path / "checkpoints" / "sessions"))
    referenced: set[str] = set()
    for cp in CheckpointStore(store).list_retained():
        referenced |= cp.referenced_paths()
    assert referenced and list_data_files(store)
    assert not scan_orphans(store, frozenset(referenced)).orphans, "orphans after the run"
