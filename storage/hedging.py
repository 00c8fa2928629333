"""Request hedging on the object upload path (writer nodes and the in-process uploader).

An upload writes one object. Its first attempt starts at once; an attempt that has not
finished after the upload timeout starts one more attempt of the same bytes under a
NEW object name, without cancelling the earlier ones, up to ``attempts`` in all. The
first attempt to finish wins: only its path is returned, so only it is ever
referenced by a handle. A loser that finishes later is deleted in the background (or,
with ``delete_losers=False``, left to orphan cleanup, which also catches losers whose
writes landed although the client saw an error). This is the technique FLIP-158
("Request hedging") and the Flink 1.15 blog describe for the DSTL upload path; the
idea goes back to Dean and Barroso, "The Tail at Scale".

Transient failures of one attempt (503 SlowDown, 500, timeouts, resets) are retried
inside that attempt by :class:`dstltree.storage.store.ObjectStore` (tenacity, exponential
backoff with jitter, see ``RetryPolicy``). An attempt that still fails ends that
attempt; the upload fails when every started attempt has failed, or at once on a
non-retryable error. A failed upload fails the persists in it; the writers keep their
changes and upload them again on the next persist (FLIP-158).

Every upload has a deadline (``deadline``, default DEFAULT_UPLOAD_DEADLINE seconds):
an upload none of whose attempts finished by then fails with RetryableStorageError,
as Flink fails an upload once its attempts have timed out, so a hung store fails the
persists (and frees their in-flight bytes) instead of holding them forever; an
attempt that completes later is a loser and is deleted.

The timeout is fixed (``upload_timeout``) or adaptive: the ``adaptive_percentile`` of
the latencies of recent successful attempts, at least ``adaptive_floor`` seconds, once
``adaptive_min_samples`` latencies are known; either grows by ``size / bandwidth`` for
an object of ``size`` bytes, so a large object is not hedged for its size alone.

Hedging never adds load to a store that throttles: after a throttled response (S3
``503 SlowDown``, HTTP 429, :func:`dstltree.storage.store.is_throttling`) no hedge or
copy starts for ``throttle_quiet`` seconds, and an upload whose own attempt was
throttled is not hedged at all (that attempt retries with backoff); such hedges are
counted in ``HedgingStats.hedges_skipped_throttled``. Objects of at most
``copies_max_bytes`` may be written ``copies`` times at once (new names, so usually
different prefixes), the first to finish winning. The rule is
:class:`dstltree.topology.latency.HedgingPolicy`, the simulated store's too.

Defaults, Flink DSTL (``dstl.dfs.*`` keys, Flink 1.15+) next to dstltree:

==========================  ===============================  ===========================
setting                     Flink DSTL default               dstltree default
==========================  ===============================  ===========================
persist delay               ``batch.persist-delay`` 10 ms    ``persist_delay`` 50 ms
                                                             (topology YAML); 0 for the
                                                             in-process uploader
size threshold              ``batch.persist-size-threshold`` ``target_object_bytes``
                            10 MB                            4 MiB (topology YAML)
pre-emptive upload          ``preemptive-persist-threshold`` 5 MiB per writer
                            5 MB                             (``ChangelogClient.open``)
max in flight               ``upload.max-in-flight`` 100 MB  100 MiB per client
                                                             (``max_in_flight_bytes``,
                                                             back-pressure on append)
upload timeout              ``upload.timeout`` 1 s           ``upload_timeout`` 1 s, or
                                                             adaptive (off by default)
upload deadline             attempts x timeout (then fails)  ``deadline`` 30 s
hedge under throttling      hedges regardless                none for ``throttle_quiet``
                                                             2 s after a 503/429; never
                                                             for a throttled upload
size term of the timeout    none                             ``size / bandwidth``,
                                                             ``bandwidth`` 32 MiB/s
copies at once              none                             ``copies`` 1 (2: objects up
                                                             to ``copies_max_bytes``
                                                             8 MiB written twice)
attempts                    ``upload.max-attempts`` 3        ``attempts`` 3 per upload
                                                             (hedges), and 3 tries per
                                                             attempt for transient
                                                             errors (``RetryPolicy``)
upload threads              ``upload.num-threads`` 5         a thread per running
                                                             attempt, reused (started
                                                             only when none is idle);
                                                             ``max_parallel_hedges`` 8
                                                             extra attempts at once
==========================  ===============================  ===========================
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from dstltree.storage.errors import RetryableStorageError, StorageError
from dstltree.storage.store import Buffer, ObjectStore, is_throttling
from dstltree.topology.latency import (
    HEDGE_BANDWIDTH,
    THROTTLE_QUIET_S,
    HedgeState,
    HedgingPolicy,
)

__all__ = [
    "HedgedUploader",
    "HedgingStats",
    "UploadPolicy",
    "UploadResult",
]

#: seconds after which an upload none of whose attempts finished fails (UploadPolicy)
DEFAULT_UPLOAD_DEADLINE = 30.0


@dataclass(frozen=True)
class UploadPolicy:
    """How one object upload is hedged.

    ``attempts``: attempts per upload (>= 1), the first included; 1 switches hedging off.
    ``upload_timeout``: seconds (> 0) an attempt may run before the next one starts.
    ``adaptive_percentile``: if set (0 < p <= 100), the timeout becomes that percentile
    of the last ``adaptive_window`` successful attempt latencies, at least
    ``adaptive_floor`` seconds, once ``adaptive_min_samples`` are known.
    ``max_parallel_hedges``: extra (non-first) attempts in flight at once per uploader;
    when reached, a due hedge waits. ``delete_losers``: delete the objects of losing
    and failed attempts in the background (else they are left for orphan cleanup).
    ``deadline``: seconds after which the upload fails with RetryableStorageError
    (default DEFAULT_UPLOAD_DEADLINE; None: wait for the attempts however long).
    ``bandwidth`` (bytes/s, None: off): an attempt of ``size`` bytes gets
    ``size / bandwidth`` seconds more before it is hedged. ``throttle_quiet``: seconds
    after a throttled response (:func:`dstltree.storage.store.is_throttling`) during
    which no hedge starts; an upload whose attempt was throttled is never hedged
    (``throttle_aware`` False: hedge regardless). ``copies``: objects of at most
    ``copies_max_bytes`` are written that many times at once (within ``attempts``).
    These are the rule of :class:`dstltree.topology.latency.HedgingPolicy`
    (:meth:`hedging`), which the simulated store applies too.
    Raises ValueError for out-of-range values.
    """

    attempts: int = 3
    upload_timeout: float = 1.0
    adaptive_percentile: float | None = None
    adaptive_floor: float = 0.05
    adaptive_window: int = 256
    adaptive_min_samples: int = 20
    max_parallel_hedges: int = 8
    delete_losers: bool = True
    deadline: float | None = DEFAULT_UPLOAD_DEADLINE
    bandwidth: float | None = HEDGE_BANDWIDTH
    throttle_quiet: float = THROTTLE_QUIET_S
    copies: int = 1
    copies_max_bytes: int = 8 * 1024 * 1024
    throttle_aware: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.upload_timeout <= 0:
            raise ValueError(f"upload_timeout must be > 0 seconds, got {self.upload_timeout}")
        p = self.adaptive_percentile
        if p is not None and not 0 < p <= 100:
            raise ValueError(f"adaptive_percentile must be in (0, 100], got {p}")
        if self.adaptive_floor < 0 or self.adaptive_window < 1 or self.adaptive_min_samples < 1:
            raise ValueError("adaptive_floor must be >= 0, window and min samples >= 1")
        if self.max_parallel_hedges < 0:
            raise ValueError(f"max_parallel_hedges must be >= 0, got {self.max_parallel_hedges}")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be > 0 seconds or None, got {self.deadline}")
        self.hedging()  # validates the rest

    def hedging(self) -> HedgingPolicy:
        """The hedging rule of this policy (shared with the simulated store)."""
        return HedgingPolicy(
            timeout_s=self.upload_timeout,
            max_attempts=self.attempts,
            bandwidth=self.bandwidth,
            quiet_s=self.throttle_quiet,
            copies=self.copies,
            copies_max_bytes=self.copies_max_bytes,
            adaptive_percentile=self.adaptive_percentile,
            adaptive_floor_s=self.adaptive_floor,
            adaptive_window=self.adaptive_window,
            adaptive_min_samples=self.adaptive_min_samples,
            throttle_aware=self.throttle_aware,
        )


@dataclass
class HedgingStats:
    """Counters of one uploader (for metrics). ``attempts`` counts every attempt started,
    ``hedged_attempts`` those started by a timeout, ``hedge_wins`` uploads won by a
    hedged attempt, ``retries`` store-level retries inside attempts, ``losers`` attempts
    that finished after the winner or after the upload failed (``losers_deleted`` of
    them deleted), ``deadline_failures`` uploads failed at their deadline,
    ``failed_attempts_deleted`` failed attempts whose path was deleted (in case the
    write landed), ``loser_delete_errors`` deletions that failed (left for orphan
    cleanup), ``throttled`` throttled responses seen by attempts (each retried or
    failed), ``hedges_skipped_throttled`` hedges or copies not started because of
    throttling (one per due hedge), ``copies`` extra attempts started together with
    the first."""

    uploads: int = 0
    uploads_failed: int = 0
    attempts: int = 0
    hedged_attempts: int = 0
    hedge_wins: int = 0
    failed_attempts: int = 0
    retries: int = 0
    losers: int = 0
    losers_deleted: int = 0
    loser_delete_errors: int = 0
    deadline_failures: int = 0
    failed_attempts_deleted: int = 0
    throttled: int = 0
    hedges_skipped_throttled: int = 0
    copies: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        """A consistent copy of the counters."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


@dataclass(frozen=True)
class UploadResult:
    """The winning attempt: object URL, size in bytes, its 0-based attempt number, the
    attempts started for this upload, and the upload latency in seconds."""

    path: str
    size: int
    winner: int
    attempts_started: int
    latency_s: float


class _AttemptThread:
    """One reusable daemon thread of :class:`_AttemptThreads`: it runs the task it is
    handed, then waits (idle) for the next one."""

    def __init__(self, owner: _AttemptThreads, task: Callable[[], None], name: str) -> None:
        self.owner = owner
        self.task: Callable[[], None] | None = task
        self.go = threading.Lock()  # released when a task is handed over
        self.go.acquire()
        threading.Thread(target=self.run, name=name, daemon=True).start()

    def run(self) -> None:
        while True:
            task, self.task = self.task, None
            if task is not None:
                task()
            if not self.owner.park(self):
                return


class _AttemptThreads:
    """Daemon threads that run upload attempts, reused from one upload to the next: a
    task goes to the most recently idle thread, or to a new thread when none is idle
    (a stalled attempt never delays another one). A thread idle for ``idle_s``
    seconds ends. Daemon threads, like one thread per attempt: a hung store never
    holds up the interpreter's exit."""

    def __init__(self, name: str, idle_s: float = 60.0) -> None:
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[_AttemptThread] = []
        self._started = 0

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` (which must not raise) on an idle thread or a new one."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            self._started += worker is None
            n = self._started
        if worker is None:
            _AttemptThread(self, task, f"{self._name}-{n}")
        else:
            worker.task = task
            worker.go.release()

    def park(self, worker: _AttemptThread) -> bool:
        """Called by ``worker`` when its task is done: wait for the next task (True) or
        end after ``idle_s`` without one (False)."""
        with self._lock:
            self._idle.append(worker)
        if worker.go.acquire(timeout=self._idle_s):
            return True
        with self._lock:
            if worker in self._idle:  # nobody took it meanwhile: end
                self._idle.remove(worker)
                return False
        worker.go.acquire()  # taken just as the wait ended: its task is on the way
        return True

    def threads_started(self) -> int:
        """Threads started so far (for tests and statistics)."""
        with self._lock:
            return self._started


class _Upload:
    """The shared state of one upload's attempts: the winner, errors, attempts running
    and started, when the next hedge is due (None: never), whether an attempt was
    throttled, and whether the due hedge was already counted as skipped."""

    def __init__(self, size: int) -> None:
        self.cond = threading.Condition()
        self.size = size
        self.winner: tuple[int, str, int] | None = None
        self.closed = False  # decided (won or failed): later successes are losers
        self.errors: list[StorageError] = []
        self.running = 0
        self.started = 0
        self.next_at: float | None = None
        self.throttled = False
        self.skip_counted = False


class HedgedUploader:
    """Writes whole objects to ``store`` with request hedging per ``policy``.
    Thread-safe; ``upload`` blocks the caller while its attempts run on this
    uploader's attempt threads (reused; a new one starts only when none is idle, so
    the caller can return when a hedge wins or the deadline passes although an
    attempt hangs).

    When to hedge is decided by :class:`dstltree.topology.latency.HedgeState` (the
    rule the simulated store applies): a timeout grown by the object's size, no hedge
    while the store throttles.

    There is no shared instance: whoever uploads creates its own at construction (a
    node's :class:`dstltree.aggregator.object_writer.ObjectWriter`, a
    :class:`dstltree.client.direct.DirectUploader`), so its statistics, latency
    history (adaptive timeout), throttling history and hedge limit belong to that
    owner alone."""

    def __init__(self, store: ObjectStore, policy: UploadPolicy | None = None) -> None:
        self.store = store
        self.policy = policy or UploadPolicy()
        self.stats = HedgingStats()
        self._lock = threading.Condition()
        self._rule = HedgeState(self.policy.hedging())
        self._hedges_in_flight = 0
        self._attempts_in_flight = 0
        self._threads = _AttemptThreads("dstl-attempt")

    # -- timeout ---------------------------------------------------------------------------
    def current_timeout(self, size_bytes: int = 0) -> float:
        """Seconds an attempt of ``size_bytes`` may run before the next starts (fixed or
        adaptive, plus ``size_bytes / bandwidth``)."""
        with self._lock:
            timeout = self._rule.timeout(size_bytes)
        return self.policy.upload_timeout if timeout is None else timeout

    def _hedge_at(self, up: _Upload, now: float) -> float | None:
        """When a hedge of ``up`` due at ``now`` may start: ``now``, later (throttled
        recently), or None (this upload was throttled: never)."""
        if up.throttled and self.policy.throttle_aware:
            return None
        with self._lock:
            self._rule.forget_before(now - self.policy.throttle_quiet)
            return self._rule.hedge_at(now)

    # -- upload ----------------------------------------------------------------------------
    def upload(
        self,
        parts: Sequence[Buffer] | Buffer,
        new_path: Callable[[], str] | None = None,
    ) -> UploadResult:
        """Write ``parts`` as one object; every attempt writes to a fresh path from
        ``new_path`` (default ``store.new_object_path``). Returns the winner. Raises
        StorageError (the failing attempt's, chained to its cause) when every attempt
        failed or one failed with a non-retryable error; RetryableStorageError when
        ``deadline`` passed."""
        chunks = self.store.prepare(parts)  # joined once, not per attempt, where needed
        make_path = new_path or self.store.new_object_path
        p = self.policy
        self.stats.add(uploads=1)
        t0 = time.monotonic()
        size = sum(memoryview(c).nbytes for c in chunks)
        if p.attempts == 1 and p.deadline is None:
            return self._single(chunks, make_path(), t0)
        up = _Upload(size)
        deadline = None if p.deadline is None else t0 + p.deadline
        self._start_copies(up, chunks, make_path, t0)
        up.next_at = t0 + self.current_timeout(size)
        with up.cond:
            while True:
                if up.winner is not None:
                    idx, path, nbytes = up.winner
                    return UploadResult(path, nbytes, idx, up.started, time.monotonic() - t0)
                fatal = next((e for e in up.errors if not e.retryable), None)
                if fatal is not None or up.running == 0:
                    up.closed = True
                    self.stats.add(uploads_failed=1)
                    raise fatal or up.errors[-1]
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self._fail_at_deadline(up)
                if up.next_at is not None and up.started < p.attempts and now >= up.next_at:
                    self._maybe_hedge(up, chunks, make_path, now)
                wake = [
                    t
                    for t in (up.next_at if up.started < p.attempts else None, deadline)
                    if t is not None
                ]
                up.cond.wait(max(min(wake) - now, 0.0) if wake else None)

    def _fail_at_deadline(self, up: _Upload) -> None:
        """Close ``up`` and raise RetryableStorageError: no attempt finished in time."""
        up.closed = True
        self.stats.add(uploads_failed=1, deadline_failures=1)
        err = RetryableStorageError(
            "put",
            "(hedged upload)",
            f"no attempt finished within {self.policy.deadline} s (upload deadline; "
            f"{up.started} attempts started)",
        )
        if up.errors:
            raise err from up.errors[-1]
        raise err

    def _start_copies(
        self, up: _Upload, chunks: list[Buffer], make_path: Callable[[], str], now: float
    ) -> None:
        """The first attempt, and the extra copies the rule asks for unless the store
        throttled recently."""
        with self._lock:
            n = self._rule.policy.copies_for(up.size)
            blocked = n > 1 and self._rule.hedge_at(now) > now
        if blocked:
            self.stats.add(hedges_skipped_throttled=n - 1)
            n = 1
        for _ in range(n):
            self._start(up, chunks, make_path(), up.started, hedged=False)
            up.started += 1
        self.stats.add(copies=n - 1)

    def _maybe_hedge(
        self, up: _Upload, chunks: list[Buffer], make_path: Callable[[], str], now: float
    ) -> None:
        """A hedge of ``up`` is due at ``now``: start it, or put it off (throttling:
        counted once per due hedge; too many hedges in flight: look again soon)."""
        at = self._hedge_at(up, now)
        if at is None or at > now:
            if not up.skip_counted:
                self.stats.add(hedges_skipped_throttled=1)
                up.skip_counted = True
            up.next_at = at
            return
        if self._reserve_hedge():
            self._start(up, chunks, make_path(), up.started, hedged=True)
            up.started += 1
            up.skip_counted = False
            up.next_at = now + self.current_timeout(up.size)
        else:  # too many hedges in flight: look again a little later
            up.next_at = now + min(self.current_timeout(up.size), 0.05)

    def _single(self, chunks: list[Buffer], path: str, t0: float) -> UploadResult:
        self.stats.add(attempts=1)
        try:
            size = self.store.put(path, chunks, on_retry=self._retry_counter(None))
        except StorageError as e:
            self._note_error(None, e)
            self.stats.add(failed_attempts=1, uploads_failed=1)
            raise
        latency = time.monotonic() - t0
        with self._lock:
            self._rule.note_latency(latency, size)
        return UploadResult(path, size, 0, 1, latency)

    def _note_error(self, up: _Upload | None, e: BaseException) -> None:
        """Count a retried or failed attempt's error; a throttling one blocks hedges
        (of ``up`` for good, of every upload for the quiet period)."""
        if not is_throttling(e):
            return
        self.stats.add(throttled=1)
        with self._lock:
            self._rule.note_throttle(time.monotonic())
        if up is not None:
            with up.cond:
                up.throttled = True

    def _retry_counter(self, up: _Upload | None) -> Callable[[BaseException], None]:
        def on_retry(e: BaseException) -> None:
            self.stats.add(retries=1)
            self._note_error(up, e)

        return on_retry

    def _reserve_hedge(self) -> bool:
        with self._lock:
            if self._hedges_in_flight >= self.policy.max_parallel_hedges:
                return False
            self._hedges_in_flight += 1
            return True

    def _start(self, up: _Upload, chunks: list[Buffer], path: str, idx: int, hedged: bool) -> None:
        self.stats.add(attempts=1, hedged_attempts=int(hedged))
        with self._lock:
            self._attempts_in_flight += 1
        with up.cond:
            up.running += 1
        self._threads.submit(lambda: self._attempt(up, chunks, path, idx, hedged))

    def _attempt(
        self, up: _Upload, chunks: list[Buffer], path: str, idx: int, hedged: bool
    ) -> None:
        t0 = time.monotonic()
        try:
            try:
                size = self.store.put(path, chunks, on_retry=self._retry_counter(up))
            except Exception as e:  # noqa: BLE001 - every failure is reported to the upload
                err = e if isinstance(e, StorageError) else StorageError("put", path, repr(e))
                if err is not e:
                    err.__cause__ = e
                self._note_error(up, err)
                self.stats.add(failed_attempts=1)
                with up.cond:
                    up.running -= 1
                    up.errors.append(err)
                    up.cond.notify_all()
                self._discard(path, "failed_attempts_deleted")
                return
            latency = time.monotonic() - t0
            with self._lock:
                self._rule.note_latency(latency, size)
            with up.cond:
                up.running -= 1
                won = up.winner is None and not up.closed
                if won:
                    up.winner = (idx, path, size)
                    up.closed = True
                    up.cond.notify_all()
            if won:
                if hedged:
                    self.stats.add(hedge_wins=1)
                return
            self.stats.add(losers=1)
            self._discard(path, "losers_deleted")
        finally:
            with self._lock:
                self._attempts_in_flight -= 1
                if hedged:
                    self._hedges_in_flight -= 1
                self._lock.notify_all()

    def _discard(self, path: str, counter: str) -> None:
        """Delete the object of a losing or failed attempt (its own thread, never the
        caller's) and count it under ``counter``; a failed delete is counted and left
        for orphan cleanup. Nothing with ``delete_losers=False``."""
        if not self.policy.delete_losers:
            return
        try:
            self.store.delete([path])
            self.stats.add(**{counter: 1})
        except StorageError:
            self.stats.add(loser_delete_errors=1)

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no attempt (winner or loser, including
        loser deletion) is running. Returns True if none is."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._attempts_in_flight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True
