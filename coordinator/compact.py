"""The compact form of checkpoint metadata inside commit records (coordinator/store.py).

Most of a checkpoint's metadata is segment references: a path and the key groups of
each segment. In a commit record (format versions 3 and 4) they are written compactly and
expanded again on reading, so that :class:`CompletedCheckpoint` and its dict form stay
as they are everywhere else:

- a path below the job's own folder (the store's base URL) is written relative to it,
  marked by a leading ``./`` (``./changelog/57/f656...dstl``); a path elsewhere (a
  node writing outside the job) stays as it is;
- a segment is an array ``[path, offset, length, sqn_from, sqn_to, crc32, runs]``, its
  key groups as runs ``[[start, stop], ...]``, or ``null`` when they are its task's
  whole key-group range (as they mostly are); so are the segments of a task's channel
  state (``channel_state``, FLIP-76), present only when it has some;
- a snapshot part is an array ``[path, first key group, end key group, size, delta]``;
- object paths are written once per checkpoint, in a table (``paths``), and named by
  their index there (the tasks' segments share the few objects of a checkpoint);
- a committable staged as the layout names it is an array ``[checkpoint, task,
  attempt, id, extension, rows, bytes]`` (its staged and final names follow), one
  with a multipart upload the same array plus ``upload id, [[number, etag, size],
  ...]`` (record format version 4; version 3 kept it a dict); one named otherwise
  stays a dict, its final name left out when it is the layout's
  (``sinks.layout.final_name``);
- pending splits of the enumerator share their locations' common folder
  (``pending_prefix``), and a location that is that folder plus the split id is
  ``null``.

:func:`pack` and :func:`unpack` are pure; :func:`unpack` raises ValueError, TypeError or
KeyError for malformed input (the store names the file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from dstltree.sparkplug.sinks.layout import final_name, staged_name

#: Most key group runs of one segment, and the largest key group, accepted on reading.
MAX_RUNS = 1 << 16
MAX_KEY_GROUP = 1 << 20


def pack(d: dict[str, Any], base: str) -> dict[str, Any]:
    """The compact form of a checkpoint dict (``CompletedCheckpoint.to_dict``) for a
    job whose base URL is ``base``."""
    prefix = base.rstrip("/") + "/"

    def rel(p: str) -> str:
        return "./" + p[len(prefix) :] if p.startswith(prefix) else p

    table: dict[str, int] = {}

    def intern(p: str) -> int:
        return table.setdefault(rel(p), len(table))

    out = _map_paths(d, intern)
    for t in out["tasks"]:
        own = [list(t.get("key_groups", (0, 0)))]
        for h in _handles(t):
            h["segments"] = [_segment_row(s, own) for s in h["segments"]]
        t["committables"] = [_lean_committable(c) for c in t.get("committables", ())]
        mat = t.get("materialized")
        if mat is not None and "parts" in mat:
            t["materialized"] = {**mat, "parts": [_part_row(p) for p in mat["parts"]]}
    if out.get("enumerator"):
        out["enumerator"] = _pack_pending(out["enumerator"])
    out["paths"] = list(table)
    return out


def unpack(d: dict[str, Any], base: str) -> dict[str, Any]:
    """The checkpoint dict of a compact one (the inverse of :func:`pack`)."""
    prefix = base.rstrip("/") + "/"
    table = d.get("paths", [])
    if not isinstance(table, list) or not all(isinstance(p, str) for p in table):
        raise TypeError("paths: expected a list of strings")
    d = {k: v for k, v in d.items() if k != "paths"}
    d["tasks"] = [dict(t) for t in d["tasks"]]
    for t in d["tasks"]:
        t["changelog"] = [dict(h) for h in t.get("changelog", ())]
        if "channel_state" in t:
            t["channel_state"] = [dict(h) for h in t["channel_state"]]

    def absolute(p: Any) -> str:
        if isinstance(p, int) and not isinstance(p, bool):
            if not 0 <= p < len(table):
                raise ValueError(f"path index {p} outside the table of {len(table)}")
            p = table[p]
        if not isinstance(p, str):
            raise TypeError(f"path: expected a string, got {type(p).__name__}")
        return prefix + p[2:] if p.startswith("./") else p

    for t in d["tasks"]:
        own = list(t.get("key_groups", (0, 0)))
        for h in _handles(t):
            h["segments"] = [_segment_dict(s, own) for s in h["segments"]]
        t["committables"] = [_full_committable(c) for c in t.get("committables", ())]
        mat = t.get("materialized")
        if isinstance(mat, dict) and "parts" in mat:
            t["materialized"] = {**mat, "parts": [_part_dict(p) for p in mat["parts"]]}
    if d.get("enumerator"):
        d["enumerator"] = _unpack_pending(d["enumerator"])
    return _map_paths(d, absolute)


_SEGMENT_FIELDS = ("path", "offset", "length", "sqn_from", "sqn_to", "crc32")


def _handles(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The handle dicts of task dict ``t``: its changelog's, then its channel state's."""
    return [*t.get("changelog", ()), *t.get("channel_state", ())]


def _segment_row(s: dict[str, Any], own: list[list[int]]) -> list[Any]:
    kg: list[list[int]] | None = runs(s["key_groups"])
    if kg == own and own[0][0] < own[0][1]:
        kg = None  # the task's whole range
    return [s["path"], s["offset"], s["length"], *s["sqn"], s["crc32"], kg]


def _segment_dict(row: Any, own: list[Any]) -> dict[str, Any]:
    if not isinstance(row, list) or len(row) != 7:
        raise ValueError(f"a segment row of 7 fields, got {str(row)[:80]}")
    path, offset, length, lo, hi, crc, kg = row
    d = {"path": path, "offset": offset, "length": length, "sqn": [lo, hi], "crc32": crc}
    d["key_groups"] = expand([own] if kg is None else kg)
    return d


def _part_row(p: dict[str, Any]) -> list[Any]:
    return [p["path"], *p["key_groups"], p["size_bytes"], p["delta"]]


def _part_dict(row: Any) -> dict[str, Any]:
    if not isinstance(row, list) or len(row) != 5:
        raise ValueError(f"a snapshot part row of 5 fields, got {str(row)[:80]}")
    path, start, stop, size, delta = row
    return {"path": path, "key_groups": [start, stop], "size_bytes": size, "delta": delta}


_COMMITTABLE_KEYS = {"checkpoint_id", "task", "attempt", "staged", "final", "rows", "bytes"}
_MULTIPART_KEYS = _COMMITTABLE_KEYS | {"upload_id", "parts"}


def _lean_committable(c: dict[str, Any]) -> dict[str, Any] | list[Any]:
    out = dict(c)
    if out.get("final") == _final_of(out):
        del out["final"]
        if set(c) in (_COMMITTABLE_KEYS, _MULTIPART_KEYS) and "." in c["staged"]:
            stem, ext = c["staged"].rsplit(".", 1)
            uid = stem.rsplit("-", 1)[-1]
            row = [c["checkpoint_id"], c["task"], c["attempt"], uid, ext, c["rows"], c["bytes"]]
            if "upload_id" in c:
                row += [c["upload_id"], c["parts"]]
            if _staged_of(row) == c["staged"]:
                return row
    return out


def _full_committable(c: Any) -> Any:
    if isinstance(c, list):
        if len(c) not in (7, 9):
            raise ValueError(f"a committable row of 7 or 9 fields, got {str(c)[:80]}")
        cid, task, attempt, _, _, rows, size = c[:7]
        c_row = c
        c = {"checkpoint_id": cid, "task": task, "attempt": attempt, "staged": _staged_of(c)}
        c.update(rows=rows, bytes=size)
        if len(c_row) == 9:
            c.update(upload_id=c_row[7], parts=c_row[8])
    if isinstance(c, dict) and "final" not in c:
        return {**c, "final": _final_of(c)}
    return c


def _staged_of(row: list[Any]) -> str:
    """The staged name of a committable row."""
    cid, task, attempt, uid, ext = row[:5]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (cid, task, attempt)):
        raise TypeError(f"committable row {str(row)[:80]}")
    if not (isinstance(uid, str) and isinstance(ext, str)):
        raise TypeError(f"committable row {str(row)[:80]}")
    return staged_name(cid, task, attempt, ext, uid)


def _final_of(c: dict[str, Any]) -> str | None:
    """The layout's final name of a committable dict (None if it has no such name)."""
    staged, cid, task, attempt = (c.get(k) for k in ("staged", "checkpoint_id", "task", "attempt"))
    if not isinstance(staged, str) or "." not in staged:
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (cid, task, attempt)):
        return None
    return final_name(cid, task, attempt, staged.rsplit(".", 1)[1])  # type: ignore[arg-type]


def _pack_pending(e: dict[str, Any]) -> dict[str, Any]:
    locations = [r[1] for r in e.get("pending", ())]
    prefix = os.path.commonprefix(locations) if locations else ""
    prefix = prefix[: prefix.rfind("/") + 1]
    if not prefix:
        return e
    rows = [[r[0], None if r[1] == prefix + r[0] else r[1], *r[2:]] for r in e["pending"]]
    return {**e, "pending": rows, "pending_prefix": prefix}


def _unpack_pending(e: Any) -> Any:
    if not isinstance(e, dict) or "pending_prefix" not in e:
        return e
    prefix = e["pending_prefix"]
    if not isinstance(prefix, str):
        raise TypeError("pending_prefix: expected a string")
    rows = [[r[0], prefix + r[0] if r[1] is None else r[1], *r[2:]] for r in e["pending"]]
    out = {k: v for k, v in e.items() if k != "pending_prefix"}
    out["pending"] = rows
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


def _map_paths(d: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    """A deep copy of checkpoint dict ``d`` with ``fn`` applied to every object path
    (snapshot files, segments, the split log)."""
    out = dict(d)
    out["tasks"] = [_task_paths(t, fn) for t in d["tasks"]]
    log = d.get("finished_log")
    if log is not None:
        out["finished_log"] = {**log, "path": fn(log["path"])}
    return out


def _task_paths(t: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    out = dict(t)
    mat = t.get("materialized")
    if mat is not None:
        mat = {**mat, "path": fn(mat["path"])}
        if "parts" in mat:
            mat["parts"] = [{**p, "path": fn(p["path"])} for p in mat["parts"]]
        out["materialized"] = mat
    for key in ("changelog", "channel_state"):
        if key in t or key == "changelog":
            out[key] = [
                {**h, "segments": [{**s, "path": fn(s["path"])} for s in h["segments"]]}
                for h in t.get(key, ())
            ]
    return out
