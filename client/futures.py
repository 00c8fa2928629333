"""The future of one segment upload: what an uploader's ``submit`` returns.

A writer holds one future per segment until the segment is truncated (about as many as
fit in the in-flight limit and two checkpoints: a thousand or more at 64 KiB segments).
``concurrent.futures.Future`` allocates ten objects the cycle collector tracks (its
Condition, the Condition's bound methods and deque, two lists); those that outlive the
young generations make every collection of the older ones longer and more frequent. On
the pre-emptive uploads of 64 KiB segments that cost the task's process about a fifth
of its time (BENCHMARKS.md, "Hot path": forwarding). :class:`SegmentFuture` allocates
itself (a list once it has a second callback) and an Event only when a thread waits.

:class:`UploadFuture` is the part of the ``Future`` interface the writer uses, so an
uploader may return either (tests' uploaders return ``concurrent.futures`` ones).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger("dstltree.client")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# guards the state changes and callback lists of every SegmentFuture: each holds it for
# a few bytecodes (never while a callback runs or a thread waits), so one lock for all
# costs no contention worth a lock object per future
_LOCK = threading.Lock()


_Callback = Callable[["SegmentFuture[T]"], object]


class UploadFuture(Protocol[T_co]):
    """The future of an upload as a writer uses it (``concurrent.futures.Future`` and
    :class:`SegmentFuture` are both one)."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> T_co: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...

    def add_done_callback(self, fn: Callable[[Any], object]) -> None: ...


class SegmentFuture(Generic[T]):
    """The outcome of one upload: a result or an exception, set once.

    The subset of ``concurrent.futures.Future`` an upload needs, with its semantics:
    ``set_result`` / ``set_exception`` raise ``InvalidStateError`` when already done;
    callbacks run in the order added, on the thread that completes the future (at once
    on the caller's if already done), an exception in one is logged and does not stop
    the others; ``result`` / ``exception`` block up to ``timeout`` seconds (None: as
    long as it takes) and raise ``TimeoutError`` after it. Never cancelled, never
    running: an upload, once submitted, is the uploader's to finish."""

    __slots__ = ("_done", "_result", "_exception", "_callbacks", "_event")

    def __init__(self) -> None:
        self._done = False
        self._result: T | None = None
        self._exception: BaseException | None = None
        # None, the one callback, or a list of them (most futures get one or two)
        self._callbacks: _Callback[T] | list[_Callback[T]] | None = None
        self._event: threading.Event | None = None

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: T) -> None:
        """Complete with ``result``. Raises InvalidStateError if already done."""
        self._complete(result, None)

    def set_exception(self, exception: BaseException) -> None:
        """Complete with ``exception``. Raises InvalidStateError if already done."""
        self._complete(None, exception)

    def add_done_callback(self, fn: Callable[[SegmentFuture[T]], object]) -> None:
        """Call ``fn(self)`` once done: now, on this thread, if it already is."""
        with _LOCK:
            if not self._done:
                cbs = self._callbacks
                if cbs is None:
                    self._callbacks = fn
                elif isinstance(cbs, list):
                    cbs.append(fn)
                else:
                    self._callbacks = [cbs, fn]
                return
        self._call(fn)

    def result(self, timeout: float | None = None) -> T:
        """The result; raises the upload's exception, or TimeoutError after
        ``timeout`` seconds."""
        self._wait(timeout)
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[return-value]  # set with _done

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception (None on success); TimeoutError after ``timeout`` seconds."""
        self._wait(timeout)
        return self._exception

    def _complete(self, result: T | None, exception: BaseException | None) -> None:
        with _LOCK:
            if self._done:
                raise InvalidStateError(f"{self!r} is already done")
            self._result, self._exception = result, exception
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        if isinstance(callbacks, list):
            for fn in callbacks:
                self._call(fn)
        elif callbacks is not None:
            self._call(callbacks)

    def _call(self, fn: Callable[[SegmentFuture[T]], object]) -> None:
        try:
            fn(self)
        except Exception:  # as concurrent.futures: logged, the other callbacks still run
            log.exception("exception calling callback for %r", self)

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        with _LOCK:
            if self._done:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            raise TimeoutError(f"upload not done within {timeout} s")

    def __repr__(self) -> str:
        if not self._done:
            return "<SegmentFuture pending>"
        if self._exception is not None:
            return f"<SegmentFuture raised {type(self._exception).__name__}>"
        return "<SegmentFuture finished>"
