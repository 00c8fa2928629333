"""Wire messages between writers, nodes and parents: pure ``dump``/``load``.

A message is a multipart ZeroMQ message ``[header, payload_0, payload_1, ...]``: the
header is msgpack, each segment travels as its own frame, or as ``n`` frames back to
back (its large changes, never copied, between its framing), and is never re-encoded
on the way up the tree (nodes pass the received frames on with ``copy=False``).

Header shapes (``t`` is the type)::

    register    {t, log}                      a writer of this client exists
    unregister  {t, log}
    persist     {t, items: [{id, log, sqn: [from, to], cp, kgs, size, crc, w?, n?}, ...], via}
                + ``n`` (1..64, default 1; above 1 only for 256 KiB or more) payload
                frames per item with size > 0, in item order, their bytes summing
                to ``size``; ``via`` is the sending node's id when a node passes
                items on (None from clients);
                ``w`` only on a node's summary marker (size 0): the writers it stands for;
                ``g`` [group id, parts, contributor, count] on an item of a flush group
                (client/batching.py FlushGroup; aggregator/groups.py)
    ack         {t, items: [{id, path, off} | {id, err}, ...]}
    stats       {t, node, writers, bytes, cp, pw}
                                              a child's residual writers and bytes per
                                              checkpoint, the highest checkpoint it saw
                                              and the newest plan window it holds (``pw``
                                              optional: -1 none, absent unknown)
    plan        {t, window, collector, address, ancestors: [[id, address], ...]}
                                              the collector (the node that writes the
                                              object) for a plan window
    error       {t, msg}                      the request was rejected (malformed, oversized)

Version 2 adds (``VERSION_2_TYPES``)::

    hello       {t, v: [versions]}            first on a new connection: the versions the
                                              sender speaks (1..16 of them, each 1..65535)
                {t, v: version, node}         the node's answer: the highest common one
    ping        {t, seq}                      are you making progress? (``seq`` 0..2**63-1)
    pong        {t, seq}                      the answer from the node's loop (same seq)
    note        {t, to, frm, body, via}       a small message between clients of the tree
                                              (bridges of different hosts): ``frm`` the
                                              sender's name (1..64 characters), ``to`` the
                                              receiver's, ``*`` for every client, ``""``
                                              for none (the sender only subscribes);
                                              ``body`` opaque bytes (at most
                                              ``MAX_NOTE_BYTES``); ``via`` the node passing
                                              it on (None from a client). Routed by
                                              aggregator/notes.py.

Versions. ``WIRE_VERSION`` (2) is this code's; it speaks ``WIRE_VERSIONS`` (1, 2) unless
configured otherwise (a node's ``wire_versions`` in the topology, a writer's
``NodeUploader(wire_versions=...)``). Version 1 is the protocol without the types above:
a peer that never sends ``hello`` is a version-1 peer and is served as before; a node
speaking version 1 only answers ``hello`` (and ``ping``) with an ``error`` "unknown message
type 'hello'", which a writer or child takes as "this node speaks version 1" and goes on
(a ping answered so still shows the node's loop alive). A sender speaking version 1 only
sends no hello and no ping (the previous release). When a hello finds no common version
the node answers with an ``error`` starting with ``REFUSAL`` that names both sides'
versions (:func:`refusal`), counts it, and from then on keeps refusing every other
message of that peer (connection) with the same error (persist items get error acks)
until a hello from it finds a common version; the peer takes the node as down. A node
that does not speak version 1 refuses the messages of a peer that sent no hello
(:class:`dstltree.aggregator.core.NodeCore`). :func:`load` decodes only the types of the
versions it is given (``versions``): the others are "unknown message type".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from dstltree.client.batching import FlushGroup, PersistItem
from dstltree.client.errors import WireError
from dstltree.client.segment import (
    MAX_SEGMENT_PARTS,
    SPLIT_FROM_BYTES,
    SegmentMeta,
    segment_parts,
    segment_size,
)

WIRE_VERSION = 2  # this code's version of the protocol
WIRE_VERSIONS: tuple[int, ...] = (1, 2)  # the versions it speaks, by default
VERSION_2_TYPES = frozenset(
    {"hello", "ping", "pong", "note"}
)  # types a version-1 peer does not know
MAX_VERSIONS = 16  # versions a hello may list
MAX_VERSION = 65535
MAX_SEQ = (1 << 63) - 1
REFUSAL = "no common wire version"  # how a node's refusal of a hello starts
UNKNOWN_TYPE = "unknown message type"  # how a node's answer to a type it does not know starts
MAX_ITEMS = 4096
MAX_NOTE_NAME = 64  # characters of a note's sender or receiver name
MAX_NOTE_BYTES = 16 * 1024  # bytes of a note's body
BROADCAST = "*"  # a note's receiver: every client of the tree
MAX_LOG_ID = 256
MAX_WRITERS = 1 << 20  # residual writers a Stats may claim
MAX_STATS_BYTES = float(1 << 62)  # bytes per checkpoint a Stats may claim
_SEQUENCES = (list, tuple)  # a tuple: ``list | tuple`` would build a union per call
_NUMBERS = (int, float)


@dataclass(frozen=True)
class PersistRequest:
    """One item of a ``persist`` message under the sender's request ``id`` (acks name
    it); the item's data (if any) travels as a separate frame."""

    id: int
    item: PersistItem

    def to_wire(self) -> dict[str, Any]:
        m = self.item.meta
        d = {
            "id": self.id,
            "log": m.log_id,
            "sqn": [m.sqn_from, m.sqn_to],
            "cp": self.item.checkpoint_id,
            "kgs": list(m.key_groups),
            "size": m.length,
            "crc": m.crc32,
        }
        if self.item.writers is not None:
            d["w"] = self.item.writers
        if type(self.item.data) is tuple:
            d["n"] = len(self.item.data)
        if (g := self.item.group) is not None:
            d["g"] = [g.gid, g.parts, g.contributor, g.count]
        return d


@dataclass(frozen=True)
class AckEntry:
    """The outcome of request ``id``: where its segment landed (``path``, ``offset``;
    the sender knows the rest of its :class:`SegmentMeta`), or an ``error``."""

    id: int
    path: str | None = None
    offset: int = 0
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        if self.error is not None:
            return {"id": self.id, "err": self.error}
        return {"id": self.id, "path": self.path, "off": self.offset}


@dataclass(frozen=True)
class Register:
    log_id: str


@dataclass(frozen=True)
class Unregister:
    log_id: str


@dataclass(frozen=True)
class Persist:
    """Persist requests; items' data are bytes, memoryviews or zmq.Frames."""

    requests: tuple[PersistRequest, ...]
    via: str | None = None

    def payloads(self) -> list[Any]:
        """The data frames, in request order (requests without data have none; a
        segment sent as several buffers has one frame each, ``n`` in its item)."""
        return [
            p for r in self.requests if r.item.data is not None for p in segment_parts(r.item.data)
        ]


def persist_messages(
    requests: Sequence[PersistRequest], max_bytes: int, via: str | None = None
) -> list[Persist]:
    """``requests`` in order as Persist messages of at most ``max_bytes`` segment bytes
    and MAX_ITEMS requests each (a request above ``max_bytes`` goes alone); one message
    per call at least (an empty one for no requests)."""
    out: list[Persist] = []
    start, nbytes = 0, 0
    for k, r in enumerate(requests):
        size = r.item.size
        if k > start and (nbytes + size > max_bytes or k - start >= MAX_ITEMS):
            out.append(Persist(tuple(requests[start:k]), via))
            start, nbytes = k, 0
        nbytes += size
    out.append(Persist(tuple(requests[start:]), via))
    return out


@dataclass(frozen=True)
class PersistAck:
    items: tuple[AckEntry, ...]


@dataclass(frozen=True)
class Stats:
    """A node's report to its parent: residual writers and bytes per checkpoint (those
    not written inside its subtree), the highest checkpoint id it has seen and the
    newest plan window it holds (-1: none; None: not reported, older senders)."""

    node: str
    writers: int
    bytes_per_checkpoint: float = 0.0
    max_checkpoint: int = -1
    plan_window: int | None = None


@dataclass(frozen=True)
class Plan:
    """Plan window ``window``: the receiving node's parent routes to ``collector`` (node
    id) at ``address``; ``ancestors`` are (id, address) of the receiver's ancestors,
    nearest first (for re-homing when the parent is gone)."""

    window: int
    collector: str
    address: str
    ancestors: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Error:
    message: str


@dataclass(frozen=True)
class WireHello:
    """Version negotiation (version 2). From a writer or child: ``versions`` it speaks,
    ``node`` None. The node's answer: ``versions`` holds the one chosen (the highest
    common), ``node`` its id."""

    versions: tuple[int, ...]
    node: str | None = None


@dataclass(frozen=True)
class Ping:
    """A heartbeat from a writer or child (version 2); the node's loop answers with a
    :class:`Pong` of the same ``seq``."""

    seq: int


@dataclass(frozen=True)
class Pong:
    seq: int


@dataclass(frozen=True)
class Note:
    """A small message from client ``frm`` to client ``to`` (``BROADCAST``: all; "": none,
    the sender subscribes under ``frm``), carried by the nodes of the tree over their
    authenticated sockets; ``body`` is opaque to them. ``via``: the node that passed it
    on (None from a client)."""

    to: str
    frm: str
    body: bytes
    via: str | None = None

    def __post_init__(self) -> None:
        if len(self.to) > MAX_NOTE_NAME or not 1 <= len(self.frm) <= MAX_NOTE_NAME:
            raise ValueError(f"note names have at most {MAX_NOTE_NAME} characters")
        if self.frm == BROADCAST:
            raise ValueError(f"{BROADCAST!r} names no sender")
        if len(self.body) > MAX_NOTE_BYTES:
            raise ValueError(f"a note body has at most {MAX_NOTE_BYTES} bytes")


Message = (
    Register
    | Unregister
    | Persist
    | PersistAck
    | Stats
    | Plan
    | Error
    | WireHello
    | Ping
    | Pong
    | Note
)


def check_versions(versions: Sequence[int], what: str = "wire_versions") -> tuple[int, ...]:
    """``versions`` as a sorted tuple without repeats. Raises ValueError (naming
    ``what``) unless it holds 1..MAX_VERSIONS integers within 1..MAX_VERSION."""
    out = tuple(sorted(set(versions)))
    if not 1 <= len(out) <= MAX_VERSIONS:
        raise ValueError(f"{what}: 1..{MAX_VERSIONS} versions needed, got {list(versions)}")
    if any(type(v) is not int or not 1 <= v <= MAX_VERSION for v in out):
        raise ValueError(f"{what}: versions are integers 1..{MAX_VERSION}, got {list(versions)}")
    return out


def common_version(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The highest version both sides speak, or None."""
    both = set(ours) & set(theirs)
    return max(both) if both else None


def refusal(ours: Sequence[int], theirs: Sequence[int] | None) -> str:
    """The error text of a node refusing a peer: ``REFUSAL``, then both sides' versions
    (``theirs`` None: the peer sent no hello, so it speaks version 1)."""
    peer = "[1] (it sent no hello)" if theirs is None else str(sorted(theirs))
    return f"{REFUSAL}: this node speaks {sorted(ours)}, the peer {peer}"


def is_refusal(msg: Message) -> bool:
    """Whether ``msg`` is a node's refusal of this peer's wire versions."""
    return isinstance(msg, Error) and msg.message.startswith(REFUSAL)


def unknown_type(msg: Message) -> str | None:
    """The message type an ``Error`` says the node does not know (a version-1 node
    answering ``hello`` or ``ping``), else None."""
    if isinstance(msg, Error) and msg.message.startswith(UNKNOWN_TYPE):
        return msg.message[len(UNKNOWN_TYPE) :].strip(" '\"")
    return None


def speaks_version_2(versions: Sequence[int]) -> bool:
    """Whether a side speaking ``versions`` knows the version-2 types (hello, ping)."""
    return any(v >= 2 for v in versions)


def dump(msg: Message) -> list[Any]:
    """Frames of ``msg``: the msgpack header, then payload frames untouched."""
    payloads: Sequence[Any] = ()
    match msg:
        case Register(log_id):
            h: dict[str, Any] = {"t": "register", "log": log_id}
        case Unregister(log_id):
            h = {"t": "unregister", "log": log_id}
        case Persist(requests, via):
            h = {"t": "persist", "items": [r.to_wire() for r in requests], "via": via}
            payloads = msg.payloads()
        case PersistAck(items):
            h = {"t": "ack", "items": [a.to_wire() for a in items]}
        case Stats(node, writers, nbytes, cp, pw):
            h = {"t": "stats", "node": node, "writers": writers, "bytes": nbytes, "cp": cp}
            if pw is not None:
                h["pw"] = pw
        case Plan(window, collector, address, ancestors):
            h = {
                "t": "plan",
                "window": window,
                "collector": collector,
                "address": address,
                "ancestors": [list(a) for a in ancestors],
            }
        case Error(message):
            h = {"t": "error", "msg": message}
        case WireHello(versions, node):
            h = {"t": "hello", "v": list(versions)} if node is None else _hello_reply(msg)
        case Ping(seq):
            h = {"t": "ping", "seq": seq}
        case Pong(seq):
            h = {"t": "pong", "seq": seq}
        case Note(to, frm, body, via):
            h = {"t": "note", "to": to, "frm": frm, "body": body, "via": via}
        case _:
            raise TypeError(f"not a message: {msg!r}")
    return [msgpack.packb(h), *payloads]


def _hello_reply(msg: WireHello) -> dict[str, Any]:
    if len(msg.versions) != 1:
        raise ValueError(f"a hello answer names one version, got {list(msg.versions)}")
    return {"t": "hello", "v": msg.versions[0], "node": msg.node}


def load(
    frames: Sequence[Any], max_bytes: int | None = None, versions: Sequence[int] = WIRE_VERSIONS
) -> Message:
    """Decode and validate ``frames`` (bytes or zmq.Frame) as a side speaking
    ``versions`` would: a type of no version in it is "unknown message type" (a
    version-1 side does not know ``hello``). Raises WireError with the reason for
    anything malformed or larger than ``max_bytes`` in total."""
    if not frames:
        raise WireError("empty message")
    if max_bytes is not None:
        total = sum(map(segment_size, frames))
        if total > max_bytes:
            raise WireError(f"message of {total} bytes exceeds the limit of {max_bytes} bytes")
    raw = frames[0]
    try:
        header = msgpack.unpackb(getattr(raw, "bytes", raw))
    except Exception as e:  # noqa: BLE001 - any decode failure is a malformed message
        raise WireError(f"header is not msgpack: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise WireError("header must be a map with a string 't'")
    if header["t"] in VERSION_2_TYPES and not speaks_version_2(versions):
        raise WireError(f"{UNKNOWN_TYPE} {header['t']!r}")
    try:
        return _decode(header, frames[1:])
    except WireError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise WireError(f"bad {header['t']!r} message: {type(e).__name__}: {e}") from e


def _decode(h: dict[str, Any], payloads: Sequence[Any]) -> Message:
    t = h["t"]
    if t in ("register", "unregister"):
        log = _log_id(h["log"])
        return Register(log) if t == "register" else Unregister(log)
    if t == "persist":
        return _decode_persist(h, payloads)
    if t == "ack":
        return PersistAck(tuple(_ack_entry(a) for a in _list(h["items"])))
    if t == "stats":
        return _decode_stats(h)
    if t == "plan":
        ancestors = tuple((_str(a[0]), _str(a[1])) for a in _list(h.get("ancestors", [])))
        return Plan(_int(h["window"]), _str(h["collector"]), _str(h["address"]), ancestors)
    if t == "error":
        return Error(_str(h["msg"]))
    if t == "hello":
        return _decode_hello(h)
    if t in ("ping", "pong"):
        seq = _int(h["seq"])
        if seq > MAX_SEQ:
            raise WireError(f"{t} seq must be <= {MAX_SEQ}, got {seq}")
        return Ping(seq) if t == "ping" else Pong(seq)
    if t == "note":
        return _decode_note(h)
    raise WireError(f"{UNKNOWN_TYPE} {t!r}")


def _decode_note(h: dict[str, Any]) -> Note:
    body, via = h["body"], h.get("via")
    if not isinstance(body, bytes):
        raise WireError(f"a note body is bytes, got {type(body).__name__}")
    try:
        return Note(_str(h["to"]), _str(h["frm"]), body, None if via is None else _log_id(via))
    except ValueError as e:
        raise WireError(f"bad note: {e}") from e


def _decode_hello(h: dict[str, Any]) -> WireHello:
    """A hello: ``v`` a list of versions (from a writer or child, no ``node``) or one
    version with the answering ``node``'s id."""
    raw, node = h["v"], h.get("node")
    if isinstance(raw, _SEQUENCES):
        if node is not None:
            raise WireError("a hello listing versions names no node")
        if not 1 <= len(raw) <= MAX_VERSIONS:
            raise WireError(f"a hello lists 1..{MAX_VERSIONS} versions, got {len(raw)}")
        return WireHello(tuple(_version(v) for v in raw))
    return WireHello((_version(raw),), _log_id(node))


def _version(x: Any) -> int:
    v = _int(x)
    if not 1 <= v <= MAX_VERSION:
        raise WireError(f"a wire version is 1..{MAX_VERSION}, got {v}")
    return v


def _decode_stats(h: dict[str, Any]) -> Stats:
    raw = h.get("bytes", 0.0)
    if not isinstance(raw, _NUMBERS) or isinstance(raw, bool):
        raise WireError(f"stats bytes must be a number, got {type(raw).__name__}")
    nbytes = float(raw)
    if not 0.0 <= nbytes <= MAX_STATS_BYTES:  # also refuses NaN and infinities
        raise WireError(f"stats bytes must be in [0, {MAX_STATS_BYTES:.0f}], got {nbytes}")
    writers = _int(h["writers"])
    if writers > MAX_WRITERS:
        raise WireError(f"stats writers must be <= {MAX_WRITERS}, got {writers}")
    cp, pw = h.get("cp", -1), h.get("pw")
    return Stats(
        _str(h["node"]),
        writers,
        nbytes,
        -1 if cp == -1 else _int(cp),
        None if pw is None else (-1 if pw == -1 else _int(pw)),
    )


def _decode_persist(h: dict[str, Any], payloads: Sequence[Any]) -> Persist:
    raw_items = _list(h["items"])
    if not raw_items or len(raw_items) > MAX_ITEMS:
        raise WireError(f"persist needs 1..{MAX_ITEMS} items, got {len(raw_items)}")
    sizes = [_int(d["size"]) if isinstance(d, dict) else 0 for d in raw_items]
    counts = [_frame_count(d, n) if n > 0 else 0 for d, n in zip(raw_items, sizes, strict=True)]
    if sum(counts) != len(payloads):
        raise WireError(
            f"persist has items of {sum(counts)} payload frames but {len(payloads)} frames"
        )
    frames, k = [], 0
    for n in counts:
        frames.append(None if n == 0 else payloads[k] if n == 1 else tuple(payloads[k : k + n]))
        k += n
    requests = tuple(_request(d, f) for d, f in zip(raw_items, frames, strict=True))
    via = h.get("via")
    return Persist(requests, None if via is None else _str(via))


def _request(d: Any, frame: Any) -> PersistRequest:
    if not isinstance(d, dict):
        raise WireError("persist item must be a map")
    rid = _int(d["id"])
    sqn = _list(d["sqn"])
    if len(sqn) != 2:
        raise WireError(f"item {rid}: SQN range needs 2 numbers, got {len(sqn)}")
    lo, hi = _int(sqn[0]), _int(sqn[1])
    if hi < lo:
        raise WireError(f"SQN range [{lo}, {hi}) is reversed")
    size = _int(d["size"])
    if frame is not None and segment_size(frame) != size:
        raise WireError(f"item {rid}: payload of {segment_size(frame)} bytes, header says {size}")
    cp = d.get("cp")
    kgs = tuple(_list(d.get("kgs", ())))
    for k in kgs:
        _int(k)
    meta = SegmentMeta(_log_id(d["log"]), lo, hi, kgs, size, _int(d.get("crc", 0)))
    cp = None if cp is None else _int(cp)
    writers = _summary_writers(rid, d, size, cp)
    group = _group(rid, d["g"], size) if "g" in d else None
    return PersistRequest(rid, PersistItem(meta, cp, frame, writers=writers, group=group))


def _group(rid: int, raw: Any, size: int) -> FlushGroup:
    """The ``g`` of an item: [gid, parts, contributor, count], only on an item with data."""
    g = _list(raw)
    if len(g) != 4 or size == 0:
        raise WireError(f"item {rid}: a flush group is [id, parts, contributor, count] on data")
    try:
        return FlushGroup(_str(g[0]), _int(g[1]), _str(g[2]), _int(g[3]))
    except ValueError as e:
        raise WireError(f"item {rid}: {e}") from e


def _frame_count(d: Any, size: int) -> int:
    """The payload frames of an item of ``size`` bytes: its ``n`` (1..MAX_SEGMENT_PARTS,
    more than 1 only from SPLIT_FROM_BYTES on, as a writer splits segments: frames,
    each a ZeroMQ message part the node keeps, stay bounded per byte), 1 without."""
    n = _int(d.get("n", 1))
    if not 1 <= n <= MAX_SEGMENT_PARTS:
        raise WireError(f"an item's segment takes 1..{MAX_SEGMENT_PARTS} frames, got {n}")
    if n > 1 and size < SPLIT_FROM_BYTES:
        raise WireError(f"a segment of {size} bytes comes as one frame, not {n}")
    return n


def _summary_writers(rid: int, d: dict[str, Any], size: int, cp: int | None) -> int | None:
    """The ``w`` of a summary marker: 1..MAX_WRITERS, only on a data-less item of a
    checkpoint (WireError otherwise); None when absent."""
    if "w" not in d:
        return None
    w = _int(d["w"])
    if not 1 <= w <= MAX_WRITERS or size != 0 or cp is None:
        raise WireError(f"item {rid}: a summary of {w} writers needs size 0 and a checkpoint")
    return w


def _ack_entry(d: Any) -> AckEntry:
    if not isinstance(d, dict):
        raise WireError("ack entry must be a map")
    if "err" in d:
        return AckEntry(_int(d["id"]), error=_str(d["err"]))
    return AckEntry(_int(d["id"]), _str(d["path"]), _int(d["off"]))


def _int(x: Any) -> int:
    if type(x) is not int or x < 0:  # exactly int: bool (a subclass) is refused
        raise WireError(f"expected a non-negative integer, got {x!r}")
    return x


def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise WireError(f"expected a string, got {type(x).__name__}")
    return x


def _log_id(x: Any) -> str:
    s = _str(x)
    if not s or len(s) > MAX_LOG_ID:
        raise WireError(f"log id must be 1..{MAX_LOG_ID} characters")
    return s


def _list(x: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(x, _SEQUENCES):
        raise WireError(f"expected a list, got {type(x).__name__}")
    return x
