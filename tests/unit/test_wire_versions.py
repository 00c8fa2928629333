"""Wire version 2 (client/wire.py): hello, ping and pong round trip; a version-1 side
does not know them; malformed and hostile ones are refused with a reason."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.errors import WireError
from dstltree.client.wire import (
    MAX_SEQ,
    WIRE_VERSION,
    WIRE_VERSIONS,
    Error,
    Ping,
    Pong,
    Register,
    WireHello,
    check_versions,
    common_version,
    dump,
    is_refusal,
    load,
    refusal,
    speaks_version_2,
    unknown_type,
)


def _raw(header: dict[str, Any]) -> list[bytes]:
    return [msgpack.packb(header)]


def test_this_release_speaks_versions_1_and_2() -> None:
    assert WIRE_VERSION == 2 and WIRE_VERSIONS == (1, 2)


@pytest.mark.parametrize(
    "msg",
    [WireHello((1, 2)), WireHello((2,), "a1"), WireHello((7,)), Ping(0), Ping(MAX_SEQ), Pong(5)],
)
def test_hello_ping_and_pong_round_trip(msg: object) -> None:
    assert load(dump(msg)) == msg  # type: ignore[arg-type]


def test_the_shapes_on_the_wire() -> None:
    assert msgpack.unpackb(dump(WireHello((1, 2)))[0]) == {"t": "hello", "v": [1, 2]}
    assert msgpack.unpackb(dump(WireHello((2,), "n"))[0]) == {"t": "hello", "v": 2, "node": "n"}
    assert msgpack.unpackb(dump(Ping(3))[0]) == {"t": "ping", "seq": 3}
    assert msgpack.unpackb(dump(Pong(3))[0]) == {"t": "pong", "seq": 3}


def test_a_hello_answer_names_exactly_one_version() -> None:
    with pytest.raises(ValueError, match="one version"):
        dump(WireHello((1, 2), "n"))


@pytest.mark.parametrize("msg", [WireHello((1, 2)), Ping(1), Pong(1)])
def test_a_version_1_side_does_not_know_the_version_2_types(msg: object) -> None:
    t = msgpack.unpackb(dump(msg)[0])["t"]  # type: ignore[arg-type]
    with pytest.raises(WireError, match=f"unknown message type '{t}'") as e:
        load(dump(msg), versions=(1,))  # type: ignore[arg-type]
    # what a version-1 node answers is what a version-2 side recognizes
    assert unknown_type(Error(str(e.value))) == t
    assert load(dump(Register("w")), versions=(1,)) == Register("w")
    assert load(dump(msg), versions=(3,)) == msg  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "header, reason",
    [
        ({"t": "hello"}, "bad 'hello' message"),
        ({"t": "hello", "v": []}, "1..16 versions"),
        ({"t": "hello", "v": list(range(1, 18))}, "1..16 versions"),
        ({"t": "hello", "v": [0]}, "wire version is 1..65535"),
        ({"t": "hello", "v": [70000]}, "wire version is 1..65535"),
        ({"t": "hello", "v": [True]}, "non-negative integer"),
        ({"t": "hello", "v": [-1]}, "non-negative integer"),
        ({"t": "hello", "v": ["2"]}, "non-negative integer"),
        ({"t": "hello", "v": [2], "node": "n"}, "names no node"),
        ({"t": "hello", "v": 2}, "expected a string"),
        ({"t": "hello", "v": 2, "node": ""}, "1..256 characters"),
        ({"t": "hello", "v": 2, "node": "x" * 300}, "1..256 characters"),
        ({"t": "hello", "v": {"a": 1}}, "non-negative integer"),
        ({"t": "ping"}, "bad 'ping' message"),
        ({"t": "ping", "seq": -1}, "non-negative integer"),
        ({"t": "ping", "seq": 1.5}, "non-negative integer"),
        ({"t": "pong", "seq": False}, "non-negative integer"),
        ({"t": "pong", "seq": 1 << 63}, "seq must be <="),
    ],
)
def test_malformed_version_2_messages_are_refused_with_a_reason(
    header: dict[str, Any], reason: str
) -> None:
    with pytest.raises(WireError, match=reason):
        load(_raw(header))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["hello", "ping", "pong"]),
    st.dictionaries(
        st.sampled_from(["v", "node", "seq", "x"]),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.text(max_size=5),
            lambda inner: st.lists(inner, max_size=20),
            max_leaves=30,
        ),
    ),
)
def test_any_hostile_hello_ping_or_pong_decodes_or_raises_a_wire_error(
    t: str, fields: dict[str, Any]
) -> None:
    try:
        packed = msgpack.packb({"t": t, **fields})
    except (OverflowError, ValueError):
        return  # not representable in msgpack: nothing a peer could send
    try:
        msg = load([packed])
    except WireError:
        return
    assert isinstance(msg, (WireHello, Ping, Pong))
    assert load(dump(msg)) == msg


def test_versions_are_checked_and_normalized() -> None:
    assert check_versions([2, 1, 2]) == (1, 2)
    for bad in ([], [0], [70000], list(range(1, 20))):
        with pytest.raises(ValueError, match="wire_versions"):
            check_versions(bad)
    assert speaks_version_2((1, 2)) and speaks_version_2((3,)) and not speaks_version_2((1,))


def test_the_common_version_is_the_highest_both_speak() -> None:
    assert common_version((1, 2), (1, 2, 3)) == 2
    assert common_version((2, 3), (3, 1)) == 3
    assert common_version((3,), (1, 2)) is None


def test_a_refusal_names_both_sides_versions() -> None:
    text = refusal((3,), (2, 1))
    assert text == "no common wire version: this node speaks [3], the peer [1, 2]"
    assert is_refusal(Error(text)) and not is_refusal(Error("too many writers"))
    assert "[1] (it sent no hello)" in refusal((2, 3), None)
    assert unknown_type(Error(text)) is None
