"""A conditional create with a hedged second attempt: the commit point of a checkpoint
(coordinator/store.py) on an object store whose request latency has a long tail.

On S3 a small PUT takes about 0.3 s at the median and seconds at the 99.9th percentile
(FLIP-158, "DFS write latency"); checkpoints complete in order, so one slow commit
record delays every checkpoint behind it. As Flink's changelog uploads do, a create
still running after ``hedge_after`` seconds (the 75th percentile of recent creates,
at least :data:`MIN_HEDGE_S`) gets a second attempt with the same bytes. Both are
exclusive creates of one name, so at most one lands; the first answer decides:

- an attempt created the object: done;
- an attempt found the object there: the other attempt landed (our bytes), or another
  writer did (the caller reads it and decides);
- both failed: the last error is raised.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from dstltree.storage.store import ObjectExistsError

#: Earliest hedge, seconds (a local disk's create takes about a millisecond).
MIN_HEDGE_S = 0.05
#: Hedge delay before enough creates were timed, seconds.
FIRST_HEDGE_S = 0.5
#: Creates timed for the percentile, and the percentile.
WINDOW = 32
PERCENTILE = 75


class HedgedCreate:
    """Runs ``create()`` (an exclusive create raising ObjectExistsError when the
    object exists) with at most one hedged second attempt. Thread-safe; attempts run
    on a pool of its own (``threads``). ``clock``: monotonic seconds."""

    def __init__(self, threads: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dstl-commit-create")
        self._clock = clock
        self._lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=WINDOW)
        self.hedges = 0

    def hedge_after(self) -> float:
        """Seconds before a second attempt starts."""
        with self._lock:
            recent = sorted(self._latencies)
        if len(recent) < 8:
            return FIRST_HEDGE_S
        return max(MIN_HEDGE_S, recent[min(len(recent) - 1, len(recent) * PERCENTILE // 100)])

    def run(self, create: Callable[[], object]) -> tuple[bool, int]:
        """(created, attempts): ``created`` False when the object was found there
        (by an attempt whose sibling did not create it first). Raises the error of
        the last attempt when every attempt failed otherwise."""
        start = self._clock()
        attempts = [self._pool.submit(create)]
        done, _ = wait(attempts, timeout=self.hedge_after())
        if not done:
            self.hedges += 1
            attempts.append(self._pool.submit(create))
        return self._first_answer(attempts, start), len(attempts)

    def _first_answer(self, attempts: list[Future[object]], start: float) -> bool:
        pending = set(attempts)
        error: BaseException | None = None
        found = False
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                e = f.exception()
                if e is None:
                    self._timed(start)
                    return True
                if isinstance(e, ObjectExistsError):
                    found = True
                else:
                    error = e
            if found and not any(f.done() and f.exception() is None for f in attempts):
                # the sibling may still be landing our bytes: the caller reads
                self._timed(start)
                return False
        assert error is not None
        raise error

    def _timed(self, start: float) -> None:
        with self._lock:
            self._latencies.append(self._clock() - start)

    def close(self) -> None:
        """Stop the attempts' threads (a running attempt finishes in the background)."""
        self._pool.shutdown(wait=False)
