"""The compacted log of finished source splits (``materialized/<xx>/<id>.splits``).

A file source's enumerator keeps the id of every split it ever finished, so that a
split listed again is not read again (sparkplug/sources/base.py, ``EnumeratorState``).
Written into every checkpoint, that set makes metadata grow with the input. Instead,
once a checkpoint names :data:`COMPACT_AFTER` or more ids beyond the last split log,
the coordinator writes the finished ids of that completed checkpoint once, off the
completion path, to a split log; checkpoints completed after it reference it
(``CompletedCheckpoint.finished_log``) and name only the ids finished since. A split
log is shared state like a snapshot file: the shared state registry counts the
checkpoints referencing it and deletes it with the last of them; one written but never
referenced is an orphan for the sweeps. Spark's ``sources/`` log compacts the same way.

File format (JSON): ``{"format": "dstl-split-log", "version": 1, "finished": [ids,
sorted]}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dstltree.coordinator.errors import CorruptCheckpointError

FORMAT = "dstl-split-log"
#: File name suffix of split logs (below ``<job>/materialized/<xx>/``).
SPLIT_LOG_SUFFIX = ".splits"
VERSION = 1
#: Finished ids beyond the last split log that make the coordinator write a new one.
COMPACT_AFTER = 32
#: Longest split id accepted from a split log, characters.
MAX_ID_CHARS = 4096


def encode_split_log(ids: Iterable[str]) -> bytes:
    """The file of the finished split ``ids``."""
    body = {"format": FORMAT, "version": VERSION, "finished": sorted(set(ids))}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_split_log(path: str, raw: bytes, count: int | None = None) -> frozenset[str]:
    """The finished ids of the split log ``path`` (``count``: how many the referencing
    metadata says it holds). Raises CorruptCheckpointError naming the path (and an
    unknown version)."""
    try:
        d: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(path, f"bad split log: {e}") from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise CorruptCheckpointError(path, "not a split log")
    if d.get("version") != VERSION:
        raise CorruptCheckpointError(
            path, f"split log format version {d.get('version')!r} is not known (this reads 1)"
        )
    ids = d.get("finished")
    if not isinstance(ids, list) or not all(
        isinstance(i, str) and 0 < len(i) <= MAX_ID_CHARS for i in ids
    ):
        raise CorruptCheckpointError(path, "split log ids must be non-empty strings")
    out = frozenset(ids)
    if len(out) != len(ids) or (count is not None and len(out) != count):
        raise CorruptCheckpointError(path, f"split log holds {len(out)} ids, not {count}")
    return out
