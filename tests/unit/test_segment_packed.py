"""Packed changes (what a writer keeps: a length table and a body per entry) encode to
exactly the bytes of the same changes as lists, in every segment version and mode."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.segment import PackedChanges, decode_segment, encode_segment

CHANGE = st.binary(max_size=40) | st.sampled_from([b"ab" * 300, b""])
CHANGESETS = st.dictionaries(
    st.integers(0, 9),
    st.dictionaries(st.integers(0, 127), st.lists(CHANGE, max_size=6), max_size=4),
    max_size=5,
)
MODES: list[dict[str, Any]] = [{"version": 1}, {}, {"compression": "zstd"}]


def _packed(changes: list[bytes]) -> PackedChanges:
    table = bytearray(struct.pack(f"!{len(changes)}I", *map(len, changes)))
    return PackedChanges(table, bytearray(b"".join(changes)))


@given(st.lists(CHANGE, max_size=10))
def test_packed_changes_give_back_their_changes(changes: list[bytes]) -> None:
    assert _packed(changes).changes() == changes


@settings(max_examples=150, deadline=None)
@given(CHANGESETS, st.sampled_from(range(len(MODES))), st.data())
def test_packed_entries_encode_as_lists_do(
    changesets: dict[int, dict[int, list[bytes]]], mode: int, data: st.DataObject
) -> None:
    mixed = {
        sqn: {kg: _packed(v) if data.draw(st.booleans()) else v for kg, v in per.items()}
        for sqn, per in changesets.items()
    }
    expected = encode_segment("w", 0, 10, changesets, **MODES[mode])
    assert encode_segment("w", 0, 10, mixed, **MODES[mode]) == expected
    decoded = decode_segment(expected)
    assert decoded.entries == {(s, kg): v for s, per in changesets.items() for kg, v in per.items()}
