"""The bridge's frames: round trips and every hostile input refused with its code."""

from __future__ import annotations

import io
import json
import posixpath
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstltree.structured_streaming import wire
from dstltree.structured_streaming.wire import (
    MAX_HEADER,
    MAX_PAYLOAD,
    ConnectionClosed,
    WireError,
    check_path,
    negotiate,
    parse_request,
    read_frame,
)

R = "file:/tmp/query"


def _frame(raw_header: bytes, payload: bytes = b"") -> bytes:
    return (
        struct.pack("!I", len(raw_header)) + raw_header + struct.pack("!I", len(payload)) + payload
    )


def _code(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(WireError) as e:
        fn(*args)
    return e.value.code


@given(
    header=st.dictionaries(st.text(max_size=20), st.integers() | st.text(max_size=50), max_size=8),
    payload=st.binary(max_size=4096),
)
def test_round_trip(header: dict, payload: bytes) -> None:
    got = read_frame(io.BytesIO(wire.encode(header, payload)))
    assert got == (header, payload)


def test_frames_back_to_back_and_clean_end() -> None:
    src = io.BytesIO(wire.encode({"a": 1}, b"x") + wire.encode({"b": 2}))
    assert read_frame(src) == ({"a": 1}, b"x")
    assert read_frame(src) == ({"b": 2}, b"")
    with pytest.raises(ConnectionClosed):
        read_frame(src)


def test_reads_from_a_recv_callable_in_small_pieces() -> None:
    data = io.BytesIO(wire.encode({"op": "hello"}, b"abc" * 100))
    assert read_frame(lambda n: data.read(min(n, 3))) == ({"op": "hello"}, b"abc" * 100)


@pytest.mark.parametrize("cut", [1, 4, 7, 10])
def test_truncated_frame_is_fatal_malformed(cut: int) -> None:
    data = wire.encode({"op": "hello"}, b"payload")
    with pytest.raises(WireError) as e:
        read_frame(io.BytesIO(data[:cut]))
    assert e.value.code == "malformed" and e.value.fatal


def test_oversized_lengths_refused_before_reading() -> None:
    huge_header = struct.pack("!I", MAX_HEADER + 1)
    with pytest.raises(WireError) as e:
        read_frame(io.BytesIO(huge_header))
    assert (e.value.code, e.value.fatal) == ("too-large", True)
    raw = b"{}"
    big = struct.pack("!I", len(raw)) + raw + struct.pack("!I", MAX_PAYLOAD + 1)
    with pytest.raises(WireError) as e:
        read_frame(io.BytesIO(big))
    assert (e.value.code, e.value.fatal) == ("too-large", True)
    assert _code(wire.dump, {}, b"x" * (MAX_PAYLOAD + 1)) == "too-large"
    assert _code(wire.dump, {"k": "x" * MAX_HEADER}) == "too-large"


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"[1,2]", b"not json", b'"s"', b"[" * 60000])
def test_header_not_a_json_object_is_malformed_not_fatal(raw: bytes) -> None:
    with pytest.raises(WireError) as e:
        read_frame(io.BytesIO(_frame(raw)))
    assert (e.value.code, e.value.fatal) == ("malformed", False)


def test_parse_every_request() -> None:
    p = "state/0/1/12.changelog"
    assert parse_request({"op": "hello", "versions": [1, 2]}) == wire.Hello((1, 2))
    assert parse_request({"op": "drive", "root": "file:/c"}) == wire.Drive("file:/c")
    app = {"op": "hello", "versions": [1], "app": "app-20261127-0001"}
    assert parse_request(app) == wire.Hello((1,), "app-20261127-0001")
    put = {"op": "put", "root": R, "path": p, "offset": 3, "last": True}
    assert parse_request(put, b"xy") == wire.Put(R, p, 3, True, b"xy")
    assert parse_request({"op": "stat", "root": R, "path": p}) == wire.Stat(R, p)
    read = {"op": "read", "root": R, "path": p, "offset": 0, "length": 9}
    assert parse_request(read) == wire.Read(R, p, 0, 9)
    assert parse_request({"op": "list", "root": R, "dir": "state"}) == wire.List(R, "state")
    assert parse_request({"op": "delete", "root": R, "path": p}) == wire.Delete(R, p)
    assert parse_request({"op": "commit", "root": R, "timeout": 5}) == wire.Commit(R, 5.0)


@pytest.mark.parametrize(
    "header",
    [
        {"op": "nope"},
        {"op": 3},
        {},
        {"op": "hello"},
        {"op": "hello", "versions": []},
        {"op": "hello", "versions": "1"},
        {"op": "hello", "versions": [True]},
        {"op": "hello", "versions": [1], "extra": 1},
        {"op": "hello", "versions": [1], "app": 7},
        {"op": "drive"},
        {"op": "drive", "root": "file:/c", "timeout": 1},
        {"op": "hello", "versions": [1], "app": "a" * 257},
        {"op": "hello", "versions": [1], "app": "a\x00b"},
        {"op": "put", "root": R, "path": "state/a", "offset": -1, "last": True},
        {"op": "put", "root": R, "path": "state/a", "offset": 1.5, "last": True},
        {"op": "put", "root": R, "path": "state/a", "offset": 2**63, "last": True},
        {"op": "put", "root": R, "path": "state/a", "offset": 0, "last": 1},
        {"op": "put", "root": R, "path": 7, "offset": 0, "last": True},
        {"op": "put", "root": None, "path": "state/a", "offset": 0, "last": True},
        {"op": "read", "root": R, "path": "state/a", "offset": 0, "length": "9"},
        {"op": "commit", "root": R, "timeout": -1},
        {"op": "commit", "root": R, "timeout": 1e9},
        {"op": "commit", "root": R, "timeout": True},
    ],
)
def test_wrong_fields_are_malformed(header: dict) -> None:
    assert _code(parse_request, header, b"") == "malformed"


def test_payload_where_none_belongs_is_malformed() -> None:
    assert _code(parse_request, {"op": "stat", "root": R, "path": "state/a"}, b"x") == "malformed"


@pytest.mark.parametrize(
    "path",
    [
        "/state/a",
        "state/../x",
        "../state/a",
        "state/./a",
        "state//a",
        "state/a/",
        "state/a\x00b",
        "state\\a",
        "state/a\nb",
        "",
        "state/" + "a" * 5000,
    ],
)
def test_hostile_paths_refused(path: str) -> None:
    assert _code(check_path, path) == "path"
    header = {"op": "stat", "root": R, "path": path}
    assert _code(parse_request, header, b"") == "path"


def test_the_root_itself_only_as_a_listed_dir() -> None:
    assert check_path("", allow_root=True) == ""
    assert _code(check_path, "") == "path"
    for p in ("state/0/1/12_0a1b.zip", "offsets/1", "commits/1", "sources/0/3", "metadata"):
        assert check_path(p) == p
    header = {"op": "list", "root": R, "dir": ""}
    assert parse_request(header) == wire.List(R, "")


def test_a_commit_carries_its_commit_file() -> None:
    h = {"op": "commit", "root": R, "timeout": 5, "path": "commits/3"}
    assert parse_request(h, b"v1") == wire.Commit(R, 5.0, None, "commits/3", b"v1")
    assert _code(parse_request, {"op": "commit", "root": R, "timeout": 5}, b"x") == "malformed"
    assert _code(parse_request, {**h, "path": "../commits/3"}, b"") == "path"


@pytest.mark.parametrize("root", ["", "x" * 4097, "file:/a\x00b", "file:/a\nb"])
def test_bad_roots_refused(root: str) -> None:
    assert _code(parse_request, {"op": "stat", "root": root, "path": "state/a"}) == "path"


@given(st.text(max_size=60))
def test_any_accepted_path_is_normalized_below_the_root(path: str) -> None:
    try:
        got = check_path(path)
    except WireError as e:
        assert e.code in ("path", "malformed")
        return
    assert not got.startswith("/") and ".." not in got.split("/") and "\x00" not in got
    assert posixpath.normpath(got) == got


def test_version_negotiation() -> None:
    assert negotiate((1, 7)) == 1
    assert negotiate((1, 2)) == 2
    with pytest.raises(WireError) as e:
        negotiate((3, 4))
    assert e.value.code == "version" and "[3, 4]" in str(e.value) and "[1, 2]" in str(e.value)


def test_error_header_shape() -> None:
    h = wire.error_header("path", "bad")
    assert h == {"ok": False, "error": "bad", "code": "path"}
    assert json.loads(wire.encode(h)[4:-4]) == h
