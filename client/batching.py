"""Pure batching rules shared by the in-process uploader and the aggregator node.

A batch gathers persist items until one of (FLIP-158, Implementation notes):
- ``size``: it holds at least ``target_bytes``;
- ``all-persisted``: every writer expected here has asked to persist for one checkpoint;
- ``delay``: ``persist_delay`` seconds passed since the first pending item.
No I/O and no clock: callers pass ``now`` (seconds, monotonic).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from dstltree.client.futures import SegmentFuture
from dstltree.client.handle import SegmentRef
from dstltree.client.objectformat import Buffer
from dstltree.client.segment import SegmentMeta, segment_size


@dataclass(frozen=True)
class LocalOrigin:
    """An item submitted in this process: its ``future`` gets the segment's reference."""

    future: SegmentFuture[SegmentRef | None] = field(compare=False)


@dataclass(frozen=True)
class RemoteOrigin:
    """An item received by a node: ack it to ROUTER ``identity`` under the sender's
    ``request_id``; ``relayed`` when the sender is a child node (not a local client)."""

    identity: bytes
    request_id: int
    relayed: bool = False


Origin = LocalOrigin | RemoteOrigin

MAX_GROUP_ID = 128  # characters of a flush group's id
MAX_GROUP_PARTS = 4096  # contributors of one flush group
MAX_GROUP_COUNT = 1 << 20  # items one contributor sends for a group


@dataclass(frozen=True)
class FlushGroup:
    """Items that belong in one object: flush group ``gid`` has ``parts`` contributors
    (e.g. the bridges of the hosts that held files of one Structured Streaming batch),
    and contributor ``contributor`` sends ``count`` items of it. The node that writes
    them holds a group's items until all of them arrived (or its ``group_wait``
    passed), so neither the persist delay nor the all-persisted rule cuts it in two
    (aggregator/groups.py)."""

    gid: str
    parts: int
    contributor: str
    count: int

    def __post_init__(self) -> None:
        if not 1 <= len(self.gid) <= MAX_GROUP_ID:
            raise ValueError(f"a flush group id has 1..{MAX_GROUP_ID} characters")
        if not 1 <= len(self.contributor) <= MAX_GROUP_ID:
            raise ValueError(f"a group contributor has 1..{MAX_GROUP_ID} characters")
        if not 1 <= self.parts <= MAX_GROUP_PARTS:
            raise ValueError(f"a flush group has 1..{MAX_GROUP_PARTS} parts, got {self.parts}")
        if not 1 <= self.count <= MAX_GROUP_COUNT:
            raise ValueError(f"a group part has 1..{MAX_GROUP_COUNT} items, got {self.count}")


@dataclass(frozen=True)
class PersistItem:
    """One writer's persist (or pre-emptive upload) request: the segment's ``meta``, the
    ``checkpoint_id`` it was persisted for (None: pre-emptive), its encoded bytes
    ``data`` (one buffer, or a tuple of buffers back to back: a segment whose large
    changes are not copied, :func:`~dstltree.client.segment.encode_segment_parts`; None
    for a marker: "this writer persisted for ``checkpoint_id`` and had no new
    changes") and its ``origin``, whom to ack (None until the receiver sets it).
    ``writers``: None for a writer's own item (counted once by its log id for the
    all-persisted rule); for a node's summary marker, the number of writers it stands
    for (:meth:`summary`). ``group``: the flush group it belongs to, if any."""

    meta: SegmentMeta
    checkpoint_id: int | None
    data: Buffer | tuple[Buffer, ...] | None = field(default=None, repr=False)
    origin: Origin | None = None
    writers: int | None = None
    group: FlushGroup | None = None

    @classmethod
    def marker(cls, log_id: str, sqn: int, checkpoint_id: int) -> PersistItem:
        """A data-less item: writer ``log_id`` persisted for ``checkpoint_id`` up to ``sqn``."""
        return cls(SegmentMeta(log_id, sqn, sqn), checkpoint_id)

    @classmethod
    def summary(cls, node_id: str, checkpoint_id: int, writers: int) -> PersistItem:
        """A data-less item from node ``node_id``: ``writers`` (>= 1) writers persisted
        for ``checkpoint_id`` and their items were written below; the node upstream
        adds it to that checkpoint's count (one item instead of one marker per writer)."""
        return cls(SegmentMeta(node_id, 0, 0), checkpoint_id, writers=writers)

    @property
    def size(self) -> int:
        """Bytes of ``data`` (0 for a marker)."""
        return 0 if self.data is None else segment_size(self.data)

    def from_origin(self, origin: Origin | None) -> PersistItem:
        """This item with ``origin`` (built directly: ``dataclasses.replace`` costs
        several times more per item on the node's hot path)."""
        return PersistItem(
            self.meta, self.checkpoint_id, self.data, origin, self.writers, self.group
        )

    def in_group(self, group: FlushGroup | None) -> PersistItem:
        """This item as a member of flush ``group``."""
        return PersistItem(
            self.meta, self.checkpoint_id, self.data, self.origin, self.writers, group
        )

    def future(self) -> SegmentFuture[SegmentRef | None]:
        """The future of a :class:`LocalOrigin` item; TypeError for any other origin."""
        if not isinstance(self.origin, LocalOrigin):
            raise TypeError(f"{self.meta.log_id}: not a local item ({self.origin!r})")
        return self.origin.future


@dataclass
class Batch:
    """Items waiting to be written (or forwarded) together."""

    target_bytes: int
    persist_delay: float
    items: list[PersistItem] = field(default_factory=list)
    nbytes: int = 0
    first_at: float | None = None
    unnumbered: bool = False  # an item without a checkpoint id is batched
    _persisted: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    _summed: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, item: PersistItem, now: float) -> None:
        if not self.items:
            self.first_at = now
        self.items.append(item)
        self.nbytes += item.size
        cp = item.checkpoint_id
        if cp is None:
            self.unnumbered = True
        else:
            if item.writers is None:
                self._persisted[cp].add(item.meta.log_id)
            else:  # a node's summary marker: writers counted below it
                self._summed[cp] += item.writers

    def _checkpoints(self) -> Iterable[int]:
        """The checkpoints counted here (no copy unless summaries arrived)."""
        if not self._summed:
            return self._persisted.keys()
        return self._persisted.keys() | self._summed.keys()

    def checkpoints(self) -> Iterator[int | None]:
        """The checkpoint ids of the batched items (None for items without one), and
        after a size cut those of the checkpoints it still counts; lazily (a caller
        may stop at the first that matters)."""
        if self.unnumbered:
            yield None
        yield from self._checkpoints()

    def persisted(self, checkpoint: int) -> int:
        """Writers known to have persisted for ``checkpoint`` (own items by log id, plus
        the nodes' summaries)."""
        return len(self._persisted.get(checkpoint, ())) + self._summed.get(checkpoint, 0)

    def due(self, now: float, expected_writers: int) -> str | None:
        """Why the batch must be flushed now, or None."""
        if not self.items:
            return None
        if self.nbytes >= self.target_bytes:
            return "size"
        if expected_writers > 0 and any(
            self.persisted(c) >= expected_writers for c in self._checkpoints()
        ):
            return "all-persisted"
        if self.first_at is not None and now - self.first_at >= self.persist_delay:
            return "delay"
        return None

    def deadline(self) -> float | None:
        """When the delay rule fires (None when empty)."""
        return None if self.first_at is None else self.first_at + self.persist_delay

    def take(self, reason: str | None = None, expected_writers: int = 0) -> list[PersistItem]:
        """Empty the batch. After a ``size`` cut the writers that already persisted for
        a checkpoint not yet complete (fewer than ``expected_writers``) stay counted, so
        the rest of that checkpoint still flushes as soon as its last writer persists
        (not only after the persist delay); complete checkpoints, and everything after
        other flushes, are forgotten."""
        items = self.items
        self.items = []
        self.nbytes = 0
        self.first_at = None
        self.unnumbered = False
        if reason == "size":
            kept = [c for c in self._checkpoints() if self.persisted(c) < expected_writers]
            self._persisted = defaultdict(
                set, {c: self._persisted[c] for c in kept if c in self._persisted}
            )
            self._summed = defaultdict(int, {c: self._summed[c] for c in kept if c in self._summed})
        else:
            self._persisted = defaultdict(set)
            self._summed = defaultdict(int)
        return items

    def __len__(self) -> int:
        return len(self.items)
