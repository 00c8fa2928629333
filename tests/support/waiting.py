"""Bounded waiting for tests: every wait has a timeout."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``cond`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s"
        time.sleep(interval)
