"""Summary statistics shared by the job report, the benchmarks and the simulator."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) of ``values`` with linear interpolation
    (numpy's default); NaN for no values. Units are those of ``values``."""
    return float(np.percentile(values, q)) if len(values) else math.nan
