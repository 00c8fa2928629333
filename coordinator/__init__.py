"""The driver side of dstltree: checkpoint triggering and acknowledgement, the
completed-checkpoint store on DFS, the shared state registry (reference counts per
object path), retention and deletion, materialization epochs, recovery selection and
orphan cleanup, the split enumerator of the job's source and the commits of its sink.
Tasks talk to it through :class:`TaskLink`."""

from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.coordinator.errors import (
    CheckpointStoreError,
    CoordinatorError,
    CorruptCheckpointError,
)
from dstltree.coordinator.protocol import (
    ApplyMaterialization,
    AssignSplits,
    CheckpointComplete,
    Command,
    ErrorReply,
    Fenced,
    Finish,
    Materialize,
    SplitsFinished,
    TriggerCheckpoint,
)
from dstltree.coordinator.registry import SharedStateRegistry
from dstltree.coordinator.service import Coordinator, CoordinatorStatistics
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.task_link import TaskLink

__all__ = [
    "ApplyMaterialization",
    "AssignSplits",
    "CheckpointComplete",
    "CheckpointStore",
    "CheckpointStoreError",
    "Command",
    "CompletedCheckpoint",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorStatistics",
    "CorruptCheckpointError",
    "ErrorReply",
    "Fenced",
    "Finish",
    "MaterializedRef",
    "Materialize",
    "SharedStateRegistry",
    "SplitsFinished",
    "TaskCheckpoint",
    "TaskLink",
    "TriggerCheckpoint",
]
