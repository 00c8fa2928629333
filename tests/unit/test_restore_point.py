"""A task restores from the checkpoint metadata the driver shipped in its closure, and
reads it from the DFS only when none (or another one) was shipped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.testing import completed
from dstltree.sparkplug.job import _for_tasks
from dstltree.sparkplug.pipeline import Pipeline
from dstltree.sparkplug.sources.memory import MemorySource
from dstltree.sparkplug.task import TaskConfig, _restore_point
from dstltree.storage.store import ObjectStore


def _cfg(tmp_path: Path, **kw: Any) -> TaskConfig:
    return TaskConfig(
        Pipeline(MemorySource({})), "j", 1, 1, str(tmp_path), "tcp://127.0.0.1:1", **kw
    )


def test_the_shipped_checkpoint_is_used_without_reading_the_dfs(tmp_path: Path) -> None:
    cp = completed(3, {0: ["a"]})
    shipped = _for_tasks(cp)
    assert shipped is not None and shipped.enumerator is None and shipped.finished_log is None
    # nothing on the DFS: the shipped copy is all the task needs
    assert (
        _restore_point(
            _cfg(tmp_path, restore_id=3, restore_from=shipped), ObjectStore(str(tmp_path))
        )
        == shipped
    )
    assert _restore_point(_cfg(tmp_path), ObjectStore(str(tmp_path))) is None


def test_without_a_shipped_copy_the_task_reads_the_checkpoint(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cp = completed(1, {0: ["a"]})
    CheckpointStore(store).add(cp)
    assert _restore_point(_cfg(tmp_path, restore_id=1), store) == cp
    other = replace(completed(7, {0: ["b"]}))
    assert _restore_point(_cfg(tmp_path, restore_id=1, restore_from=other), store) == cp
