"""The node's pure state machine, driven event by event (no sockets, no clock)."""

from __future__ import annotations

from aggregator.core import NodeConfig, NodeCore
from aggregator.events import (
    FromBelow,
    FromUpstream,
    ObjectWritten,
    Reply,
    SendTo,
    Tick,
    WriteObject,
)
from client.handle import SegmentRef
from client.wire import Ack, AckEntry, Error, Persist, Register, Stats, WireItem

CLIENT = b"client-1"
PARENT = "tcp://parent:1"


def _core(parent: str | None = PARENT, target: int = 1000, delay: float = 0.05) -> NodeCore:
    return NodeCore(NodeConfig("n", parent, target, address="tcp://n:1", persist_delay=delay,
                               parent_timeout=1.0, plans=False))  # fmt: skip


def _persist(log: str, cp: int, size: int, rid: int = 1) -> Persist:
    item = WireItem(rid, log, cp, cp + 1, cp, (0,), size, 0)
    return Persist((item,), (b"x" * size,) if size else ())


def _kinds(out: list) -> list[str]:  # type: ignore[type-arg]
    return [type(i).__name__ for i in out]


def test_all_persisted_flushes_at_once_and_forwards_to_the_parent() -> None:
    core = _core()
    for w in ("w1", "w2"):
        core.handle(FromBelow(CLIENT, Register(w), 0.0))
    assert core.handle(FromBelow(CLIENT, _persist("w1", 0, 10), 0.0)) == []
    out = core.handle(FromBelow(CLIENT, _persist("w2", 0, 10, rid=2), 0.001))
    sends = [i for i in out if isinstance(i, SendTo) and isinstance(i.msg, Persist)]
    assert len(sends) == 1 and sends[0].address == PARENT
    assert len(sends[0].msg.items) == 2 and sends[0].msg.via == "n"


def test_size_flush_writes_here_and_acks_after_the_object_is_written() -> None:
    core = _core(target=100)
    out = core.handle(FromBelow(CLIENT, _persist("w1", 0, 150), 0.0))
    writes = [i for i in out if isinstance(i, WriteObject)]
    assert len(writes) == 1 and not any(isinstance(i, Reply) for i in out)
    ref = SegmentRef(0, 1, "/o.dstl", 0, 150, 0, (0,))
    acks = core.handle(ObjectWritten(writes[0].object_id, "/o.dstl", (ref,), 0.01))
    assert acks == [Reply(CLIENT, Ack((AckEntry(1, "/o.dstl", 0, 150),)))]


def test_parent_timeout_makes_the_node_write_itself_and_ignore_the_late_ack() -> None:
    core = _core(delay=0.0)
    out = core.handle(FromBelow(CLIENT, _persist("w1", 0, 10), 0.0))
    fwd = next(i for i in out if isinstance(i, SendTo) and isinstance(i.msg, Persist))
    out = core.handle(Tick(1.5))  # no ack within parent_timeout
    assert "WriteObject" in _kinds(out)
    late = Ack((AckEntry(fwd.msg.items[0].id, "/elsewhere", 0, 10),))
    assert core.handle(FromUpstream(PARENT, late, 1.6)) == []
    # while the parent is down, new items are written here at once
    out = core.handle(FromBelow(CLIENT, _persist("w1", 1, 10, rid=5), 1.7))
    assert "WriteObject" in _kinds(out) and "SendTo" not in _kinds(out)[:1]


def test_root_writes_on_delay() -> None:
    core = _core(parent=None)
    core.handle(FromBelow(CLIENT, Register("w2"), 0.0))  # registered, has not persisted
    assert core.handle(FromBelow(CLIENT, _persist("w1", 0, 10), 0.0)) == []
    assert core.handle(Tick(0.04)) == []
    assert "WriteObject" in _kinds(core.handle(Tick(0.06)))


def test_a_crashed_writer_stops_counting_within_two_checkpoints() -> None:
    core = _core(parent=None, delay=10.0)
    for w in ("live", "dead"):
        core.handle(FromBelow(CLIENT, Register(w), 0.0))
    for cp in (0, 1):
        core.handle(FromBelow(CLIENT, _persist("live", cp, 10), cp))
        core.handle(FromBelow(CLIENT, _persist("dead", cp, 10), cp))
    assert core.expected_writers() == 2
    # "dead" crashed after checkpoint 1; "live" goes on alone
    core.handle(FromBelow(CLIENT, _persist("live", 2, 10), 2.0))
    out = core.handle(FromBelow(CLIENT, _persist("live", 3, 10), 3.0))
    assert core.expected_writers() == 1
    assert "WriteObject" in _kinds(out), "all (live) writers persisted: no persist delay"


def test_unexpected_message_from_below_gets_an_error_reply() -> None:
    core = _core()
    out = core.handle(FromBelow(CLIENT, Ack(()), 0.0))
    assert out[0] == Reply(CLIENT, Error("unexpected Ack from below"))
    assert core.statistics().rejected_messages == 1


def test_a_size_cut_written_here_sends_markers_upstream() -> None:
    """The parent counts this node's writers for the all-persisted rule: items written
    here on a size cut are announced to it as data-less markers (no persist delay)."""
    core = _core(target=100)
    out = core.handle(FromBelow(CLIENT, _persist("w1", 0, 150), 0.0))
    assert "WriteObject" in _kinds(out)
    sends = [i for i in out if isinstance(i, SendTo) and isinstance(i.msg, Persist)]
    assert len(sends) == 1 and sends[0].address == PARENT
    (marker,) = sends[0].msg.items
    assert (marker.log_id, marker.checkpoint_id, marker.size) == ("w1", 0, 0)
    assert sends[0].msg.payloads == ()


def test_a_changed_writer_count_is_reported_at_once() -> None:
    core = _core()
    core.handle(Tick(1.0))  # the periodic report
    out = core.handle(FromBelow(CLIENT, Register("w1"), 1.01))  # well before the next one
    stats = [i.msg for i in out if isinstance(i, SendTo) and isinstance(i.msg, Stats)]
    assert stats and stats[-1].writers == 1
    assert not [i for i in core.handle(Tick(1.02)) if isinstance(i, SendTo)]
