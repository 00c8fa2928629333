"""Changelog handles: what ``persist_durably`` returns (FLIP-158, API and Example).

A handle covers the SQN range [from, to) of one writer and references the segments
holding those changes. Changes of a referenced segment outside the range are filtered
on read (FLIP-158, Example: CP3 reuses segment (T1:T3) with range (T2:T4)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class SegmentRef:
    """One segment inside an object: ``path`` (object URL), ``offset`` and ``length`` in
    bytes, the SQN range [sqn_from, sqn_to) it holds, its key groups and CRC32."""

    sqn_from: int
    sqn_to: int
    path: str
    offset: int
    length: int
    crc32: int
    key_groups: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "offset": self.offset,
            "length": self.length,
            "sqn": [self.sqn_from, self.sqn_to],
            "crc32": self.crc32,
            "key_groups": list(self.key_groups),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SegmentRef:
        return cls(
            sqn_from=int(d["sqn"][0]),
            sqn_to=int(d["sqn"][1]),
            path=str(d["path"]),
            offset=int(d["offset"]),
            length=int(d["length"]),
            crc32=int(d["crc32"]),
            key_groups=tuple(int(k) for k in d.get("key_groups", ())),
        )


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
            segments=tuple(SegmentRef.from_dict(s) for s in d["segments"]),
        )
