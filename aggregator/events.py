"""Events into and instructions out of the node state machine (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from client.batching import PersistItem
from client.handle import SegmentRef
from client.wire import Message


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FromBelow:
    """A message from a client or child node, identified by its ROUTER identity."""

    identity: bytes
    msg: Message
    now: float


@dataclass(frozen=True)
class FromUpstream:
    """A message from an upstream node (parent, ancestor or planned writer) at
    ``address``: acks for items sent there, or plans from the parent."""

    address: str
    msg: Message
    now: float


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class ObjectWritten:
    """The shell wrote object ``object_id``; ``refs`` align with its data items."""

    object_id: int
    path: str
    refs: tuple[SegmentRef, ...]
    now: float


@dataclass(frozen=True)
class ObjectFailed:
    object_id: int
    error: str
    now: float


Event = FromBelow | FromUpstream | Tick | ObjectWritten | ObjectFailed


# -- instructions ------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """Send ``msg`` to the client or child with ROUTER ``identity``."""

    identity: bytes
    msg: Message


@dataclass(frozen=True)
class SendTo:
    """Send ``msg`` to the upstream node at ``address`` (the shell opens at most one
    connection per address, lazily)."""

    address: str
    msg: Message


@dataclass(frozen=True)
class WriteObject:
    """Write ``items`` (all with data) as one object, then feed back ObjectWritten or
    ObjectFailed with the same ``object_id``."""

    object_id: int
    items: tuple[PersistItem, ...]


Instruction = Reply | SendTo | WriteObject
