"""The exactly-once file sink on the local filesystem (sparkplug/sinks): staging,
commit, abort and cleanup for each format, idempotent commits, recovery after a failure
between prepare and commit, names in commit order, row and schema errors, and a
hypothesis run of random job histories against the rows of committed checkpoints."""

from __future__ import annotations

import datetime
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import msgpack
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstltree.sparkplug.sinks import (
    Committable,
    FileSink,
    SinkCommitError,
    SinkError,
    SinkRowError,
    SinkSchemaError,
    committed_files,
    read_committed,
)
from dstltree.sparkplug.sinks.formats import FORMATS
from dstltree.storage.errors import StorageError
from tests.support.sink_job import SinkJobModel
from tests.support.waiting import wait_until


def _rows(start: int, stop: int) -> list[dict[str, object]]:
    return [{"id": i, "name": f"n{i}", "score": i / 2} for i in range(start, stop)]


def _staged(root: Path) -> list[str]:
    staging = root / "_staging"
    return sorted(str(p.relative_to(root)) for p in staging.rglob("*") if p.is_file())


def _write(sink: FileSink, task: int, attempt: int, cid: int, rows: list) -> Committable:
    with sink.create_writer(task, attempt) as w:
        for r in rows:
            w.write(r)
        c = w.prepare_commit(cid)
    assert c is not None
    return c


@pytest.mark.parametrize("fmt", FORMATS)
def test_stage_then_commit_makes_rows_visible(tmp_path: Path, fmt: str) -> None:
    sink = FileSink(str(tmp_path / "out"), fmt, batch_rows=4)
    c = _write(sink, 3, 0, 7, _rows(0, 10))
    assert (c.checkpoint_id, c.task, c.attempt, c.rows) == (7, 3, 0, 10)
    assert c.final == f"part-000000000007-000000-00003.{fmt}"
    assert _staged(tmp_path / "out") == [c.staged]
    assert os.path.getsize(tmp_path / "out" / c.staged) == c.bytes
    assert read_committed(sink.url, fmt).num_rows == 0  # staged is not visible
    made = sink.create_committer().commit([c])
    assert made == [str(tmp_path / "out" / c.final)]
    assert read_committed(sink.url, fmt).to_pylist() == _rows(0, 10)
    assert _staged(tmp_path / "out") == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_abort_deletes_staged_files(tmp_path: Path, fmt: str) -> None:
    sink = FileSink(str(tmp_path), fmt)
    c1 = _write(sink, 0, 0, 1, _rows(0, 3))
    c2 = _write(sink, 1, 0, 1, _rows(3, 5))
    c3 = _write(sink, 0, 1, 1, _rows(5, 6))  # same id, another attempt
    committer = sink.create_committer()
    assert committer.abort([c1]) == [str(tmp_path / c1.staged)]
    assert committer.abort(1, attempt=0) == [str(tmp_path / c2.staged)]
    assert _staged(tmp_path) == [c3.staged]
    assert committer.abort(1) == [str(tmp_path / c3.staged)]
    assert read_committed(sink.url, fmt).num_rows == 0
    assert committed_files(sink.url) == []


def test_commit_is_idempotent_also_after_a_driver_restart(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    cs = [_write(sink, t, 0, 1, _rows(t * 5, t * 5 + 5)) for t in range(2)]
    assert len(sink.create_committer().commit(cs)) == 2
    before = {f: Path(f).read_bytes() for f in committed_files(sink.url)}
    assert sink.create_committer().commit(cs) == []  # a new committer: the restarted driver
    assert {f: Path(f).read_bytes() for f in committed_files(sink.url)} == before


def test_commit_finishes_an_interrupted_copy_then_delete(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    c = _write(sink, 0, 0, 1, _rows(0, 4))
    shutil.copyfile(tmp_path / c.staged, tmp_path / c.final)  # copied, not yet deleted
    assert sink.create_committer().commit([c]) == []
    assert _staged(tmp_path) == []
    assert read_committed(sink.url).to_pylist() == _rows(0, 4)


def test_commit_refuses_a_final_file_of_another_size(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    c = _write(sink, 0, 0, 1, _rows(0, 4))
    (tmp_path / c.final).write_bytes(b"other")
    with pytest.raises(SinkCommitError, match="exists with 5 bytes"):
        sink.create_committer().commit([c])


def test_commit_of_a_lost_staged_file_fails(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    c = _write(sink, 0, 0, 1, _rows(0, 4))
    (tmp_path / c.staged).unlink()
    with pytest.raises(SinkCommitError, match="rows of checkpoint 1, task 0 are lost"):
        sink.create_committer().commit([c])


def test_committable_travels_as_msgpack_and_is_checked(tmp_path: Path) -> None:
    c = _write(FileSink(str(tmp_path)), 2, 1, 9, _rows(0, 2))
    wire = msgpack.unpackb(msgpack.packb(c.to_wire()))
    assert Committable.from_wire(wire) == c
    bad = [
        {**wire, "staged": "../../etc/passwd"},
        {**wire, "final": "../part-000000000009-000001-00002.parquet"},
        {**wire, "task": 3},  # names no longer match
        {**wire, "rows": -1},
    ]
    for d in bad:
        with pytest.raises(ValueError):
            Committable.from_wire(d)
    with pytest.raises(SinkCommitError, match="not a staged file"):
        FileSink(str(tmp_path)).create_committer().commit([Committable(**bad[0])])


def test_failure_between_prepare_and_commit_keeps_rows_exactly_once(tmp_path: Path) -> None:
    job = SinkJobModel(FileSink(str(tmp_path), batch_rows=3))
    job.emit(10)
    job.barrier()
    job.complete(0, commit=True)  # checkpoint 1: rows 0..9
    job.emit(10)
    job.barrier()  # checkpoint 2 staged by attempt 0, never completed
    failed_staged = [c.staged for c in job.pending[0].committables]
    job.emit(5)  # in progress when the tasks die
    job.fail()  # restore checkpoint 1 in attempt 1: rows 10.. again
    assert job.next_row == 10 and job.next_checkpoint == 2
    assert _staged(tmp_path) == []  # the failed attempt's files are gone, none visible
    job.emit(12)
    job.finish()  # checkpoint 2 again, by attempt 1
    assert job.visible() == list(range(22))
    names = [os.path.basename(f) for f in committed_files(str(tmp_path))]
    assert all("-000000-" not in n for n in names if n.startswith("part-000000000002"))
    assert not any((tmp_path / s).exists() for s in failed_staged)


def test_recovery_commits_a_completed_checkpoint_the_driver_did_not_commit(
    tmp_path: Path,
) -> None:
    job = SinkJobModel(FileSink(str(tmp_path), "json"))
    job.emit(6)
    job.barrier()
    job.complete(0, commit=False)  # metadata written, driver dies before commit
    assert job.visible() == []
    job.fail()
    assert job.visible() == list(range(6))


def test_a_declined_checkpoint_is_committed_with_the_next_completed_one(tmp_path: Path) -> None:
    job = SinkJobModel(FileSink(str(tmp_path), "csv"))
    job.emit(4)
    job.barrier()  # checkpoint 1: declined
    job.emit(4)
    job.barrier()  # checkpoint 2 completes; its metadata carries 1's committables
    job.complete(1, commit=False)
    assert [c.checkpoint_id for c in job.completed[0].committables] == [1, 1, 2, 2]
    job.fail()  # recovery commits both
    assert job.visible() == list(range(8))


def test_cleanup_removes_leftovers_and_nothing_committed(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), batch_rows=2)
    committed = _write(sink, 0, 0, 1, _rows(0, 4))
    committer = sink.create_committer()
    committer.commit([committed])
    retained = _write(sink, 0, 0, 2, _rows(4, 6))  # completed, commit pending
    _write(sink, 1, 0, 3, _rows(6, 8))  # aborted checkpoint of attempt 0
    crashed = sink.create_writer(0, 1)
    for r in _rows(8, 12):
        crashed.write(r)  # an in-progress file of a crashed attempt
    crashed._io.shutdown(wait=True)
    running = _write(sink, 0, 2, 3, _rows(12, 13))
    assert len(_staged(tmp_path)) == 4
    deleted = committer.cleanup([committed, retained], keep_attempts=[2])
    assert len(deleted) == 2
    assert _staged(tmp_path) == sorted([retained.staged, running.staged])
    assert sorted(os.listdir(tmp_path / "_staging")) == ["attempt-000000", "attempt-000002"]
    assert read_committed(sink.url).to_pylist() == _rows(0, 4)


def test_final_names_sort_in_commit_order(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), "csv")
    committer = sink.create_committer()
    order = []
    for cid, attempt in [(1, 0), (2, 0), (9, 0), (10, 0), (11, 1), (100, 2)]:
        cs = [_write(sink, t, attempt, cid, [{"id": cid * 100 + t}]) for t in (11, 2, 0)]
        made = committer.commit(cs)
        assert made == sorted(made)
        order += made
    assert committed_files(sink.url) == order == sorted(order)
    ids = read_committed(sink.url, "csv").column("id").to_pylist()
    assert ids == [cid * 100 + t for cid in (1, 2, 9, 10, 11, 100) for t in (0, 2, 11)]


def test_unencodable_value_names_the_column(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    with sink.create_writer(0, 0) as w:
        with pytest.raises(SinkRowError, match="column 'when': datetime") as e:
            w.write({"id": 1, "when": datetime.datetime(2026, 1, 1)})
        assert e.value.column == "when"
        with pytest.raises(SinkRowError, match="column 'deep'"):
            w.write({"id": 1, "deep": {"a": [1, {2, 3}]}})
        with pytest.raises(SinkRowError, match="column '1'"):
            w.write({1: "x"})  # type: ignore[dict-item]
        with pytest.raises(SinkRowError, match="does not fit 64 bits"):
            w.write({"big": 2**70})
        w.write({"id": 2, "when": None})  # still usable
        c = w.prepare_commit(1)
    assert c is not None and c.rows == 1


@pytest.mark.parametrize(
    ("fmt", "row", "column"),
    [("csv", {"a": 1, "tags": [1, 2]}, "tags"), ("json", {"blob": b"\x00"}, "blob")],
)
def test_format_limits_name_the_column(tmp_path: Path, fmt: str, row: dict, column: str) -> None:
    with FileSink(str(tmp_path), fmt).create_writer(0, 0) as w, pytest.raises(SinkRowError) as e:
        w.write(row)
    assert e.value.column == column


def test_schema_mismatch_names_the_column_and_fails_the_writer(tmp_path: Path) -> None:
    with FileSink(str(tmp_path), batch_rows=2).create_writer(0, 0) as w:
        w.write({"id": 1, "v": 1})
        w.write({"id": 2, "v": 2})
        w.write({"id": 3, "v": "three"})
        with pytest.raises(SinkSchemaError, match="column 'v'"):
            w.write({"id": 4, "v": 4})
        with pytest.raises(SinkError, match="failed earlier"):
            w.write({"id": 5, "v": 5})


def test_a_given_schema_fixes_types_and_rejects_new_columns(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int32()), ("note", pa.string())])
    sink = FileSink(str(tmp_path), schema=schema)
    c = _write(sink, 0, 0, 1, [{"id": 1}, {"id": 2, "note": "x"}])
    sink.create_committer().commit([c])
    assert read_committed(sink.url).schema == schema
    with sink.create_writer(0, 0) as w:
        w.write({"id": 1, "extra": True})
        with pytest.raises(SinkSchemaError, match="column 'extra': not a column"):
            w.prepare_commit(2)


def test_rows_go_to_the_file_in_batches(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), batch_rows=10, max_pending_batches=2)
    with sink.create_writer(0, 0) as w:
        for r in _rows(0, 1000):
            w.write(r)
            assert len(w._buffer) < 10 and len(w._pending) <= 2
        c = w.prepare_commit(1)
    assert c is not None and c.rows == 1000
    assert pq.ParquetFile(tmp_path / c.staged).num_row_groups == 100


def test_rows_written_during_an_async_prepare_go_to_the_next_part(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), "json", batch_rows=2)
    with sink.create_writer(0, 0) as w:
        for r in _rows(0, 5):
            w.write(r)
        staging = w.prepare_commit_async(1)
        for r in _rows(5, 8):
            w.write(r)
        c2 = w.prepare_commit(2)
        c1 = staging.result()
    assert c1 is not None and c2 is not None
    assert (c1.rows, c2.rows) == (5, 3)
    sink.create_committer().commit([c2, c1])
    assert read_committed(sink.url, "json").to_pylist() == _rows(0, 8)


def test_no_rows_no_committable_and_ids_must_grow(tmp_path: Path) -> None:
    with FileSink(str(tmp_path)).create_writer(0, 0) as w:
        assert w.prepare_commit(1) is None
        with pytest.raises(ValueError, match="checkpoint 1 after 1"):
            w.prepare_commit(1)
    assert not (tmp_path / "_staging").exists()


def test_sink_pickles_and_checks_its_arguments(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), "json", schema=pa.schema([("id", pa.int64())]))
    assert pickle.loads(pickle.dumps(sink)) == sink
    with pytest.raises(ValueError, match="format must be one of"):
        FileSink(str(tmp_path), "orc")
    with pytest.raises(ValueError, match=">= 1"):
        FileSink(str(tmp_path), batch_rows=0)


def test_storage_errors_are_translated(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where the sink wants a folder")
    with FileSink(str(tmp_path / "blocker" / "out"), batch_rows=1).create_writer(0, 0) as w:
        w.write({"id": 1})
        with pytest.raises(StorageError, match="write .*blocker"):
            w.prepare_commit(1)


def test_pyarrow_and_pandas_read_only_committed_files(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), batch_rows=2)
    sink.create_committer().commit([_write(sink, 0, 0, 1, _rows(0, 3))])
    _write(sink, 0, 0, 2, _rows(3, 9))  # staged
    w = sink.create_writer(1, 0)
    for r in _rows(9, 14):
        w.write(r)  # in progress
    wait_until(lambda: any((tmp_path / "_staging").rglob("inprogress-*")))
    assert ds.dataset(str(tmp_path), format="parquet").to_table().num_rows == 3
    assert sorted(pd.read_parquet(tmp_path)["id"]) == [0, 1, 2]
    w.close()


_EVENTS = st.one_of(
    st.tuples(st.just("emit"), st.integers(0, 7)),
    st.tuples(st.just("barrier")),
    st.tuples(st.just("complete"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("fail")),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), events=st.lists(_EVENTS, max_size=14))
def test_random_histories_commit_each_row_exactly_once(fmt: str, events: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as d:
        job = SinkJobModel(FileSink(d, fmt, batch_rows=2), tasks=3)
        for kind, *args in events:
            getattr(job, kind)(*args)
            assert job.visible() == job.expected()
        job.finish()
        assert job.visible() == list(range(job.next_row))
        assert job.visible() == job.expected()
