"""Events and instructions for driving the bare coordinator state in tests: task
identities, task messages, committables of a sink layout, and filters of the
instructions a state returns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import TaskCheckpoint
from dstltree.coordinator.events import (
    CheckpointTriggered,
    Event,
    Instruction,
    MessageFromTask,
    SendToTask,
)
from dstltree.coordinator.state import CoordinatorState
from dstltree.sparkplug.sinks.layout import Committable, final_name, staged_name
from dstltree.sparkplug.sources.base import SplitState


def ident(task: int, attempt: int) -> bytes:
    return f"a{attempt}-t{task}".encode()


def message(now: float, task: int, attempt: int, msg: protocol.Message) -> MessageFromTask:
    return MessageFromTask(now, ident(task, attempt), msg)


def hello(now: float, task: int, attempt: int) -> MessageFromTask:
    return message(now, task, attempt, protocol.Hello(task, attempt))


def finished(now: float, task: int, attempt: int, *ids: str) -> MessageFromTask:
    return message(now, task, attempt, protocol.SplitsFinished(task, attempt, ids))


def ack(
    now: float,
    task: int,
    attempt: int,
    cid: int,
    splits: Sequence[SplitState] = (),
    committables: Sequence[Committable] = (),
) -> MessageFromTask:
    tc = TaskCheckpoint(task, attempt, splits=tuple(splits), committables=tuple(committables))
    return message(now, task, attempt, protocol.Ack(task, attempt, cid, tc))


def committable(cid: int, task: int, attempt: int = 0) -> Committable:
    """A valid committable of a json sink (no file behind it)."""
    staged = staged_name(cid, task, attempt, "json")
    return Committable(cid, task, attempt, staged, final_name(cid, task, attempt, "json"), 1, 10)


def feed(s: CoordinatorState, *events: Event) -> list[Instruction]:
    """Every event in turn; returns all instructions, in order (validated after each),
    without the CheckpointTriggered notices (tests of those call ``s.handle``)."""
    out: list[Instruction] = []
    for event in events:
        out += without_notices(s.handle(event))
        s.validate()
    return out


def without_notices(out: Iterable[Instruction]) -> list[Instruction]:
    """``out`` without the CheckpointTriggered notices."""
    return [i for i in out if not isinstance(i, CheckpointTriggered)]


def sends(out: Iterable[Instruction], kind: type) -> dict[int, protocol.Command]:
    """task -> the one message of type ``kind`` sent to it in ``out``."""
    got: dict[int, protocol.Command] = {}
    for ins in out:
        if isinstance(ins, SendToTask) and isinstance(ins.message, kind):
            assert ins.task not in got, f"two {kind.__name__} to task {ins.task}"
            got[ins.task] = ins.message
    return got


def of_type(out: Iterable[Instruction], kind: type) -> list[Instruction]:
    return [i for i in out if isinstance(i, kind)]


def assigned(out: Iterable[Instruction]) -> dict[int, list[tuple[str, int]]]:
    """task -> (split id, offset) of the AssignSplits sent to it in ``out``."""
    return {
        t: [(s.split.id, s.offset) for s in m.states]
        for t, m in sends(out, protocol.AssignSplits).items()
        if isinstance(m, protocol.AssignSplits)
    }
