"""Record values as plain, msgpack-encodable Python: what every source yields.

Conversions (:func:`plain`), one rule per type:

- None, bool, int, str, bytes: unchanged; float: unchanged, NaN -> None;
- null of any kind (``pandas.NA``, ``pandas.NaT``, ``numpy.datetime64("NaT")``) -> None;
- ``datetime`` (also ``pandas.Timestamp``), ``date``, ``time``: ISO 8601 strings
  (``datetime.isoformat()``: ``"2013-01-01T05:17:00"`` for a naive timestamp,
  ``"2013-01-01T05:17:00+00:00"`` for one with a time zone; microsecond precision,
  nanoseconds are truncated);
- ``timedelta`` (Arrow durations, ``pandas.Timedelta``): int microseconds;
- ``Decimal``: its exact string (``"12.50"``);
- numpy scalars: their Python value, then the rules above;
- lists, tuples, numpy arrays -> lists; dicts -> dicts with string keys; Arrow maps
  (lists of key/value pairs) -> lists of ``[key, value]``.

Anything else raises TypeError naming the type.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd

_SCALARS = (bool, int, str, bytes)


def plain(value: Any) -> Any:
    """``value`` as a msgpack-encodable Python value (rules in the module docstring)."""
    if value is None or isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return None if value is pd.NaT else value.isoformat()
    if isinstance(value, dt.timedelta):
        return None if value is pd.NaT else value // dt.timedelta(microseconds=1)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return _numpy(value)
    if value is pd.NA or value is pd.NaT:
        return None
    raise TypeError(f"no plain value for {type(value).__name__}: {value!r}")


def _numpy(value: np.generic) -> Any:
    if isinstance(value, np.datetime64 | np.timedelta64):
        if np.isnat(value):
            return None
        return plain(
            pd.Timestamp(value) if isinstance(value, np.datetime64) else pd.Timedelta(value)
        )
    return plain(value.item())


def plain_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record with every value made plain (column names as strings)."""
    return {str(k): plain(v) for k, v in record.items()}
