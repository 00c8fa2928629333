"""The history checker (dstltree.bench.history) against handles it reads back: every
acknowledged change there once and in order passes; a change missing, read twice or
out of order, and an object gone, are each counted."""

from __future__ import annotations

from pathlib import Path

from dstltree.bench.history import WriterHistory, check
from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES
from dstltree.client.direct import DirectUploader


def _written(tmp_path: Path, changes: list[tuple[int, bytes]]) -> tuple[ObjectStore, WriterHistory]:
    store = ObjectStore(str(tmp_path / "dfs"))
    client = ChangelogClient(store, DirectUploader(store), DEFAULT_PREEMPTIVE_BYTES)
    w = client.create_writer("w0", range(2))
    h = WriterHistory()
    done: list[tuple[int, bytes]] = []
    for kg, c in changes:
        w.append(kg, c)
        done.append((kg, c))
        h.acknowledged(w.persist_durably(0).result(timeout=30), done)
    client.close()
    return store, h


def test_a_history_read_back_whole_passes(tmp_path: Path) -> None:
    store, h = _written(tmp_path, [(0, b"a"), (1, b"b"), (0, b"c")])
    r = check(store, [h])
    assert r.ok and r.checked == 3 and r.referenced


def test_missing_twice_reordered_and_gone_are_counted(tmp_path: Path) -> None:
    store, h = _written(tmp_path, [(0, b"a"), (1, b"b"), (0, b"c")])
    more = WriterHistory([*h.acked, (1, b"never written")], h.handle)
    assert check(store, [more]).lost == 1
    reordered = WriterHistory([(0, b"c"), (1, b"b"), (0, b"a")], h.handle)
    assert check(store, [reordered]).out_of_order == 1
    assert check(store, [WriterHistory(h.acked, None)]).lost == 3  # nothing acknowledged
    assert h.handle is not None
    store.delete(sorted(h.handle.object_paths()))
    gone = check(store, [h])
    assert gone.missing_objects >= 1 and gone.lost == 3 and not gone.ok
