"""The simulated object store: request latency from a
:class:`~dstltree.topology.latency.LatencyModel`, request-rate throttling per prefix,
retries with exponential backoff and request hedging with the rule of
:class:`~dstltree.topology.latency.HedgingPolicy` (the real upload path's rule: no
hedge while the store throttles, timeouts grown by the object's size, optional copies
to different prefixes).

Throttling (S3: 3,500 PUT/s per prefix, then "503 SlowDown") is modelled with fixed
windows of ``window_s`` seconds per prefix, each admitting ``rate * window_s`` requests.
A throttled request gets its error after ``response_s`` and retries after
``min(cap_s, base_s * 2**k) * jitter`` seconds (k = retries so far, jitter drawn once
per request in [0.5, 1]); it retries until admitted. A window filled out of time order
(a retry or hedge scheduled ahead) is still counted correctly, so a request's whole
timeline can be computed when it is issued, without one event per retry.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from dstltree.storage.store import object_prefix
from dstltree.topology.latency import HedgeState, HedgingPolicy, LatencyModel, hedge_timeline

__all__ = ["SimulatedStore", "StoreCounters", "Throttle"]


class Throttle:
    """Fixed-window request-rate limiter per prefix with client backoff (seconds)."""

    def __init__(
        self,
        rate_per_s: float = 3500.0,
        window_s: float = 1.0,
        response_s: float = 0.01,
        base_s: float = 0.05,
        cap_s: float = 20.0,
    ) -> None:
        if rate_per_s * window_s < 1:
            raise ValueError("rate_per_s * window_s must admit at least one request")
        self.window_s = window_s
        self.per_window = int(rate_per_s * window_s)
        self.response_s = response_s
        self.base_s = base_s
        self.cap_s = cap_s
        self._counts: dict[str, defaultdict[int, int]] = defaultdict(lambda: defaultdict(int))
        self._first_open: dict[str, int] = defaultdict(int)  # windows below it are full
        # backoff k (0-based) is base*2**k until it reaches cap at k = _k_cap
        self._k_cap = max(0, math.ceil(math.log2(cap_s / base_s))) if cap_s > base_s else 0

    def _retry_time(self, t0: float, k: int, jitter: float) -> float:
        """Time of retry number ``k`` (1-based) of a request first sent at ``t0``."""
        exp_k = min(k, self._k_cap)
        exp_part = self.base_s * (2**exp_k - 1)
        lin_part = (k - exp_k) * self.cap_s
        return t0 + k * self.response_s + jitter * (exp_part + lin_part)

    def _first_retry_at_or_after(self, t0: float, t: float, jitter: float) -> int:
        k = 1
        step = 1
        while self._retry_time(t0, k + step, jitter) < t:  # galloping search
            k += step
            step *= 2
        while self._retry_time(t0, k, jitter) < t:
            k += 1
        return k

    def admit(self, prefix: str, t: float, rng: random.Random) -> tuple[float, int]:
        """Send a request at ``t``: (time it is admitted, number of throttled attempts)."""
        admitted, throttled, _ = self.admit_span(prefix, t, rng)
        return admitted, throttled

    def admit_span(
        self, prefix: str, t: float, rng: random.Random
    ) -> tuple[float, int, float | None]:
        """:meth:`admit`, plus the time the last throttled response (503) reached the
        client (None if none was throttled)."""
        counts = self._counts[prefix]
        jitter = 0.5 + 0.5 * rng.random()
        t0, k, when = t, 0, t
        while True:
            w = int(when / self.window_s)
            first_open = self._first_open[prefix]
            if w < first_open:  # surely full: jump to the first retry in an open window
                k = self._first_retry_at_or_after(t0, first_open * self.window_s, jitter)
                when = self._retry_time(t0, k, jitter)
                continue
            if counts[w] < self.per_window:
                counts[w] += 1
                while counts[first_open] >= self.per_window:
                    first_open += 1
                self._first_open[prefix] = first_open
                last = None if k == 0 else self._retry_time(t0, k - 1, jitter) + self.response_s
                return when, k, last
            k += 1
            when = self._retry_time(t0, k, jitter)


@dataclass
class StoreCounters:
    """Per-checkpoint totals: objects written, PUT attempts admitted (objects plus
    copies and hedged attempts), throttled responses, hedged (extra) attempts, bytes
    written; ``copies`` extra attempts started with the first, ``skipped_throttled``
    hedges or copies not started because the store throttled, ``repeated_throttled``
    hedges started for an upload already throttled (uploads repeated because of
    throttling: 0 under a ``throttle_aware`` policy)."""

    objects: int = 0
    requests: int = 0
    throttled: int = 0
    hedged: int = 0
    bytes: int = 0
    copies: int = 0
    skipped_throttled: int = 0
    repeated_throttled: int = 0

    def add(self, other: StoreCounters) -> None:
        """Add ``other``'s counts to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class SimulatedStore:
    """Computes each PUT's completion when it is issued (all times in seconds), with
    the hedging rule of :class:`~dstltree.topology.latency.HedgeState` (the real
    uploader's): a hedge decision sees the throttled responses of requests issued
    before it, at their times. Objects are spread over ``prefixes`` prefixes by a hash
    of their number (:func:`dstltree.storage.store.object_prefix`, as the real store
    places them); the copies and hedges of one object go to the next prefixes."""

    model: LatencyModel
    hedging: HedgingPolicy
    throttle: Throttle
    rng: random.Random
    prefixes: int = 1
    counters: defaultdict[int, StoreCounters] = field(
        default_factory=lambda: defaultdict(StoreCounters)
    )
    _next_prefix: int = 0
    _state: HedgeState | None = field(default=None, repr=False)

    def totals(self, checkpoints: Iterable[int]) -> StoreCounters:
        """The counters of ``checkpoints`` added up."""
        tot = StoreCounters()
        for c in checkpoints:
            tot.add(self.counters[c])
        return tot

    def put(self, checkpoint: int, t: float, size_bytes: int) -> float:
        """Write one object of ``size_bytes`` issued at ``t``; returns when it is durable."""
        if self._state is None or self._state.policy is not self.hedging:
            self._state = HedgeState(self.hedging)
        state = self._state
        state.forget_before(t)
        base = int(object_prefix(str(self._next_prefix), self.prefixes), 16)
        self._next_prefix += 1
        c = self.counters[checkpoint]
        throttle = self.throttle

        def attempt(k: int, offset: float) -> tuple[float, float | None]:
            start = t + offset
            prefix = f"p{(base + k) % self.prefixes}"
            admitted, throttled, last = throttle.admit_span(prefix, start, self.rng)
            c.throttled += throttled
            duration = admitted - start + self.model.sample(self.rng, size_bytes)
            if last is None:
                state.note_latency(duration, size_bytes)
                return duration, None
            state.note_throttle(start + throttle.response_s, last)
            return duration, throttle.response_s

        out = hedge_timeline(state, size_bytes, t, attempt)
        c.objects += 1
        c.requests += out.attempts
        c.hedged += out.attempts - out.copies
        c.copies += out.copies - 1
        c.skipped_throttled += out.skipped
        c.repeated_throttled += out.repeated
        c.bytes += size_bytes
        return t + out.latency_s
