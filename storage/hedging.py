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
upload threads              ``upload.num-threads`` 5         the first attempt on the
                                                             caller's thread (``start``;
                                                             ``upload``: an attempt
                                                             thread), hedges and copies
                                                             on reused attempt threads
                                                             (started only when none is
                                                             idle), one watchdog thread
                                                             per uploader;
                                                             ``max_parallel_hedges`` 8
                                                             extra attempts at once
==========================  ===============================  ===========================
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
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
    "ReusableThreads",
    "Outcome",
    "HedgingStats",
    "UploadPolicy",
    "UploadResult",
]

log = logging.getLogger("dstltree.hedging")

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


class _ReusableThread:
    """One reusable daemon thread of :class:`ReusableThreads`: it runs the task it is
    handed, then waits (idle) for the next one."""

    def __init__(
        self,
        owner: ReusableThreads,
        task: Callable[[], None] | None,
        name: str,
        resident: bool = False,
    ) -> None:
        self.owner = owner
        self.task: Callable[[], None] | None = task
        self.resident = resident  # never ends when idle
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


class ReusableThreads:
    """Daemon threads that run upload attempts (and a node's object writes), reused
    from one task to the next: a task goes to the most recently idle thread, or to a
    new thread when none is idle (a stalled attempt never delays another one). A
    thread idle for ``idle_s`` seconds ends, except the ``resident`` threads started
    with the pool, which wait for tasks as long as the process lives (a long-running
    owner, such as a node, keeps a constant thread count while its load is steady).
    Daemon threads, like one thread per attempt: a hung store never holds up the
    interpreter's exit."""

    def __init__(self, name: str, idle_s: float = 60.0, resident: int = 0) -> None:
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[_ReusableThread] = []
        self._started = resident
        for n in range(resident):
            _ReusableThread(self, None, f"{name}-{n + 1}", resident=True)

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` (which must not raise) on an idle thread or a new one."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            self._started += worker is None
            n = self._started
        if worker is None:
            _ReusableThread(self, task, f"{self._name}-{n}")
        else:
            worker.task = task
            worker.go.release()

    def park(self, worker: _ReusableThread) -> bool:
        """Called by ``worker`` when its task is done: wait for the next task (True) or
        end after ``idle_s`` without one (False)."""
        with self._lock:
            self._idle.append(worker)
        if worker.resident:
            worker.go.acquire()
            return True
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


#: what an upload ends with, handed to the ``on_done`` of :meth:`HedgedUploader.start`
Outcome = UploadResult | StorageError


class _Upload:
    """The shared state of one upload's attempts (guarded by ``cond``): the bytes and
    how to name an attempt, when it started and must end (``deadline``, None: never),
    its outcome once decided, errors, attempts running and started, when the next
    hedge is due (None: never), whether an attempt was throttled, whether the due
    hedge was already counted as skipped, and whom to tell (``on_done``)."""

    def __init__(
        self,
        chunks: list[Buffer],
        make_path: Callable[[], str],
        t0: float,
        deadline: float | None,
        on_done: Callable[[Outcome], None] | None,
    ) -> None:
        self.cond = threading.Condition()
        self.chunks = chunks
        self.make_path = make_path
        self.size = sum(memoryview(c).nbytes for c in chunks)
        self.t0 = t0
        self.deadline = deadline
        self.on_done = on_done
        self.outcome: Outcome | None = None
        self.closed = False  # decided (won or failed): later successes are losers
        self.errors: list[StorageError] = []
        self.running = 0
        self.started = 0
        self.next_at: float | None = None
        self.throttled = False
        self.skip_counted = False

    def look_at(self, attempts: int) -> float | None:
        """When the watchdog must look at this upload next (a hedge due or the
        deadline; None: never). Caller holds ``cond``."""
        due = self.next_at if self.started < attempts else None
        if due is None or (self.deadline is not None and self.deadline < due):
            return self.deadline
        return due


class _Watchdog:
    """The one thread of an uploader that starts hedges and fails uploads at their
    deadline: it sleeps until the earliest time an open upload must be looked at.
    :meth:`watch` wakes it only when the new time is earlier than the one it sleeps
    until (uploads with the same timeout arrive in deadline order: no wake-up per
    upload), and uploads decided meanwhile are dropped without a wake-up of their own.
    Started at the first upload it watches, it ends after ``idle_s`` seconds with
    nothing to watch (a daemon thread: a hung store never holds up the exit); a
    ``resident`` watchdog starts at once and never ends."""

    def __init__(
        self,
        name: str,
        look: Callable[[_Upload, float], float | None],
        idle_s: float = 60.0,
        resident: bool = False,
    ) -> None:
        self._name = name
        self._look = look
        self._idle_s = None if resident else idle_s
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Upload]] = []
        self._seq = itertools.count()
        self._running = False
        self._sleeps_until = -math.inf  # while awake: nobody to wake
        self.threads_started = 0
        if resident:
            with self._cond:
                self._start()

    def _start(self) -> None:
        """Start the thread (caller holds ``_cond``)."""
        self._running = True
        self.threads_started += 1
        threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def watch(self, up: _Upload, at: float) -> None:
        """Look at ``up`` at monotonic time ``at`` (seconds)."""
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), up))
            if not self._running:
                self._start()
            elif at < self._sleeps_until:
                self._cond.notify()

    def _due(self) -> tuple[list[_Upload], float] | None:
        """Wait for the uploads due (decided ones dropped on the way) and return them
        with the time; None when nothing was watched for ``idle_s`` (the thread ends)."""
        heap = self._heap
        with self._cond:
            while True:
                now = time.monotonic()
                due = []
                while heap and (heap[0][0] <= now or heap[0][2].closed):
                    up = heapq.heappop(heap)[2]
                    if not up.closed:
                        due.append(up)
                if due:
                    return due, now
                self._sleeps_until = heap[0][0] if heap else math.inf
                woken = self._cond.wait(heap[0][0] - now if heap else self._idle_s)
                self._sleeps_until = -math.inf
                if not woken and not heap and self._idle_s is not None:
                    self._running = False
                    return None

    def _run(self) -> None:
        while (batch := self._due()) is not None:
            due, now = batch
            for up in due:
                try:
                    at = self._look(up, now)
                except Exception:  # noqa: BLE001 - the watchdog serves every upload
                    log.exception("hedging watchdog: looking at an upload failed")
                    at = now + 0.05  # look again soon (the deadline still applies)
                if at is not None:
                    self.watch(up, at)


class HedgedUploader:
    """Writes whole objects to ``store`` with request hedging per ``policy``.
    Thread-safe. :meth:`start` runs an upload's first attempt on the calling thread
    and reports the outcome to a callback as soon as ANY attempt wins (or the upload
    fails), from whichever thread decides it; :meth:`upload` blocks the caller while
    every attempt runs on this uploader's attempt threads (reused; a new one starts
    only when none is idle), so it returns when a hedge wins or the deadline passes
    although an attempt hangs. Hedges and deadlines are the watchdog's (one thread
    per uploader, started with its first hedged upload, or at once and for good when
    ``resident``, as a node's: a long-running process keeps a constant thread count):
    no thread is started or woken per upload while attempts finish within the timeout.

    When to hedge is decided by :class:`dstltree.topology.latency.HedgeState` (the
    rule the simulated store applies): a timeout grown by the object's size, no hedge
    while the store throttles.

    There is no shared instance: whoever uploads creates its own at construction (a
    node's :class:`dstltree.aggregator.object_writer.ObjectWriter`, a
    :class:`dstltree.client.direct.DirectUploader`), so its statistics, latency
    history (adaptive timeout), throttling history and hedge limit belong to that
    owner alone."""

    def __init__(
        self, store: ObjectStore, policy: UploadPolicy | None = None, resident: bool = False
    ) -> None:
        self.store = store
        self.policy = policy or UploadPolicy()
        self.stats = HedgingStats()
        self._lock = threading.Condition()
        self._rule = HedgeState(self.policy.hedging())
        self._hedges_in_flight = 0
        self._attempts_in_flight = 0
        self._threads = ReusableThreads("dstl-attempt")
        self._watchdog = _Watchdog("dstl-hedge-watchdog", self._look, resident=resident)

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
        ``new_path`` (default ``store.new_object_path``), on an attempt thread. Returns
        the winner. Raises StorageError (the failing attempt's, chained to its cause)
        when every attempt failed or one failed with a non-retryable error;
        RetryableStorageError when ``deadline`` passed."""
        up = self._open(parts, new_path, None)
        if up is None:
            return self._single(self._prepared(parts, new_path))
        self._launch(up, inline=False)
        with up.cond:
            while up.outcome is None:
                up.cond.wait()
            outcome = up.outcome
        if isinstance(outcome, UploadResult):
            return outcome
        raise outcome

    def start(
        self,
        parts: Sequence[Buffer] | Buffer,
        on_done: Callable[[Outcome], None],
        new_path: Callable[[], str] | None = None,
    ) -> None:
        """Write ``parts`` as one object like :meth:`upload`, its first attempt on the
        calling thread: returns when that attempt has ended. ``on_done`` is called
        exactly once with the outcome (the winner's UploadResult, or the StorageError
        :meth:`upload` would raise) as soon as the upload is decided, on the thread
        that decides it: this one, a hedge's, or the watchdog's at the deadline, so
        possibly before this returns. ``on_done`` must not raise (it is logged)."""
        up = self._open(parts, new_path, on_done)
        if up is not None:
            self._launch(up, inline=True)
            return
        try:
            outcome: Outcome = self._single(self._prepared(parts, new_path))
        except StorageError as e:
            outcome = e
        _tell(on_done, outcome)

    def _prepared(
        self, parts: Sequence[Buffer] | Buffer, new_path: Callable[[], str] | None
    ) -> tuple[list[Buffer], str, float]:
        """The bytes as every attempt writes them (joined once, not per attempt, where
        needed), the first path and the start time."""
        self.stats.add(uploads=1)
        chunks = self.store.prepare(parts)
        return chunks, (new_path or self.store.new_object_path)(), time.monotonic()

    def _open(
        self,
        parts: Sequence[Buffer] | Buffer,
        new_path: Callable[[], str] | None,
        on_done: Callable[[Outcome], None] | None,
    ) -> _Upload | None:
        """A new hedged upload of ``parts``, or None when the policy neither hedges
        nor has a deadline (one attempt, on the caller's thread: :meth:`_single`)."""
        p = self.policy
        if p.attempts == 1 and p.deadline is None:
            return None
        t0 = time.monotonic()
        deadline = None if p.deadline is None else t0 + p.deadline
        make_path = new_path or self.store.new_object_path
        return _Upload(self.store.prepare(parts), make_path, t0, deadline, on_done)

    def _launch(self, up: _Upload, inline: bool) -> None:
        """Start ``up``'s first attempt (and copies), hand it to the watchdog, and run
        the first attempt here if ``inline``."""
        chunks = up.chunks  # the upload drops them once decided
        first = self._start_copies(up, inline)
        timeout = self.current_timeout(up.size)
        with up.cond:
            up.next_at = up.t0 + timeout
            at = None if up.closed else up.look_at(self.policy.attempts)
        if at is not None:
            self._watchdog.watch(up, at)
        if first is not None:
            self._attempt(up, chunks, first, 0, hedged=False, inline=True)

    def _look(self, up: _Upload, now: float) -> float | None:
        """The watchdog's turn on ``up`` at ``now``: fail it at its deadline, start a
        due hedge; returns when to look again (None: never)."""
        with up.cond:
            if up.closed:
                return None
            if up.deadline is None or now < up.deadline:
                due = up.next_at is not None and now >= up.next_at
                if due and up.started < self.policy.attempts:
                    self._maybe_hedge(up, now)
                return up.look_at(self.policy.attempts)
        self._fail_at_deadline(up)
        return None

    def _decide(self, up: _Upload, outcome: Outcome, **counts: int) -> bool:
        """Close ``up`` with ``outcome`` unless already decided (then False); the
        counters go in first, so a caller woken by the outcome sees them. The bytes and
        the callback are dropped (the watchdog may hold ``up`` until its next look)."""
        with up.cond:
            if up.closed:
                return False
            up.closed = True
            if counts:
                self.stats.add(**counts)
            up.outcome = outcome
            on_done, up.on_done, up.chunks = up.on_done, None, []
            up.cond.notify_all()
        if on_done is not None:
            _tell(on_done, outcome)
        return True

    def _fail_at_deadline(self, up: _Upload) -> None:
        """Fail ``up`` with RetryableStorageError: no attempt finished in time."""
        err = RetryableStorageError(
            "put",
            "(hedged upload)",
            f"no attempt finished within {self.policy.deadline} s (upload deadline; "
            f"{up.started} attempts started)",
        )
        with up.cond:
            if up.errors:
                err.__cause__ = up.errors[-1]
        self._decide(up, err, uploads_failed=1, deadline_failures=1)

    def _start_copies(self, up: _Upload, inline: bool) -> str | None:
        """Start the first attempt and the extra copies the rule asks for unless the
        store throttled recently; the first is not started but counted and its path
        returned when it is to run ``inline``."""
        n, blocked = 1, False
        if self.policy.copies > 1:
            with self._lock:
                n = self._rule.policy.copies_for(up.size)
                blocked = n > 1 and self._rule.hedge_at(up.t0) > up.t0
        if blocked:
            self.stats.add(hedges_skipped_throttled=n - 1)
            n = 1
        first = None
        with up.cond:
            for i in range(n):
                if i == 0 and inline:
                    first = up.make_path()
                    self._count_attempt(up, hedged=False, uploads=1)
                else:
                    self._start(up, up.make_path(), up.started, hedged=False, uploads=int(i == 0))
                up.started += 1
        if n > 1:
            self.stats.add(copies=n - 1)
        return first

    def _maybe_hedge(self, up: _Upload, now: float) -> None:
        """A hedge of ``up`` is due at ``now``: start it, or put it off (throttling:
        counted once per due hedge; too many hedges in flight: look again soon).
        Caller holds ``up.cond``."""
        at = self._hedge_at(up, now)
        if at is None or at > now:
            if not up.skip_counted:
                self.stats.add(hedges_skipped_throttled=1)
                up.skip_counted = True
            up.next_at = at
            return
        if self._reserve_hedge():
            self._start(up, up.make_path(), up.started, hedged=True)
            up.started += 1
            up.skip_counted = False
            up.next_at = now + self.current_timeout(up.size)
        else:  # too many hedges in flight: look again a little later
            up.next_at = now + min(self.current_timeout(up.size), 0.05)

    def _single(self, prepared: tuple[list[Buffer], str, float]) -> UploadResult:
        """The only attempt of an unhedged upload without deadline, on this thread."""
        chunks, path, t0 = prepared
        self.stats.add(attempts=1)
        try:
            size = self.store.put(path, chunks, on_retry=self._retry_counter(None))
        except StorageError as e:
            self._note_error(None, e)
            self.stats.add(failed_attempts=1, uploads_failed=1)
            raise
        latency = time.monotonic() - t0
        self._note_latency(latency, size)
        return UploadResult(path, size, 0, 1, latency)

    def _note_latency(self, latency_s: float, size_bytes: int) -> None:
        """A successful attempt's latency, for the adaptive timeout."""
        with self._lock:
            self._rule.note_latency(latency_s, size_bytes)

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

    def _count_attempt(self, up: _Upload, hedged: bool, uploads: int = 0) -> None:
        """Count an attempt about to run (and the upload with its first attempt)."""
        if hedged:
            self.stats.add(attempts=1, hedged_attempts=1)
        else:
            self.stats.add(attempts=1, uploads=uploads)
        with self._lock:
            self._attempts_in_flight += 1
        with up.cond:
            up.running += 1

    def _start(self, up: _Upload, path: str, idx: int, hedged: bool, uploads: int = 0) -> None:
        """Start an attempt on an attempt thread. Caller holds ``up.cond`` (``up`` is
        not decided: its bytes are there)."""
        self._count_attempt(up, hedged, uploads)
        chunks = up.chunks
        self._threads.submit(lambda: self._attempt(up, chunks, path, idx, hedged))

    def _attempt(
        self,
        up: _Upload,
        chunks: list[Buffer],
        path: str,
        idx: int,
        hedged: bool,
        inline: bool = False,
    ) -> None:
        """Run one attempt (counted by :meth:`_count_attempt`); the first to succeed
        decides the upload, a failure decides it if it is fatal or the last running.
        A loser's or failed attempt's object is deleted on an attempt thread (never
        on the thread of an ``inline`` attempt, the caller's)."""
        t0 = time.monotonic()
        leftover: tuple[str, str] | None = None
        try:
            try:
                size = self.store.put(path, chunks, on_retry=self._retry_counter(up))
            except Exception as e:  # noqa: BLE001 - every failure is reported to the upload
                self._attempt_failed(up, path, e)
                leftover = (path, "failed_attempts_deleted")
                return
            latency = time.monotonic() - t0
            if not inline:  # noted before a blocked upload() returns
                self._note_latency(latency, size)
            with up.cond:
                up.running -= 1
                result = UploadResult(path, size, idx, up.started, t0 + latency - up.t0)
            won = self._decide(up, result, hedge_wins=1) if hedged else self._decide(up, result)
            if inline:  # after the outcome went out, before start() returns
                self._note_latency(latency, size)
            if not won:
                self.stats.add(losers=1)
                leftover = (path, "losers_deleted")
        finally:
            if leftover is not None and inline:  # deleted off the caller's thread
                loser, counter = leftover
                self._threads.submit(lambda: self._discard_then_release(loser, counter))
            else:
                if leftover is not None:
                    self._discard(*leftover)
                self._release(hedged)

    def _discard_then_release(self, path: str, counter: str) -> None:
        """An inline attempt's leftover object: deleted, then the attempt ends."""
        try:
            self._discard(path, counter)
        finally:
            self._release(False)

    def _attempt_failed(self, up: _Upload, path: str, e: Exception) -> None:
        err = e if isinstance(e, StorageError) else StorageError("put", path, repr(e))
        if err is not e:
            err.__cause__ = e
        self._note_error(up, err)
        self.stats.add(failed_attempts=1)
        with up.cond:
            up.running -= 1
            up.errors.append(err)
            fails = not err.retryable or up.running == 0
        if fails:
            self._decide(up, err, uploads_failed=1)

    def _release(self, hedged: bool) -> None:
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


def _tell(on_done: Callable[[Outcome], None], outcome: Outcome) -> None:
    """Call ``on_done(outcome)``; an exception from it is logged, never raised."""
    try:
        on_done(outcome)
    except Exception:  # noqa: BLE001 - a callback must not break an attempt
        log.exception("upload callback failed")
