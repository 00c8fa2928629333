"""Users' keyed stateful jobs on Spark.

The public API: :class:`StreamingJob` (``source(...).filter/map(...).key_by(...)
.process(...).sink(...)``, then ``run``), :class:`KeyedProcessFunction` with value, map
and list state, the sources :class:`FileSource` and :class:`MemorySource` (FLIP-27
splits with offsets; implement :class:`Source` for your own) and the exactly-once
:class:`FileSink`. docs/user-guide.md is the guide.

Inside: the driver (``job.py``), the task runtime (``task.py``, ``task_loop.py``,
``reading.py``), the key-group exchange with barrier alignment (``exchange``), the
keyed state backend and restore with rescaling (``state_backend.py``, ``restore.py``),
nodes beside executors (``nodes.py``), sources (``sources/``) and sinks (``sinks/``).
"""

from dstltree.sparkplug.api import CrashDrill, JobResult, StreamingJob
from dstltree.sparkplug.pipeline import (
    Collector,
    KeyedProcessFunction,
    RecordError,
    RuntimeContext,
)
from dstltree.sparkplug.sinks.sink import FileSink
from dstltree.sparkplug.sources.base import Source, SourceError, Split, SplitState
from dstltree.sparkplug.sources.files import FileSource
from dstltree.sparkplug.sources.memory import MemorySource

__all__ = [
    "Collector",
    "CrashDrill",
    "FileSink",
    "FileSource",
    "JobResult",
    "KeyedProcessFunction",
    "MemorySource",
    "RecordError",
    "RuntimeContext",
    "Source",
    "SourceError",
    "Split",
    "SplitState",
    "StreamingJob",
]
