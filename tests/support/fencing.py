"""Checks shared by the unit and S3 tests of the completed-checkpoint store's fencing."""

from __future__ import annotations

import pytest

from dstltree.coordinator.store import CheckpointStore, JobFencedError
from dstltree.coordinator.testing import completed


def fence_two_stores(first: CheckpointStore, second: CheckpointStore) -> None:
    """The checks of two drivers on one job prefix (also run on S3): the newer wins,
    the older is fenced at its next commit record, with no listing on that path."""
    first.claim()
    first.add(completed(1, {0: ["a"]}))
    assert second.claim() == first.seq + 1  # type: ignore[operator]
    assert second.latest_id() == 1
    with pytest.raises(JobFencedError, match="another driver"):
        first.add(completed(2, {0: ["b"]}))
    assert first.fenced is not None
    with pytest.raises(JobFencedError):
        first.delete(1)  # a fenced driver deletes nothing, not even metadata
    with pytest.raises(JobFencedError):
        first.verify_owner()
    assert first.load(1) == completed(1, {0: ["a"]})
    # The first wrote nothing for checkpoint 2: the second goes on after its claim.
    second.add(completed(2, {0: ["c"]}), retained=[1])
    second.verify_owner()
    assert second.retained_ids() == [1, 2]
    assert CheckpointStore(second.store).load_latest() == completed(2, {0: ["c"]})
    assert second.stale_files() == []  # the claim records stay (they fence)
