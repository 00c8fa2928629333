"""Events into and instructions out of the node state machine (no I/O).

Convention (as dask/distributed's worker_state_machine.py, shared with the coordinator's
core): events are frozen dataclasses carrying ``now`` (seconds, the shell's monotonic
clock); protocol messages are wrapped, never mirrored; instructions are frozen
dataclasses the shell executes in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from dstltree.client.batching import PersistItem
from dstltree.client.handle import SegmentRef
from dstltree.client.wire import Message


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MessageFromBelow:
    """``message`` from a client or child node, identified by its ROUTER ``identity``."""

    now: float
    identity: bytes
    message: Message


@dataclass(frozen=True)
class MalformedFromBelow:
    """A message from ROUTER ``identity`` that could not be decoded (``reason``)."""

    now: float
    identity: bytes
    reason: str


@dataclass(frozen=True)
class MessageFromUpstream:
    """``message`` from an upstream node (parent, ancestor or planned collector) at
    ``address``: acks for items sent there, or plans from the parent."""

    now: float
    address: str
    message: Message


@dataclass(frozen=True)
class UpstreamLost:
    """The connection to the upstream node at ``address`` was lost (the socket
    monitor saw a disconnect: the peer closed, reset, or missed ZeroMQ heartbeats), or
    with wire version 2 the node sent nothing for the liveness timeout (its loop makes
    no progress) or refused this node's wire versions."""

    now: float
    address: str


@dataclass(frozen=True)
class UpstreamUp:
    """The connection to the upstream node at ``address`` is (again) established (the
    socket monitor saw a completed handshake; with wire version 2: the node's first
    message after it was lost or the link opened)."""

    now: float
    address: str


@dataclass(frozen=True)
class TimePassed:
    """Nothing arrived; deadlines up to ``now`` are due."""

    now: float


@dataclass(frozen=True)
class ObjectWritten:
    """The shell wrote object ``object_id`` at ``path``; ``refs`` align with the items
    of its WriteObject."""

    now: float
    object_id: int
    path: str
    refs: tuple[SegmentRef, ...]


@dataclass(frozen=True)
class ObjectFailed:
    """Writing object ``object_id`` failed with ``error`` (after the upload retries)."""

    now: float
    object_id: int
    error: str


@dataclass(frozen=True)
class ReplyFailed:
    """The shell could not deliver ``message`` to ROUTER ``identity`` (the peer is
    gone or its queue is full): a plan is forgotten as pushed so it is sent again."""

    now: float
    identity: bytes
    message: Message


@dataclass(frozen=True)
class ShuttingDown:
    """The node stops: the batch is written here (no new sends upstream) so that its
    items can still be acked before the sockets close."""

    now: float


Event = (
    MessageFromBelow
    | MalformedFromBelow
    | MessageFromUpstream
    | UpstreamLost
    | UpstreamUp
    | TimePassed
    | ObjectWritten
    | ObjectFailed
    | ReplyFailed
    | ShuttingDown
)


# -- instructions ------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplyBelow:
    """Send ``message`` to the client or child with ROUTER ``identity``."""

    identity: bytes
    message: Message


@dataclass(frozen=True)
class SendUpstream:
    """Send ``message`` to the upstream node at ``address`` (the shell opens at most one
    connection per address, lazily)."""

    address: str
    message: Message


@dataclass(frozen=True)
class WriteObject:
    """Write ``items`` (all with data) as one object off the event loop, then feed back
    ObjectWritten or ObjectFailed with the same ``object_id``."""

    object_id: int
    items: tuple[PersistItem, ...]


Instruction = ReplyBelow | SendUpstream | WriteObject
