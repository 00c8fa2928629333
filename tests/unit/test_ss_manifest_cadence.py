"""How often a bridge writes a root's manifest (structured_streaming/files.py
:func:`manifest_due`): at most once per MANIFEST_BATCHES mean batch intervals, at least
every MANIFEST_MAX_WAIT s, at once when nothing is known yet; and when held writes are
flushed without a commit (:func:`idle_flush_due`)."""

from __future__ import annotations

from dstltree.structured_streaming.files import (
    IDLE_QUIET,
    MANIFEST_BATCHES,
    MANIFEST_MAX_WAIT,
    idle_flush_due,
    manifest_due,
)


def test_a_first_manifest_is_due_at_once() -> None:
    assert manifest_due(None, [], 0.0)
    assert manifest_due(None, [1.0, 2.0], 2.0)
    assert manifest_due(5.0, [4.0], 5.1)  # one batch: no interval to judge by yet


def test_a_manifest_waits_for_several_batches() -> None:
    batches = [0.0, 1.0, 2.0, 3.0]  # a batch every second
    last = 3.0
    assert not manifest_due(last, batches, last + MANIFEST_BATCHES - 0.01)
    assert manifest_due(last, batches, last + MANIFEST_BATCHES)


def test_a_manifest_of_slow_batches_waits_no_longer_than_the_maximum() -> None:
    batches = [0.0, 100.0, 200.0]  # a batch every 100 s
    assert not manifest_due(200.0, batches, 200.0 + MANIFEST_MAX_WAIT - 0.01)
    assert manifest_due(200.0, batches, 200.0 + MANIFEST_MAX_WAIT)


def test_over_a_run_the_manifests_are_a_third_of_the_batches_or_fewer() -> None:
    """A housekeeper that asks every 0.1 s over 300 batches of 1 s each."""
    batches: list[float] = []
    last, written, t, ended = None, 0, 0.0, 0
    while t < 300.0:
        if t >= ended + 1.0:
            ended += 1
            batches = (batches + [t])[-(MANIFEST_BATCHES + 1) :]
        if manifest_due(last, batches, t):
            last, written = t, written + 1
        t = round(t + 0.1, 1)
    assert MANIFEST_BATCHES == 3
    # until the second batch ended (t = 2 s) no interval is known: one at every turn
    assert written <= 20 + 300 / MANIFEST_BATCHES + 1


def test_held_writes_are_flushed_only_between_batches_once_quiet() -> None:
    """structured_streaming/files.py :func:`idle_flush_due`: what Spark's maintenance
    writes after a commit waits for the next batch's commit while one runs, and is
    flushed on its own once nothing new was held for IDLE_QUIET s with no batch running."""
    assert not idle_flush_due(False, None, 100.0)  # nothing held
    assert not idle_flush_due(True, 0.0, 100.0)  # a batch runs: its commit flushes them
    assert not idle_flush_due(False, 100.0 - IDLE_QUIET + 0.01, 100.0)  # still writing
    assert idle_flush_due(False, 100.0 - IDLE_QUIET, 100.0)
