"""Reading objects back through an :class:`ObjectStore`: an object's index (footer, then
index: two range reads), and handles, with range reads of only the referenced segments,
filtered by the handle's SQN range and by key group (FLIP-158, Example, CP3: "b"
filtered on recovery). The store moves bytes; every check of what they mean is here:
a segment read by reference must be exactly the segment the reference describes (log
id, SQN range, key groups, length, CRC32), and an index must describe its object."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dstltree.client.errors import CorruptObjectError
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.objectformat import FOOTER_SIZE, parse_footer, parse_index, verify_segments
from dstltree.client.segment import DecodedSegment, check_segment, decode_segment
from dstltree.storage.store import ObjectStore


def read_exact(store: ObjectStore, url: str, offset: int, length: int) -> bytes:
    """``length`` bytes of object ``url`` at ``offset``. Raises CorruptObjectError (at the
    offset where the object ends) if it ends early, StorageError for storage failures."""
    data = store.read_range(url, offset, length)
    if len(data) != length:
        raise CorruptObjectError(
            url,
            offset + len(data),
            f"truncated: wanted {length} bytes at {offset}, got {len(data)}",
        )
    return data


def read_index(store: ObjectStore, url: str, verify: bool = True) -> list[SegmentRef]:
    """The segment index of object ``url`` (layout in client/objectformat.py). With
    ``verify`` (default) the whole object is read once and every index entry is
    cross-checked against the segment it points to (:func:`verify_segments`); without,
    two range reads (footer, then index) and only the index's own checks. Raises
    CorruptObjectError (path, offset), StorageError."""
    size = store.size(url)
    if size < FOOTER_SIZE:
        raise CorruptObjectError(url, 0, f"object of {size} bytes is too short for a footer")
    if not verify:
        tail = read_exact(store, url, size - FOOTER_SIZE, FOOTER_SIZE)
        footer = parse_footer(tail, url, size, lambda o, n: read_exact(store, url, o, n))
        data = read_exact(store, url, footer.index_offset, footer.index_length)
        return parse_index(data, url, footer)
    whole = memoryview(read_exact(store, url, 0, size))
    footer = parse_footer(whole[size - FOOTER_SIZE :], url, size, lambda o, n: whole[o : o + n])
    start, end = footer.index_offset, footer.index_offset + footer.index_length
    refs = parse_index(whole[start:end], url, footer)
    verify_segments(refs, whole[:start])
    return refs


def read_segment(
    store: ObjectStore, ref: SegmentRef, log_id: str | None = None, *, copy: bool = True
) -> DecodedSegment:
    """Range-read and verify one segment, and check it is the segment ``ref`` describes
    (log id, SQN range, key groups, length, CRC32) and belongs to ``log_id`` when given.
    ``copy`` False: changes are read-only memoryview slices (:func:`decode_segment`).
    Raises CorruptObjectError (path, offset) or StorageError."""
    data = read_exact(store, ref.path, ref.offset, ref.length)
    seg = decode_segment(data, ref.path, ref.offset, copy=copy)
    if log_id is not None and seg.log_id != log_id:
        raise CorruptObjectError(
            ref.path, ref.offset, f"segment belongs to log {seg.log_id!r}, not {log_id!r}"
        )
    check_segment(seg, ref.meta, ref.path, ref.offset)
    return seg


def read_changes(store: ObjectStore, handle: ChangelogHandle, key_group: int) -> Iterator[bytes]:
    """Changes of ``key_group`` in SQN order, only those in the handle's SQN range."""
    lo, hi = handle.sqn_range
    for ref in handle.segments:
        if ref.sqn_to <= lo or ref.sqn_from >= hi or ref.meta.is_marker:
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
        if ref.sqn_to <= lo or ref.sqn_from >= hi or ref.meta.is_marker:
            continue
        if wanted is not None and ref.key_groups and wanted.isdisjoint(ref.key_groups):
            continue
        seg = read_segment(store, ref, handle.log_id)
        for sqn, kg, change in seg.key_group_changes(lo, hi):
            if wanted is None or kg in wanted:
                yield sqn, kg, change
