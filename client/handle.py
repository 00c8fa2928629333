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
        """Inverse of :meth:`to_dict`; ``log_id`` comes from the enclosing handle."""
        meta = SegmentMeta(
            log_id,
            int(d["sqn"][0]),
            int(d["sqn"][1]),
            tuple(int(k) for k in d.get("key_groups", ())),
            int(d["length"]),
            int(d["crc32"]),
        )
        return cls(meta, str(d["path"]), int(d["offset"]))


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
        lo, hi = d["sqn_range"]
        return cls(
            log_id=str(d["log_id"]),
            sqn_range=(int(lo), int(hi)),
            segments=tuple(SegmentRef.from_dict(s, str(d["log_id"])) for s in d["segments"]),
        )
