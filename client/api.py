"""The changelog client of one task (FLIP-158, StateChangelogClient).

``ChangelogClient.open(base_path, node=None)`` writes straight to DFS in-process (the
flat baseline); ``node="tcp://..."`` sends segments to the aggregator node of this
executor, falling back to DFS when the node does not answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import fsspec

from dstltree.client.direct import DirectUploader
from dstltree.client.errors import DstlError
from dstltree.client.handle import ChangelogHandle
from dstltree.client.inflight import DEFAULT_MAX_IN_FLIGHT, InFlightLimit
from dstltree.client.liveness import DEFAULT_LIVENESS_TIMEOUT, DEFAULT_PING_INTERVAL
from dstltree.client.reader import iter_changes, read_changes
from dstltree.client.segment import CODECS
from dstltree.client.uploader import SegmentUploader
from dstltree.client.wire import WIRE_VERSIONS
from dstltree.client.writer import DEFAULT_SQUASH_ENTRIES, ChangelogWriter
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import RESERVED_OBJECTS, ObjectStore

if TYPE_CHECKING:
    from dstltree.security.curve import Curve

DEFAULT_PREEMPTIVE_BYTES = 5 * 1024 * 1024  # Flink DSTL pre-emptive upload threshold


class ChangelogClient:
    """Creates writers and reads handles back. One per task (or per process)."""

    def __init__(
        self,
        store: ObjectStore,
        uploader: SegmentUploader,
        preemptive_bytes: int,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT,
        compression: str | None = None,
    ) -> None:
        if compression is not None and compression not in CODECS:
            raise ValueError(f"unknown segment compression {compression!r} (known: {CODECS})")
        self.store = store
        self.compression = compression
        self.uploader = uploader
        self._preemptive = preemptive_bytes
        self.in_flight = InFlightLimit(max_in_flight_bytes)
        self._writers: list[ChangelogWriter] = []
        self._closed = False

    @classmethod
    def open(
        cls,
        base_path: str,
        node: str | Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        fs: fsspec.AbstractFileSystem | None = None,
        persist_delay: float = 0.0,
        target_object_bytes: int = 1,
        preemptive_bytes: int = DEFAULT_PREEMPTIVE_BYTES,
        ack_timeout: float = 10.0,
        upload_policy: UploadPolicy | None = None,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT,
        security: Curve | None = None,
        compression: str | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
        hold_down: float = 5.0,
        wire_versions: Sequence[int] | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT,
    ) -> ChangelogClient:
        """Open a client on ``base_path`` (fsspec URL).

        ``node=None``: segments are written in-process; ``persist_delay`` (seconds) and
        ``target_object_bytes`` batch the writers of this client into one object (the
        defaults write one object per segment). ``node``: a ZeroMQ endpoint of the
        aggregator node, or several in order of preference (the executor's node first,
        then a neighbour's): a lost connection moves the unacknowledged segments to the
        next one at once, the preferred node gets them back after ``hold_down`` seconds
        up (:class:`~dstltree.client.node_uploader.NodeUploader`); a segment not acked
        within ``ack_timeout`` seconds is written straight to DFS instead.
        ``upload_policy`` sets hedging of in-process uploads
        (default: storage.hedging.UploadPolicy()). Starting an upload blocks while
        more than ``max_in_flight_bytes`` of this client's segments are not yet durable
        (back-pressure on ``append``; Flink's default, 100 MB). ``security``: CURVE to
        the node (``dstltree.security.Curve.for_writer``); None = plaintext.
        ``compression``: ``"zstd"`` compresses each segment's body where that saves
        bytes (recorded in the segment header: readers need no option); None (default)
        = off. ``max_message_bytes``: segment bytes per message to the node (more
        queued at once go in several messages; keep it at or below the node's own
        limit, 64 MiB by default). ``wire_versions``: the node protocol versions
        spoken (None: all, ``client.wire.WIRE_VERSIONS``); a node is pinged every
        ``ping_interval`` seconds and left for the next after ``liveness_timeout``
        seconds of silence (the topology's settings: ``TopologyConfig.link_settings``).
        Raises ValueError for an unknown codec, unknown versions or a liveness timeout
        shorter than the ping interval.
        """
        if compression is not None and compression not in CODECS:
            raise ValueError(f"unknown segment compression {compression!r} (known: {CODECS})")
        store = ObjectStore(
            base_path,
            storage_options,
            fs=fs,
            reserve_objects=RESERVED_OBJECTS if node is None else 0,
        )
        uploader: SegmentUploader
        if node is None:
            uploader = DirectUploader(
                store, persist_delay, target_object_bytes, upload_policy=upload_policy
            )
        else:
            from dstltree.client.node_uploader import NodeUploader

            uploader = NodeUploader(
                node,
                store,
                ack_timeout=ack_timeout,
                upload_policy=upload_policy,
                security=security,
                max_message_bytes=max_message_bytes,
                hold_down=hold_down,
                wire_versions=WIRE_VERSIONS if wire_versions is None else wire_versions,
                ping_interval=ping_interval,
                liveness_timeout=liveness_timeout,
            )
        return cls(store, uploader, preemptive_bytes, max_in_flight_bytes, compression)

    def create_writer(
        self,
        log_id: str,
        key_groups: range,
        *,
        initial_sqn: int = 0,
        squash_entries: int = DEFAULT_SQUASH_ENTRIES,
    ) -> ChangelogWriter:
        """A writer for ``key_groups``; ``log_id`` must be unique among live writers.
        ``squash_entries``: keys its last-wins staging holds before a hand-over folds
        them (0: no last-wins staging, every change is logged; see
        :class:`~dstltree.client.writer.ChangelogWriter`)."""
        w = ChangelogWriter(
            log_id,
            key_groups,
            self.uploader,
            initial_sqn,
            self._preemptive,
            self.in_flight,
            squash_entries=squash_entries,
        )
        w.compression = self.compression
        self._writers.append(w)
        return w

    def read_changes(self, handle: ChangelogHandle, key_group: int) -> Iterator[bytes]:
        """Changes of ``key_group`` within the handle's SQN range, in SQN order."""
        return read_changes(self.store, handle, key_group)

    def iter_changes(
        self, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
    ) -> Iterator[tuple[int, int, bytes]]:
        """(sqn, key_group, change) in SQN order, each segment read once."""
        return iter_changes(self.store, handle, key_groups)

    def close(self) -> None:
        """Close every writer, the uploader (waits for pending uploads: their futures
        resolve) and the store. Idempotent, and quiet after the uploader's own
        ``close``: a writer is closed all the same, it just has no uploader left to
        withdraw from. Raises DstlError only if a writer could not withdraw from an
        uploader that is not closed (its I/O thread stopped), after closing the rest."""
        if self._closed:
            return
        self._closed = True
        failed: DstlError | None = None
        for w in self._writers:
            try:
                w.close()  # marks the writer closed, then withdraws it from the uploader
            except DstlError as e:
                if not getattr(self.uploader, "closed", False):
                    failed = failed or e
        self.uploader.close()
        self.store.close()
        if failed is not None:
            raise failed

    def __enter__(self) -> ChangelogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
