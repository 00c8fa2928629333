"""The fencing race (``dstl bench fencing-race``): two drivers of one job start at once,
many rounds, on a store whose conditional create is atomic (local POSIX ``link``, or
moto with serialized writes: dstltree.storage.atomic_moto; plain moto's is not).

Per round, on a fresh job prefix: both drivers pass a barrier, then each commits
``checkpoints`` checkpoints through its own :class:`CheckpointStore` (the first commit
claims the job) until done or fenced. Then each tries one more commit, in turn: exactly
one may succeed (the newest claimer), the other must be fenced. Every commit a driver
was told succeeded must be in the store as its own record (same sequence number, its
owner token): a create that two drivers both won would leave one of them with an
acknowledged record that names the other (lost). Figures: rounds, winners per round
(must be 1 each), acknowledged commits, lost ones, drivers fenced mid-round, seconds.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dstltree.coordinator.store import CheckpointStore, JobFencedError
from dstltree.coordinator.testing import completed
from dstltree.storage.store import ObjectStore

__all__ = ["RaceResult", "race_round", "run_race"]

BARRIER_TIMEOUT_S = 30.0  # seconds a driver waits for the other at a round's start


@dataclass
class RaceResult:
    """Figures of a run (see the module docstring); ``seconds``: wall time of the run."""

    rounds: int = 0
    winners: list[int] = field(default_factory=list)
    acked: int = 0
    lost: int = 0
    fenced_mid_round: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Exactly one winner every round and nothing acknowledged lost."""
        return self.lost == 0 and all(w == 1 for w in self.winners)


def _drive(s: CheckpointStore, first: int, n: int, acked: list[str]) -> bool:
    """Commit checkpoints ``first .. first + n - 1``; False when fenced on the way."""
    try:
        for k in range(first, first + n):
            acked.append(s.add(completed(k, {0: [f"{s.owner}-{k}"]})))
    except JobFencedError:
        return False
    return True


def _own(store: ObjectStore, url: str, owner: str) -> bool:
    """Whether the record at ``url`` exists and was written by ``owner``."""
    try:
        return bool(json.loads(store.read(url))["owner"] == owner)
    except Exception:  # noqa: BLE001 - missing (StorageError) or unreadable: lost
        return False


def race_round(
    make_store: Callable[[], ObjectStore], checkpoints: int = 3
) -> tuple[int, int, int, int]:
    """One round on the store ``make_store()`` opens (a fresh job prefix; one store per
    driver). Returns (winners, acknowledged, lost, fenced mid-round)."""
    drivers = [CheckpointStore(make_store(), owner=f"driver-{i}") for i in range(2)]
    acked: list[list[str]] = [[], []]
    finished = [False, False]
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT_S)

    def run(i: int) -> None:
        barrier.wait()
        finished[i] = _drive(drivers[i], 1, checkpoints, acked[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=BARRIER_TIMEOUT_S * 4)
    winners = sum(
        _drive(d, checkpoints + 1 + i, 1, acked[i]) for i, d in enumerate(drivers) if finished[i]
    )
    reader = make_store()
    lost = sum(
        not _own(reader, url, d.owner)
        for d, urls in zip(drivers, acked, strict=True)
        for url in urls
    )
    return winners, sum(map(len, acked)), lost, finished.count(False)


def run_race(
    make_store: Callable[[int], ObjectStore],
    rounds: int,
    checkpoints: int = 3,
    progress: Callable[[int], None] | None = None,
) -> RaceResult:
    """``rounds`` rounds; ``make_store(r)`` opens round ``r``'s job prefix."""
    r = RaceResult()
    t0 = time.monotonic()
    for k in range(rounds):
        winners, acked, lost, fenced = race_round(functools.partial(make_store, k), checkpoints)
        r.rounds += 1
        r.winners.append(winners)
        r.acked += acked
        r.lost += lost
        r.fenced_mid_round += fenced
        if progress is not None:
            progress(k)
    r.seconds = time.monotonic() - t0
    return r
