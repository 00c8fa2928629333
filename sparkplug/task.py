"""The stateful task of a user's job: one Spark barrier task running a source reader, a
keyed operator and a sink writer (dstltree.sparkplug.task_loop), with its state restored
from a checkpoint.

Contract per attempt (precise about what a checkpoint covers):
- Restore: the task's key groups' state from checkpoint ``restore_id`` (snapshot plus
  changelog replay, from every old task whose key groups overlap: any parallelism);
  with another parallelism than the checkpoint's, a fresh snapshot of the restored
  state is written first, so that later checkpoints reference no old task's objects.
  The enumerator on the driver hands out the unfinished splits at their recorded
  offsets. Without a checkpoint, state is empty.
- A checkpoint acknowledged by every task covers exactly: every record read by any
  reader before its barrier (split offsets), each processed once into the state and
  the sink's staged output of that checkpoint; nothing after the barriers.
- The changelog writer of attempt ``a`` has log id ``<job_id>-t<task>-a<a>``; handles
  of the restored checkpoint are carried in every acknowledgement until the next
  materialization replaces them.
- The task returns when the coordinator sends Finish (a final checkpoint completed).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.task_link import TaskLink
from dstltree.security.settings import JobSecurity
from dstltree.sparkplug.channel_state import channel_log_id, restore_inflight
from dstltree.sparkplug.keygroups import key_group_range
from dstltree.sparkplug.pipeline import Pipeline
from dstltree.sparkplug.restore import restore_key_groups
from dstltree.sparkplug.spark_session import executor_host
from dstltree.sparkplug.state_backend import KeyedStateBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskConfig:
    """Everything a task needs; pickled into the Spark closure. Times in seconds."""

    pipeline: Pipeline
    job_id: str
    attempt: int
    parallelism: int
    base_path: str
    coordinator: str
    restore_id: int | None = None
    # the metadata of checkpoint restore_id as the driver read it, without the
    # enumerator (tasks carry no splits): the task does not read it again from the DFS
    # (a listing and one or two reads on the recovery's critical path, about 1.9 s on
    # the FLIP-158 S3 model); None: read it
    restore_from: CompletedCheckpoint | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    node_for_task: dict[int, str] = field(default_factory=dict)  # local mode
    node_for_executor: dict[str, str] = field(default_factory=dict)  # one node per executor
    node_for_host: dict[str, str] = field(default_factory=dict)  # topology nodes by host
    ack_timeout: float = 10.0
    max_pending_acks: int = 2  # checkpoints persisting while the task goes on (sparkplug/acks.py)
    max_parallelism: int = 128
    batch_records: int = 256
    persist_changelog: bool = True
    source_rate: float = 0.0  # records per second per reader, 0 = unlimited
    kill_task: int | None = None
    kill_after_checkpoints: int = 0
    kill_with_channel_state: bool = False  # at a completion instead (CrashDrill)
    # CURVE settings from the driver (per-job keys, the writer's keys for the nodes);
    # None = plaintext. Shipped in the closure: see docs/deploy.md (spark.authenticate)
    security: JobSecurity | None = None
    compression: str | None = None  # segment codec of the task's writer (None: off)
    # how the keyed exchange takes barriers (sparkplug/barriers.py; FLIP-76)
    checkpointing: str = "aligned"
    aligned_checkpoint_timeout: float = 0.0
    max_inflight_bytes: int = 1024 * 1024  # read ahead for one unaligned checkpoint
    # how the task's writer talks to its nodes (ChangelogClient.open's keywords of the
    # same names; the job passes its topology's, TopologyConfig.link_settings)
    link: dict[str, Any] = field(default_factory=dict)


@dataclass
class Restored:
    """What a task starts from: ``materialized`` and ``handles`` to reference in its
    acknowledgements, the records processed before, the parallelism restored from
    when it differs (None otherwise), and the checkpoint's in-flight records of its key
    groups, to process before any new record (sparkplug/channel_state.py)."""

    materialized: MaterializedRef | None = None
    handles: tuple[ChangelogHandle, ...] = ()
    records: int = 0
    rescaled_from: int | None = None
    inflight: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)


def kill_if_drilled(cfg: TaskConfig, task: int, barriers: int, completed: bool) -> None:
    """The crash drill: SIGKILL this process (no cleanup, no flush) at the barrier that
    comes after ``kill_after_checkpoints`` barriers of this attempt (``barriers``: those
    before it), once a checkpoint of the attempt is known complete (``completed``), in
    an attempt the driver armed (``kill_task`` set). Counted per attempt, not by
    checkpoint id: ids the coordinator used up while the previous attempt failed
    (aborted checkpoints) do not count, and every killed attempt leaves a completed
    checkpoint of its own behind. A drill ``kill_with_channel_state`` kills in
    :func:`kill_if_channel_state_restorable` instead."""
    if (
        cfg.kill_task == task
        and not cfg.kill_with_channel_state
        and cfg.kill_after_checkpoints > 0
        and barriers >= cfg.kill_after_checkpoints
        and completed
    ):
        os.kill(os.getpid(), signal.SIGKILL)


def kill_if_channel_state_restorable(
    cfg: TaskConfig, task: int, barriers: int, restorable: bool
) -> None:
    """The crash drill ``kill_with_channel_state``: SIGKILL this process once at least
    ``kill_after_checkpoints`` barriers of this attempt came (``barriers``) and the
    checkpoint just completed is the last one the task acknowledged and holds its
    in-flight records (``restorable``): the recovery starts from that channel state."""
    if (
        cfg.kill_task == task
        and cfg.kill_with_channel_state
        and barriers >= cfg.kill_after_checkpoints
        and restorable
    ):
        os.kill(os.getpid(), signal.SIGKILL)


def run_task(
    cfg: TaskConfig, task: int, executor: str | None, gather: Any = None
) -> dict[str, Any]:
    """Run task ``task`` of ``cfg.attempt`` until the coordinator says Finish. Blocking.
    ``gather(str) -> list[str]`` exchanges one string with every task of the stage
    (Spark's ``BarrierTaskContext.allGather``). Returns ``{"task", "attempt",
    "records", "max_gap_s", "busy_s", "materialization_sync_s", "restored_inflight",
    "last_materialization"}`` (the longest time between two batches of records
    processed, from the first batch to the last, the longest
    synchronous part of a materialization, seconds; the in-flight records of the
    restored checkpoint it processed first; the last materialization's figures).
    Raises SourceError / RecordError for input it cannot use."""
    from dstltree.sparkplug.task_loop import TaskLoop

    store = ObjectStore(cfg.base_path, cfg.storage_options)
    nodes = find_nodes(cfg, task, executor)
    node = nodes[0] if nodes else None
    sec = cfg.security or JobSecurity()
    client = ChangelogClient.open(
        cfg.base_path,
        node=list(nodes) or None,
        storage_options=cfg.storage_options,
        ack_timeout=cfg.ack_timeout,
        security=sec.nodes,
        compression=cfg.compression,
        **cfg.link,
    )
    kgs = key_group_range(task, cfg.parallelism, cfg.max_parallelism)
    backend = KeyedStateBackend(kgs, None, cfg.max_parallelism)
    try:
        latest = _restore_point(cfg, store)
        restored = restore(store, latest, task, cfg.parallelism, backend)
        restored.inflight = restore_inflight(store, latest, kgs).records
        channels = None
        if cfg.persist_changelog:
            log_id = f"{cfg.job_id}-t{task}-a{cfg.attempt}"
            backend.writer = client.create_writer(log_id, kgs)
            if cfg.checkpointing == "unaligned":
                channels = client.create_writer(channel_log_id(log_id), kgs)
            if restored.rescaled_from is not None:
                restored.materialized = snapshot_now(store, backend)
        loop = TaskLoop(cfg, task, store, backend, restored, executor_host(executor), channels)
        loop.connect(gather)
        link = TaskLink(cfg.coordinator, task, cfg.attempt, node=node or "", security=sec.job)
        with link:
            records = loop.run(link)
    finally:
        client.close()
    last = None if loop.materializer is None else loop.materializer.last
    return {
        "task": task,
        "attempt": cfg.attempt,
        "records": records,
        "max_gap_s": loop.max_gap_s,
        "busy_s": loop.busy_s,
        "materialization_sync_s": loop.materialization_sync_s,
        "restored_inflight": loop.restored_inflight,
        "last_materialization": None if last is None else dataclasses.asdict(last),
    }


def find_nodes(cfg: TaskConfig, task: int, executor: str | None) -> tuple[str, ...]:
    """The endpoints of this task's aggregator nodes in order of preference: its own
    node, then a neighbour's (the next host's, executor's or task's node in the
    placement), which the writer uses while its own node is lost. ``DSTL_NODE`` in the
    environment (``spark.executorEnv.DSTL_NODE``, comma-separated for several) wins,
    else the topology's node of the executor's host, else the local-mode or launcher
    placement; an executor the launcher did not reach (it registered later) takes a node
    of its host, else one of the others'. () (with a warning): the changelog goes
    straight to the DFS, and the coordinator counts the task."""
    env = os.environ.get("DSTL_NODE", "").strip()
    if env:
        return tuple(e.strip() for e in env.split(",") if e.strip())
    host = executor_host(executor)
    for placement, key in (
        (cfg.node_for_host, host),
        (cfg.node_for_task, task),
        (cfg.node_for_executor, executor or ""),
    ):
        if key in placement:
            return _with_neighbour(placement, key)
    if cfg.node_for_executor:  # an executor the launcher's stage did not reach
        return _late_executor(cfg.node_for_executor, host, task)
    if cfg.node_for_host or cfg.node_for_executor or cfg.node_for_task:
        log.warning(
            "task %d on %s: no aggregator node for this host; writing to the DFS", task, host
        )
    return ()


def _late_executor(placement: dict[str, str], host: str, task: int) -> tuple[str, ...]:
    """The nodes of an executor that registered after the launcher's stage: a node of an
    executor on its host if there is one, else the node of executor ``task mod n`` in
    sorted order, then that node's neighbour."""
    keys = sorted(placement)
    same_host = [k for k in keys if k.rsplit(":", 1)[0] == host]
    key = same_host[task % len(same_host)] if same_host else keys[task % len(keys)]
    return _with_neighbour(placement, key)


def _with_neighbour(placement: dict[Any, str], key: Any) -> tuple[str, ...]:
    """``placement[key]``, then the node of the next key in sorted order (wrapping
    around) whose node differs, if any."""
    own = placement[key]
    keys = sorted(placement)
    i = keys.index(key)
    for k in keys[i + 1 :] + keys[:i]:
        if placement[k] != own:
            return (own, placement[k])
    return (own,)


def _restore_point(cfg: TaskConfig, store: ObjectStore) -> CompletedCheckpoint | None:
    """The checkpoint to restore: the driver's copy when it shipped one for
    ``restore_id``, else read from the DFS (None: a fresh start)."""
    if cfg.restore_id is None:
        return None
    shipped = cfg.restore_from
    if shipped is not None and shipped.checkpoint_id == cfg.restore_id:
        return shipped
    return CheckpointStore(store).load(cfg.restore_id)


def restore(
    store: ObjectStore,
    latest: CompletedCheckpoint | None,
    task: int,
    parallelism: int,
    backend: KeyedStateBackend,
) -> Restored:
    """Fill ``backend`` with its key groups' state from ``latest`` (any parallelism);
    returns what the task's acknowledgements start from. Raises RescaleError for another
    max_parallelism, CorruptObjectError / StorageError naming the object."""
    if latest is None:
        return Restored()
    restore_key_groups(store, latest, backend)
    p = latest.parallelism or len(latest.tasks)
    if p == parallelism and task in latest.tasks:
        tc = latest.tasks[task]
        return Restored(tc.materialized, tc.changelog, tc.records)
    total = sum(t.records for t in latest.tasks.values())
    return Restored(None, (), total if task == 0 else 0, p)


def snapshot_now(store: ObjectStore, backend: KeyedStateBackend) -> MaterializedRef:
    """Materialize the whole state of ``backend`` now (synchronously) at the writer's
    next SQN, in files per key group (sparkplug/materialize.py); returns the reference
    for the acknowledgements. Raises StorageError if a file cannot be written."""
    from dstltree.sparkplug.materialize import Materializer

    m = Materializer(store, backend)
    try:
        return m.run_now()
    finally:
        m.close()
        backend.on_frozen_write = None
