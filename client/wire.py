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
                ``w`` only on a node's summary marker (size 0): the writers it stands for
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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from dstltree.client.batching import PersistItem
from dstltree.client.errors import WireError
from dstltree.client.segment import (
    MAX_SEGMENT_PARTS,
    SPLIT_FROM_BYTES,
    SegmentMeta,
    segment_parts,
    segment_size,
)

MAX_ITEMS = 4096
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


Message = Register | Unregister | Persist | PersistAck | Stats | Plan | Error


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
        case _:
            raise TypeError(f"not a message: {msg!r}")
    return [msgpack.packb(h), *payloads]


def load(frames: Sequence[Any], max_bytes: int | None = None) -> Message:
    """Decode and validate ``frames`` (bytes or zmq.Frame). Raises WireError with the
    reason for anything malformed or larger than ``max_bytes`` in total."""
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
    raise WireError(f"unknown message type {t!r}")


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
    return PersistRequest(rid, PersistItem(meta, cp, frame, writers=writers))


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
