"""The stateful task of the long-running job: runs inside one Spark barrier task.

Contract per attempt (bytewax-style, precise about offsets):
- Restore: load the latest completed checkpoint; state = its snapshot (if any) plus
  the replay of its changelog handles; the source resumes at its ``source_offset``
  (the number of this task's events already folded into that state). With no
  checkpoint, state is empty and the offset 0. The events and how each one changes its
  key's value come from the job (:class:`dstltree.sparkplug.keyed_job.KeyedJob`); the
  runtime knows nothing else of it.
- A checkpoint acknowledged with offset ``o`` covers exactly events [0, o).
- The writer of attempt ``a`` has log id ``<job_id>-t<task>-a<a>``; handles of earlier
  attempts restored from the checkpoint are carried in every acknowledgement until the
  next materialization replaces them.
- The task returns once a completed checkpoint shows every task at its shard's end.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.client.reader import iter_changes
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.coordinator.protocol import (
    ApplyMaterialization,
    Fenced,
    Materialize,
    TriggerCheckpoint,
)
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.task_link import TaskLink
from dstltree.sparkplug.keyed_job import KeyedJob
from dstltree.sparkplug.keygroups import key_group_range
from dstltree.sparkplug.state_backend import KeyedStateBackend


@dataclass(frozen=True)
class TaskConfig:
    """Everything a task needs; pickled into the Spark closure."""

    job: KeyedJob
    job_id: str
    attempt: int
    parallelism: int
    base_path: str
    coordinator: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    node_for_task: dict[int, str] = field(default_factory=dict)  # local mode
    node_for_executor: dict[str, str] = field(default_factory=dict)  # one node per executor
    ack_timeout: float = 10.0
    max_parallelism: int = 128
    batch_records: int = 200
    records_per_second: float = 0.0  # 0 = as fast as possible (per task)
    kill_task: int | None = None
    kill_after_checkpoints: int = 0
    finish_timeout: float = 120.0


@dataclass
class _Run:
    cfg: TaskConfig
    task: int
    store: ObjectStore
    client: ChangelogClient
    backend: KeyedStateBackend
    events: Sequence[Any]
    lengths: list[int]
    offset: int = 0
    materialized: MaterializedRef | None = None
    base_handles: tuple[ChangelogHandle, ...] = ()
    after_sqn: int = 0


def run_task(cfg: TaskConfig, task: int, executor: str | None) -> dict[str, Any]:
    """Run task ``task`` of ``cfg.attempt`` to the end of the stream. Blocking.
    Returns ``{"task", "state": {key: value}, "records", "attempt"}``."""
    store = ObjectStore(cfg.base_path, cfg.storage_options)
    node = cfg.node_for_task.get(task) or (cfg.node_for_executor.get(executor or "") or None)
    client = ChangelogClient.open(
        cfg.base_path, node=node, storage_options=cfg.storage_options, ack_timeout=cfg.ack_timeout
    )
    kgs = key_group_range(task, cfg.parallelism, cfg.max_parallelism)
    run = _Run(
        cfg,
        task,
        store,
        client,
        KeyedStateBackend(kgs, None, cfg.max_parallelism),
        cfg.job.events(task, cfg.parallelism, cfg.max_parallelism),
        cfg.job.lengths(cfg.parallelism, cfg.max_parallelism),
    )
    _restore(run, CheckpointStore(store).load_latest())
    run.backend.writer = client.create_writer(f"{cfg.job_id}-t{task}-a{cfg.attempt}", kgs)
    link = TaskLink(cfg.coordinator, task, cfg.attempt)
    start_offset = run.offset
    try:
        _process(run, link)
    finally:
        link.close()
        client.close()
    state = dict(run.backend.items(cfg.job.state_name))
    return {
        "task": task,
        "attempt": cfg.attempt,
        "state": state,
        "records": run.offset - start_offset,
    }


def restore_state(
    store: ObjectStore,
    tc: TaskCheckpoint,
    kgs: range,
    state_name: str,
    max_parallelism: int = 128,
    into: KeyedStateBackend | None = None,
) -> KeyedStateBackend:
    """Task ``tc``'s state (value state ``state_name``): its snapshot plus the replay of
    its changelog handles (range reads of only their segments), in ``into`` (an empty
    backend) or a new backend. Raises CorruptObjectError / StorageError naming the
    object."""
    backend = into if into is not None else KeyedStateBackend(kgs, None, max_parallelism)
    backend.value_state(state_name)
    if tc.materialized is not None:
        backend.restore_snapshot(store.read(tc.materialized.path))
    for h in tc.changelog:
        for _, kg, change in iter_changes(store, h):
            backend.apply_change(kg, change)
    return backend


def _restore(run: _Run, latest: CompletedCheckpoint | None) -> None:
    name = run.cfg.job.state_name
    run.backend.value_state(name)
    if latest is None or run.task not in latest.tasks:
        return
    tc = latest.tasks[run.task]
    restore_state(run.store, tc, run.backend.key_groups, name, run.cfg.max_parallelism, run.backend)
    run.offset = tc.records
    run.materialized = tc.materialized
    run.base_handles = tc.changelog


def _process(run: _Run, link: TaskLink) -> None:
    job = run.cfg.job
    state = run.backend.value_state(job.state_name)
    events = run.events
    started = time.monotonic()
    first = run.offset
    finished_at: float | None = None
    while True:
        wait = 0.0
        if run.offset < len(events):
            end = min(run.offset + run.cfg.batch_records, len(events))
            for ev in events[run.offset : end]:
                key = job.key(ev)
                state.update(key, job.update(state.get(key), ev))
            run.offset = end
            wait = _ahead(run, started, first)
        elif finished_at is None:
            finished_at = time.monotonic()
        else:
            wait = 0.1
        # waiting for the source rate doubles as waiting for coordinator commands
        for cmd in link.poll(timeout=wait):
            if _command(run, link, cmd):
                return
        if finished_at is not None:
            if _all_done(run):
                return
            if time.monotonic() - finished_at > run.cfg.finish_timeout:
                raise TimeoutError(
                    f"task {run.task}: no final checkpoint in {run.cfg.finish_timeout} s"
                )


def _ahead(run: _Run, started: float, first: int) -> float:
    """Seconds this task is ahead of its source rate (0 when unthrottled or behind)."""
    rate = run.cfg.records_per_second
    if rate <= 0:
        return 0.0
    return max(0.0, (run.offset - first) / rate - (time.monotonic() - started))


def _command(run: _Run, link: TaskLink, cmd: object) -> bool:
    """Handle one coordinator command; True if this attempt must stop (fenced)."""
    writer = run.backend.writer
    assert writer is not None
    if isinstance(cmd, TriggerCheckpoint):
        _maybe_die(run, cmd.checkpoint_id)
        handle = writer.persist_durably(run.after_sqn, checkpoint_id=cmd.checkpoint_id).result(
            timeout=run.cfg.ack_timeout * 3
        )
        link.ack_checkpoint(
            cmd.checkpoint_id,
            TaskCheckpoint(
                run.task, run.cfg.attempt, run.offset, run.materialized, (*run.base_handles, handle)
            ),
        )
    elif isinstance(cmd, Materialize):
        sqn = writer.next_sqn()
        data = run.backend.snapshot()
        path = run.store.new_snapshot_path()
        run.store.put(path, data)
        link.report_materialization(cmd.epoch, MaterializedRef(path, sqn, len(data)))
    elif isinstance(cmd, ApplyMaterialization):
        run.materialized = cmd.ref
        run.base_handles = ()
        run.after_sqn = cmd.ref.sqn
        writer.truncate(cmd.ref.sqn)
    elif isinstance(cmd, Fenced):
        return True
    return False


def _maybe_die(run: _Run, checkpoint_id: int) -> None:
    cfg = run.cfg
    if (
        cfg.kill_task == run.task
        and cfg.attempt == 0
        and cfg.kill_after_checkpoints > 0
        and checkpoint_id > cfg.kill_after_checkpoints
    ):
        os.kill(os.getpid(), signal.SIGKILL)  # a hard crash: no cleanup, no flush


def _all_done(run: _Run) -> bool:
    latest = CheckpointStore(run.store).load_latest()
    if latest is None or latest.attempt != run.cfg.attempt:
        return False
    return all(
        t in latest.tasks and latest.tasks[t].records >= n for t, n in enumerate(run.lengths)
    )
