"""The synthetic workload: W writers spread evenly over E executors, bytes per writer per
checkpoint drawn from a seeded distribution.

Distributions (``--distribution``):

- ``constant``: every writer changes exactly B bytes per checkpoint;
- ``lognormal[:SIGMA]``: lognormal with mean B (default SIGMA 0.5), drawn per writer and
  checkpoint;
- ``skewed[:FRACTION:FACTOR]``: hot executors; that fraction of the executors (spread
  evenly over the breadth-first order, default 0.25) changes FACTOR times as much
  (default 4), the others B each.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["Distribution", "Workload", "parse_distribution"]


@dataclass(frozen=True)
class Distribution:
    """A parsed ``--distribution``: ``kind`` and its two parameters (see module doc)."""

    kind: str = "constant"
    sigma: float = 0.5
    hot_fraction: float = 0.25
    hot_factor: float = 4.0

    def __str__(self) -> str:
        if self.kind == "lognormal":
            return f"lognormal:{self.sigma:g}"
        if self.kind == "skewed":
            return f"skewed:{self.hot_fraction:g}:{self.hot_factor:g}"
        return "constant"


def parse_distribution(text: str) -> Distribution:
    """``constant``, ``lognormal[:SIGMA]`` or ``skewed[:FRACTION:FACTOR]``; ValueError
    otherwise."""
    kind, *args = [t.strip() for t in text.split(":")]
    try:
        nums = [float(a) for a in args]
    except ValueError:
        raise ValueError(f"--distribution {text!r}: parameters must be numbers") from None
    if kind == "constant" and not nums:
        return Distribution()
    if kind == "lognormal" and len(nums) <= 1:
        sigma = nums[0] if nums else 0.5
        if sigma < 0:
            raise ValueError("--distribution lognormal: SIGMA must be >= 0")
        return Distribution("lognormal", sigma=sigma)
    if kind == "skewed" and len(nums) in (0, 2):
        frac, factor = nums if nums else (0.25, 4.0)
        if not 0 <= frac <= 1 or factor < 0:
            raise ValueError("--distribution skewed: FRACTION in [0, 1], FACTOR >= 0")
        return Distribution("skewed", hot_fraction=frac, hot_factor=factor)
    raise ValueError(
        f"--distribution {text!r}: expected constant, lognormal[:SIGMA] or skewed[:FRACTION:FACTOR]"
    )


@dataclass(frozen=True)
class Workload:
    """``writers`` writers on ``executors`` executors; ``bytes_per_writer`` (B) bytes per
    writer per checkpoint on average; ``checkpoints`` (K) checkpoints; ``seed``."""

    writers: int
    executors: int
    bytes_per_writer: int
    checkpoints: int
    distribution: Distribution = Distribution()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.writers < 1 or self.executors < 1 or self.checkpoints < 1:
            raise ValueError("writers, executors and checkpoints must be >= 1")
        if self.bytes_per_writer < 1:
            raise ValueError("bytes per writer per checkpoint must be >= 1")

    def writers_of(self, executor: int) -> list[int]:
        """Global writer indices on ``executor`` (round robin: writers spread evenly)."""
        return list(range(executor, self.writers, self.executors))

    def hot_executors(self) -> set[int]:
        """Executors changing more bytes (``skewed`` only), spread evenly."""
        d = self.distribution
        if d.kind != "skewed" or d.hot_fraction == 0:
            return set()
        n = max(1, round(d.hot_fraction * self.executors))
        step = self.executors / n
        return {int(i * step) for i in range(n)}

    def sizes(self) -> list[list[list[int]]]:
        """``sizes[k][e][j]``: bytes of the j-th writer of executor ``e`` in checkpoint
        ``k`` (deterministic for a seed; each at least 1)."""
        rng = random.Random(self.seed)
        d = self.distribution
        hot = self.hot_executors()
        mu = math.log(self.bytes_per_writer) - d.sigma**2 / 2
        out: list[list[list[int]]] = []
        for _ in range(self.checkpoints):
            per_exec: list[list[int]] = []
            for e in range(self.executors):
                row = []
                for _w in self.writers_of(e):
                    if d.kind == "lognormal":
                        b = rng.lognormvariate(mu, d.sigma)
                    elif e in hot:
                        b = self.bytes_per_writer * d.hot_factor
                    else:
                        b = float(self.bytes_per_writer)
                    row.append(max(1, int(b)))
                per_exec.append(row)
            out.append(per_exec)
        return out
