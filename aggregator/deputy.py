"""A stand-in for an event loop whose thread is inside a blocking call.

A node's loop may write an object itself (an inline write: no hand-off to a write
thread on the way to the ack) only if a store that hangs cannot stop the node. The
:class:`LoopDeputy` is that guarantee: while the owner is :meth:`LoopDeputy.busy` for
longer than ``after_s`` seconds, the deputy's thread runs the loop's turns, until the
owner returns.

Turns are serialized by :attr:`LoopDeputy.turn`, a lock the owner holds for each of its
own turns as well, so that the loop's sockets and poller are only ever used by one
thread at a time (the lock is the memory barrier ZeroMQ asks for when a socket moves
between threads). The deputy looks at the owner every ``after_s`` seconds while the
owner was busy in the last ``idle_s`` seconds, and sleeps until woken otherwise: no
wake-up per busy call, so the owner's blocking call never waits for another thread.
A takeover therefore starts between ``after_s`` and ``2 * after_s`` seconds into the
call. When the owner returns, it wakes the deputy's turn (``wake``, e.g. a byte on the
loop's wake pipe), which ends its turn and hands the loop back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("dstltree.node")


class LoopDeputy:
    """Runs ``turn()`` (one loop turn, which may block in a poll) on its own thread
    while the owner is in :meth:`busy` for more than ``after_s`` seconds; ``wake()``
    ends a turn that waits (called from the owner's thread when it returns).
    :attr:`takeovers` counts the busy calls it served for. Raises ValueError for
    ``after_s <= 0``."""

    def __init__(
        self,
        name: str,
        turn: Callable[[], None],
        wake: Callable[[], None],
        after_s: float,
        idle_s: float = 1.0,
    ) -> None:
        if after_s <= 0:
            raise ValueError(f"after_s must be > 0, got {after_s}")
        self.turn = threading.Lock()  # held by whoever runs a loop turn
        self.after_s = after_s
        self.idle_s = idle_s
        self.takeovers = 0
        self.failure: BaseException | None = None  # what a turn of the deputy raised
        self._name = name
        self._turn = turn
        self._wake = wake
        self._cond = threading.Condition(threading.Lock())
        # the owner's busy call: its monotonic start, in a tuple of its own (one
        # assignment; compared by identity, it tells one call from the next)
        self._busy: tuple[float] | None = None
        self._last_busy = -float("inf")
        self._serving = False  # the deputy runs turns now
        self._asleep = False  # waiting without timeout: the next busy call wakes it
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Around the owner's blocking call (the owner must not hold :attr:`turn`):
        after ``after_s`` seconds in it, the deputy runs the loop's turns."""
        now = time.monotonic()
        self._busy = (now,)
        self._last_busy = now
        if self._thread is None or self._asleep:
            self._start_or_wake()
        try:
            yield
        finally:
            self._busy = None
            if self._serving:  # a turn of the deputy may be waiting in its poll
                self._wake()

    @property
    def serving(self) -> bool:
        """Whether the deputy is running the loop's turns now."""
        return self._serving

    def close(self, timeout: float = 5.0) -> None:
        """Stop the deputy's thread (idempotent); waits up to ``timeout`` seconds for
        a turn in progress."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        self._wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def start(self) -> None:
        """Start the deputy's thread now (it sleeps until the owner's first busy call)
        instead of at that call: a long-running owner keeps a constant thread count."""
        self._start_or_wake()

    def _start_or_wake(self) -> None:
        with self._cond:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def _run(self) -> None:
        while self._wait():
            busy = self._busy
            if busy is None or time.monotonic() - busy[0] < self.after_s:
                continue
            if self.failure is None:  # after a failure the owner raises it
                self._serve(busy)

    def _wait(self) -> bool:
        """Sleep ``after_s`` (or, after ``idle_s`` without busy calls, until the next
        one); False once closed."""
        with self._cond:
            if self._closed:
                return False
            self._asleep = True  # before the look at _busy: busy() sees one or the other
            if self._busy is None and time.monotonic() - self._last_busy > self.idle_s:
                self._cond.wait()
                self._asleep = False
            else:
                self._asleep = False
                self._cond.wait(self.after_s)
            return not self._closed

    def _serve(self, busy: tuple[float]) -> None:
        """Run turns while the owner's busy call ``busy`` lasts."""
        with self.turn:
            self._serving = True
            try:
                if self._busy is not busy:
                    return  # it ended meanwhile
                self.takeovers += 1
                log.warning(
                    "%s: the loop is blocked in a write for over %.3f s; serving its turns",
                    self._name,
                    self.after_s,
                )
                while self._busy is busy and not self._closed:
                    self._turn()
            except BaseException as e:  # noqa: BLE001 - the owner raises it on its next turn
                log.error("%s: a loop turn failed: %s", self._name, e)
                self.failure = e
            finally:
                self._serving = False
