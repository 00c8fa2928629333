"""Latency models of DFS / object-store writes and the request-hedging rule. Pure code,
no I/O: the simulator samples them; the fault-injecting filesystem and the real upload
path (hedging) use the same definitions.

A :class:`LatencyModel` is a table of request-latency percentiles measured at one
reference object size, sampled by inverse CDF with linear interpolation between the
listed percentiles:

* below the lowest listed percentile ``p_lo`` the curve runs linearly from
  ``p0 = floor_fraction * latency(p_lo)`` at percentile 0;
* above the highest listed percentile ``p_hi`` it runs on with the slope of the last
  segment up to ``p100`` (an extrapolation, and the cap: no sample exceeds it).

A request for an object of ``size`` bytes takes the reference-size latency shifted by
``(size - reference_bytes) / bandwidth`` seconds, never less than ``floor_s``.

Named models (:func:`get_model`): ``flip158-s3`` and ``flip158-s3-hedged`` carry the S3
tables of FLIP-158, "DFS write latency" (500 streams of 5 MB objects; without and with
request hedging). The bandwidth and floor of those models are NOT in FLIP-158: they are
assumptions of this project (one S3 PUT stream at 32 MiB/s, at least 20 ms), to be
replaced by measurements. ``local`` is a fast local disk (a few ms).

The hedging rule (:class:`HedgingPolicy`, applied by :class:`HedgeState` and, for a
whole simulated request, :func:`hedge_timeline`) is the one of the real uploader
(:class:`dstltree.storage.hedging.HedgedUploader`) and of the simulated store: a
timeout that grows with the object's size, no hedges while the store throttles,
optionally an adaptive timeout and copies of small objects.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

__all__ = [
    "HEDGE_BANDWIDTH",
    "MODELS",
    "THROTTLE_QUIET_S",
    "AttemptFn",
    "HedgeOutcome",
    "HedgeState",
    "HedgingPolicy",
    "LatencyModel",
    "checkpoint_quantile",
    "expected_attempts",
    "get_model",
    "hedge_timeline",
    "hedged_latency",
    "request_survival",
]

MiB = 1024 * 1024


@dataclass(frozen=True)
class LatencyModel:
    """Request latency (seconds) as a percentile table at ``reference_bytes``.

    ``percentiles`` maps a percentile in (0, 100) to seconds, non-decreasing in the
    percentile. ``bandwidth`` is bytes/s, ``floor_s`` the least latency of any request,
    ``floor_fraction`` sets p0 as a fraction of the lowest listed latency. Raises
    ValueError for an empty, unordered or out-of-range table or non-positive numbers.
    """

    name: str
    percentiles: Mapping[float, float]
    reference_bytes: int
    bandwidth: float
    floor_s: float = 0.0
    floor_fraction: float = 0.5
    _xs: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _ys: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pts = sorted((float(p), float(s)) for p, s in self.percentiles.items())
        if not pts:
            raise ValueError(f"{self.name}: the percentile table is empty")
        if any(not 0 < p < 100 for p, _ in pts):
            raise ValueError(f"{self.name}: percentiles must lie in (0, 100)")
        if any(b[1] < a[1] for a, b in zip(pts, pts[1:], strict=False)) or pts[0][1] < 0:
            raise ValueError(f"{self.name}: latencies must be >= 0 and non-decreasing")
        if self.bandwidth <= 0 or self.reference_bytes < 0 or self.floor_s < 0:
            raise ValueError(f"{self.name}: bandwidth must be > 0, sizes and floor >= 0")
        if not 0 <= self.floor_fraction <= 1:
            raise ValueError(f"{self.name}: floor_fraction must be in [0, 1]")
        p0 = (0.0, self.floor_fraction * pts[0][1])
        if len(pts) >= 2:
            (pa, sa), (pb, sb) = pts[-2], pts[-1]
            slope = (sb - sa) / (pb - pa)
        else:
            slope = 0.0
        p100 = (100.0, pts[-1][1] + slope * (100.0 - pts[-1][0]))
        xs, ys = zip(p0, *pts, p100, strict=True)
        object.__setattr__(self, "percentiles", MappingProxyType(dict(pts)))
        object.__setattr__(self, "_xs", tuple(xs))
        object.__setattr__(self, "_ys", tuple(ys))

    def __reduce__(self) -> tuple[Any, ...]:  # picklable despite the read-only mapping
        return (
            LatencyModel,
            (
                self.name,
                dict(self.percentiles),
                self.reference_bytes,
                self.bandwidth,
                self.floor_s,
                self.floor_fraction,
            ),
        )

    @property
    def max_s(self) -> float:
        """p100 at the reference size: the extrapolated cap (seconds)."""
        return self._ys[-1]

    def quantile(self, percentile: float, size_bytes: int | None = None) -> float:
        """Latency in seconds at ``percentile`` in [0, 100] for ``size_bytes`` (default:
        the reference size). ValueError outside [0, 100] or for a negative size."""
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        i = min(bisect.bisect_right(self._xs, percentile), len(self._xs) - 1)
        x0, x1, y0, y1 = self._xs[i - 1], self._xs[i], self._ys[i - 1], self._ys[i]
        base = y0 + (y1 - y0) * (percentile - x0) / (x1 - x0) if x1 > x0 else y1
        return self.shift(base, self.reference_bytes if size_bytes is None else size_bytes)

    def shift(self, reference_latency: float, size_bytes: int) -> float:
        """Move a reference-size latency to ``size_bytes``: plus
        ``(size - reference) / bandwidth``, at least ``floor_s``."""
        if size_bytes < 0:
            raise ValueError(f"size must be >= 0, got {size_bytes}")
        return max(
            self.floor_s, reference_latency + (size_bytes - self.reference_bytes) / self.bandwidth
        )

    def sample(self, rng: random.Random, size_bytes: int) -> float:
        """One request latency in seconds for an object of ``size_bytes``."""
        return self.quantile(100.0 * rng.random(), size_bytes)

    def scaled(self, factor: float) -> LatencyModel:
        """The same shape with every latency times ``factor`` (> 0) and the bandwidth
        divided by it: for tests and scaled-down runs."""
        if factor <= 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        return replace(
            self,
            name=f"{self.name}*{factor:g}",
            percentiles={p: s * factor for p, s in self.percentiles.items()},
            bandwidth=self.bandwidth / factor,
            floor_s=self.floor_s * factor,
        )


# FLIP-158, "DFS write latency": S3, 500 streams of 5 MB objects (2.5 GB in total).
_FLIP158_S3 = {50: 0.459, 90: 0.740, 95: 0.833, 99: 1.039, 99.9: 3.202}
_FLIP158_S3_HEDGED = {50: 0.495, 90: 0.733, 95: 0.807, 99: 0.937, 99.9: 1.689}
_FIVE_MB = 5 * 1000 * 1000

MODELS: Mapping[str, LatencyModel] = MappingProxyType(
    {
        m.name: m
        for m in (
            LatencyModel("flip158-s3", _FLIP158_S3, _FIVE_MB, bandwidth=32 * MiB, floor_s=0.02),
            LatencyModel(
                "flip158-s3-hedged", _FLIP158_S3_HEDGED, _FIVE_MB, bandwidth=32 * MiB, floor_s=0.02
            ),
            LatencyModel(
                "local",
                {50: 0.002, 90: 0.003, 99: 0.005, 99.9: 0.010},
                MiB,
                bandwidth=500 * MiB,
                floor_s=0.0005,
            ),
        )
    }
)


def get_model(name: str) -> LatencyModel:
    """The named latency model; ValueError listing the known names otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown latency model {name!r}; known: {', '.join(sorted(MODELS))}"
        ) from None


#: bytes/s one request is assumed to move (the flip158 models' assumption): an attempt
#: of ``size`` bytes may run ``size / HEDGE_BANDWIDTH`` seconds longer before it is hedged
HEDGE_BANDWIDTH = 32 * MiB
#: seconds without a throttled response before hedges start again (an assumption of
#: this project: two of S3's one-second request-rate windows)
THROTTLE_QUIET_S = 2.0


@dataclass(frozen=True)
class HedgingPolicy:
    """Request hedging as in Flink's DSTL upload path: an attempt not finished after its
    timeout starts one more attempt, up to ``max_attempts`` in all; the first attempt
    to finish wins and the others are abandoned (FLIP-158, "Request hedging"; Flink
    ``dstl.dfs.upload.timeout`` 1 s, 3 attempts). ``timeout_s`` None switches hedging
    off. The one rule of the simulated store and the real uploader
    (:class:`HedgeState` applies it):

    * size: an attempt of ``size`` bytes gets ``timeout_s + size / bandwidth`` seconds
      (``bandwidth`` bytes/s, None: no size term), so an attempt slow only because its
      object is large is not hedged;
    * overload: no hedge (and no extra copy) starts within ``quiet_s`` seconds after
      any throttled response (S3 503 SlowDown, 429), nor ever for an upload one of
      whose attempts was throttled: that attempt retries with backoff alone, so
      hedging never multiplies the load of a throttling store (``throttle_aware``
      False: the old rule, hedges regardless, for comparison);
    * adaptive: with ``adaptive_percentile`` set, ``timeout_s`` is replaced by that
      percentile of the last ``adaptive_window`` attempt latencies minus their size
      term, at least ``adaptive_floor_s``, once ``adaptive_min_samples`` are known;
    * copies: an object of at most ``copies_max_bytes`` is written ``copies`` times at
      once (to different prefixes), the first to finish wins; copies count in
      ``max_attempts``.

    Raises ValueError for out-of-range values.
    """

    timeout_s: float | None = 1.0
    max_attempts: int = 3
    bandwidth: float | None = HEDGE_BANDWIDTH
    quiet_s: float = THROTTLE_QUIET_S
    copies: int = 1
    copies_max_bytes: int = 8 * MiB
    adaptive_percentile: float | None = None
    adaptive_floor_s: float = 0.05
    adaptive_window: int = 256
    adaptive_min_samples: int = 20
    throttle_aware: bool = True

    def __post_init__(self) -> None:
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"hedge timeout must be > 0 or off, got {self.timeout_s}")
        if self.max_attempts < 1 or self.copies < 1:
            raise ValueError("max_attempts and copies must be >= 1")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s or None, got {self.bandwidth}")
        if self.quiet_s < 0 or self.copies_max_bytes < 0 or self.adaptive_floor_s < 0:
            raise ValueError("quiet_s, copies_max_bytes and adaptive_floor_s must be >= 0")
        p = self.adaptive_percentile
        if p is not None and not 0 < p <= 100:
            raise ValueError(f"adaptive_percentile must be in (0, 100], got {p}")
        if self.adaptive_window < 1 or self.adaptive_min_samples < 1:
            raise ValueError("adaptive_window and adaptive_min_samples must be >= 1")

    def size_s(self, size_bytes: int) -> float:
        """Seconds added to the timeout of an attempt of ``size_bytes``."""
        return 0.0 if self.bandwidth is None else max(0, size_bytes) / self.bandwidth

    def copies_for(self, size_bytes: int) -> int:
        """Attempts started at once for an object of ``size_bytes`` (at most
        ``max_attempts``)."""
        n = self.copies if size_bytes <= self.copies_max_bytes else 1
        return min(n, self.max_attempts)

    def run(self, attempt_latency: Callable[[int], float]) -> tuple[float, int]:
        """See :func:`hedged_latency` (the fixed ``timeout_s``, no size term, no copies)."""
        if self.timeout_s is None:
            return attempt_latency(0), 1
        return hedged_latency(attempt_latency, self.timeout_s, self.max_attempts)


class HedgeState:
    """What one uploader (or the simulated store) has seen, and the decisions of its
    :class:`HedgingPolicy` from it. Pure: times are seconds on the caller's clock
    (monotonic, or simulated), passed in. Not thread-safe (callers lock).

    ``note_throttle(t0, t1)`` records throttled responses received from ``t0`` to
    ``t1``; ``hedge_at(t)`` is the earliest time >= ``t`` at which a hedge may start
    (``t`` itself when allowed); ``note_latency`` feeds the adaptive timeout;
    ``timeout(size)`` is the current timeout of an attempt of ``size`` bytes (None:
    hedging off)."""

    def __init__(self, policy: HedgingPolicy) -> None:
        self.policy = policy
        self._blocked: list[tuple[float, float]] = []  # disjoint, sorted [start, end)
        self._latencies: deque[float] = deque(maxlen=policy.adaptive_window)

    def note_throttle(self, t0: float, t1: float | None = None) -> None:
        """Throttled responses were received from ``t0`` to ``t1`` (default ``t0``):
        hedges are blocked from ``t0`` until ``t1 + quiet_s``."""
        start, end = t0, (t0 if t1 is None else max(t0, t1)) + self.policy.quiet_s
        spans = self._blocked
        i = bisect.bisect_left(spans, (start, start))
        if i and spans[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(spans) and spans[j][0] <= end:
            start, end = min(start, spans[j][0]), max(end, spans[j][1])
            j += 1
        spans[i:j] = [(start, end)]

    def hedge_at(self, t: float) -> float:
        """The earliest time >= ``t`` (seconds) at which a new hedge or copy may start
        (``t`` when the policy is not ``throttle_aware``)."""
        spans = self._blocked
        if not self.policy.throttle_aware:
            return t
        i = bisect.bisect_right(spans, (t, math.inf)) - 1
        if i >= 0 and spans[i][0] <= t < spans[i][1]:
            return spans[i][1]
        return t

    def forget_before(self, t: float) -> None:
        """Drop what cannot block a hedge at ``t`` or later (bounded memory)."""
        spans = self._blocked
        i = 0
        while i < len(spans) and spans[i][1] <= t:
            i += 1
        del spans[:i]

    def note_latency(self, latency_s: float, size_bytes: int) -> None:
        """One successful attempt of ``size_bytes`` took ``latency_s`` seconds."""
        self._latencies.append(latency_s - self.policy.size_s(size_bytes))

    def timeout(self, size_bytes: int) -> float | None:
        """Seconds an attempt of ``size_bytes`` may run before the next starts."""
        p = self.policy
        if p.timeout_s is None:
            return None
        base = p.timeout_s
        if p.adaptive_percentile is not None and len(self._latencies) >= p.adaptive_min_samples:
            lat = sorted(self._latencies)
            rank = p.adaptive_percentile / 100 * (len(lat) - 1)
            lo = int(rank)
            hi = min(lo + 1, len(lat) - 1)
            base = max(p.adaptive_floor_s, lat[lo] + (lat[hi] - lat[lo]) * (rank - lo))
        return base + p.size_s(size_bytes)


@dataclass(frozen=True)
class HedgeOutcome:
    """One hedged request: ``latency_s`` until the first attempt finished, attempts
    started (copies and hedges included), ``copies`` started at once, hedges or copies
    ``skipped`` because of throttling, and hedges started although the request had
    already been throttled (``repeated``: 0 unless ``throttle_aware`` is off)."""

    latency_s: float
    attempts: int
    copies: int
    skipped: int
    repeated: int


#: one attempt started at a time (seconds after the request): its duration and the
#: seconds after its start of its first throttled response (None: never throttled)
AttemptFn = Callable[[int, float], tuple[float, float | None]]


def _first_copies(
    state: HedgeState, size_bytes: int, t: float, attempt: AttemptFn
) -> tuple[float, float, int, int]:
    """Start the copies of a request at ``t``: (first end, first throttled response,
    copies started, copies skipped), times in seconds after ``t``."""
    n = state.policy.copies_for(size_bytes)
    skipped = 0
    if n > 1 and state.hedge_at(t) > t:
        skipped, n = n - 1, 1
    best, throttled = math.inf, math.inf
    for k in range(n):
        d, th = attempt(k, 0.0)
        best = min(best, d)
        throttled = min(throttled, math.inf if th is None else th)
    return best, throttled, n, skipped


def hedge_timeline(
    state: HedgeState, size_bytes: int, t: float, attempt: AttemptFn
) -> HedgeOutcome:
    """Run the rule of ``state.policy`` for one request of ``size_bytes`` issued at
    ``t`` (seconds, the state's clock), computing the whole timeline at once (the
    simulated store). ``attempt(k, offset)`` starts attempt ``k`` ``offset`` seconds
    after ``t``; it is called only for attempts that start, in order. Copies start at
    offset 0 (one only while throttling blocks hedges); a hedge starts one timeout
    after the previous attempt if none has finished, unless the request was already
    throttled (then never) or :meth:`HedgeState.hedge_at` defers it (both counted
    once in ``skipped``). The caller notes throttled responses and latencies."""
    best, throttled, n, skipped = _first_copies(state, size_bytes, t, attempt)
    timeout = state.timeout(size_bytes)
    aware = state.policy.throttle_aware
    last = state.policy.max_attempts if timeout is not None else n  # None: no hedges
    step = timeout or 0.0
    started, next_at, deferred, repeated = n, step, False, 0
    while started < last and best > next_at:
        was_throttled = throttled <= next_at
        gate = state.hedge_at(t + next_at)  # compared on the caller's clock (rounding)
        if aware and (was_throttled or gate > t + next_at):
            skipped += not deferred
            if was_throttled:
                break
            next_at, deferred = gate - t, True
            continue
        d, th = attempt(started, next_at)
        best = min(best, next_at + d)
        throttled = min(throttled, math.inf if th is None else next_at + th)
        repeated += was_throttled
        started, next_at, deferred = started + 1, next_at + step, False
    return HedgeOutcome(best, started, n, skipped, repeated)


def hedged_latency(
    attempt_latency: Callable[[int], float], timeout: float, max_attempts: int
) -> tuple[float, int]:
    """Latency (seconds) of a hedged request and the number of attempts started.

    Attempt ``k`` (0-based) starts ``k * timeout`` seconds after the request if no
    earlier attempt has finished by then, for ``k < max_attempts``;
    ``attempt_latency(k)`` is its own duration and is called only for attempts that
    start, in order. The request ends when the first attempt ends. ValueError for
    ``timeout <= 0`` or ``max_attempts < 1``.
    """
    if timeout <= 0 or max_attempts < 1:
        raise ValueError("timeout must be > 0 and max_attempts >= 1")
    best = attempt_latency(0)
    started = 1
    while started < max_attempts and best > started * timeout:
        best = min(best, started * timeout + attempt_latency(started))
        started += 1
    return best, started


def _model_cdf(model: LatencyModel, seconds: float, size_bytes: int) -> float:
    """P(one request of ``size_bytes`` takes <= ``seconds``) under ``model``."""
    if seconds < model.shift(0.0, size_bytes) and seconds < model.floor_s:
        return 0.0
    ref = seconds - (size_bytes - model.reference_bytes) / model.bandwidth
    xs, ys = model._xs, model._ys
    if ref < ys[0]:
        return 0.0 if seconds < model.floor_s else xs[0] / 100
    if ref >= ys[-1]:
        return 1.0
    i = bisect.bisect_right(ys, ref)
    y0, y1 = ys[i - 1], ys[i]
    x = xs[i] if y1 == y0 else xs[i - 1] + (xs[i] - xs[i - 1]) * (ref - y0) / (y1 - y0)
    return x / 100


def _attempt_starts(model: LatencyModel, policy: HedgingPolicy, size_bytes: int) -> list[float]:
    """Offsets (seconds) at which the attempts of one request start if none finishes:
    its copies at 0, then one hedge per timeout (the adaptive one taken as that
    percentile of ``model`` without its size term)."""
    n = policy.copies_for(size_bytes)
    state = HedgeState(replace(policy, adaptive_percentile=None))
    timeout = state.timeout(size_bytes)
    if timeout is None:
        return [0.0] * n
    if policy.adaptive_percentile is not None:
        base = model.quantile(policy.adaptive_percentile) - policy.size_s(model.reference_bytes)
        timeout = max(policy.adaptive_floor_s, base) + policy.size_s(size_bytes)
    return [0.0] * n + [timeout * k for k in range(1, policy.max_attempts - n + 1)]


def request_survival(
    model: LatencyModel, policy: HedgingPolicy, size_bytes: int, seconds: float
) -> float:
    """P(a request of ``size_bytes`` under ``policy`` takes longer than ``seconds``),
    attempts independent, no throttling: every attempt started before ``seconds``
    (and only started because the earlier ones had not finished) is still running."""
    p = 1.0
    for start in _attempt_starts(model, policy, size_bytes):
        if start >= seconds:
            break
        p *= 1.0 - _model_cdf(model, seconds - start, size_bytes)
    return p


def expected_attempts(model: LatencyModel, policy: HedgingPolicy, size_bytes: int) -> float:
    """Mean attempts (requests) of one object under ``policy``, no throttling."""
    starts = _attempt_starts(model, policy, size_bytes)
    n = policy.copies_for(size_bytes)
    return n + sum(request_survival(model, policy, size_bytes, s) for s in starts[n:])


def checkpoint_quantile(
    model: LatencyModel,
    policy: HedgingPolicy,
    object_sizes: Sequence[int],
    percentile: float = 99.0,
) -> float:
    """Seconds by which all of ``object_sizes`` (bytes, written at once) are durable
    with probability ``percentile``/100: the checkpoint's store latency, the most of
    independent requests (:func:`request_survival`). ValueError for an empty list or
    a percentile outside (0, 100)."""
    if not object_sizes or not 0 < percentile < 100:
        raise ValueError("object_sizes must not be empty, percentile in (0, 100)")
    counts: dict[int, int] = {}
    for s in object_sizes:
        counts[s] = counts.get(s, 0) + 1
    goal = math.log(percentile / 100)

    def log_done(x: float) -> float:
        total = 0.0
        for s, k in counts.items():
            surv = request_survival(model, policy, s, x)
            if surv >= 1.0:
                return -math.inf
            total += k * math.log1p(-surv)
        return total

    lo, hi = 0.0, model.max_s + max(model.shift(0.0, s) for s in counts) + 60.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if log_done(mid) < goal else (lo, mid)
    return hi
