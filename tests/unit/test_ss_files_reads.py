"""Reads of a rebuild or refresh run side by side (structured_streaming/files.py)."""

from __future__ import annotations

import threading

import pytest

from dstltree.structured_streaming.files import READERS, _concurrently


def test_reads_run_side_by_side_and_keep_their_order() -> None:
    # each call waits until 4 calls are in it at once: one after the other would break it
    barrier = threading.Barrier(4, timeout=30)

    def read(x: int) -> int:
        barrier.wait()
        return x * 10

    assert READERS >= 4
    assert _concurrently(read, [1, 2, 3, 4]) == [10, 20, 30, 40]


def test_the_first_error_is_raised() -> None:
    ended: list[int] = []

    def read(x: int) -> int:
        if x == 0:
            raise OSError("unreadable")
        ended.append(x)
        return x

    with pytest.raises(OSError, match="unreadable"):
        _concurrently(read, list(range(8)))
    assert set(ended) <= set(range(1, 8))
    assert _concurrently(read, []) == [] and _concurrently(read, [5]) == [5]
