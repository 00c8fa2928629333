"""Wire messages between the coordinator (ROUTER) and task links (DEALER).

Every message is one msgpack frame: a map with ``"t"`` (the type) and its fields.

Versions: a task's first message, :class:`Hello`, names the protocol versions it
speaks (``"v"``; absent: ``[1]``, what tasks before versions were named sent); the
coordinator serves the highest one it also speaks, or refuses the hello with an
:class:`ErrorReply` naming both sides' versions (:func:`negotiate`). This module
speaks :data:`PROTOCOL_VERSIONS`.
:func:`dump` and :func:`load` are pure; ``load`` raises :class:`dstltree.client.errors.WireError`
for anything malformed or larger than :data:`MAX_MESSAGE_BYTES`.

Task -> coordinator: :class:`Hello`, :class:`Ack`, :class:`Report`,
:class:`SplitsFinished`.
Coordinator -> task (the commands :meth:`TaskLink.poll` returns):
:class:`TriggerCheckpoint`, :class:`Materialize`, :class:`ApplyMaterialization`,
:class:`AssignSplits`, :class:`CheckpointComplete`, :class:`Finish`,
:class:`Fenced` (this attempt is stale), :class:`ErrorReply` (a message was rejected).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from dstltree.client.errors import WireError
from dstltree.coordinator.checkpoint import MaterializedRef, TaskCheckpoint
from dstltree.sparkplug.sources.base import SplitState

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
PROTOCOL_VERSION = 1  # the highest version this module speaks
PROTOCOL_VERSIONS = (1,)  # every version this module speaks
_MAX_VERSIONS = 16  # versions a hello may list


@dataclass(frozen=True)
class Hello:
    """Task ``task`` of ``attempt`` is connected; ``node``: the endpoint of the
    aggregator node its changelog goes through ("" = none: it writes straight to the
    DFS, counted by the coordinator); ``versions``: the protocol versions the task
    speaks."""

    task: int
    attempt: int
    node: str = ""
    versions: tuple[int, ...] = PROTOCOL_VERSIONS


def negotiate(versions: tuple[int, ...], ours: tuple[int, ...] = PROTOCOL_VERSIONS) -> int:
    """The highest protocol version in both ``versions`` (a task's) and ``ours``.
    Raises WireError naming both sides' versions when there is none."""
    common = set(versions) & set(ours)
    if not common:
        raise WireError(
            f"no common protocol version: task speaks {sorted(set(versions))}, "
            f"coordinator speaks {sorted(ours)}"
        )
    return max(common)


@dataclass(frozen=True)
class Ack:
    task: int
    attempt: int
    checkpoint_id: int
    checkpoint: TaskCheckpoint


@dataclass(frozen=True)
class Report:
    task: int
    attempt: int
    epoch: int
    ref: MaterializedRef


@dataclass(frozen=True)
class SplitsFinished:
    """The source reader of ``task`` consumed these assigned splits to their end
    (FLIP-27: a reader asks for more work when its splits are done)."""

    task: int
    attempt: int
    split_ids: tuple[str, ...]


@dataclass(frozen=True)
class TriggerCheckpoint:
    """Checkpoint ``checkpoint_id``: the source reader records its split states and
    sends a barrier on every channel; the keyed operator, once the barriers of all its
    input channels arrived, persists the changelog (``persist_durably``), stages its
    sink output and acknowledges. ``final``: the reader reads nothing after this
    barrier (the run ends with this checkpoint)."""

    checkpoint_id: int
    final: bool = False


@dataclass(frozen=True)
class AssignSplits:
    """Read these splits from their offsets (FLIP-27 split assignment). Sent before
    the barrier of any checkpoint whose enumerator snapshot counts them assigned."""

    states: tuple[SplitState, ...]


@dataclass(frozen=True)
class CheckpointComplete:
    """Checkpoint ``checkpoint_id`` is durable and its sink output committed: stop
    carrying committables of it and earlier checkpoints (Flink's
    ``notifyCheckpointComplete``)."""

    checkpoint_id: int


@dataclass(frozen=True)
class Finish:
    """The run ended with final checkpoint ``checkpoint_id`` (durable, committed):
    close and return."""

    checkpoint_id: int


@dataclass(frozen=True)
class Materialize:
    """Snapshot the state at ``next_sqn()``, upload it, report it for ``epoch``."""

    epoch: int


@dataclass(frozen=True)
class ApplyMaterialization:
    """Every task reported ``epoch``: truncate writers before ``ref.sqn`` and reference
    ``ref`` as the materialized state in later acknowledgements."""

    epoch: int
    ref: MaterializedRef


@dataclass(frozen=True)
class Fenced:
    """The coordinator ignores this task's ``attempt`` (a newer attempt has started)."""

    attempt: int


@dataclass(frozen=True)
class ErrorReply:
    """The coordinator rejected a message of this task (``reason``)."""

    reason: str


Command = (
    TriggerCheckpoint
    | Materialize
    | ApplyMaterialization
    | AssignSplits
    | CheckpointComplete
    | Finish
    | Fenced
    | ErrorReply
)
Message = Hello | Ack | Report | SplitsFinished | Command
COMMANDS = (
    TriggerCheckpoint,
    Materialize,
    ApplyMaterialization,
    AssignSplits,
    CheckpointComplete,
    Finish,
    Fenced,
    ErrorReply,
)


def _fields(m: Message) -> dict[str, Any]:
    if isinstance(m, Hello):
        return {
            "t": "hello",
            "task": m.task,
            "attempt": m.attempt,
            "node": m.node,
            "v": list(m.versions),
        }
    if isinstance(m, Ack):
        return {
            "t": "ack",
            "task": m.task,
            "attempt": m.attempt,
            "checkpoint_id": m.checkpoint_id,
            "checkpoint": m.checkpoint.to_dict(),
        }
    if isinstance(m, Report):
        return {
            "t": "report",
            "task": m.task,
            "attempt": m.attempt,
            "epoch": m.epoch,
            "ref": m.ref.to_dict(),
        }
    if isinstance(m, SplitsFinished):
        return {"t": "finished", "task": m.task, "attempt": m.attempt, "ids": list(m.split_ids)}
    if isinstance(m, TriggerCheckpoint):
        return {"t": "trigger", "checkpoint_id": m.checkpoint_id, "final": m.final}
    if isinstance(m, AssignSplits):
        return {"t": "assign", "states": [st.as_record() for st in m.states]}
    if isinstance(m, CheckpointComplete):
        return {"t": "complete", "checkpoint_id": m.checkpoint_id}
    if isinstance(m, Finish):
        return {"t": "finish", "checkpoint_id": m.checkpoint_id}
    if isinstance(m, Materialize):
        return {"t": "materialize", "epoch": m.epoch}
    if isinstance(m, ApplyMaterialization):
        return {"t": "apply", "epoch": m.epoch, "ref": m.ref.to_dict()}
    if isinstance(m, Fenced):
        return {"t": "fenced", "attempt": m.attempt}
    if isinstance(m, ErrorReply):
        return {"t": "error", "reason": m.reason}
    raise TypeError(f"not a message: {m!r}")


def dump(m: Message) -> bytes:
    """Encode one message as a msgpack frame."""
    return bytes(msgpack.packb(_fields(m), use_bin_type=True))


def _int(d: dict[str, Any], k: str) -> int:
    v = d[k]
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"field {k!r} must be an integer")
    return v


def _bool(d: dict[str, Any], k: str) -> bool:
    v = d.get(k, False)
    if not isinstance(v, bool):
        raise ValueError(f"field {k!r} must be a boolean")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {type(v).__name__}")
    return v


def _endpoint(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 256:
        raise ValueError("a node endpoint is a string of at most 256 characters")
    return v


def _versions(d: dict[str, Any]) -> tuple[int, ...]:
    """A hello's ``v``: 1.._MAX_VERSIONS integers >= 1 (absent: version 1)."""
    raw = d.get("v", [1])
    if not isinstance(raw, list | tuple) or not 1 <= len(raw) <= _MAX_VERSIONS:
        raise ValueError(f"a hello's versions are a list of 1..{_MAX_VERSIONS} integers")
    for v in raw:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"a protocol version is an integer >= 1, got {v!r}")
    return tuple(raw)


def _split_state(r: Any) -> SplitState:
    if not isinstance(r, list | tuple) or len(r) != 4:
        raise ValueError("a split state is [id, location, offset, finished]")
    _str(r[0]), _str(r[1])
    if not isinstance(r[2], int) or isinstance(r[2], bool) or r[2] < 0:
        raise ValueError("a split offset must be an integer >= 0")
    return SplitState.from_record(r)


_DECODERS: dict[str, Callable[[dict[str, Any]], Message]] = {
    "hello": lambda d: Hello(
        _int(d, "task"), _int(d, "attempt"), _endpoint(d.get("node", "")), _versions(d)
    ),
    "ack": lambda d: Ack(
        _int(d, "task"),
        _int(d, "attempt"),
        _int(d, "checkpoint_id"),
        TaskCheckpoint.from_dict(d["checkpoint"]),
    ),
    "report": lambda d: Report(
        _int(d, "task"), _int(d, "attempt"), _int(d, "epoch"), MaterializedRef.from_dict(d["ref"])
    ),
    "finished": lambda d: SplitsFinished(
        _int(d, "task"), _int(d, "attempt"), tuple(_str(x) for x in d["ids"])
    ),
    "trigger": lambda d: TriggerCheckpoint(_int(d, "checkpoint_id"), _bool(d, "final")),
    "assign": lambda d: AssignSplits(tuple(_split_state(r) for r in d["states"])),
    "complete": lambda d: CheckpointComplete(_int(d, "checkpoint_id")),
    "finish": lambda d: Finish(_int(d, "checkpoint_id")),
    "materialize": lambda d: Materialize(_int(d, "epoch")),
    "apply": lambda d: ApplyMaterialization(_int(d, "epoch"), MaterializedRef.from_dict(d["ref"])),
    "fenced": lambda d: Fenced(_int(d, "attempt")),
    "error": lambda d: ErrorReply(str(d["reason"])),
}


def load(data: bytes | memoryview) -> Message:
    """Decode one frame. Raises WireError (malformed, unknown type, oversized)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - any decode failure is a malformed message
        raise WireError(f"undecodable message: {e}") from e
    if not isinstance(d, dict) or d.get("t") not in _DECODERS:
        kind = d.get("t") if isinstance(d, dict) else type(d).__name__
        raise WireError(f"unknown message type {kind!r}")
    try:
        return _DECODERS[d["t"]](d)
    except Exception as e:  # noqa: BLE001 - missing or mistyped fields
        raise WireError(f"malformed {d['t']} message: {type(e).__name__}: {e}") from e
