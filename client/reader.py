"""Reading handles back: range reads of only the referenced segments, filtered by the
handle's SQN range and by key group (FLIP-158, Example, CP3: "b" filtered on recovery)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from client.errors import CorruptObjectError
from client.handle import ChangelogHandle, SegmentRef
from client.segment import Segment, decode_segment
from client.storage import ObjectStore


def read_segment(store: ObjectStore, ref: SegmentRef, log_id: str | None = None) -> Segment:
    """Range-read and verify one segment. Raises CorruptObjectError (path, offset) or
    StorageError."""
    data = store.read_range(ref.path, ref.offset, ref.length)
    seg = decode_segment(data, ref.path, ref.offset)
    if log_id is not None and seg.log_id != log_id:
        raise CorruptObjectError(
            ref.path, ref.offset, f"segment belongs to log {seg.log_id!r}, not {log_id!r}"
        )
    return seg


def read_changes(store: ObjectStore, handle: ChangelogHandle, key_group: int) -> Iterator[bytes]:
    """Changes of ``key_group`` in SQN order, only those in the handle's SQN range."""
    lo, hi = handle.sqn_range
    for ref in handle.segments:
        if ref.sqn_to <= lo or ref.sqn_from >= hi:
            continue
        if ref.key_groups and key_group not in ref.key_groups:
            continue
        yield from read_segment(store, ref, handle.log_id).changes(key_group, lo, hi)


def iter_changes(
    store: ObjectStore, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """(sqn, key_group, change) of the handle in SQN order, reading each segment once;
    ``key_groups`` restricts the key groups (None: all)."""
    lo, hi = handle.sqn_range
    wanted = None if key_groups is None else set(key_groups)
    for ref in handle.segments:
        if ref.sqn_to <= lo or ref.sqn_from >= hi:
            continue
        if wanted is not None and ref.key_groups and wanted.isdisjoint(ref.key_groups):
            continue
        seg = read_segment(store, ref, handle.log_id)
        for sqn, kg, change in seg.key_group_changes(lo, hi):
            if wanted is None or kg in wanted:
                yield sqn, kg, change
