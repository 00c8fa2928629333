"""Key groups: every key type hashes to a stable group; non-keys are refused by type;
decoded keys become keys again; tasks own contiguous ranges."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.sparkplug.keygroups import (
    canonical_key,
    check_key,
    encode_key,
    key_group_of,
    key_group_of_encoded,
    key_group_range,
    task_of_key,
    task_of_key_group,
)

ROOT = Path(__file__).resolve().parents[2]

scalar_keys = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=40),
    st.binary(max_size=40),
)
keys = st.recursive(
    scalar_keys, lambda inner: st.tuples(inner, inner) | st.tuples(inner), max_leaves=6
)

# Pinned groups: a change of the hash would silently misroute restored state.
PINNED: list[tuple[Any, int, int]] = [
    ("tailnum", 64, 12992),
    ("N123AA", 33, 10145),
    ("", 101, 19557),
    (None, 61, 11581),
    (True, 7, 31879),
    (False, 17, 19473),
    (0, 13, 28557),
    (1, 27, 24347),
    (2**63, 109, 24045),
    (b"k", 31, 28191),
    (("a", 1), 20, 11028),
    (((None,), b""), 38, 422),
]


@pytest.mark.parametrize(("key", "g128", "g32768"), PINNED)
def test_key_groups_are_pinned(key: Any, g128: int, g32768: int) -> None:
    assert key_group_of(key, 128) == g128
    assert key_group_of(key) == g128  # the default max_parallelism is 128
    assert key_group_of(key, 32768) == g32768


def test_key_groups_are_the_same_in_another_process() -> None:
    code = (
        "from dstltree.sparkplug.keygroups import key_group_of\n"
        "print([key_group_of(k, 1000) for k in ['a', None, True, 7, b'x', ('a', (1, None))]])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    here = [key_group_of(k, 1000) for k in ["a", None, True, 7, b"x", ("a", (1, None))]]
    assert out.stdout.strip() == str(here)


def test_key_types_are_distinguished() -> None:
    encodings = {encode_key(k) for k in (1, True, "1", b"1", None, (1,), ((1,),), ("1", b"1"))}
    assert len(encodings) == 8
    assert encode_key(False) != encode_key(0)


@pytest.mark.parametrize(
    ("bad", "type_name"),
    [
        (1.5, "float"),
        ([1], "list"),
        ({"a": 1}, "dict"),
        ({1}, "set"),
        (bytearray(b"x"), "bytearray"),
        (("a", 1.0), "float"),
        (("a", ("b", [1])), "list"),
        (object(), "object"),
    ],
)
def test_non_keys_are_refused_naming_the_type(bad: Any, type_name: str) -> None:
    with pytest.raises(TypeError, match=rf"not {type_name}\b"):
        key_group_of(bad, 128)
    with pytest.raises(TypeError, match=rf"not {type_name}\b"):
        check_key(bad)


def test_ints_outside_64_bits_are_refused() -> None:
    for bad in (2**64, -(2**63) - 1, ("a", 2**70)):
        with pytest.raises(ValueError, match="64-bit"):
            key_group_of(bad)


@given(keys, st.integers(min_value=1, max_value=40000))
@settings(max_examples=300, deadline=None)
def test_key_group_is_the_crc_of_the_encoding_and_in_range(key: Any, m: int) -> None:
    kg = key_group_of(key, m)
    assert 0 <= kg < m
    assert kg == key_group_of_encoded(encode_key(key), m)


@given(keys)
@settings(max_examples=300, deadline=None)
def test_decoded_keys_come_back_canonical(key: Any) -> None:
    decoded = canonical_key(msgpack.unpackb(msgpack.packb(key)))
    assert decoded == key
    assert encode_key(decoded) == encode_key(key)  # also bool vs int, str vs bytes
    assert hash(decoded) == hash(key)


def test_canonical_key_keeps_scalars() -> None:
    assert canonical_key("a") == "a" and canonical_key(None) is None
    assert canonical_key([1, [2, ["x"]]]) == (1, (2, ("x",)))


def test_key_group_ranges_partition_all_key_groups() -> None:
    for m in (16, 100, 128):
        for p in (1, 3, 7, 16):
            seen = [kg for t in range(p) for kg in key_group_range(t, p, m)]
            assert seen == list(range(m))
            assert all(
                task_of_key_group(kg, p, m) == t
                for t in range(p)
                for kg in key_group_range(t, p, m)
            )
    with pytest.raises(ValueError):
        key_group_range(0, 129)
    with pytest.raises(ValueError):
        key_group_range(3, 3)


@given(keys, st.integers(min_value=1, max_value=8), st.sampled_from([8, 128, 32768]))
@settings(max_examples=300, deadline=None)
def test_task_of_key_is_the_owner_of_its_key_group(key: Any, p: int, m: int) -> None:
    """The task loop routes with task_of_key: the owner of the key's group, and with one
    task task 0 without computing the group (the backend computes it once)."""
    assert task_of_key(key, p, m) == task_of_key_group(key_group_of(key, m), p, m)
    assert key_group_of(key, m) in key_group_range(task_of_key(key, p, m), p, m)


@pytest.mark.parametrize("p", [1, 4])
def test_task_of_key_refuses_non_keys_with_any_parallelism(p: int) -> None:
    with pytest.raises(TypeError, match="float"):
        task_of_key(1.5, p)
    with pytest.raises(TypeError, match="list"):
        task_of_key(("a", [1]), p)
    with pytest.raises(ValueError, match="64-bit"):
        task_of_key(2**64, p)
