"""A persist leaves no reference cycle behind: once its handle is out and the writer
truncated, reference counting alone frees the upload futures (the cycle collector's
passes cost the hot path CPU in proportion to everything alive)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from dstltree.client.batching import PersistItem
from dstltree.client.errors import PersistError
from dstltree.client.handle import SegmentRef
from dstltree.client.writer import ChangelogWriter

pytestmark = pytest.mark.timeout(60)


class HeldUploader:
    """Holds every future until the test resolves it (after the writer's callbacks are
    attached, as with a real node)."""

    def __init__(self) -> None:
        self.held: list[tuple[PersistItem, Future[SegmentRef | None]]] = []

    def register(self, log_id: str) -> None: ...

    def unregister(self, log_id: str) -> None: ...

    def close(self) -> None: ...

    def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
        fut: Future[SegmentRef | None] = Future()
        self.held.append((item, fut))
        return fut


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.usefixtures("no_gc")
def test_persisted_uploads_are_freed_without_the_cycle_collector(fail: bool) -> None:
    up = HeldUploader()
    w = ChangelogWriter("w", range(4), up, preemptive_bytes=8)
    for i in range(6):
        w.append(i % 4, b"change-%d" % i)  # pre-emptive uploads: several per persist
    handle = w.persist_durably(0)
    assert len(up.held) >= 2
    refs = [weakref.ref(f) for _, f in up.held]
    for item, fut in up.held:
        if fail:
            fut.set_exception(OSError("upload failed"))
        else:
            fut.set_result(SegmentRef(item.meta, "mem://x", 0))
    up.held.clear()
    del item, fut
    if fail:
        with pytest.raises(PersistError):
            handle.result(timeout=10)
    else:
        assert handle.result(timeout=10).sqn_range == (0, w.next_sqn())
    del handle
    w.truncate(w.next_sqn())
    assert [r() for r in refs] == [None] * len(refs)
