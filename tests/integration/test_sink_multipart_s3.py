"""The file sink's commit without copies on S3 (sparkplug/sinks/multipart.py), against
moto's server on loopback (tests/support/s3_server.py): a staged part file is an open
multipart upload at its final key, invisible to listings and readers; the commit is
one CompleteMultipartUpload per file (requests counted with a botocore hook on the
sink's own s3fs client); a repeated commit is a no-op; a lost upload raises
SinkCommitError; cleanup and abort remove the uploads nobody retains."""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
import s3fs
from botocore.exceptions import ClientError
from s3fs.errors import translate_boto_error

from dstltree.sparkplug.sinks import (
    Committable,
    FileSink,
    SinkCommitError,
    committed_files,
    read_committed,
)
from dstltree.sparkplug.sinks import multipart as mp
from dstltree.sparkplug.sinks.committer import SinkCommitter
from dstltree.storage.errors import StorageError
from tests.support.s3_server import S3Target

pytestmark = pytest.mark.s3

PREFIX = "out"


@pytest.fixture(autouse=True)
def _moto_answers_no_such_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto 5.2 answers a CompleteMultipartUpload of an unknown (aborted) upload id
    with a 500 (a KeyError inside the server); AWS S3 answers ``404 NoSuchUpload``.
    The server runs in this process: make it answer as S3 does."""
    from moto.s3.exceptions import NoSuchUpload
    from moto.s3.models import S3Backend

    original = S3Backend.complete_multipart_upload

    def complete(self: S3Backend, bucket_name: str, multipart_id: str, body: Any) -> Any:
        if multipart_id not in self.get_bucket(bucket_name).multiparts:
            raise NoSuchUpload(upload_id=multipart_id)
        return original(self, bucket_name, multipart_id, body)

    monkeypatch.setattr(S3Backend, "complete_multipart_upload", complete)


def _sink(s3: S3Target, tmp_path: Path, fmt: str = "parquet") -> FileSink:
    spill = tmp_path / "spill"
    spill.mkdir(exist_ok=True)
    return FileSink(
        f"{s3.base_url}/{PREFIX}", fmt, s3.storage_options, batch_rows=4, spill_dir=str(spill)
    )


@functools.lru_cache(maxsize=4)
def _fs(s3: S3Target) -> s3fs.S3FileSystem:
    """The tests' own client (the sink's stores make theirs: skip_instance_cache)."""
    return s3fs.S3FileSystem(**s3.storage_options)


def _bucket(s3: S3Target) -> str:
    return s3.base_url.removeprefix("s3://")


def _keys(s3: S3Target) -> list[str]:
    """Every object below the sink URL, relative to it (listing, no cache)."""
    fs = _fs(s3)
    fs.invalidate_cache()
    root = f"{_bucket(s3)}/{PREFIX}"
    return sorted(p.removeprefix(root + "/") for p in fs.find(root))


def _uploads(s3: S3Target) -> dict[str, str]:
    """upload id -> key (relative to the sink URL) of every open multipart upload."""
    out = _fs(s3).call_s3("list_multipart_uploads", Bucket=_bucket(s3), Prefix=f"{PREFIX}/")
    return {u["UploadId"]: u["Key"].removeprefix(f"{PREFIX}/") for u in out.get("Uploads") or []}


def _start_upload(s3: S3Target, relative: str) -> str:
    """An open upload with one part at ``relative`` below the sink URL (what a writer
    that died after staging leaves); returns its id."""
    fs, bucket, key = _fs(s3), _bucket(s3), f"{PREFIX}/{relative}"
    upload_id = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"x")
    return str(upload_id)


def _write(sink: FileSink, task: int, attempt: int, cid: int, ids: range) -> Committable:
    with sink.create_writer(task, attempt) as w:
        for i in ids:
            w.write({"id": i, "task": task})
        c = w.prepare_commit(cid)
    assert c is not None
    return c


def _ids(sink: FileSink) -> list[int]:
    table = read_committed(sink.url, sink.format, sink.storage_options)
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


@contextmanager
def _requests(committer: SinkCommitter) -> Iterator[Counter[str]]:
    """Counts the S3 requests (HTTP attempts, by operation) the committer's s3fs client
    sends inside the block."""
    client = committer._store.fs.s3  # the client s3fs made for the sink's store
    seen: Counter[str] = Counter()

    def count(event_name: str, **_: Any) -> None:
        seen[event_name.rsplit(".", 1)[-1]] += 1

    client.meta.events.register("before-send.s3", count)
    try:
        yield seen
    finally:
        client.meta.events.unregister("before-send.s3", count)


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_staged_output_is_invisible_until_the_commit_completes_it(
    s3: S3Target, tmp_path: Path, fmt: str
) -> None:
    sink = _sink(s3, tmp_path, fmt)
    c = _write(sink, 2, 0, 1, range(10))
    assert c.upload_id is not None and c.multipart
    assert [(p.number, p.size) for p in c.parts] == [(1, c.bytes)]  # a small file: one part
    assert c.final == f"part-000000000001-000000-00002.{fmt}"
    assert _keys(s3) == []  # no object, under the final name or below _staging
    assert _uploads(s3) == {c.upload_id: c.final}
    assert committed_files(sink.url, s3.storage_options) == []
    assert _ids(sink) == []
    assert not list((tmp_path / "spill").rglob("*.*"))  # the spilled part went up
    assert sink.create_committer().commit([c]) == [f"{sink.url}/{c.final}"]
    assert _keys(s3) == [c.final]
    assert _fs(s3).size(f"{sink.url}/{c.final}") == c.bytes
    assert _uploads(s3) == {}
    assert _ids(sink) == list(range(10))


def test_pyarrow_dataset_sees_committed_files_only(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    committed = _write(sink, 0, 0, 1, range(3))
    _write(sink, 1, 0, 1, range(3, 8))  # staged, never committed
    sink.create_committer().commit([committed])
    table = ds.dataset(f"{_bucket(s3)}/{PREFIX}", format="parquet", filesystem=_fs(s3)).to_table()
    assert sorted(table.column("id").to_pylist()) == [0, 1, 2]


def test_a_commit_is_one_complete_request_per_file(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path, "json")
    cs = [_write(sink, t, 0, 4, range(t * 10, t * 10 + 6)) for t in range(3)]
    committer = sink.create_committer()
    with _requests(committer) as seen:
        made = committer.commit(reversed(cs))
    assert made == [f"{sink.url}/{c.final}" for c in cs]  # in commit (name) order
    assert seen == Counter({"CompleteMultipartUpload": 3})  # no HEAD, copy or delete
    assert _ids(sink) == [i for t in range(3) for i in range(t * 10, t * 10 + 6)]


def test_a_large_part_file_is_uploaded_in_parts(
    s3: S3Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mp, "PART_BYTES", mp.MIN_PART_BYTES)  # 5 MiB parts
    sink = _sink(s3, tmp_path)
    blobs = [os.urandom(2**20) for _ in range(11)]  # incompressible: ~11 MiB of parquet
    with sink.create_writer(0, 0) as w:
        for i, blob in enumerate(blobs):
            w.write({"id": i, "blob": blob})
        c = w.prepare_commit(1)
    assert c is not None and c.upload_id is not None
    sizes = [p.size for p in c.parts]
    assert [p.number for p in c.parts] == [1, 2, 3]
    assert sizes[:2] == [mp.MIN_PART_BYTES] * 2 and 0 < sizes[2] <= mp.MIN_PART_BYTES
    assert sum(sizes) == c.bytes
    assert Committable.from_wire(c.to_wire()) == c
    committer = sink.create_committer()
    with _requests(committer) as seen:
        assert committer.commit([c]) == [f"{sink.url}/{c.final}"]
    assert seen == Counter({"CompleteMultipartUpload": 1})
    table = read_committed(sink.url, "parquet", s3.storage_options)
    assert table.column("blob").to_pylist() == blobs


def test_a_failed_staging_aborts_its_upload(
    s3: S3Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = s3fs.S3FileSystem.call_s3

    def refusing(self: s3fs.S3FileSystem, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "upload_part":
            error = {"Error": {"Code": "AccessDenied", "Message": "no"}}
            raise translate_boto_error(ClientError(error, "UploadPart"))
        return real(self, method, *args, **kwargs)

    sink = _sink(s3, tmp_path)
    with monkeypatch.context() as m, sink.create_writer(0, 0) as w:
        m.setattr(s3fs.S3FileSystem, "call_s3", refusing)
        w.write({"id": 1})
        with pytest.raises(StorageError, match="upload-part .*AccessDenied"):
            w.prepare_commit(1)
    assert _uploads(s3) == {} and _keys(s3) == []


def test_commit_twice_is_a_no_op(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    c = _write(sink, 0, 0, 1, range(5))
    assert sink.create_committer().commit([c]) == [f"{sink.url}/{c.final}"]
    before = _fs(s3).cat_file(f"{sink.url}/{c.final}")
    again = sink.create_committer()  # the restarted driver
    with _requests(again) as seen:
        again.commit([c])  # moto, like S3, acknowledges completing the same upload again
    assert set(seen) == {"CompleteMultipartUpload"}
    assert _keys(s3) == [c.final] and _uploads(s3) == {}
    assert _fs(s3).cat_file(f"{sink.url}/{c.final}") == before
    assert _ids(sink) == list(range(5))


def test_commit_after_success_answered_no_such_upload_is_a_no_op(
    s3: S3Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that forgets a completed upload answers ``NoSuchUpload``: the final
    object with the committable's size shows it was committed earlier."""
    sink = _sink(s3, tmp_path)
    c = _write(sink, 0, 0, 1, range(5))
    committer = sink.create_committer()
    assert committer.commit([c]) == [f"{sink.url}/{c.final}"]
    fs = committer._store.fs
    real = fs.call_s3

    def forgetting(method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "complete_multipart_upload":
            error = {"Error": {"Code": "NoSuchUpload", "Message": "gone"}}
            raise translate_boto_error(ClientError(error, "CompleteMultipartUpload"))
        return real(method, *args, **kwargs)

    monkeypatch.setattr(fs, "call_s3", forgetting)
    with _requests(committer) as seen:
        assert committer.commit([c]) == []
    assert "CopyObject" not in seen and "DeleteObject" not in seen
    assert _ids(sink) == list(range(5))


def test_commit_when_the_name_was_taken_by_the_same_bytes_is_a_no_op(
    s3: S3Target, tmp_path: Path
) -> None:
    """The completion is conditional (If-None-Match): an object already at the final
    name is never replaced; one of the committable's size means committed, and the
    upload left open is aborted."""
    sink = _sink(s3, tmp_path)
    c = _write(sink, 0, 0, 1, range(5))
    committed = _write(sink, 0, 1, 1, range(5))  # the same rows, committed by another way
    sink.create_committer().commit([committed])
    fs = _fs(s3)
    fs.copy(f"{sink.url}/{committed.final}", f"{sink.url}/{c.final}")
    fs.rm(f"{sink.url}/{committed.final}")
    assert sink.create_committer().commit([c]) == []
    assert _uploads(s3) == {} and _keys(s3) == [c.final]


def test_commit_refuses_a_final_object_of_another_size(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    c = _write(sink, 0, 0, 1, range(5))
    _fs(s3).pipe_file(f"{sink.url}/{c.final}", b"other")
    with pytest.raises(SinkCommitError, match="exists with 5 bytes"):
        sink.create_committer().commit([c])
    assert _fs(s3).cat_file(f"{sink.url}/{c.final}") == b"other"  # not replaced
    assert list(_uploads(s3)) == [c.upload_id]  # kept for whoever sorts this out


def test_commit_of_an_aborted_upload_raises(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    c = _write(sink, 3, 0, 7, range(4))
    assert c.upload_id is not None
    _fs(s3).call_s3(
        "abort_multipart_upload",
        Bucket=_bucket(s3),
        Key=f"{PREFIX}/{c.final}",
        UploadId=c.upload_id,
    )  # e.g. by a lifecycle rule
    with pytest.raises(SinkCommitError, match=f"upload {c.upload_id} is gone") as e:
        sink.create_committer().commit([c])
    assert "rows of checkpoint 7, task 3 are lost" in str(e.value)
    assert _keys(s3) == []


def test_abort_removes_uploads(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    c1 = _write(sink, 0, 0, 3, range(2))
    c2 = _write(sink, 1, 0, 3, range(2, 4))
    c3 = _write(sink, 0, 1, 3, range(4, 6))  # the same checkpoint id, another attempt
    committer = sink.create_committer()
    assert committer.abort([c1]) == [f"{sink.url}/{c1.final}?uploadId={c1.upload_id}"]
    assert committer.abort([c1]) == []  # gone already
    assert committer.abort(3, attempt=0) == [f"{sink.url}/{c2.final}?uploadId={c2.upload_id}"]
    assert list(_uploads(s3)) == [c3.upload_id]
    assert committer.abort(3) == [f"{sink.url}/{c3.final}?uploadId={c3.upload_id}"]
    assert _uploads(s3) == {} and _keys(s3) == []


def test_cleanup_aborts_the_uploads_nobody_retains(s3: S3Target, tmp_path: Path) -> None:
    sink = _sink(s3, tmp_path)
    committer = sink.create_committer()
    committed = _write(sink, 0, 0, 1, range(0, 3))
    committer.commit([committed])
    retained = _write(sink, 0, 0, 2, range(3, 6))  # completed, commit pending
    aborted = _write(sink, 1, 0, 3, range(6, 9))  # a checkpoint of attempt 0 that failed
    failed = _start_upload(s3, "part-000000000002-000001-00000.parquet")  # attempt 1 died
    running = _write(sink, 0, 2, 2, range(9, 12))  # attempt 2, staging meanwhile
    foreign = _start_upload(s3, "elsewhere/not-a-part.bin")  # not the sink's layout
    old_staged = "_staging/attempt-000000/cp-000000000003-task-00002-" + "a" * 32 + ".parquet"
    _fs(s3).pipe_file(f"{sink.url}/{old_staged}", b"staged by the previous version")
    assert len(_uploads(s3)) == 5
    removed = committer.cleanup([committed, retained], keep_attempts=[2])
    assert sorted(removed) == sorted(
        [
            f"{sink.url}/{aborted.final}?uploadId={aborted.upload_id}",
            f"{sink.url}/part-000000000002-000001-00000.parquet?uploadId={failed}",
            f"{sink.url}/{old_staged}",
        ]
    )
    assert _uploads(s3) == {
        retained.upload_id: retained.final,
        running.upload_id: running.final,
        foreign: "elsewhere/not-a-part.bin",
    }
    assert committer.cleanup([committed, retained], keep_attempts=[2]) == []
    assert committer.commit([retained, running]) == [
        f"{sink.url}/{c.final}" for c in (retained, running)
    ]
    with pytest.raises(SinkCommitError, match="are lost"):
        committer.commit([aborted])  # (the coordinator never commits what it cleaned up)
    assert _ids(sink) == list(range(6)) + list(range(9, 12))
    assert committer.cleanup([]) == []  # nothing of the sink left open
    assert list(_uploads(s3)) == [foreign]
