"""The node's pure state machine, driven event by event (no sockets, no clock); every
core is built with ``validate=True``, so its invariants are checked after each event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dstltree.aggregator.core import NodeConfig, NodeCore, NodeInvariantError
from dstltree.aggregator.events import (
    Instruction,
    MalformedFromBelow,
    MessageFromBelow,
    MessageFromUpstream,
    ObjectFailed,
    ObjectWritten,
    ReplyBelow,
    SendUpstream,
    TimePassed,
    UpstreamLost,
    UpstreamUp,
    WriteObject,
)
from dstltree.client.batching import PersistItem
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import (
    AckEntry,
    Error,
    Persist,
    PersistAck,
    PersistRequest,
    Plan,
    Register,
    Stats,
)

CLIENT = b"client-1"
CHILD = b"child-1"
PARENT = "tcp://parent:1"
GRANDPARENT = "tcp://grandparent:1"
ME = "tcp://n:1"


def _core(parent: str | None = PARENT, target: int = 1000, delay: float = 0.05, **kw) -> NodeCore:  # type: ignore[no-untyped-def]
    cfg = NodeConfig("n", parent, target, address=ME, persist_delay=delay, parent_timeout=1.0)
    return NodeCore(replace(cfg, **{"plans": False, **kw}), validate=True)


def _persist(log: str, cp: int, size: int, rid: int = 1, via: str | None = None) -> Persist:
    meta = SegmentMeta(log, cp, cp + 1, (0,), size)
    return Persist(
        (PersistRequest(rid, PersistItem(meta, cp, b"x" * size if size else None)),), via
    )


def _below(core: NodeCore, msg, now: float, who: bytes = CLIENT) -> list[Instruction]:  # type: ignore[no-untyped-def]
    return core.handle(MessageFromBelow(now, who, msg))


def _of(out: list[Instruction], kind: type, msg: type | None = None) -> list:  # type: ignore[type-arg]
    return [i for i in out if isinstance(i, kind) and (msg is None or isinstance(i.message, msg))]


def _written(core: NodeCore, write: WriteObject, now: float, path: str = "/o") -> list[Instruction]:
    refs = tuple(SegmentRef(i.meta, path, 100 * k) for k, i in enumerate(write.items))
    return core.handle(ObjectWritten(now, write.object_id, path, refs))


# -- flush rules ---------------------------------------------------------------------------
def test_all_persisted_flushes_at_once_and_forwards_to_the_parent() -> None:
    core = _core()
    for w in ("w1", "w2"):
        _below(core, Register(w), 0.0)
    assert _below(core, _persist("w1", 0, 10), 0.0) == []
    out = _below(core, _persist("w2", 0, 10, rid=2), 0.001)
    (send,) = _of(out, SendUpstream, Persist)
    assert send.address == PARENT and send.message.via == "n"
    assert [r.item.meta.log_id for r in send.message.requests] == ["w1", "w2"]


def test_size_flush_writes_here_and_acks_only_after_the_object_is_written() -> None:
    core = _core(target=100)
    out = _below(core, _persist("w1", 0, 150), 0.0)
    (write,) = _of(out, WriteObject)
    assert _of(out, ReplyBelow) == []
    assert _of(core.handle(TimePassed(0.5)), ReplyBelow) == [], "no ack while writing"
    acks = _of(_written(core, write, 0.6), ReplyBelow)
    assert acks == [ReplyBelow(CLIENT, PersistAck((AckEntry(1, "/o", 0),)))]
    assert core.statistics().objects_written == 1 and core.statistics().bytes_written == 150


def test_root_writes_after_the_persist_delay() -> None:
    core = _core(parent=None)
    _below(core, Register("w2"), 0.0)  # registered, has not persisted
    assert _below(core, _persist("w1", 0, 10), 0.0) == []
    assert core.handle(TimePassed(0.04)) == []
    (write,) = _of(core.handle(TimePassed(0.06)), WriteObject)
    assert [i.meta.log_id for i in write.items] == ["w1"]


def test_a_size_cut_written_here_sends_markers_upstream() -> None:
    """The parent counts this node's writers for the all-persisted rule: items written
    here on a size cut are announced to it as data-less markers (no persist delay)."""
    core = _core(target=100)
    out = _below(core, _persist("w1", 0, 150), 0.0)
    assert len(_of(out, WriteObject)) == 1
    (send,) = _of(out, SendUpstream, Persist)
    (marker,) = send.message.requests
    assert send.address == PARENT and send.message.payloads() == []
    item = marker.item
    assert (item.meta.log_id, item.checkpoint_id, item.size, item.writers) == ("n", 0, 0, 1)


def _summary(node: str, cp: int, writers: int, rid: int = 1) -> Persist:
    return Persist((PersistRequest(rid, PersistItem.summary(node, cp, writers)),), node)


def test_a_summary_from_below_counts_its_writers_for_the_all_persisted_rule() -> None:
    core = _core(delay=10.0)
    _below(core, Stats("child", 3, 0.0, 0), 0.0, who=CHILD)  # 3 writers below the child
    _below(core, Register("w1"), 0.0)
    assert core.expected_writers() == 4
    assert _below(core, _persist("w1", 0, 10), 0.01) == []
    assert _below(core, _summary("child", 0, 2), 0.02, who=CHILD) == [], "3 of 4 persisted"
    out = _below(core, _persist("c3", 0, 10, rid=2, via="child"), 0.03, who=CHILD)
    (send,) = _of(out, SendUpstream, Persist)
    assert [r.item.meta.log_id for r in send.message.requests] == ["w1", "child", "c3"]


def test_a_size_cut_sums_own_writers_and_summaries_into_one_marker_per_checkpoint() -> None:
    core = _core(target=100, delay=10.0)
    _below(core, Stats("child", 10, 0.0, 0), 0.0, who=CHILD)
    _below(core, _summary("child", 0, 5), 0.0, who=CHILD)
    _below(core, _persist("w2", 1, 10, rid=2), 0.0)
    out = _below(core, _persist("w1", 0, 150, rid=3), 0.01)
    assert len(_of(out, WriteObject)) == 1
    (send,) = _of(out, SendUpstream, Persist)
    got = sorted((r.item.checkpoint_id, r.item.writers) for r in send.message.requests)
    assert got == [(0, 6), (1, 1)], "one summary per checkpoint: 5 below plus w1; w2"


def test_a_summary_from_a_client_is_refused() -> None:
    core = _core()
    out = _below(core, Persist((PersistRequest(7, PersistItem.summary("x", 0, 9)),)), 0.0)
    (ack,) = _of(out, ReplyBelow, PersistAck)
    assert ack.message.items[0].id == 7 and "summary" in (ack.message.items[0].error or "")
    assert core.batch.persisted(0) == 0


def test_a_crashed_tasks_writers_stop_counting_within_two_checkpoints() -> None:
    core = _core(parent=None, delay=10.0)
    for w in ("live", "dead"):
        _below(core, Register(w), 0.0)
    for cp in (0, 1):
        _below(core, _persist("live", cp, 10, rid=10 + cp), cp)
        _below(core, _persist("dead", cp, 10, rid=20 + cp), cp)
    assert core.expected_writers() == 2
    # "dead" crashed after checkpoint 1; "live" goes on alone
    _below(core, _persist("live", 2, 10, rid=12), 2.0)
    out = _below(core, _persist("live", 3, 10, rid=13), 3.0)
    assert core.expected_writers() == 1
    (write,) = _of(out, WriteObject)
    assert [i.checkpoint_id for i in write.items] == [2, 3], "all live writers persisted"


def test_a_changed_writer_count_is_reported_at_once() -> None:
    core = _core()
    core.handle(TimePassed(1.0))  # the periodic report
    (stats,) = _of(_below(core, Register("w1"), 1.01), SendUpstream, Stats)
    assert (stats.message.node, stats.message.writers) == ("n", 1)
    assert _of(core.handle(TimePassed(1.02)), SendUpstream) == []


def test_unexpected_and_malformed_messages_get_an_error_reply() -> None:
    core = _core()
    out = _of(_below(core, PersistAck(()), 0.0), ReplyBelow)
    assert out == [ReplyBelow(CLIENT, Error("unexpected PersistAck from below"))]
    out = _of(core.handle(MalformedFromBelow(0.1, CLIENT, "header is not msgpack")), ReplyBelow)
    assert out == [ReplyBelow(CLIENT, Error("header is not msgpack"))]
    assert core.statistics().rejected_messages == 2


# -- timeouts, relay errors, failed writes -------------------------------------------------
def test_parent_timeout_makes_the_node_write_itself_and_ignore_the_late_ack() -> None:
    core = _core(delay=0.0)
    (fwd,) = _of(_below(core, _persist("w1", 0, 10), 0.0), SendUpstream, Persist)
    (write,) = _of(core.handle(TimePassed(1.5)), WriteObject)  # no ack within the timeout
    assert core.statistics().parent_timeouts == 1 and core.statistics().parent_down
    late = PersistAck((AckEntry(fwd.message.requests[0].id, "/elsewhere", 0),))
    assert core.handle(MessageFromUpstream(1.6, PARENT, late)) == []
    acks = _of(_written(core, write, 1.7), ReplyBelow)
    assert acks == [ReplyBelow(CLIENT, PersistAck((AckEntry(1, "/o", 0),)))]
    # while the parent is down, new items are written here at once
    out = _below(core, _persist("w1", 1, 10, rid=5), 1.8)
    assert len(_of(out, WriteObject)) == 1 and _of(out, SendUpstream, Persist) == []


def test_an_upstream_error_reply_means_the_node_writes_the_item_itself() -> None:
    core = _core(delay=0.0)
    (fwd,) = _of(_below(core, _persist("w1", 0, 10, rid=7), 0.0), SendUpstream, Persist)
    err = PersistAck((AckEntry(fwd.message.requests[0].id, error="disk full"),))
    out = core.handle(MessageFromUpstream(0.1, PARENT, err))
    (write,) = _of(out, WriteObject)
    assert _of(out, ReplyBelow) == [], "the error is not passed down: the item is written here"
    acks = _of(_written(core, write, 0.2), ReplyBelow)
    assert acks == [ReplyBelow(CLIENT, PersistAck((AckEntry(7, "/o", 0),)))]


def test_an_upstream_success_is_relayed_to_the_sender_under_its_own_id() -> None:
    core = _core(delay=0.0)
    out = _below(core, _persist("c1", 0, 10, rid=3, via="child"), 0.0, who=CHILD)
    out += _below(core, _persist("w1", 0, 10, rid=3), 0.0)
    fwd = _of(out, SendUpstream, Persist)
    ids = [r.id for s in fwd for r in s.message.requests]
    ack = PersistAck(tuple(AckEntry(i, "/up", 10 * i) for i in ids))
    replies = core.handle(MessageFromUpstream(0.1, PARENT, ack))
    got = {r.identity: r.message.items for r in _of(replies, ReplyBelow, PersistAck)}
    assert got == {
        CHILD: (AckEntry(3, "/up", 10 * ids[0]),),
        CLIENT: (AckEntry(3, "/up", 10 * ids[1]),),
    }
    assert core.statistics().bytes_relayed == 10 and core.statistics().bytes_forwarded == 20


def test_an_ack_from_another_address_is_ignored() -> None:
    core = _core(delay=0.0)
    (fwd,) = _of(_below(core, _persist("w1", 0, 10), 0.0), SendUpstream, Persist)
    ack = PersistAck((AckEntry(fwd.message.requests[0].id, "/x", 0),))
    assert core.handle(MessageFromUpstream(0.1, "tcp://stranger:1", ack)) == []
    assert core.statistics().in_flight_up == 1


def test_a_failed_write_is_answered_with_an_error_never_a_success() -> None:
    core = _core(parent=None, target=10)
    (write,) = _of(_below(core, _persist("w1", 0, 20, rid=4), 0.0), WriteObject)
    out = core.handle(ObjectFailed(0.3, write.object_id, "503 SlowDown"))
    (reply,) = _of(out, ReplyBelow, PersistAck)
    (entry,) = reply.message.items
    assert (entry.id, entry.path, entry.error) == (4, None, "object write failed: 503 SlowDown")
    assert core.statistics().objects_written == 0
    # the sender retries: the new copy is written and acked once
    (write2,) = _of(_below(core, _persist("w1", 0, 20, rid=5), 0.4), WriteObject)
    assert _written(core, write2, 0.5) == [ReplyBelow(CLIENT, PersistAck((AckEntry(5, "/o", 0),)))]


def test_a_relayed_item_failing_here_goes_back_to_the_child_as_an_error() -> None:
    core = _core(parent=None, target=10)
    out = _below(core, _persist("c1", 0, 20, rid=9, via="child"), 0.0, who=CHILD)
    (write,) = _of(out, WriteObject)
    (reply,) = _of(core.handle(ObjectFailed(0.1, write.object_id, "boom")), ReplyBelow)
    assert reply.identity == CHILD and reply.message.items[0].error is not None


# -- plans -----------------------------------------------------------------------------------
def _planned(core: NodeCore, window: int, collector: str, address: str, now: float) -> list:  # type: ignore[type-arg]
    plan = Plan(window, collector, address, (("p", PARENT), ("g", GRANDPARENT)))
    return core.handle(MessageFromUpstream(now, PARENT, plan))


def test_with_a_plan_items_go_to_the_collector_in_one_hop() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4, target=10**6)
    _planned(core, 0, "g", GRANDPARENT, 0.0)
    assert core.collector_for(3) == ("g", GRANDPARENT) and core.collector_for(4) is None
    (send,) = _of(_below(core, _persist("w1", 2, 10), 0.1), SendUpstream, Persist)
    assert send.address == GRANDPARENT, "one hop to the collector, not the parent"
    # a checkpoint of a window without a plan goes hop by hop, to the parent
    (send,) = _of(_below(core, _persist("w1", 4, 10, rid=2), 0.2), SendUpstream, Persist)
    assert send.address == PARENT


def test_a_node_whose_subtree_reaches_the_target_collects_and_passes_itself_down() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4, target=100)
    _below(core, Stats("child", 2, 500.0, 0), 0.0, who=CHILD)
    out = _planned(core, 1, "g", GRANDPARENT, 0.1)
    (push,) = _of(out, ReplyBelow, Plan)
    assert push.identity == CHILD
    assert (push.message.window, push.message.collector, push.message.address) == (1, "n", ME)
    assert push.message.ancestors[0] == ("n", ME)
    assert core.collector_for(5) == ("n", ME)
    (write,) = _of(_below(core, _persist("w1", 5, 10), 0.2), WriteObject)
    assert write.items[0].checkpoint_id == 5


def test_the_root_plans_window_w_plus_1_during_window_w_and_writes() -> None:
    core = _core(parent=None, delay=0.0, plans=True, plan_window=4)
    _below(core, Stats("child", 1, 0.0, 0), 0.0, who=CHILD)
    assert core.collector_for(0) is None, "window 0 has no plan"
    out = _below(core, Stats("child", 1, 0.0, 2), 0.1, who=CHILD)  # middle of window 0
    pushed = [(p.message.window, p.message.collector) for p in _of(out, ReplyBelow, Plan)]
    assert pushed == [(1, "n")]
    out = _below(core, Stats("child", 1, 0.0, 4), 0.2, who=CHILD)
    assert [p.message.window for p in _of(out, ReplyBelow, Plan)] == [], "window 1 already sent"
    (write,) = _of(_below(core, _persist("w1", 4, 10), 0.3), WriteObject)
    assert write.items[0].meta.log_id == "w1"
    assert core.statistics().writes_for_window


def test_the_node_re_homes_to_the_next_live_ancestor_when_the_parent_is_silent() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4)
    _planned(core, 0, "p", PARENT, 0.0)
    (fwd,) = _of(_below(core, _persist("w1", 1, 10), 0.1), SendUpstream, Persist)
    assert fwd.address == PARENT
    out = core.handle(TimePassed(1.2))  # the parent did not answer within parent_timeout
    assert core.parent == GRANDPARENT
    assert core.collector_for(1) is None, "the old parent's plans are dropped"
    (stats,) = _of(out, SendUpstream, Stats)
    assert stats.address == GRANDPARENT, "the new parent hears of this node at once"
    (send,) = _of(_below(core, _persist("w1", 2, 10, rid=2), 1.6), SendUpstream, Persist)
    assert send.address == GRANDPARENT
    # the new parent's plan is taken
    plan = Plan(1, "g", GRANDPARENT, (("g", GRANDPARENT),))
    core.handle(MessageFromUpstream(1.7, GRANDPARENT, plan))
    assert core.collector_for(5) == ("g", GRANDPARENT)


def test_a_plan_from_a_node_other_than_the_parent_is_ignored() -> None:
    core = _core(plans=True, plan_window=4)
    core.handle(MessageFromUpstream(0.0, GRANDPARENT, Plan(0, "x", "tcp://x:1")))
    assert core.collector_for(0) is None


# -- the invariant checker itself ----------------------------------------------------------
def test_validate_names_an_item_held_in_two_states() -> None:
    core = _core(delay=0.0)
    _below(core, _persist("w1", 0, 10, rid=1), 0.0)  # sent upstream, awaiting an ack
    sent = next(iter(core._sent.values()))
    core.batch.add(sent.item, 0.0)  # the same item also batched: a bookkeeping bug
    with pytest.raises(NodeInvariantError, match="one-state"):
        core.validate()


def test_validate_names_an_ack_before_the_write() -> None:
    core = _core(parent=None, target=10**6)
    _below(core, Register("w2"), 0.0)
    _below(core, _persist("w1", 0, 20, rid=1), 0.0)  # batched: w2 has not persisted
    (origin,) = core._item_states()
    ack = ReplyBelow(CLIENT, PersistAck((AckEntry(1, "/o", 0),)))
    core._last = (ObjectWritten(0.1, 1, "/o", ()), {origin: "batched"}, [ack])
    core.batch.take()  # as if a bug had acked the batched item
    with pytest.raises(NodeInvariantError, match="ack-after-write"):
        core.validate()
    core._last = (ObjectWritten(0.1, 1, "/o", ()), {}, [ack])
    with pytest.raises(NodeInvariantError, match="ack-to-sender"):
        core.validate()


# -- many items per message ----------------------------------------------------------------
def _many(n: int, size: int, via: str | None = None) -> Persist:
    """One message with ``n`` pre-emptive items of writer ``w1``, request ids 1..n."""
    requests = tuple(
        PersistRequest(k, PersistItem(SegmentMeta("w1", k, k + 1, (0,), size), None, b"x" * size))
        for k in range(1, n + 1)
    )
    return Persist(requests, via)


def test_one_message_with_many_items_is_cut_into_objects_of_about_the_target() -> None:
    core = _core(parent=None, target=100)
    out = _below(core, _many(10, 40), 0.0)
    writes = _of(out, WriteObject)
    assert [len(w.items) for w in writes] == [3, 3, 3], "cut at 120 bytes, 40 stay batched"
    assert core.batch.nbytes == 40
    acked = [
        e.id
        for w in writes
        for a in _of(_written(core, w, 0.1), ReplyBelow)
        for e in a.message.items
    ]
    assert sorted(acked) == list(range(1, 10))


def test_a_relay_passes_on_a_full_message_at_once_split_within_max_forward_bytes() -> None:
    """A node whose target is above one message (it relays: nothing is written here
    before the delay) sends as soon as its batch holds ``max_forward_bytes``."""
    core = _core(target=10**9, max_forward_bytes=100)
    sends = _of(_below(core, _many(7, 40), 0.0), SendUpstream, Persist)
    assert [len(s.message.requests) for s in sends] == [2, 1, 2, 1], "cut at 120 bytes twice"
    assert all(sum(len(p) for p in s.message.payloads()) <= 100 for s in sends)
    assert all(s.address == PARENT and s.message.via == "n" for s in sends)
    assert core.batch.nbytes == 40
    sends += _of(core.handle(TimePassed(0.06)), SendUpstream, Persist)
    entries = tuple(AckEntry(r.id, "/up", 0) for s in sends for r in s.message.requests)
    (ack,) = _of(core.handle(MessageFromUpstream(0.1, PARENT, PersistAck(entries))), ReplyBelow)
    assert sorted(e.id for e in ack.message.items) == list(range(1, 8))
    assert core.idle()


def test_no_relay_cut_where_items_would_be_written_here() -> None:
    """The root, and a node whose parent is down, keep batching up to the target."""
    for core in (
        _core(parent=None, target=10**9, max_forward_bytes=100),
        _core(target=10**9, max_forward_bytes=100),
    ):
        if core.parent is not None:
            core.handle(UpstreamLost(0.0, PARENT))
        out = _below(core, _many(7, 40), 0.0)
        assert _of(out, SendUpstream, Persist) == [] and _of(out, WriteObject) == []
        assert core.batch.nbytes == 280


def test_an_item_above_max_forward_bytes_goes_alone() -> None:
    core = _core(target=10**9, max_forward_bytes=100)
    sends = _of(_below(core, _many(3, 150), 0.0), SendUpstream, Persist)
    assert [len(s.message.requests) for s in sends] == [1, 1, 1]


# -- a lost upstream connection (socket monitor, heartbeats) -----------------------------------
def test_a_lost_parent_is_noticed_at_once_and_its_unacked_items_are_written_here() -> None:
    core = _core(delay=0.0)
    (fwd,) = _of(_below(core, _persist("w1", 0, 10, rid=4), 0.0), SendUpstream, Persist)
    out = core.handle(UpstreamLost(0.05, PARENT))  # long before parent_timeout (1 s)
    (write,) = _of(out, WriteObject)
    assert [i.meta.log_id for i in write.items] == ["w1"]
    stats = core.statistics()
    assert (stats.upstream_losses, stats.parent_timeouts, stats.in_flight_up) == (1, 0, 0)
    assert stats.parent_down
    acks = _of(_written(core, write, 0.1), ReplyBelow)
    assert acks == [ReplyBelow(CLIENT, PersistAck((AckEntry(4, "/o", 0),)))]
    late = PersistAck((AckEntry(fwd.message.requests[0].id, "/elsewhere", 0),))
    assert core.handle(MessageFromUpstream(0.2, PARENT, late)) == [], "a late ack is ignored"


def test_a_lost_parent_s_items_go_to_the_next_live_ancestor() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4, target=10**6)
    _planned(core, 0, "p", PARENT, 0.0)
    (fwd,) = _of(_below(core, _persist("w1", 1, 10, rid=2), 0.1), SendUpstream, Persist)
    assert fwd.address == PARENT
    out = core.handle(UpstreamLost(0.2, PARENT))
    (resend,) = _of(out, SendUpstream, Persist)
    assert resend.address == GRANDPARENT and core.parent == GRANDPARENT
    assert [r.item.meta.log_id for r in resend.message.requests] == ["w1"]
    assert _of(out, WriteObject) == []


def test_losing_an_address_with_nothing_in_flight_only_marks_it_down() -> None:
    core = _core(delay=0.0)
    out = core.handle(UpstreamLost(0.0, PARENT))
    assert _of(out, WriteObject) == [] and _of(out, SendUpstream, Persist) == []
    assert core.statistics().parent_down and core.statistics().upstream_losses == 0


def test_the_node_returns_to_its_parent_once_it_is_back_for_the_hold_down() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4, target=10**6, parent_retry_after=2.0)
    _planned(core, 0, "p", PARENT, 0.0)
    core.handle(UpstreamLost(0.1, PARENT))
    assert core.parent == GRANDPARENT
    core.handle(TimePassed(5.0))
    assert core.parent == GRANDPARENT, "still lost: no handshake since"
    core.handle(UpstreamUp(5.0, PARENT))
    core.handle(TimePassed(6.9))
    assert core.parent == GRANDPARENT, "back for 1.9 s only"
    core.handle(TimePassed(7.0))
    assert core.parent == PARENT
    (send,) = _of(_below(core, _persist("w1", 9, 10), 7.1), SendUpstream, Persist)
    assert send.address == PARENT


def test_a_lost_root_parent_is_not_used_again_before_its_connection_is_back() -> None:
    core = _core(delay=0.0, parent_retry_after=1.0)  # no plan: no other ancestor
    core.handle(UpstreamLost(0.0, PARENT))
    out = _below(core, _persist("w1", 0, 10), 3.0)  # long after parent_retry_after
    assert len(_of(out, WriteObject)) == 1 and _of(out, SendUpstream, Persist) == []
    core.handle(UpstreamUp(3.1, PARENT))
    assert _of(_below(core, _persist("w1", 1, 10, rid=2), 3.5), SendUpstream, Persist) == []
    (send,) = _of(_below(core, _persist("w1", 2, 10, rid=3), 4.2), SendUpstream, Persist)
    assert send.address == PARENT


SECOND = "tcp://second-parent:1"


def test_a_lost_parent_s_items_go_to_the_second_parent_before_any_ancestor() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4, target=10**6, parent_retry_after=2.0)
    core = NodeCore(replace(core.config, fallback_addresses=(SECOND,)), validate=True)
    _planned(core, 0, "p", PARENT, 0.0)  # the plan names GRANDPARENT as an ancestor
    _below(core, _persist("w1", 1, 10, rid=2), 0.1)
    (resend,) = _of(core.handle(UpstreamLost(0.2, PARENT)), SendUpstream, Persist)
    assert resend.address == SECOND and core.parent == SECOND
    # the second parent lost too: on to the plan's ancestor
    (again,) = _of(core.handle(UpstreamLost(0.3, SECOND)), SendUpstream, Persist)
    assert again.address == GRANDPARENT and core.parent == GRANDPARENT
    # the second parent back for the hold-down comes before the ancestor, the first
    # parent back after it comes before both
    core.handle(UpstreamUp(1.0, SECOND))
    core.handle(TimePassed(3.0))
    assert core.parent == SECOND
    core.handle(UpstreamUp(3.0, PARENT))
    core.handle(TimePassed(4.9))
    assert core.parent == SECOND
    core.handle(TimePassed(5.0))
    assert core.parent == PARENT


def test_an_up_event_of_an_address_never_lost_changes_nothing() -> None:
    core = _core(delay=0.0)
    core.handle(UpstreamUp(0.0, PARENT))  # the first connect
    (send,) = _of(_below(core, _persist("w1", 0, 10), 0.1), SendUpstream, Persist)
    assert send.address == PARENT


def test_the_plan_is_recomputed_through_the_second_parent_and_again_after_the_return() -> None:
    core = _core(delay=0.0, plans=True, plan_window=4, target=10**6, parent_retry_after=1.0)
    core = NodeCore(replace(core.config, fallback_addresses=(SECOND,)), validate=True)
    _planned(core, 0, "p", PARENT, 0.0)
    assert core.collector_for(1) == ("p", PARENT)
    out = core.handle(UpstreamLost(0.2, PARENT))
    assert core.collector_for(1) is None, "the lost parent's plan is dropped"
    out += core.handle(TimePassed(0.5))
    stats = _of(out, SendUpstream, Stats)[-1]
    assert stats.address == SECOND and stats.message.plan_window == -1, "asks for plans"
    chain = (("s", SECOND), ("g", GRANDPARENT))
    core.handle(MessageFromUpstream(0.6, SECOND, Plan(0, "s", SECOND, chain)))
    assert core.collector_for(1) == ("s", SECOND)
    (send,) = _of(_below(core, _persist("w1", 1, 10), 0.7), SendUpstream, Persist)
    assert send.address == SECOND
    core.handle(UpstreamUp(1.0, PARENT))
    core.handle(TimePassed(2.1))  # back for the hold-down: home again, plans from there
    assert core.parent == PARENT and core.collector_for(1) is None
    stats = _of(core.handle(TimePassed(2.1)) + core.handle(TimePassed(3.5)), SendUpstream, Stats)
    assert stats and stats[-1].address == PARENT
