"""S3 multipart uploads of the sink (its "recoverable writer", after Flink's S3 file
sink): a task uploads a part file's bytes as the parts of a multipart upload started
at the part file's FINAL key and leaves it open; the driver's commit completes it.

Why this is atomic and exactly once:

- An open multipart upload is not an object: a listing, a GET or a HEAD of its key
  does not see it. CompleteMultipartUpload makes the whole object visible at once (S3
  assembles it from the uploaded parts server side; nothing is copied).
- Completing is idempotent in effect: the parts named are fixed in the committable,
  so a second completion can only produce the same bytes. A store answers a repeated
  completion either with success (AWS S3 and moto for the same upload id) or with
  ``NoSuchUpload`` (the id is gone once completed or aborted); the committer then
  tells "committed earlier" from "lost" by the final object and its size.
- The completion is conditional (``If-None-Match: *``, S3 conditional writes on AWS,
  MinIO and moto): it never replaces an object that already holds the name; the store
  answers ``PreconditionFailed`` instead.

Every call goes through s3fs's own client (``S3FileSystem.call_s3``), under the
store's retry policy (:func:`dstltree.sparkplug.sinks.files.run`); errors leave as
:class:`dstltree.storage.errors.StorageError`. Open uploads keep their parts (and cost
storage) until completed or aborted: the committer's cleanup aborts those no retained
committable names. A bucket lifecycle rule that aborts incomplete multipart uploads
(``AbortIncompleteMultipartUpload``; MinIO's ``api.stale_uploads_expiry``, 24 h by
default) must allow more than the longest time from a checkpoint's barrier to its
commit or recovery, or rows are lost (the commit then raises SinkCommitError).

Limits (S3's): at most :data:`MAX_PARTS` parts numbered 1..10,000, each from
:data:`MIN_PART_BYTES` (5 MiB; the last part may be smaller) to :data:`MAX_PART_BYTES`
(5 GiB).
"""

from __future__ import annotations

import contextlib
import enum
import os
import posixpath
from typing import Any, NamedTuple

from dstltree.sparkplug.sinks import files
from dstltree.storage.store import ObjectStore

MIN_PART_BYTES = 5 * 2**20
MAX_PART_BYTES = 5 * 2**30
MAX_PARTS = 10_000
#: the size of every part but the last (bytes), grown for files above 10,000 of them;
#: also the memory one staging holds at a time
PART_BYTES = 8 * 2**20
_MAX_LIST_PAGES = 10_000  # ListMultipartUploads pages of 1,000 uploads at most


class UploadPart(NamedTuple):
    """One uploaded part: ``number`` (1..10,000), the ``etag`` the store returned for
    it (sent back unchanged on completion), its ``size`` in bytes."""

    number: int
    etag: str
    size: int


class Outcome(enum.Enum):
    """What a :func:`complete` call found."""

    COMPLETED = "completed"  # the store assembled the object (or acknowledged it again)
    GONE = "gone"  # NoSuchUpload: completed earlier, or aborted
    EXISTS = "exists"  # PreconditionFailed: another object holds the key already


def supports(store: ObjectStore) -> bool:
    """Whether the sink stages by multipart upload on ``store``: its filesystem is an
    s3fs ``S3FileSystem`` (not wrapped). Other stores stage a whole file and copy it."""
    try:
        from s3fs import S3FileSystem
    except ImportError:  # pragma: no cover - s3fs is a dependency
        return False
    return isinstance(store.fs, S3FileSystem)


def part_bytes(size: int) -> int:
    """The part size (bytes) for a file of ``size`` bytes: :data:`PART_BYTES`, or the
    smallest whole number of MiB that keeps the file within :data:`MAX_PARTS` parts.
    Raises ValueError for a file S3 cannot hold in one multipart upload."""
    if size < 0 or size > MAX_PARTS * MAX_PART_BYTES:
        raise ValueError(f"{size} bytes cannot be one multipart upload")
    mib = 2**20
    needed = -(-size // MAX_PARTS)
    return max(PART_BYTES, MIN_PART_BYTES, -(-needed // mib) * mib)


def error_code(e: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError in ``e``'s cause chain (s3fs raises
    OSError subclasses with the ClientError chained), or None."""
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 16 and all(cur is not s for s in seen):
        seen.append(cur)
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            if code is not None:
                return str(code)
        cur = cur.__cause__ if cur.__cause__ is not None else cur.__context__
    return None


def _bucket_key(store: ObjectStore, url: str) -> tuple[str, str]:
    bucket, key, _ = store.fs.split_path(url)
    return str(bucket), str(key)


def _call(store: ObjectStore, method: str, **kwargs: Any) -> Any:
    return store.fs.call_s3(method, **kwargs)


def upload_file(store: ObjectStore, local_path: str, url: str) -> tuple[str, list[UploadPart]]:
    """Start a multipart upload at ``url`` and upload the local file's bytes as its
    parts, in order, one part in memory at a time (:func:`part_bytes` each, the last
    one smaller; an empty or small file is one part). The upload is left open: the
    object at ``url`` appears only when :func:`complete` is called. Returns (upload
    id, parts). On failure the upload is aborted (as far as the store lets us; the
    committer's cleanup aborts what is left) and StorageError is raised."""
    bucket, key = _bucket_key(store, url)
    size = files.run(store, "stat", local_path, lambda: os.path.getsize(local_path))
    chunk = part_bytes(size)
    created = files.run(
        store,
        "create-upload",
        url,
        lambda: _call(store, "create_multipart_upload", Bucket=bucket, Key=key),
    )
    upload_id = str(created["UploadId"])
    parts: list[UploadPart] = []
    try:
        with open(local_path, "rb") as f:
            number = 0
            while True:
                data = f.read(chunk)
                if not data and number > 0:
                    break
                number += 1
                parts.append(_upload_part(store, url, bucket, key, upload_id, number, data))
                if len(data) < chunk:
                    break
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to raise
            abort(store, url, upload_id)
        raise
    return upload_id, parts


def _upload_part(
    store: ObjectStore, url: str, bucket: str, key: str, upload_id: str, number: int, data: bytes
) -> UploadPart:
    out = files.run(
        store,
        "upload-part",
        url,
        lambda: _call(
            store,
            "upload_part",
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
        ),
    )
    return UploadPart(number, str(out["ETag"]), len(data))


def complete(
    store: ObjectStore, url: str, upload_id: str, parts: list[UploadPart] | tuple[UploadPart, ...]
) -> Outcome:
    """Complete the upload ``upload_id`` at ``url`` with ``parts`` (one
    CompleteMultipartUpload request, conditional on no object holding ``url``; retried
    on transient failures). Returns :attr:`Outcome.COMPLETED`, :attr:`Outcome.GONE`
    (``NoSuchUpload``) or :attr:`Outcome.EXISTS` (``PreconditionFailed``); raises
    StorageError for any other failure."""
    bucket, key = _bucket_key(store, url)
    body = {"Parts": [{"PartNumber": p.number, "ETag": p.etag} for p in parts]}

    def once() -> Outcome:
        try:
            _call(
                store,
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload=body,
                IfNoneMatch="*",
            )
        except Exception as e:
            code = error_code(e)
            if code == "NoSuchUpload":
                return Outcome.GONE
            if code == "PreconditionFailed":
                return Outcome.EXISTS
            raise
        store.fs.invalidate_cache(url)
        return Outcome.COMPLETED

    return files.run(store, "complete-upload", url, once)


def abort(store: ObjectStore, url: str, upload_id: str) -> bool:
    """Abort the upload ``upload_id`` at ``url`` (its parts are deleted; one
    AbortMultipartUpload request). Returns False if the store no longer knows it
    (completed or aborted already). Raises StorageError."""
    bucket, key = _bucket_key(store, url)

    def once() -> bool:
        try:
            _call(store, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception as e:
            if error_code(e) == "NoSuchUpload":
                return False
            raise
        return True

    return bool(files.run(store, "abort-upload", url, once))


def list_uploads(store: ObjectStore, prefix_url: str) -> list[tuple[str, str]]:
    """(URL of the key, upload id) of every open multipart upload below the folder
    ``prefix_url`` (ListMultipartUploads with the key prefix ``<prefix>/``, every
    page). Raises StorageError."""
    bucket, prefix = _bucket_key(store, prefix_url)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    found: list[tuple[str, str]] = []
    markers: dict[str, str] = {}

    def page_after(markers: dict[str, str]) -> Any:
        return files.run(
            store,
            "list-uploads",
            prefix_url,
            lambda: _call(store, "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers),
        )

    for _ in range(_MAX_LIST_PAGES):
        page = page_after(markers)
        for u in page.get("Uploads") or []:
            key, upload_id = u.get("Key"), u.get("UploadId")
            if isinstance(key, str) and isinstance(upload_id, str) and key.startswith(prefix):
                found.append((store.url(posixpath.join(bucket, key)), upload_id))
        following = {
            "KeyMarker": page.get("NextKeyMarker"),
            "UploadIdMarker": page.get("NextUploadIdMarker"),
        }
        if not page.get("IsTruncated") or not following["KeyMarker"]:
            break
        nxt = {k: str(v) for k, v in following.items() if v}
        if nxt == markers:  # a store that does not move on: stop rather than loop
            break
        markers = nxt
    return found
