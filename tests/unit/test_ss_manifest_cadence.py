"""How often a bridge writes a root's manifest (structured_streaming/files.py
:func:`manifest_due`): at most once per MANIFEST_BATCHES mean batch intervals, at least
every MANIFEST_MAX_WAIT s, at once when nothing is known yet."""

from __future__ import annotations

from dstltree.structured_streaming.files import MANIFEST_BATCHES, MANIFEST_MAX_WAIT, manifest_due


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
