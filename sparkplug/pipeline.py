"""What a user's job is, as data the tasks receive: the source, the stateless steps
before ``key_by``, the key, the keyed function and the sink (:class:`Pipeline`), and the
user-facing parts of the keyed function (:class:`KeyedProcessFunction`,
:class:`RuntimeContext`, :class:`Collector`).

A pipeline travels to the Spark tasks inside the stage's closure (cloudpickle), so
lambdas and locally defined classes work; it holds parameters only, never open
handles.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dstltree.sparkplug.sources.base import Record, Source

if TYPE_CHECKING:
    from dstltree.sparkplug.sinks.sink import FileSink
    from dstltree.sparkplug.state_backend import ListState, MapState, ValueState


class RecordError(ValueError):
    """A record the job cannot use (its key column is missing, a step failed on it):
    ``location`` names the split's file (or id), ``row`` the record's index in it."""

    def __init__(self, location: str, row: int, detail: str) -> None:
        super().__init__(f"{location}, row {row}: {detail}")
        self.location = location
        self.row = row


class Collector(Protocol):
    """Where a keyed function's output goes."""

    def emit(self, row: dict[str, Any]) -> None:
        """Emit one row (column -> msgpack-encodable value) to the job's sink."""


class RuntimeContext(Protocol):
    """What :meth:`KeyedProcessFunction.open` receives: the task's state of its key
    groups. State handles act on the key of the record being processed."""

    task: int
    parallelism: int
    attempt: int

    def value_state(self, name: str) -> ValueState:
        """One value per key: ``get() -> value | None``, ``set(value)``, ``clear()``."""

    def map_state(self, name: str) -> MapState:
        """A map per key: ``get(k)``, ``put(k, v)``, ``remove(k)``, ``contains(k)``,
        ``items()``."""

    def list_state(self, name: str) -> ListState:
        """A list per key: ``add(v)``, ``get() -> list``, ``clear()``."""


class KeyedProcessFunction(ABC):
    """The stateful step of a job (after Flink's ``KeyedProcessFunction``): called once
    per record with the record's key; its state (declared in :meth:`open`) is the
    key's, restored exactly after a failure or a rescale. Instances are pickled into
    every task: keep parameters in ``__init__`` and create state handles in ``open``."""

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Once per task attempt, after the state is restored."""

    @abstractmethod
    def process(self, key: Any, record: Record, out: Collector) -> None:
        """Handle one record of ``key``; emit any number of rows with ``out.emit``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Once when the task ends normally."""


Step = tuple[str, Callable[[Record], Any]]  # ("filter" | "map", fn)
KeySelector = str | Callable[[Record], Any]


@dataclass
class Pipeline:
    """A job's dataflow: ``source`` -> ``steps`` (in order) -> ``key_by`` ->
    ``function`` -> ``sink``. Built by :class:`dstltree.sparkplug.api.StreamingJob`."""

    source: Source
    steps: list[Step] = field(default_factory=list)
    key_by: KeySelector | None = None
    function: KeyedProcessFunction | None = None
    sink: FileSink | None = None

    def check(self) -> None:
        """Raise ValueError naming the missing part of an incomplete pipeline."""
        if self.key_by is None:
            raise ValueError("the job has no key_by(...)")
        if self.function is None:
            raise ValueError("the job has no process(...)")


def apply_steps(steps: list[Step], record: Record) -> Record | None:
    """``record`` after the filter and map steps (None: filtered out). A map must
    return a dict; raises TypeError otherwise."""
    for kind, fn in steps:
        if kind == "filter":
            if not fn(record):
                return None
        else:
            out = fn(record)
            if not isinstance(out, dict):
                raise TypeError(f"map returned {type(out).__name__}, not a dict")
            record = out
    return record


def key_of(selector: KeySelector, record: Record) -> Any:
    """The record's key: its column ``selector`` (KeyError if missing) or
    ``selector(record)``."""
    if isinstance(selector, str):
        return record[selector]
    return selector(record)
