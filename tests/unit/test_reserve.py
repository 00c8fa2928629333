"""Object files created ahead (storage/reserve.py): a put writes into the reserved file
with one fsync, an orphan sweep never deletes a reservation in use but deletes those a
killed process left, a vanished reservation falls back to the ordinary write, close
deletes what was never handed out; listings and ``dstl inspect`` count reservations
apart from objects."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dstltree.cli.commands.inspect import inspect_base
from dstltree.coordinator.cleanup import list_data_files, scan_orphans
from dstltree.coordinator.events import CleanOrphans, OrphansDeleted, SweepOrphans
from dstltree.coordinator.storage_worker import StorageWorker
from dstltree.coordinator.store import CheckpointStore
from dstltree.storage import reserve
from dstltree.storage.store import ObjectExistsError, ObjectStore
from tests.support.waiting import wait_until


def _store(tmp_path: Path, n: int = 4) -> ObjectStore:
    store = ObjectStore(str(tmp_path), reserve_objects=n)
    store.new_object_path()  # the first call starts the refill thread
    assert store._reserved is not None
    reserved = store._reserved
    wait_until(lambda: reserved.ready() == n)
    return store


def test_put_writes_into_the_reserved_file(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = store.new_object_path()
    before = os.stat(path)
    assert before.st_size == 0 and before.st_mtime > time.time() + reserve.FUTURE_S / 2
    assert store.put(path, [b"abc", b"def"]) == 6
    after = os.stat(path)
    assert after.st_ino == before.st_ino, "written in place, not renamed over"
    assert store.read(path) == b"abcdef" and after.st_mtime <= time.time() + 1
    assert not [p for p in os.listdir(os.path.dirname(path)) if ".tmp-" in p]
    store.close()


def test_the_orphan_sweep_spares_reservations(tmp_path: Path) -> None:
    store = _store(tmp_path)
    reserved = store.list_reservations()
    assert len(reserved) == 4
    scan = scan_orphans(store, [], cutoff=time.time() + 60)  # everything written before
    assert scan.orphans == () and sorted(scan.spared) == sorted(reserved)
    store.close()


def test_a_vanished_reservation_is_written_the_usual_way(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = store.new_object_path()
    os.unlink(path)  # e.g. the final sweep of a finished run
    assert store.put(path, b"payload") == 7
    assert store.read(path) == b"payload"
    store.close()


def test_close_deletes_unused_reservations_and_the_store_stays_usable(tmp_path: Path) -> None:
    store = _store(tmp_path)
    used = store.new_object_path()
    store.put(used, b"x")
    store.close()
    assert list_data_files(store) == [used] and store.list_reservations() == []
    fresh = store.new_object_path()
    assert not os.path.exists(fresh)
    store.put(fresh, b"y")
    assert store.read(fresh) == b"y"


def test_stale_reservations_are_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path, n=2)
    before = set(store.list_reservations())
    assert len(before) == 2
    monkeypatch.setattr(reserve, "MAX_AGE_S", -1.0)
    path = store.new_object_path()
    assert path not in before and not os.path.exists(path), "a fresh name instead"
    assert not before & set(store.list_reservations()), "the stale files are gone"
    store.close()


def test_exclusive_and_wrapped_stores_never_reserve(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = store.new_object_path()
    with pytest.raises(ObjectExistsError):
        store.put(path, b"x", exclusive=True)  # the reserved name is taken
    store.close()
    assert ObjectStore("memory://reserve-test", reserve_objects=4)._reserved is None


def test_a_reserved_target_must_be_positive() -> None:
    with pytest.raises(ValueError, match="target"):
        reserve.ObjectReservations(lambda n: ["x"] * n, lambda _: None, lambda _: None, 0)


def test_close_waits_for_a_refill_in_progress_and_leaves_no_file(tmp_path: Path) -> None:
    """A listing right after close() must not meet files a refill is still making."""
    names = iter(range(1000))
    entered, go = threading.Event(), threading.Event()

    def slow_fsync_dir(_: str) -> None:  # the refill has made its files: hold it here
        entered.set()
        go.wait(30)

    r = reserve.ObjectReservations(
        lambda n: [str(tmp_path / f"o{next(names)}") for _ in range(n)],
        lambda _: None,
        slow_fsync_dir,
        4,
    )
    assert r.take() is None  # nothing ready yet: starts the refill
    assert entered.wait(30)
    seen: list[list[str]] = []
    joining = threading.Event()  # close() waits for the refill thread
    refill = r._thread
    assert refill is not None
    join = refill.join

    def observed_join(timeout: float | None = None) -> None:
        joining.set()
        join(timeout)

    refill.join = observed_join  # type: ignore[method-assign]

    def close_and_list() -> None:
        r.close()
        seen.append(sorted(os.listdir(tmp_path)))

    closer = threading.Thread(target=close_and_list)
    closer.start()
    # a close that did not wait would list the 4 files without joining the refill
    wait_until(lambda: joining.is_set() or bool(seen), timeout=10)
    go.set()
    closer.join(30)
    assert not closer.is_alive() and seen == [[]]


def test_a_refill_batch_shares_one_directory_and_one_fsync(tmp_path: Path) -> None:
    synced: list[str] = []
    store = ObjectStore(str(tmp_path), reserve_objects=8)
    assert store._reserved is not None
    store._reserved._fsync_dir = synced.append  # observe (the files are made all the same)
    store.new_object_path()  # starts the refill: one batch of 8
    reserved = store._reserved
    wait_until(lambda: reserved.ready() == 8)
    files = store.list_reservations()
    assert len(files) == 8 and len({os.path.dirname(p) for p in files}) == 1
    assert synced == [os.path.dirname(files[0])]
    store.close()


def test_reservations_are_listed_apart_from_objects(tmp_path: Path) -> None:
    """A store with files created ahead lists its written objects only; the empty
    reserved files are reservations, in ``dstl inspect`` too (neither present nor
    orphans); the one taken and not yet written is still a reservation."""
    store = _store(tmp_path, n=8)  # two taken leave 6: no refill under way
    written = store.new_object_path()
    store.put(written, b"an object's bytes")
    taken = store.new_object_path()  # handed out, not written yet
    assert store.list_objects() == [written]
    reserved = store.list_reservations()
    assert taken in reserved and written not in reserved
    assert len(reserved) == 7 and list_data_files(store) == [written]
    info = inspect_base(str(tmp_path), {})
    assert info["present"] == [written] and info["orphans"] == [written]
    assert info["reservations"] == reserved
    store.put(taken, b"another")
    assert store.list_objects() == sorted([written, taken])
    store.close()
    assert store.list_reservations() == []


def test_reservations_a_killed_process_left_are_swept(tmp_path: Path) -> None:
    """A node killed with reservations on disk (its store never closed) leaves empty
    files under its final names: an in-run sweep spares them (their time lies ahead,
    a live writer may fill them), the final sweep of a run deletes them, and so does
    the cleanup at the next start once their time has passed; referenced objects stay."""
    killed = _store(tmp_path, n=4)  # never closed while the sweeps run: killed
    kept = killed.new_object_path()
    killed.put(kept, b"referenced")
    left = killed.list_reservations()
    assert len(left) == 3
    again = _store(tmp_path / "second", n=2)
    store = ObjectStore(str(tmp_path))  # the coordinator's
    worker = StorageWorker(store, CheckpointStore(store), orphan_grace=0.0)
    try:
        in_run = worker.call(SweepOrphans(frozenset({kept}), time.time()))
        assert isinstance(in_run, OrphansDeleted) and in_run.orphans == 0
        assert store.list_reservations() == left
        final = worker.call(SweepOrphans(frozenset({kept}), None, final=True))
        assert isinstance(final, OrphansDeleted) and final.orphans == len(left)
        assert store.list_reservations() == [] and store.list_objects() == [kept]
        # the cleanup at the next start: reservations whose time has passed (an hour
        # later: their modification time set back instead)
        other = ObjectStore(str(tmp_path / "second"))
        for path in other.list_reservations():
            os.utime(path, (time.time() - 120, time.time() - 120))
        cleaner = StorageWorker(other, CheckpointStore(other), orphan_grace=60.0)
        try:
            cleaned = cleaner.call(CleanOrphans(frozenset()))
            assert isinstance(cleaned, OrphansDeleted) and cleaned.orphans == 2
        finally:
            cleaner.shutdown()
        assert other.list_reservations() == []
    finally:
        worker.shutdown()
        killed.close()  # stops its refill thread; its files are gone already
        again.close()
