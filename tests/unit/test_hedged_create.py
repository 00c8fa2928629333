"""The hedged conditional create of commit records (coordinator/hedged_create.py)."""

from __future__ import annotations

import threading

import pytest

from dstltree.coordinator.hedged_create import FIRST_HEDGE_S, MIN_HEDGE_S, HedgedCreate
from dstltree.storage.errors import StorageError
from dstltree.storage.store import ObjectExistsError


class _Name:
    """One name created exclusively; ``hold`` makes the first attempt wait for
    ``release`` before it tries (a slow request)."""

    def __init__(self, hold: bool = False) -> None:
        self.lock = threading.Lock()
        self.exists = False
        self.calls = 0
        self.hold = hold
        self.release = threading.Event()

    def create(self) -> None:
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first and self.hold:
            assert self.release.wait(10), "never released"
        with self.lock:
            if self.exists:
                raise ObjectExistsError("put", "x", "exists")
            self.exists = True


def test_a_fast_create_is_one_attempt() -> None:
    h, name = HedgedCreate(), _Name()
    assert h.run(name.create) == (True, 1) and h.hedges == 0
    assert h.run(name.create) == (False, 1)  # there already: the caller reads it
    h.close()


def test_a_slow_create_is_hedged_and_the_first_answer_wins() -> None:
    h, name = HedgedCreate(), _Name(hold=True)
    h._latencies.extend([0.001] * 8)  # recent creates were fast: hedge after 50 ms
    assert h.hedge_after() == MIN_HEDGE_S
    assert h.run(name.create) == (True, 2) and h.hedges == 1
    name.release.set()  # the slow first attempt lands late: it finds the name taken
    h.close()


def test_hedge_delay_follows_recent_creates() -> None:
    h = HedgedCreate()
    assert h.hedge_after() == FIRST_HEDGE_S
    h._latencies.extend([0.2] * 7 + [0.4] * 3 + [2.0])
    assert h.hedge_after() == 0.4


def test_every_attempt_failing_raises_the_error() -> None:
    h = HedgedCreate()

    def broken() -> None:
        raise StorageError("put", "x", "down")

    with pytest.raises(StorageError, match="down"):
        h.run(broken)
    h.close()
