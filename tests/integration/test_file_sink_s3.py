"""The exactly-once file sink on S3 (moto server, tests/support/s3_server.py): part
files spill locally and are staged as open multipart uploads at their final keys;
commit completes them (no rename on S3, no copy either); committables of the previous
format (a staged object) still commit by copy then delete; recovery and cleanup as on
local disks. The multipart details: tests/integration/test_sink_multipart_s3.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest
import s3fs

from dstltree.sparkplug.sinks import Committable, FileSink, committed_files, read_committed
from tests.support.s3_server import S3Target
from tests.support.sink_job import SinkJobModel
from tests.support.waiting import wait_until

pytestmark = pytest.mark.s3


def _sink(s3: S3Target, tmp_path: Path, fmt: str = "parquet") -> FileSink:
    spill = tmp_path / "spill"
    spill.mkdir(exist_ok=True)
    return FileSink(
        f"{s3.base_url}/out", fmt, s3.storage_options, batch_rows=3, spill_dir=str(spill)
    )


def _spilled(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "spill").rglob("*") if p.is_file())


def _uploads(s3: S3Target) -> list[str]:
    """Keys (relative to the sink URL) of the open multipart uploads below it."""
    fs = s3fs.S3FileSystem(**s3.storage_options)
    bucket = s3.base_url.removeprefix("s3://")
    out = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix="out/")
    return sorted(u["Key"].removeprefix("out/") for u in out.get("Uploads") or [])


def _previous_format(s3: S3Target, sink: FileSink, c: Committable) -> Committable:
    """What the previous version staged for ``c``: the part file as an object at
    ``c.staged`` and a committable without multipart fields (taken from the bytes
    of ``c``'s committed final object, which is then removed again)."""
    fs = s3fs.S3FileSystem(**s3.storage_options)
    assert sink.create_committer().commit([c]) == [f"{sink.url}/{c.final}"]
    fs.mv(f"{sink.url}/{c.final}", f"{sink.url}/{c.staged}")
    wire = {k: v for k, v in c.to_wire().items() if k not in ("upload_id", "parts")}
    return Committable.from_wire(wire)


def _keys(s3: S3Target, under: str) -> list[str]:
    fs = s3fs.S3FileSystem(**s3.storage_options)
    prefix = f"{s3.base_url.removeprefix('s3://')}/out/{under}".rstrip("/")
    return sorted(
        p.removeprefix(f"{s3.base_url.removeprefix('s3://')}/out/") for p in fs.find(prefix)
    )


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_stage_commit_abort_on_s3(s3: S3Target, tmp_path: Path, fmt: str) -> None:
    sink = _sink(s3, tmp_path, fmt)
    with sink.create_writer(0, 0) as w:
        for i in range(7):
            w.write({"id": i})
        c1 = w.prepare_commit(1)
        w.write({"id": 7})
        c2 = w.prepare_commit(2)
    assert c1 is not None and c2 is not None
    assert _spilled(tmp_path) == []  # spilled parts uploaded, then removed
    assert _keys(s3, "") == []  # open uploads are no objects, under no name
    assert _uploads(s3) == sorted([c1.final, c2.final])
    assert read_committed(sink.url, fmt, s3.storage_options).num_rows == 0
    committer = sink.create_committer()
    assert committer.commit([c1]) == [f"{sink.url}/{c1.final}"]
    assert committer.abort([c2]) == [f"{sink.url}/{c2.final}?uploadId={c2.upload_id}"]
    assert _keys(s3, "") == [c1.final]
    assert _uploads(s3) == []
    table = read_committed(sink.url, fmt, s3.storage_options)
    assert table.column("id").to_pylist() == list(range(7))


def test_commit_by_copy_is_idempotent_after_an_interrupted_move(
    s3: S3Target, tmp_path: Path
) -> None:
    sink = _sink(s3, tmp_path)
    with sink.create_writer(4, 2) as w:
        w.write({"id": 1})
        c = w.prepare_commit(3)
    assert c is not None
    old = _previous_format(s3, sink, c)
    assert old.upload_id is None and _keys(s3, "") == [c.staged]
    fs = s3fs.S3FileSystem(**s3.storage_options)
    fs.copy(f"{sink.url}/{c.staged}", f"{sink.url}/{c.final}")  # the driver died here
    assert sink.create_committer().commit([old]) == []
    assert _keys(s3, "") == [c.final]
    assert sink.create_committer().commit([old]) == []


def test_a_previous_format_committable_commits_by_copy(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    with sink.create_writer(1, 0) as w:
        for i in range(5):
            w.write({"id": i})
        c = w.prepare_commit(1)
    assert c is not None
    old = _previous_format(s3, sink, c)
    assert read_committed(sink.url, "parquet", s3.storage_options).num_rows == 0
    assert sink.create_committer().commit([old]) == [f"{sink.url}/{c.final}"]
    assert _keys(s3, "") == [c.final]
    assert read_committed(sink.url, "parquet", s3.storage_options).column("id").to_pylist() == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_recovery_and_cleanup_on_s3(s3: S3Target, tmp_path: Path) -> None:
    job = SinkJobModel(_sink(s3, tmp_path, "json"))
    job.emit(9)
    job.barrier()
    job.complete(0, commit=True)
    job.emit(6)
    job.barrier()  # staged by attempt 0, never completed
    job.emit(8)  # a batch per task in progress: spilled locally
    wait_until(lambda: len(_spilled(tmp_path)) == 2)
    assert [p.parent.name for p in _spilled(tmp_path)] == ["attempt-000000"] * 2
    assert len(_uploads(s3)) == 2  # checkpoint 2's, open
    job.fail()
    assert _keys(s3, "_staging") == []
    assert _uploads(s3) == []  # aborted: their rows come again from attempt 1
    assert _spilled(tmp_path) == []  # attempt 1's writers dropped attempt 0's spills
    job.emit(8)
    job.finish()
    assert job.visible() == list(range(17))
    names = [f.rsplit("/", 1)[1] for f in committed_files(job.sink.url, s3.storage_options)]
    assert names == [  # checkpoint 2 of attempt 0 never shows; attempt 1 made it again
        "part-000000000001-000000-00000.json",
        "part-000000000001-000000-00001.json",
        "part-000000000002-000001-00000.json",
        "part-000000000002-000001-00001.json",
    ]


def test_pyarrow_dataset_on_s3_skips_staging(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    with sink.create_writer(0, 0) as w:
        for i in range(4):
            w.write({"id": i})
        c1 = w.prepare_commit(1)
        w.write({"id": 4})
        w.prepare_commit(2)
    assert c1 is not None
    sink.create_committer().commit([c1])
    fs = s3fs.S3FileSystem(**s3.storage_options)
    root = sink.url.removeprefix("s3://")
    assert ds.dataset(root, format="parquet", filesystem=fs).to_table().num_rows == 4
