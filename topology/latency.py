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
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

__all__ = [
    "MODELS",
    "HedgingPolicy",
    "LatencyModel",
    "get_model",
    "hedged_latency",
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


@dataclass(frozen=True)
class HedgingPolicy:
    """Request hedging as in Flink's DSTL upload path: an attempt not finished after
    ``timeout_s`` seconds starts one more attempt, up to ``max_attempts`` in all; the
    first attempt to finish wins and the others are abandoned (FLIP-158, "Request
    hedging"; Flink ``dstl.dfs.upload.timeout`` 1 s, 3 attempts). ``timeout_s`` None
    switches hedging off."""

    timeout_s: float | None = 1.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"hedge timeout must be > 0 or off, got {self.timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def run(self, attempt_latency: Callable[[int], float]) -> tuple[float, int]:
        """See :func:`hedged_latency`."""
        if self.timeout_s is None:
            return attempt_latency(0), 1
        return hedged_latency(attempt_latency, self.timeout_s, self.max_attempts)


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
