"""The compact form of checkpoint metadata inside commit records (coordinator/store.py).

Most of a checkpoint's metadata is segment references: a path and the key groups of
each segment. In a commit record (format version 3) they are written compactly and
expanded again on reading, so that :class:`CompletedCheckpoint` and its dict form stay
as they are everywhere else:

- a path below the job's own folder (the store's base URL) is written relative to it,
  marked by a leading ``./`` (``./changelog/57/f656...dstl``); a path elsewhere (a
  node writing outside the job) stays as it is;
- a segment's key groups, a list of ints, are written as runs ``[[start, stop], ...]``
  under ``kg`` (a task's key groups are one contiguous range: one run).

:func:`pack` and :func:`unpack` are pure; :func:`unpack` raises ValueError, TypeError or
KeyError for malformed input (the store names the file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: Most key group runs of one segment, and the largest key group, accepted on reading.
MAX_RUNS = 1 << 16
MAX_KEY_GROUP = 1 << 20


def pack(d: dict[str, Any], base: str) -> dict[str, Any]:
    """The compact form of a checkpoint dict (``CompletedCheckpoint.to_dict``) for a
    job whose base URL is ``base``."""
    prefix = base.rstrip("/") + "/"

    def rel(p: str) -> str:
        return "./" + p[len(prefix) :] if p.startswith(prefix) else p

    out = _map_paths(d, rel)
    for t in out["tasks"]:
        for h in t.get("changelog", ()):
            for s in h["segments"]:
                s["kg"] = runs(s.pop("key_groups"))
    return out


def unpack(d: dict[str, Any], base: str) -> dict[str, Any]:
    """The checkpoint dict of a compact one (the inverse of :func:`pack`)."""
    prefix = base.rstrip("/") + "/"

    def absolute(p: str) -> str:
        if not isinstance(p, str):
            raise TypeError(f"path: expected a string, got {type(p).__name__}")
        return prefix + p[2:] if p.startswith("./") else p

    out = _map_paths(d, absolute)
    for t in out["tasks"]:
        for h in t.get("changelog", ()):
            for s in h["segments"]:
                s["key_groups"] = expand(s.pop("kg"))
    return out


def runs(key_groups: Iterable[int]) -> list[list[int]]:
    """Sorted, distinct ``key_groups`` as ``[start, stop)`` runs."""
    out: list[list[int]] = []
    for k in sorted(set(key_groups)):
        if out and out[-1][1] == k:
            out[-1][1] = k + 1
        else:
            out.append([k, k + 1])
    return out


def expand(packed: Any) -> list[int]:
    """The key groups of runs (:func:`runs`). Raises ValueError or TypeError for
    anything but at most :data:`MAX_RUNS` ascending, disjoint runs of ints in
    ``[0, MAX_KEY_GROUP]``."""
    if not isinstance(packed, list) or len(packed) > MAX_RUNS:
        raise ValueError("key group runs: expected a list")
    out: list[int] = []
    last = 0
    for run in packed:
        if not (isinstance(run, list) and len(run) == 2):
            raise ValueError(f"key group run {run!r}")
        start, stop = run
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in run):
            raise TypeError(f"key group run {run!r}")
        if not last <= start < stop <= MAX_KEY_GROUP:
            raise ValueError(f"key group run {run!r} out of order or range")
        out.extend(range(start, stop))
        last = stop
    return out


def _map_paths(d: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """A deep copy of checkpoint dict ``d`` with ``fn`` applied to every object path
    (snapshot files, segments, the split log)."""
    out = dict(d)
    out["tasks"] = [_task_paths(t, fn) for t in d["tasks"]]
    log = d.get("finished_log")
    if log is not None:
        out["finished_log"] = {**log, "path": fn(log["path"])}
    return out


def _task_paths(t: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    out = dict(t)
    mat = t.get("materialized")
    if mat is not None:
        mat = {**mat, "path": fn(mat["path"])}
        if "parts" in mat:
            mat["parts"] = [{**p, "path": fn(p["path"])} for p in mat["parts"]]
        out["materialized"] = mat
    out["changelog"] = [
        {**h, "segments": [{**s, "path": fn(s["path"])} for s in h["segments"]]}
        for h in t.get("changelog", ())
    ]
    return out
