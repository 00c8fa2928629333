"""Key groups: keys hash to a key group in [0, max_parallelism); task i of P owns a
contiguous range of key groups (the unit of state redistribution on rescale)."""

from __future__ import annotations

import zlib

DEFAULT_MAX_PARALLELISM = 128


def key_group_of(key: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """A stable key group for ``key`` (CRC32 of its UTF-8 bytes), same in every process."""
    return zlib.crc32(key.encode()) % max_parallelism


def key_group_range(
    task: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> range:
    """Key groups owned by ``task`` of ``parallelism`` tasks: from ceil(task*M/P) to
    floor(((task+1)*M - 1)/P) inclusive, so that ``task_of_key_group`` (kg*P//M) is its
    exact inverse (the assignment Flink uses). Raises ValueError if parallelism exceeds
    max_parallelism."""
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be in 1..{max_parallelism}")
    if not 0 <= task < parallelism:
        raise ValueError(f"task {task} outside 0..{parallelism - 1}")
    start = (task * max_parallelism + parallelism - 1) // parallelism
    end = ((task + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def task_of_key_group(
    key_group: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> int:
    """The task owning ``key_group`` (inverse of key_group_range)."""
    return key_group * parallelism // max_parallelism
