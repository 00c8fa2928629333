"""What the task runtime needs to know of a job: its input per task and how one event
changes one key's value.

The runtime (``dstltree.sparkplug.task``) is generic: it restores the keyed state from a
checkpoint, feeds each task its events in order, writes every state update to the
changelog, checkpoints, materializes and recovers. A :class:`KeyedJob` supplies the
rest. It is pickled into the Spark closure, so it holds parameters only and loads its
data inside the task.

Contract: ``events(task, P, M)`` returns the same sequence on every call and in every
attempt (the source offset of a checkpoint is an index into it), and every event's key
lies in a key group of task ``task`` (key groups follow FLIP-158: ``M`` groups, task
``t`` of ``P`` owns a contiguous range; see ``dstltree.sparkplug.keygroups``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class KeyedJob(ABC):
    """A keyed job over a finite, replayable input, with one value state per key."""

    #: the name of the job's value state in snapshots and the changelog
    state_name: str = "value"

    @abstractmethod
    def events(self, task: int, parallelism: int, max_parallelism: int) -> Sequence[Any]:
        """The events of ``task`` (of ``parallelism``), in processing order."""

    @abstractmethod
    def lengths(self, parallelism: int, max_parallelism: int) -> list[int]:
        """``len(events(t, ...))`` for every task ``t``: where each task's input ends."""

    @abstractmethod
    def key(self, event: Any) -> str:
        """The key of ``event`` (the state backend keys by string)."""

    @abstractmethod
    def update(self, value: Any, event: Any) -> Any:
        """The key's new value after ``event``; ``value`` is None for a new key. Values
        must be msgpack-encodable."""
