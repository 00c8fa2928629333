"""In-flight records of unaligned checkpoints (FLIP-76 channel state): how a task logs
them and how a restore gets them back.

A task logs the batches of checkpoint ``cp`` that its snapshot does not hold through
its *channel-state writer* (log ``<job>-t<task>-a<attempt>-cs``, on the same
changelog client, node and objects as its state changes), one change per batch: one
kind byte, then the batch frame as the exchange sent it (``[0, [[key, record],
...]]``, msgpack):

- ``I`` (input channel state): a batch that arrived on a channel before that
  channel's barrier ``cp`` but after the snapshot (or was read, not yet processed, at
  the snapshot);
- ``O`` (output channel state): a batch this task had queued for sending, overtaken
  by its barrier ``cp`` (sent after it, so no receiver logs it again).

Each checkpoint's channel state is one SQN range of that writer, referenced from the
task's acknowledgement (``TaskCheckpoint.channel_state``), so every batch is logged
once for the checkpoint it belongs to. A restore (:func:`restore_inflight`) reads the
channel state of every task of the checkpoint (an output batch may hold records of
any key group), keeps the records of the wanted key groups and returns them in the
order they are processed, before any new record: every input batch, then every
output batch (on one channel the input batches were sent before the output batches:
per key, the order the records were sent in), each batch's records in order. Records
are routed again by key group, so a restore with another parallelism takes each
record exactly once (FLIP-76, "Recovery"; rescaling).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dstltree.client.handle import ChangelogHandle
from dstltree.client.reader import read_segment
from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.sparkplug.exchange import ExchangeError, Key, decode_batch
from dstltree.sparkplug.keygroups import key_group_of
from dstltree.storage.store import ObjectStore

INPUT = b"I"
OUTPUT = b"O"


def channel_log_id(state_log_id: str) -> str:
    """The channel-state writer's log id beside the state writer ``state_log_id``."""
    return f"{state_log_id}-cs"


def input_change(frame: bytes) -> bytes:
    """The change logging ``frame`` as input channel state."""
    return INPUT + frame


def output_change(frame: bytes) -> bytes:
    """The change logging ``frame`` as output channel state."""
    return OUTPUT + frame


@dataclass
class InFlight:
    """Restored in-flight records, in processing order (module docstring), and what
    was read: ``batches`` logged batches, ``bytes_read`` bytes of segments."""

    records: list[tuple[Key, dict[str, Any]]] = field(default_factory=list)
    batches: int = 0
    bytes_read: int = 0


def order_records(
    changes: Iterable[tuple[bytes, str]], wanted: range, max_parallelism: int
) -> tuple[list[tuple[Key, dict[str, Any]]], int]:
    """The records of ``wanted`` key groups in ``changes`` (``(change, where)`` in log
    order, ``where`` naming the segment) in processing order: the input batches' records,
    then the output batches'. Returns (records, batches). Raises ExchangeError naming
    ``where`` for a change that is not a logged batch. Pure."""
    parts: dict[bytes, list[tuple[Key, dict[str, Any]]]] = {INPUT: [], OUTPUT: []}
    batches = 0
    for change, where in changes:
        kind = change[:1]
        if kind not in parts:
            raise ExchangeError(
                f"{where}: not a channel-state change: kind {kind!r} "
                f"({kind[0] if kind else 'none'}) is unknown to this dstltree (it reads "
                f"{INPUT!r}, {OUTPUT!r}); written by a newer version?"
            )
        batches += 1
        out = parts[kind]
        for key, record in decode_batch(change[1:], where):
            if key_group_of(key, max_parallelism) in wanted:
                out.append((key, record))
    return parts[INPUT] + parts[OUTPUT], batches


def restore_inflight(
    store: ObjectStore, checkpoint: CompletedCheckpoint | None, wanted: range
) -> InFlight:
    """The in-flight records of ``checkpoint`` for key groups ``wanted`` (module
    docstring); empty for None or an aligned checkpoint. Raises ExchangeError /
    CorruptObjectError naming the object and offset, StorageError if unreadable."""
    got = InFlight()
    if checkpoint is None:
        return got
    max_p = checkpoint.max_parallelism or wanted.stop
    handles = [h for t in sorted(checkpoint.tasks) for h in checkpoint.tasks[t].channel_state]
    if not handles:
        return got
    got.records, got.batches = order_records(_changes(store, handles, got), wanted, max_p)
    return got


def _changes(
    store: ObjectStore, handles: list[ChangelogHandle], got: InFlight
) -> Iterator[tuple[bytes, str]]:
    for h in handles:
        lo, hi = h.sqn_range
        for ref in h.segments:
            if ref.sqn_to <= lo or ref.sqn_from >= hi or ref.meta.is_marker:
                continue
            seg = read_segment(store, ref, h.log_id)
            got.bytes_read += ref.length
            where = f"{ref.path}@{ref.offset}"
            for (sqn, _kg), changes in sorted(seg.entries.items()):
                if lo <= sqn < hi:
                    for change in changes:
                        yield bytes(change), where
