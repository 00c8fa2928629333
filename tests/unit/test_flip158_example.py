"""FLIP-158's Example table (T0..T4), step by step, against the in-process uploader."""

from __future__ import annotations

from pathlib import Path

from dstltree.client import ChangelogClient

KG = 0


def _values(client: ChangelogClient, handle) -> list[bytes]:
    return list(client.read_changes(handle, KG))


def test_flip158_example(tmp_path: Path) -> None:
    client = ChangelogClient.open(str(tmp_path))
    w = client.create_writer("list-state", range(0, 4))
    # On startup the state is empty: sqn = T0; lastMaterializedSqn = T0.
    t0 = w.next_sqn()
    last_materialized = t0
    w.append(KG, b"a")
    # CP1: persistDurably(after=T0) rolls the SQN over to T1; (T0:T1 = a).
    cp1 = w.persist_durably(after=last_materialized)
    w.append(KG, b"b")
    # Materialization obtains T2; materialized state will be (T0:T2 = a, b).
    t2 = w.next_sqn()
    w.append(KG, b"c")
    # CP2: persistDurably(after=T0) -> T3; reuses (T0:T1 = a), uploads (T1:T3 = b, c).
    cp2 = w.persist_durably(after=last_materialized)
    h1 = cp1.result(timeout=10)
    h2 = cp2.result(timeout=10)
    assert h1.sqn_range == (t0, t0 + 1)
    assert _values(client, h1) == [b"a"]
    t3 = h2.sqn_range[1]
    assert h2.sqn_range == (t0, t3) and t3 == t2 + 1
    assert len(h2.segments) == 2
    assert h2.segments[0] == h1.segments[0], "CP2 reuses the CP1 upload, no re-upload"
    assert (h2.segments[1].sqn_from, h2.segments[1].sqn_to) == (t0 + 1, t3)
    assert _values(client, h2) == [b"a", b"b", b"c"]
    uploads_before = w.statistics().uploads_started
    # Materialization completes: lastMaterializedSqn = T2; truncate(before=T2) drops (T0:T1).
    last_materialized = t2
    w.truncate(before=t2)
    assert w.statistics().uploads == 1, "the (T0:T1) reference is released"
    w.append(KG, b"d")
    # CP3: persistDurably(after=T2) -> T4; reuses (T1:T3 = b, c) with range (T2:T4).
    h3 = w.persist_durably(after=last_materialized).result(timeout=10)
    t4 = h3.sqn_range[1]
    assert h3.sqn_range == (t2, t4)
    assert [(s.sqn_from, s.sqn_to) for s in h3.segments] == [(t0 + 1, t3), (t3, t4)]
    assert h3.segments[0] == h2.segments[1]
    assert w.statistics().uploads_started == uploads_before + 1, "only (T3:T4 = d) is new"
    # On recovery "b" (SQN T1) is filtered out by the handle's range.
    assert _values(client, h3) == [b"c", b"d"]
    # CP2 subsumed: CP3 no longer references the segment holding (T0:T1 = a).
    assert h1.segments[0] not in h3.segments
    client.close()


def test_next_sqn_rules(tmp_path: Path) -> None:
    client = ChangelogClient.open(str(tmp_path))
    w = client.create_writer("w", range(8))
    s0 = w.next_sqn()
    assert w.next_sqn() == s0, "an empty changeset is not closed"
    w.append(3, b"x")
    s1 = w.next_sqn()
    assert s1 == s0 + 1, "every change appended so far has a lower SQN"
    h = w.persist_durably(after=s1).result(timeout=10)
    assert h.sqn_range == (s1, s1) and h.segments == (), "nothing new: an empty handle"
    client.close()


def test_truncate_and_errors(tmp_path: Path) -> None:
    import pytest

    client = ChangelogClient.open(str(tmp_path))
    w = client.create_writer("w", range(2, 4))
    with pytest.raises(ValueError, match="outside"):
        w.append(5, b"x")
    w.append(2, b"x")
    s = w.next_sqn()
    w.append(3, b"y")
    w.truncate(before=s)
    with pytest.raises(ValueError, match="truncated"):
        w.persist_durably(after=s - 1)
    h = w.persist_durably(after=s).result(timeout=10)
    assert list(client.read_changes(h, 3)) == [b"y"]
    assert list(client.read_changes(h, 2)) == []
    client.close()


def test_append_blocks_while_too_much_is_in_flight(tmp_path: Path) -> None:
    """Back-pressure: with 1 KiB in flight allowed and an upload that cannot finish,
    the next pre-emptive upload (started by append) waits until the first is durable."""
    import threading
    from concurrent.futures import Future

    from dstltree.client.batching import PersistItem
    from dstltree.client.handle import SegmentRef
    from dstltree.client.inflight import InFlightLimit
    from dstltree.client.writer import ChangelogWriter

    class HeldUploader:
        def __init__(self) -> None:
            self.futures: list[Future[SegmentRef | None]] = []

        def register(self, log_id: str) -> None: ...

        def unregister(self, log_id: str) -> None: ...

        def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
            self.futures.append(Future())
            return self.futures[-1]

        def close(self) -> None: ...

    up = HeldUploader()
    limit = InFlightLimit(1024)
    w = ChangelogWriter("bp", range(1), up, preemptive_bytes=600, in_flight=limit)  # type: ignore[arg-type]
    w.append(0, b"a" * 700)  # pre-emptive upload 1: 700+ bytes in flight
    assert len(up.futures) == 1
    done = threading.Event()

    def second() -> None:
        w.append(0, b"b" * 700)  # upload 2 would exceed 1 KiB: append blocks
        done.set()

    t = threading.Thread(target=second, daemon=True)
    t.start()
    assert not done.wait(0.3), "append must wait while the limit is reached"
    assert limit.statistics().waits == 1
    up.futures[0].set_result(None)  # upload 1 durable: capacity is back
    assert done.wait(10), "append resumes once the in-flight bytes drop"
    t.join(10)
    assert len(up.futures) == 2
