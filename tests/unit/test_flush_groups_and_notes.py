"""Flush groups and notes in the node's pure core (aggregator/groups.py,
aggregator/notes.py), and the bridges' cross-host commit state
(structured_streaming/crosshost.py), driven without sockets or clocks."""

from __future__ import annotations

import msgpack
import pytest

from dstltree.aggregator.core import NodeConfig, NodeCore
from dstltree.aggregator.events import (
    MessageFromBelow,
    MessageFromUpstream,
    ReplyBelow,
    SendUpstream,
    TimePassed,
    WriteObject,
)
from dstltree.client.batching import FlushGroup, PersistItem
from dstltree.client.errors import WireError
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import BROADCAST, Note, Persist, PersistRequest, Stats, dump, load
from dstltree.structured_streaming import crosshost
from dstltree.structured_streaming.crosshost import CrossHost, dump_body, load_body
from dstltree.structured_streaming.wire import WireError as BridgeWireError

PARENT = "tcp://parent:1"


def _core(parent: str | None = None, delay: float = 0.01, wait: float = 2.0) -> NodeCore:
    cfg = NodeConfig(
        "n", parent, 1 << 20, address="tcp://n:1", persist_delay=delay, group_wait=wait
    )
    return NodeCore(cfg, validate=True)


def _grouped(log: str, rid: int, group: FlushGroup | None, cp: int = 7) -> Persist:
    meta = SegmentMeta(log, 1, 2, (0,), 10)
    item = PersistItem(meta, cp, b"x" * 10, group=group)
    return Persist((PersistRequest(rid, item),))


def _writes(out: list) -> list[WriteObject]:  # type: ignore[type-arg]
    return [i for i in out if isinstance(i, WriteObject)]


def test_a_group_from_two_hosts_is_written_as_one_object_whatever_the_delay() -> None:
    core = _core()
    out = []
    for k in range(3):  # host a: 3 files, its part of 2
        g = FlushGroup("q:1", 2, "host-a", 3)
        out += core.handle(MessageFromBelow(0.0 + k * 0.01, b"a", _grouped(f"a{k}", k, g)))
    out += core.handle(TimePassed(1.0))  # far past the persist delay: still held
    assert _writes(out) == []
    for k in range(2):  # host b: 2 files
        g = FlushGroup("q:1", 2, "host-b", 2)
        out += core.handle(MessageFromBelow(1.5, b"b", _grouped(f"b{k}", k, g)))
    (write,) = _writes(out)
    assert sorted(i.meta.log_id for i in write.items) == ["a0", "a1", "a2", "b0", "b1"]


def test_a_group_whose_parts_went_elsewhere_is_written_after_its_wait() -> None:
    core = _core(wait=2.0)
    g = FlushGroup("q:2", 3, "host-a", 1)
    out = core.handle(MessageFromBelow(0.0, b"a", _grouped("a", 1, g)))
    assert core.next_deadline() == pytest.approx(2.0)
    out += core.handle(TimePassed(1.9))
    assert _writes(out) == []
    (write,) = _writes(core.handle(TimePassed(2.0)))
    assert [i.meta.log_id for i in write.items] == ["a"]


def test_a_node_that_forwards_does_not_hold_a_group() -> None:
    core = _core(parent=PARENT, delay=0.01)
    g = FlushGroup("q:3", 2, "host-a", 1)
    out = core.handle(MessageFromBelow(0.0, b"a", _grouped("a", 1, g)))
    out += core.handle(TimePassed(0.02))
    sent = [i for i in out if isinstance(i, SendUpstream) and isinstance(i.message, Persist)]
    assert [r.item.group for r in sent[0].message.requests] == [g]  # passed on, with its group


def test_a_group_travels_the_wire_and_bad_groups_are_refused() -> None:
    g = FlushGroup("q:4", 2, "host-a", 1)
    (req,) = load(dump(_grouped("a", 1, g))).requests  # type: ignore[union-attr]
    assert req.item.group == g
    header = msgpack.unpackb(dump(_grouped("a", 1, g))[0])
    for bad in ([1, 2], ["q", 0, "h", 1], ["q", 2, "", 1], ["q", 2, "h", 0], "q"):
        header["items"][0]["g"] = bad
        with pytest.raises(WireError):
            load([msgpack.packb(header), b"x" * 10])


def _note(to: str, frm: str, body: bytes = b"b") -> Note:
    return Note(to, frm, body)


def _notes(out: list) -> list:  # type: ignore[type-arg]
    return [i for i in out if isinstance(getattr(i, "message", None), Note)]


def _stats(core: NodeCore, child: bytes, node: str) -> None:
    core.handle(MessageFromBelow(0.0, child, Stats(node, 0)))


def test_notes_reach_every_client_of_the_tree_once_and_answers_go_one_way() -> None:
    mid = _core(parent=PARENT)
    _stats(mid, b"child-1", "c1")
    _stats(mid, b"child-2", "c2")
    mid.handle(MessageFromBelow(0.1, b"bridge-x", _note("", "x")))  # subscribes
    # a broadcast from a bridge below child-1: to the other child, the local bridge, up
    out = _notes(mid.handle(MessageFromBelow(0.2, b"child-1", Note(BROADCAST, "d", b"d", "c1"))))
    to = {(type(i).__name__, getattr(i, "identity", getattr(i, "address", None))) for i in out}
    assert to == {
        ("ReplyBelow", b"bridge-x"),
        ("ReplyBelow", b"child-2"),
        ("SendUpstream", PARENT),
    }
    assert all(i.message.via == "n" for i in out)  # type: ignore[union-attr]
    # the answer to d goes down child-1 only (learned), not everywhere
    out = _notes(mid.handle(MessageFromBelow(0.3, b"bridge-x", _note("d", "x"))))
    assert [(type(i).__name__, getattr(i, "identity", None)) for i in out] == [
        ("ReplyBelow", b"child-1")
    ]
    # a note to the local bridge from upstream: delivered to it alone
    out = _notes(mid.handle(MessageFromUpstream(0.4, PARENT, _note("x", "far"))))
    assert [i.identity for i in out if isinstance(i, ReplyBelow)] == [b"bridge-x"]
    # a note from upstream to an unknown name: down to every child, never back up
    out = _notes(mid.handle(MessageFromUpstream(0.5, PARENT, _note("nobody", "far"))))
    assert sorted(i.identity for i in out if isinstance(i, ReplyBelow)) == [b"child-1", b"child-2"]
    assert not [i for i in out if isinstance(i, SendUpstream)]


def test_hostile_notes_are_refused_on_the_wire() -> None:
    for h in (
        {"t": "note", "to": "x", "frm": "", "body": b""},
        {"t": "note", "to": "x" * 65, "frm": "a", "body": b""},
        {"t": "note", "to": "x", "frm": "a", "body": b"y" * (16 * 1024 + 1)},
        {"t": "note", "to": "x", "frm": "a", "body": "text"},
        {"t": "note", "to": "x", "frm": "*", "body": b""},
    ):
        with pytest.raises(WireError):
            load([msgpack.packb(h)])


def test_note_bodies_are_checked() -> None:
    assert load_body(dump_body("held", root="r"))["root"] == "r"
    for bad in (
        b"\xc1",
        msgpack.packb([1]),
        dump_body("nope"),
        dump_body("flush", root="r"),
        dump_body("flushed", cid="c", ok="yes"),
        dump_body("drive", root="r" * 5000, app="a", boot="b"),
        dump_body("flush", root="r", gid="g", parts=-1, boot="b", cid="c"),
    ):
        with pytest.raises(BridgeWireError):
            load_body(bad)


def test_a_commit_waits_for_every_holder_and_fails_on_silence_or_error() -> None:
    ch = CrossHost("driver")
    ch.on_hold({"root": "r", "boot": "b1"}, "host-a")
    ch.on_hold({"root": "r", "boot": "b2"}, "host-b")
    cids = list(ch.start_commit("r", 0.0))
    assert ch.holders == {}  # announced again for the next commit
    a, b = cids
    assert ch.commit_state(cids, 1.0) == (False, "")
    ch.on_flushing({"cid": a}, "host-a")
    ch.on_flushed({"cid": b, "ok": True, "n": 4}, "host-b")
    ch.on_flushed({"cid": a, "ok": True, "n": 9}, "host-c")  # not its holder: ignored
    finished, error = ch.commit_state(cids, crosshost.RECEIPT_WAIT + 1)
    assert not finished and error == ""  # a answered flushing: alive, still writing
    ch.on_flushed({"cid": a, "ok": True, "n": 3}, "host-a")
    assert ch.commit_state(cids, 9.0) == (True, "") and ch.end_commit(cids) == 7
    ch.on_hold({"root": "r", "boot": "b1"}, "host-a")
    (c,) = ch.start_commit("r", 10.0)
    assert ch.commit_state([c], 10.0 + crosshost.RECEIPT_WAIT + 0.1)[1].startswith("host-a")
    ch.on_hold({"root": "r", "boot": "b1"}, "host-a")
    (c,) = ch.start_commit("r", 20.0)
    ch.on_flushed({"cid": c, "ok": False, "error": "bridge restarted"}, "host-a")
    assert ch.commit_state([c], 20.0) == (True, "host-a: bridge restarted")


def test_a_new_committer_process_makes_a_holder_announce_again() -> None:
    ch = CrossHost("host-a")
    ch.on_drive({"root": "r", "app": "x", "boot": "b1"}, "driver", 0.0)
    ch.announced["r"] = "driver"
    ch.on_drive({"root": "r", "app": "x", "boot": "b1"}, "driver", 1.0)
    assert ch.announced == {"r": "driver"}
    ch.on_drive({"root": "r", "app": "x", "boot": "b2"}, "driver", 2.0)
    assert ch.announced == {}
    assert ch.committer("r", "x", 3.0) is not None and ch.committer("r", "y", 3.0) is None
    assert ch.committer("r", "x", 2.0 + crosshost.REMOTE_TTL + 1) is None
