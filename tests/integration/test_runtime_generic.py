"""The task runtime runs any KeyedJob: a word count, with no Spark and no nodes (the
in-process uploader), against a real coordinator over loopback."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstltree.coordinator.service import Coordinator
from dstltree.sparkplug.job import restore_all
from dstltree.sparkplug.keyed_job import KeyedJob
from dstltree.sparkplug.keygroups import key_group_of, task_of_key_group
from dstltree.sparkplug.task import TaskConfig, run_task
from dstltree.storage.store import ObjectStore

TEXT = ("the quick brown fox jumps over the lazy dog and the dog sleeps " * 40).split()


@dataclass(frozen=True)
class WordCount(KeyedJob):
    words: tuple[str, ...]
    state_name: str = "count"

    def events(self, task: int, parallelism: int, max_parallelism: int) -> list[str]:
        return [w for w in self.words if self._owner(w, parallelism, max_parallelism) == task]

    def lengths(self, parallelism: int, max_parallelism: int) -> list[int]:
        return [len(self.events(t, parallelism, max_parallelism)) for t in range(parallelism)]

    def key(self, event: str) -> str:
        return event

    def update(self, value: int | None, event: str) -> int:
        return (value or 0) + 1

    @staticmethod
    def _owner(word: str, parallelism: int, max_parallelism: int) -> int:
        return task_of_key_group(key_group_of(word, max_parallelism), parallelism, max_parallelism)


def _start(tmp_path: Path, tasks: int) -> Coordinator:
    coord = Coordinator(
        ObjectStore(str(tmp_path / "dfs")),
        tasks,
        checkpoint_interval=0.05,
        materialization_interval=0.1,
    )
    coord.start()
    return coord


def _attempt(
    tmp_path: Path, coord: Coordinator, job: WordCount, tasks: int, attempt: int
) -> list[dict[str, Any]]:
    """Run attempt ``attempt`` of every task in threads of this process (direct
    uploads, no nodes); each task's source runs at 1000 events/s."""
    coord.begin_attempt(attempt)
    cfg = TaskConfig(
        job=job,
        job_id="wc",
        attempt=attempt,
        parallelism=tasks,
        base_path=str(tmp_path / "dfs"),
        coordinator=coord.address,
        batch_records=50,
        records_per_second=1000.0,
        finish_timeout=60.0,
    )
    results: list[dict[str, Any]] = [{} for _ in range(tasks)]

    def one(t: int) -> None:
        results[t] = run_task(cfg, t, None)

    threads = [threading.Thread(target=one, args=(t,)) for t in range(tasks)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "tasks did not finish"
    return results


def test_word_count_through_the_generic_runtime(tmp_path: Path) -> None:
    """Attempt 0 counts every word; attempt 1 restores the counts from the latest
    checkpoint (a snapshot plus changelog replay), finds every source at its end and
    processes nothing."""
    job = WordCount(tuple(TEXT))
    coord = _start(tmp_path, tasks=2)
    try:
        first = _attempt(tmp_path, coord, job, 2, attempt=0)
        latest = coord.latest_checkpoint()
        stats = coord.statistics()
        second = _attempt(tmp_path, coord, job, 2, attempt=1)
    finally:
        coord.stop()
    expected = dict(collections.Counter(TEXT))
    assert {k: v for r in first for k, v in r["state"].items()} == expected
    assert [r["records"] for r in first] == job.lengths(2, 128)
    assert latest is not None and latest.attempt == 0
    assert [latest.tasks[t].source_offset for t in range(2)] == job.lengths(2, 128)
    # task 1's 480 events at 1000/s take ~0.5 s, with a materialization every 0.1 s:
    # the latest checkpoint restores from snapshots plus the changelog after them
    assert stats.materializations_completed >= 1
    assert all(tc.materialized is not None for tc in latest.tasks.values())
    restored = restore_all(ObjectStore(str(tmp_path / "dfs")), latest, job, 2)
    assert restored == expected
    assert [r["attempt"] for r in second] == [1, 1]
    assert [r["records"] for r in second] == [0, 0]
    assert {k: v for r in second for k, v in r["state"].items()} == expected
