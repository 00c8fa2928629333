"""Back-pressure: a bound on the bytes a client has sent but not yet seen durable.

Flink's DSTL blocks ``append`` once 100 MB are in flight (``dstl.dfs.upload.max-in-flight``);
dstltree does the same per client: a writer that starts an upload (a pre-emptive one
from ``append``, or ``persist_durably``) waits while the in-flight bytes would exceed
the limit. A segment larger than the whole limit still goes when nothing else is in
flight, so progress never stops.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

DEFAULT_MAX_IN_FLIGHT = 100 * 1024 * 1024  # bytes, as Flink


@dataclass(frozen=True)
class InFlightStatistics:
    in_flight_bytes: int
    waits: int
    waited_s: float


class InFlightLimit:
    """Bytes in flight, at most ``limit_bytes`` (> 0). Thread-safe."""

    def __init__(self, limit_bytes: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"max in-flight bytes must be > 0, got {limit_bytes}")
        self.limit = limit_bytes
        self._in_flight = 0
        self._cond = threading.Condition()
        self._waits = 0
        self._waited = 0.0
        self._waiting = 0  # threads blocked in acquire: release wakes them only if any

    def acquire(self, nbytes: int, timeout: float | None = None) -> None:
        """Block until ``nbytes`` fit (blocking call). Raises TimeoutError after
        ``timeout`` seconds (None: wait as long as it takes)."""
        with self._cond:
            if self._fits(nbytes):
                self._in_flight += nbytes
                return
            self._waits += 1
            self._waiting += 1
            start = time.monotonic()
            try:
                ok = self._cond.wait_for(lambda: self._fits(nbytes), timeout)
            finally:
                self._waiting -= 1
            self._waited += time.monotonic() - start
            if not ok:
                raise TimeoutError(f"{self._in_flight} bytes in flight; {nbytes} more do not fit")
            self._in_flight += nbytes

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._in_flight = max(0, self._in_flight - nbytes)
            if self._waiting:
                self._cond.notify_all()

    def statistics(self) -> InFlightStatistics:
        with self._cond:
            return InFlightStatistics(self._in_flight, self._waits, self._waited)

    def _fits(self, nbytes: int) -> bool:
        return self._in_flight == 0 or self._in_flight + nbytes <= self.limit
