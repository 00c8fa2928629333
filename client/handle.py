"""Changelog handles: what ``persist_durably`` returns (FLIP-158, API and Example).

A handle covers the SQN range [from, to) of one writer and references the segments
holding those changes. Changes of a referenced segment outside the range are filtered
on read (FLIP-158, Example: CP3 reuses segment (T1:T3) with range (T2:T4)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dstltree.client.segment import SegmentMeta


@dataclass(frozen=True)
class SegmentRef:
    """One segment inside an object: its :class:`SegmentMeta` plus where it lies,
    ``path`` (object URL) and ``offset`` in bytes. Handles, acks and the object index
    (``objectformat.parse_index``) all use this one record."""

    meta: SegmentMeta
    path: str
    offset: int

    @property
    def log_id(self) -> str:
        return self.meta.log_id

    @property
    def sqn_from(self) -> int:
        return self.meta.sqn_from

    @property
    def sqn_to(self) -> int:
        return self.meta.sqn_to

    @property
    def key_groups(self) -> tuple[int, ...]:
        return self.meta.key_groups

    @property
    def length(self) -> int:
        return self.meta.length

    @property
    def crc32(self) -> int:
        """The segment's trailer checksum (CRC32C for segment version 2, CRC32 for
        version 1); the persisted field keeps the name ``crc32``."""
        return self.meta.crc32

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint-metadata form (field names are persisted: do not change)."""
        return {
            "path": self.path,
            "offset": self.offset,
            "length": self.length,
            "sqn": [self.sqn_from, self.sqn_to],
            "crc32": self.crc32,
            "key_groups": list(self.key_groups),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], log_id: str) -> SegmentRef:
        """Inverse of :meth:`to_dict`; ``log_id`` comes from the enclosing handle.
        Raises KeyError (a missing field), TypeError or ValueError (a field of the wrong
        type, a negative integer, a reversed SQN range, a CRC32 of 2**32 or more)."""
        lo, hi = _range(d["sqn"], "sqn")
        crc = _uint(d["crc32"], "crc32")
        if crc >= 1 << 32:
            raise ValueError(f"crc32 {crc} does not fit 32 bits")
        kgs = tuple(_uint(k, "key_groups") for k in _list(d.get("key_groups", []), "key_groups"))
        meta = SegmentMeta(log_id, lo, hi, kgs, _uint(d["length"], "length"), crc)
        return cls(meta, _str(d["path"], "path"), _uint(d["offset"], "offset"))


def _uint(x: Any, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ValueError(f"{what}: expected a non-negative integer, got {x!r}")
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{what}: expected a string, got {type(x).__name__}")
    return x


def _list(x: Any, what: str) -> list[Any]:
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{what}: expected a list, got {type(x).__name__}")
    return list(x)


def _range(x: Any, what: str) -> tuple[int, int]:
    pair = _list(x, what)
    if len(pair) != 2:
        raise ValueError(f"{what}: expected [from, to], got {x!r}")
    lo, hi = _uint(pair[0], what), _uint(pair[1], what)
    if hi < lo:
        raise ValueError(f"{what}: range [{lo}, {hi}) is reversed")
    return lo, hi


@dataclass(frozen=True)
class ChangelogHandle:
    """The durable changes of writer ``log_id`` in SQN range [from, to).

    ``segments`` are in SQN order; every change of the range is in exactly one of them
    (a segment may also hold changes outside the range, which readers skip).
    """

    log_id: str
    sqn_range: tuple[int, int]
    segments: tuple[SegmentRef, ...] = ()

    def object_paths(self) -> frozenset[str]:
        """Paths of every object this handle references (for the shared state registry)."""
        return frozenset(s.path for s in self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.length for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "log_id": self.log_id,
            "sqn_range": list(self.sqn_range),
            "segments": [s.to_dict() for s in self.segments],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChangelogHandle:
        """Inverse of :meth:`to_dict`. Raises KeyError, TypeError or ValueError for a
        malformed record (see :meth:`SegmentRef.from_dict`)."""
        log_id = _str(d["log_id"], "log_id")
        segments = _list(d["segments"], "segments")
        for s in segments:
            if not isinstance(s, dict):
                raise TypeError(f"segments: expected a map, got {type(s).__name__}")
        return cls(
            log_id=log_id,
            sqn_range=_range(d["sqn_range"], "sqn_range"),
            segments=tuple(SegmentRef.from_dict(s, log_id) for s in segments),
        )
