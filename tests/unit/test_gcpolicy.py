"""The simulator's garbage-collector thresholds are raised only while it runs."""

from __future__ import annotations

import gc

import pytest

from dstltree.simulations.gcpolicy import rare_collections


def test_thresholds_are_raised_in_the_body_and_restored_after_it() -> None:
    before = gc.get_threshold()
    with rare_collections(123_456):
        assert gc.get_threshold() == (123_456, 1000, 1000)
    assert gc.get_threshold() == before


def test_thresholds_are_restored_when_the_body_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), rare_collections():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
