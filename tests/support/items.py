"""Persist items as a writer makes them, for tests of the upload path."""

from __future__ import annotations

from dstltree.client.batching import PersistItem
from dstltree.client.segment import SegmentMeta, encode_segment, segment_crc, segment_key_groups


def persist_item(log_id: str, sqn: int, changes: dict[int, list[bytes]]) -> PersistItem:
    """One segment of ``log_id`` holding SQN ``sqn`` (``changes``: key group -> changes)."""
    cs = {sqn: changes}
    data = encode_segment(log_id, sqn, sqn + 1, cs)
    meta = SegmentMeta(log_id, sqn, sqn + 1, segment_key_groups(cs), len(data), segment_crc(data))
    return PersistItem(meta, None, data)
