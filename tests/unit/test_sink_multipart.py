"""The committable's multipart fields (sparkplug/sinks/layout.py) and the pure parts of
sparkplug/sinks/multipart.py: the wire format stays that of the previous version for
staged-file committables, carries upload id and parts for S3 ones, and refuses
hostile values from the network; part sizes; which stores get multipart staging."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from s3fs.errors import translate_boto_error

from dstltree.sparkplug.sinks import Committable, FileSink, SinkCommitError
from dstltree.sparkplug.sinks import multipart as mp
from dstltree.sparkplug.sinks.layout import final_key, final_name, staged_name
from dstltree.sparkplug.sinks.multipart import MAX_PART_BYTES, MAX_PARTS, MIN_PART_BYTES
from dstltree.sparkplug.sinks.multipart import UploadPart as Part
from dstltree.storage.store import ObjectStore

MiB = 2**20
ETAG = '"5d41402abc4b2a76b9719d911017c592"'
UPLOAD = "2~Yb7Cjq_kh-4Wgx9.f3+/z0=="


def _committable(sizes: list[int], upload_id: str | None = UPLOAD) -> Committable:
    staged = staged_name(12, 3, 1, "parquet")
    parts = tuple(Part(i, ETAG, s) for i, s in enumerate(sizes, start=1))
    return Committable(
        12,
        3,
        1,
        staged,
        final_name(12, 3, 1, "parquet"),
        rows=40,
        bytes=sum(sizes),
        upload_id=upload_id,
        parts=parts if upload_id is not None else (),
    )


def _wire(**changes: Any) -> dict[str, Any]:
    d = _committable([5 * MiB, 5 * MiB, 17]).to_wire()
    d.update(changes)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()


def test_a_multipart_committable_travels_as_msgpack_and_json() -> None:
    c = _committable([5 * MiB, 6 * MiB, 1])
    wire = c.to_wire()
    assert wire["upload_id"] == UPLOAD
    assert wire["parts"] == [[1, ETAG, 5 * MiB], [2, ETAG, 6 * MiB], [3, ETAG, 1]]
    assert Committable.from_wire(msgpack.unpackb(msgpack.packb(wire))) == c
    assert Committable.from_wire(json.loads(json.dumps(wire))) == c
    assert c.multipart


def test_a_staged_file_committable_keeps_the_previous_wire_format() -> None:
    c = _committable([], upload_id=None)
    previous = {
        "checkpoint_id": 12,
        "task": 3,
        "attempt": 1,
        "staged": c.staged,
        "final": c.final,
        "rows": 40,
        "bytes": 0,
    }
    assert c.to_wire() == previous  # no new keys: what the previous version wrote
    decoded = Committable.from_wire(previous)
    assert decoded == c and decoded.upload_id is None and decoded.parts == ()
    assert not decoded.multipart


def test_a_single_small_part_and_an_empty_file_are_valid() -> None:
    _committable([1]).validate()
    _committable([0]).validate()
    _committable([MAX_PART_BYTES]).validate()


_HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"upload_id": 7}, "not a string"),
    ({"upload_id": ""}, "bad upload id"),
    ({"upload_id": "x" * 1025}, "bad upload id"),
    ({"upload_id": "../../other-bucket"}, "bad upload id"),
    ({"upload_id": "abc&partNumber=1"}, "bad upload id"),
    ({"upload_id": "a b"}, "bad upload id"),
    ({"upload_id": "id\n"}, "bad upload id"),
    ({"upload_id": "<x/>"}, "bad upload id"),
    ({"upload_id": _DROP}, "come together"),
    ({"parts": _DROP}, "come together"),
    ({"parts": "1,2,3"}, "must be 1..10000 parts"),
    ({"parts": {"1": ETAG}}, "must be 1..10000 parts"),
    ({"parts": []}, "must be 1..10000 parts"),
    ({"parts": [[1, ETAG, 1]] * (MAX_PARTS + 1)}, "must be 1..10000 parts"),
    ({"parts": [[1, ETAG]]}, "not \\[number, etag, size\\]"),
    ({"parts": [[1, ETAG, 1, 0]]}, "not \\[number, etag, size\\]"),
    ({"parts": [7]}, "not \\[number, etag, size\\]"),
    ({"parts": [[0, ETAG, 17]]}, "part number"),
    ({"parts": [[10_001, ETAG, 17]]}, "part number"),
    ({"parts": [[True, ETAG, 17]]}, "part number"),
    ({"parts": [["1", ETAG, 17]]}, "part number"),
    ({"parts": [[1, ETAG, 5 * MiB], [1, ETAG, 17]]}, "numbered 1"),  # repeated
    ({"parts": [[2, ETAG, 5 * MiB], [1, ETAG, 17]]}, "numbered 2"),  # descending
    ({"parts": [[1, ETAG, 5 * MiB], [3, ETAG, 17]]}, "numbered 3"),  # a gap
    ({"parts": [[1, 5, 17]]}, "not a string"),
    ({"parts": [[1, None, 17]]}, "not a string"),
    ({"parts": [[1, "", 17]]}, "bad ETag"),
    ({"parts": [[1, "e" * 129, 17]]}, "bad ETag"),
    ({"parts": [[1, "<ETag>x</ETag>", 17]]}, "bad ETag"),
    ({"parts": [[1, "a\x00b", 17]]}, "bad ETag"),
    ({"parts": [[1, ETAG, -1]]}, "part size"),
    ({"parts": [[1, ETAG, MAX_PART_BYTES + 1]]}, "part size"),
    ({"parts": [[1, ETAG, 1.5]]}, "part size"),
    ({"parts": [[1, ETAG, MIN_PART_BYTES - 1], [2, ETAG, 17]]}, "part 1 size"),  # too small
    ({"parts": [[1, ETAG, 5 * MiB], [2, ETAG, 0]]}, "part 2 size"),  # an empty last part
    ({"bytes": 5 * MiB}, "parts hold"),  # sizes do not add up to the file
    ({"staged": "../../etc/passwd"}, "not a staged file"),
    ({"final": "part-000000000012-000001-00003.parquet/../x"}, "final name"),
    ({"task": 4}, "is not of checkpoint 12"),
    ({"staged": None}, "must be strings"),
]


@pytest.mark.parametrize(("changes", "message"), _HOSTILE)
def test_hostile_wire_values_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Committable.from_wire(_wire(**changes))


def test_names_with_a_trailing_newline_are_refused() -> None:
    wire = _wire()
    for field in ("staged", "final"):
        with pytest.raises(ValueError):
            Committable.from_wire({**wire, field: wire[field] + "\n"})


def test_a_committable_that_is_not_a_dict_is_refused() -> None:
    with pytest.raises(ValueError, match="is a dict"):
        Committable.from_wire([1, 2, 3])  # type: ignore[arg-type]


def test_validate_is_strict_for_committables_made_in_code() -> None:
    c = _committable([5 * MiB, 17])
    c.validate()
    bad = [
        dataclasses.replace(c, upload_id=None),  # parts without an upload
        dataclasses.replace(c, parts=()),
        dataclasses.replace(c, parts=(Part(1, ETAG, 5 * MiB), (2, ETAG, 17))),  # type: ignore[arg-type]
        dataclasses.replace(c, parts=(Part(1, ETAG, 5 * MiB), Part(2, ETAG, "17"))),  # type: ignore[arg-type]
        dataclasses.replace(c, upload_id="bad id"),
    ]
    for b in bad:
        with pytest.raises(ValueError):
            b.validate()


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["upload_id", "parts", "bytes"]), st.from_type(object)))
def test_random_junk_in_the_multipart_fields_is_refused_or_valid(junk: dict[str, Any]) -> None:
    """Whatever arrives, decoding raises ValueError or yields a committable that
    validates: it never crashes with another error."""
    try:
        c = Committable.from_wire(_wire(**junk))
    except ValueError:
        return
    c.validate()


def test_the_committer_refuses_a_multipart_committable_off_s3(tmp_path: Path) -> None:
    c = _committable([17])
    with pytest.raises(SinkCommitError, match="is not on S3"):
        FileSink(str(tmp_path)).create_committer().commit([c])


def test_final_key_names_checkpoint_and_attempt() -> None:
    assert final_key(final_name(12, 3, 1, "json")) == (12, 1)
    assert final_key("_staging/attempt-000001/x.json") is None
    assert final_key("part-1-1-1.json") is None


def test_part_size_grows_only_past_ten_thousand_parts() -> None:
    assert mp.part_bytes(0) == mp.PART_BYTES
    assert mp.part_bytes(mp.PART_BYTES * MAX_PARTS) == mp.PART_BYTES
    big = mp.PART_BYTES * MAX_PARTS + 1
    size = mp.part_bytes(big)
    assert size % MiB == 0 and size > mp.PART_BYTES and -(-big // size) <= MAX_PARTS
    assert mp.part_bytes(MAX_PARTS * MAX_PART_BYTES) == MAX_PART_BYTES
    with pytest.raises(ValueError, match="cannot be one multipart upload"):
        mp.part_bytes(MAX_PARTS * MAX_PART_BYTES + 1)
    assert MIN_PART_BYTES <= mp.PART_BYTES <= MAX_PART_BYTES


def test_error_codes_are_found_through_s3fs_translation() -> None:
    for code in ("NoSuchUpload", "PreconditionFailed", "SlowDown"):
        error = ClientError({"Error": {"Code": code, "Message": "m"}}, "CompleteMultipartUpload")
        assert mp.error_code(translate_boto_error(error)) == code
    assert mp.error_code(OSError("plain")) is None


def test_only_s3fs_stores_get_multipart_staging(tmp_path: Path) -> None:
    assert not mp.supports(ObjectStore(str(tmp_path)))
    assert not mp.supports(ObjectStore("memory://sink-multipart-test"))
    s3 = ObjectStore(
        "s3://bucket/out", {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"}
    )
    assert mp.supports(s3)  # built only: no request is sent
