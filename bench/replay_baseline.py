"""The restore BASELINE of the hot-path suite: a faithful copy of the changelog replay
of commit 9a5af1e (before squashing and bulk replay), kept only to be timed next to
the product's restore in the same run (``restore ... x the replay of 9a5af1e``).

Per segment: one range read, CRC32 over the segment, the header unpacked, every change
copied out as its own ``bytes``; then, entries sorted, per change: ``msgpack.unpackb``
of the whole change, the state declared, the key re-packed and its key group checked,
the value re-packed and stored (``KeyedStateBackend.apply_change`` and ``_replay`` of
9a5af1e). Not product code: nothing outside the bench may import it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import msgpack

from dstltree.client.errors import CorruptObjectError
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import decode_segment, encode_segment, segment_crc
from dstltree.sparkplug.state_backend import (
    LIST,
    MAP,
    OP_LIST_ADD,
    OP_LIST_SET,
    OP_MAP_PUT,
    OP_MAP_REMOVE,
    OP_VALUE_SET,
    VALUE,
    KeyedStateBackend,
)
from dstltree.storage.store import ObjectStore

_U32 = struct.Struct("!I")
_KIND = {0: VALUE, 1: VALUE, 2: MAP, 3: MAP, 4: MAP, 5: LIST, 6: LIST, 7: LIST}


def as_written_by_9a5af1e(store: ObjectStore, handle: ChangelogHandle) -> ChangelogHandle:
    """The same changes as ``handle``, each segment re-encoded in the segment format
    9a5af1e wrote (version 1) and stored as its own object: what the baseline reads
    (the product's restore reads ``handle`` itself)."""
    refs = []
    for ref in handle.segments:
        if ref.meta.is_marker:
            refs.append(ref)
            continue
        seg = decode_segment(store.read_range(ref.path, ref.offset, ref.length), ref.path)
        changesets: dict[int, dict[int, list[bytes]]] = {}
        for (sqn, kg), changes in seg.entries.items():
            changesets.setdefault(sqn, {})[kg] = changes
        data = encode_segment(seg.log_id, seg.sqn_from, seg.sqn_to, changesets, version=1)
        path = store.new_object_path()
        store.put(path, data)
        meta = replace(ref.meta, length=len(data), crc32=segment_crc(data))
        refs.append(SegmentRef(meta, path, 0))
    return replace(handle, segments=tuple(refs))


def baseline_replay(store: ObjectStore, handle: ChangelogHandle, into: KeyedStateBackend) -> int:
    """Replay every change of ``handle`` into ``into`` as 9a5af1e did (no squash; its
    ``_replay_handle``). Returns the number of changes applied. Raises ValueError /
    CorruptObjectError."""
    lo, hi = handle.sqn_range
    wanted = into.key_groups
    applied = 0
    for ref in handle.segments:
        if ref.sqn_to <= lo or ref.sqn_from >= hi or ref.meta.is_marker:
            continue
        if ref.key_groups and not any(kg in wanted for kg in ref.key_groups):
            continue
        data = store.read_range(ref.path, ref.offset, ref.length)
        entries = _decode_v1(data, ref.path, ref.offset)
        for _, kg, change in _key_group_changes(entries, lo, hi):
            if kg in wanted:
                _apply_change(into, kg, change)
                applied += 1
    return applied


def _key_group_changes(
    entries: dict[tuple[int, int], list[bytes]], sqn_from: int, sqn_to: int
) -> Iterator[tuple[int, int, bytes]]:
    """9a5af1e's ``DecodedSegment.key_group_changes``."""
    for (sqn, kg), values in sorted(entries.items()):
        if sqn_from <= sqn < sqn_to:
            for v in values:
                yield sqn, kg, v


def _decode_v1(data: bytes, path: str, offset: int) -> dict[tuple[int, int], list[bytes]]:
    """9a5af1e's ``decode_segment`` hot work (a version-1 segment): CRC, header, one
    ``bytes`` copy per change out of a memoryview of the body, each bound checked."""
    buf = memoryview(data)
    if _U32.unpack_from(buf, len(buf) - 4)[0] != zlib.crc32(buf[:-4]):
        raise CorruptObjectError(path, offset, "segment checksum mismatch")
    hlen = _U32.unpack_from(buf, 0)[0]
    header = msgpack.unpackb(buf[4 : 4 + hlen])
    if header.get("v") != 1:
        raise CorruptObjectError(path, offset, "the baseline reads version 1 only")
    body = buf[4 + hlen : -4]
    entries: dict[tuple[int, int], list[bytes]] = {}
    for sqn, kg, count, start, length in header["entries"]:
        out, pos, end = [], start, start + length
        for _ in range(count):
            if pos + 4 > end:
                raise CorruptObjectError(path, offset + pos, "truncated change length")
            n = _U32.unpack_from(body, pos)[0]
            pos += 4
            if pos + n > end:
                raise CorruptObjectError(path, offset + pos, "truncated change")
            out.append(bytes(body[pos : pos + n]))
            pos += n
        entries[(sqn, kg)] = out
    return entries


def _apply_change(b: KeyedStateBackend, key_group: int, change: bytes) -> None:
    """9a5af1e's ``KeyedStateBackend.apply_change`` (errors aside)."""
    if key_group not in b.key_groups:
        return
    op, name, key, *rest = msgpack.unpackb(change, strict_map_key=False)
    groups = b._declare(name, _KIND[op])
    kb = b._pack(key)
    b._check_group(kb, key_group)
    bucket = groups.get(key_group)
    if bucket is None:
        bucket = groups[key_group] = {}
    _replay(b, op, bucket, kb, rest)


def _replay(b: KeyedStateBackend, op: int, bucket: dict[bytes, Any], kb: bytes, rest: Any) -> None:
    """9a5af1e's ``KeyedStateBackend._replay``."""
    pack = b._pack
    if op == OP_VALUE_SET:
        bucket[kb] = pack(rest[0])
    elif op == OP_MAP_PUT:
        m = bucket.get(kb)
        if m is None:
            m = bucket[kb] = {}
        m[pack(rest[0])] = pack(rest[1])
    elif op == OP_MAP_REMOVE:
        m = bucket.get(kb)
        if m is not None:
            m.pop(pack(rest[0]), None)
            if not m:
                del bucket[kb]
    elif op == OP_LIST_ADD:
        lst = bucket.get(kb)
        if lst is None:
            bucket[kb] = [pack(rest[0])]
        else:
            lst.append(pack(rest[0]))
    elif op == OP_LIST_SET:
        values = [pack(v) for v in rest[0]]
        if values:
            bucket[kb] = values
        else:
            bucket.pop(kb, None)
    else:
        bucket.pop(kb, None)
