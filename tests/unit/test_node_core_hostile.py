"""The node core against hostile and malformed input: the checkpoint window and its
resettable horizon, peer bounds, the backlog bound, plans resent, shutdown. Every core
is built with ``validate=True`` (invariants checked after each event)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import msgpack
import pytest

from dstltree.aggregator.core import NodeConfig, NodeCore
from dstltree.aggregator.events import (
    Instruction,
    MessageFromBelow,
    MessageFromUpstream,
    ObjectWritten,
    ReplyBelow,
    ReplyFailed,
    SendUpstream,
    ShuttingDown,
    TimePassed,
    WriteObject,
)
from dstltree.client.batching import PersistItem
from dstltree.client.errors import WireError
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import (
    Error,
    Persist,
    PersistAck,
    PersistRequest,
    Plan,
    Register,
    Stats,
    Unregister,
    dump,
    load,
)

CLIENT = b"client-1"
CHILD = b"child-1"
PARENT = "tcp://parent:1"
ME = "tcp://n:1"
HUGE = 2**63


def _core(parent: str | None = PARENT, **kw) -> NodeCore:  # type: ignore[no-untyped-def]
    cfg = NodeConfig(
        "n", parent, 1000, address=ME, persist_delay=0.05, parent_timeout=1.0, plans=False
    )
    return NodeCore(replace(cfg, **kw), validate=True)


def _persist(log: str, cp: int | None, size: int = 10, rid: int = 1) -> Persist:
    meta = SegmentMeta(log, 0, 1, (0,), size)
    return Persist((PersistRequest(rid, PersistItem(meta, cp, b"x" * size)),))


def _below(core: NodeCore, msg, now: float, who: bytes = CLIENT) -> list[Instruction]:  # type: ignore[no-untyped-def]
    return core.handle(MessageFromBelow(now, who, msg))


def _errors(out: list[Instruction]) -> list[str]:
    """Error replies and error acks in ``out``."""
    got = []
    for i in out:
        if isinstance(i, ReplyBelow) and isinstance(i.message, Error):
            got.append(i.message.message)
        elif isinstance(i, ReplyBelow) and isinstance(i.message, PersistAck):
            got += [e.error for e in i.message.items if e.error is not None]
    return got


# -- the checkpoint window -----------------------------------------------------------------
def test_a_huge_checkpoint_in_stats_is_refused_at_once_while_the_horizon_is_held() -> None:
    core = _core(parent=None, checkpoint_window=100)
    _below(core, _persist("w1", 5), 0.0)
    t0 = time.perf_counter()
    out = _below(core, Stats("evil", 1, 0.0, HUGE), 0.01, who=b"evil")
    assert time.perf_counter() - t0 < 0.1
    (err,) = _errors(out)
    assert "outside the window" in err
    assert core.statistics().refused_checkpoints == 1
    assert core.statistics().plan_window == 0, "the horizon did not move"
    assert "evil" not in core._children


def test_persist_items_outside_the_window_get_an_error_ack_the_rest_is_batched() -> None:
    core = _core(parent=None, checkpoint_window=100)
    _below(core, Register("w2"), 0.0)  # w2 has not persisted: the batch waits
    _below(core, _persist("w1", 1000), 0.0)
    meta = SegmentMeta("w1", 1, 2, (0,), 4)
    msg = Persist(
        (
            PersistRequest(7, PersistItem(meta, HUGE, b"abcd")),
            PersistRequest(8, PersistItem(meta, 1001, b"abcd")),
            PersistRequest(9, PersistItem(meta, 1, b"abcd")),  # far below
        )
    )
    out = _below(core, msg, 0.01)
    (ack,) = [i.message for i in out if isinstance(i, ReplyBelow)]
    assert [(e.id, e.error is not None) for e in ack.items] == [(7, True), (9, True)]
    assert len(core.batch.items) == 2
    assert core.statistics().refused_checkpoints == 2


def test_advancing_the_horizon_by_a_huge_jump_is_o1() -> None:
    core = _core(parent=None, checkpoint_window=HUGE)
    _below(core, _persist("w1", 1), 0.0)
    t0 = time.perf_counter()
    _below(core, _persist("w1", HUGE - 1, rid=2), 0.01)
    assert time.perf_counter() - t0 < 0.1
    assert core._max_cp == HUGE - 1


def test_a_new_job_restarting_at_checkpoint_1_resets_the_horizon_once_the_old_left() -> None:
    core = _core(parent=None, checkpoint_window=100)
    _below(core, Register("old"), 0.0)
    _below(core, _persist("old", 5000), 0.0)
    assert _errors(_below(core, _persist("new", 1, rid=2), 0.01)), "the old job holds it"
    _below(core, Unregister("old"), 0.02)
    _below(core, Unregister("new"), 0.02)
    assert core.statistics().horizon_resets == 1
    assert _errors(_below(core, _persist("new", 1, rid=3), 0.03)) == []
    assert core._max_cp == 1


def test_the_horizon_resets_when_the_holders_leases_end() -> None:
    core = _core(parent=None, checkpoint_window=100, registration_lease=1.0)
    _below(core, _persist("old", 10**9), 0.0)
    core.handle(TimePassed(1.5))
    assert core._max_cp == -1
    assert _errors(_below(core, _persist("new", 1, rid=2), 1.6)) == []


def test_a_child_holds_the_horizon_with_its_stats() -> None:
    core = _core(parent=None, checkpoint_window=10)
    _below(core, Stats("c", 1, 0.0, 500), 0.0, who=CHILD)
    assert _errors(_below(core, _persist("w1", 1), 0.01))
    _below(core, Stats("c", 1, 0.0, 505), 0.02, who=CHILD)
    assert core._max_cp == 505


# -- wire validation -----------------------------------------------------------------------
@pytest.mark.parametrize("nbytes", [math.inf, -math.inf, math.nan, -1.0, 1e300, "1"])
def test_stats_with_bad_byte_counts_do_not_decode(nbytes: object) -> None:
    header = {"t": "stats", "node": "c", "writers": 1, "bytes": nbytes, "cp": 1}
    with pytest.raises(WireError):
        load([msgpack.packb(header)])


def test_stats_with_absurd_writer_counts_do_not_decode() -> None:
    header = {"t": "stats", "node": "c", "writers": 2**40, "bytes": 0.0, "cp": 1}
    with pytest.raises(WireError, match="writers"):
        load([msgpack.packb(header)])


def test_stats_round_trip_the_plan_window_and_old_stats_still_decode() -> None:
    assert load(dump(Stats("c", 2, 3.0, 4, 5))) == Stats("c", 2, 3.0, 4, 5)
    old = {"t": "stats", "node": "c", "writers": 2, "bytes": 3.0, "cp": 4}
    assert load([msgpack.packb(old)]) == Stats("c", 2, 3.0, 4, None)


def test_a_summary_marker_round_trips_and_a_plain_item_has_no_writer_count() -> None:
    msg = Persist((PersistRequest(3, PersistItem.summary("n7", 12, 40)),), "n7")
    (req,) = load(dump(msg)).requests  # type: ignore[attr-defined]
    assert (req.item.meta.log_id, req.item.checkpoint_id, req.item.writers) == ("n7", 12, 40)
    (plain,) = load(dump(_persist("w1", 1))).requests  # type: ignore[attr-defined]
    assert plain.item.writers is None


@pytest.mark.parametrize(
    "change",
    [{"w": 0}, {"w": 2**40}, {"w": True}, {"w": 3, "cp": None}, {"w": 3, "size": 4}],
)
def test_hostile_summary_counts_do_not_decode(change: dict[str, object]) -> None:
    item = {"id": 1, "log": "n", "sqn": [0, 0], "cp": 1, "kgs": [], "size": 0, "crc": 0}
    item |= change
    frames = [msgpack.packb({"t": "persist", "items": [item], "via": "n"})]
    if item["size"]:
        frames.append(b"xxxx")
    with pytest.raises(WireError):
        load(frames)


# -- peer bounds ---------------------------------------------------------------------------
def test_writers_beyond_the_per_peer_bound_are_refused_and_counted() -> None:
    core = _core(parent=None, max_writers_per_peer=3, max_writers=5)
    for k in range(3):
        assert _below(core, Register(f"w{k}"), 0.0) == []
    assert _errors(_below(core, Register("w3"), 0.0))
    assert _errors(_below(core, _persist("w4", 1), 0.0)), "a persist registers too"
    assert _below(core, Register("w0"), 0.1) == [], "a known writer renews"
    for k in range(2):  # another peer: up to the node's bound
        _below(core, Register(f"o{k}"), 0.0, who=b"other")
    assert _errors(_below(core, Register("o2"), 0.0, who=b"other"))
    assert core.statistics().refused_peers == 3
    _below(core, Unregister("w0"), 0.2)
    assert _below(core, Register("w9"), 0.3) == [], "room again"


def test_many_fake_children_from_one_identity_are_refused() -> None:
    core = _core(parent=None, max_children=8)
    for k in range(100):
        _below(core, Stats(f"fake{k}", 1, 0.0, 1), 0.0, who=b"evil")
    assert list(core._children) == ["fake0"]
    for k in range(20):
        _below(core, Stats(f"c{k}", 1, 0.0, 1), 0.0, who=f"peer{k}".encode())
    assert len(core._children) == 8
    assert core.statistics().refused_peers == 99 + 13


# -- back-pressure -------------------------------------------------------------------------
def test_the_core_stops_accepting_while_its_backlog_is_full() -> None:
    core = _core(parent=None, max_queued_bytes=100)
    _below(core, Register("w2"), 0.0)  # w2 never persists: the batch waits the delay
    _below(core, _persist("w1", 1, size=60), 0.0)
    assert core.accepting()
    _below(core, _persist("w1", 1, size=60, rid=2), 0.0)
    assert not core.accepting() and core.backlog_bytes == 120
    (write,) = [i for i in core.handle(TimePassed(0.1)) if isinstance(i, WriteObject)]
    assert not core.accepting(), "being written still counts"
    refs = tuple(SegmentRef(i.meta, "/o", 0) for i in write.items)
    core.handle(ObjectWritten(0.2, write.object_id, "/o", refs))
    assert core.accepting() and core.statistics().backlog_bytes == 0


# -- plans ---------------------------------------------------------------------------------
def _root_with_plans() -> NodeCore:
    core = _core(parent=None, plans=True, plan_window=4)
    _below(core, Stats("c", 1, 0.0, 2), 0.0, who=CHILD)  # middle of window 0: plans w1
    return core


def _plans(out: list[Instruction]) -> list[tuple[bytes, int]]:
    return [(i.identity, i.message.window) for i in out if isinstance(i.message, Plan)]


def test_a_child_reconnecting_with_a_new_identity_gets_the_plans_again() -> None:
    core = _root_with_plans()
    assert _plans(_below(core, Stats("c", 1, 0.0, 2), 0.1, who=CHILD)) == []
    out = _below(core, Stats("c", 1, 0.0, 2), 0.2, who=b"child-new")
    assert _plans(out) == [(b"child-new", 1)]
    assert core.statistics().plans_resent == 1


def test_an_undeliverable_plan_is_sent_again_with_the_next_stats() -> None:
    core = _root_with_plans()
    core.handle(ReplyFailed(0.1, CHILD, Plan(1, "n", ME)))
    assert core.statistics().undeliverable_replies == 1
    assert _plans(_below(core, Stats("c", 1, 0.0, 2), 0.2, who=CHILD)) == [(CHILD, 1)]


def test_a_child_reporting_an_older_plan_window_gets_the_newer_plans_again() -> None:
    core = _root_with_plans()
    assert _plans(_below(core, Stats("c", 1, 0.0, 2, 1), 0.1, who=CHILD)) == []
    out = _below(core, Stats("c", 1, 0.0, 2, -1), 0.2, who=CHILD)  # the plan was lost
    assert _plans(out) == [(CHILD, 1)]


def _stats(out: list[Instruction]) -> list[Stats]:
    return [i.message for i in out if isinstance(i, SendUpstream) and isinstance(i.message, Stats)]


def test_a_child_reports_the_newest_plan_window_it_holds() -> None:
    core = _core(plans=True, plan_window=4, stats_interval=0.1)
    (first,) = _stats(core.handle(TimePassed(0.0)))
    assert first.plan_window == -1
    plan = Plan(3, "p", PARENT, (("p", PARENT),))
    assert not _stats(core.handle(MessageFromUpstream(0.05, PARENT, plan))), "rate-limited"
    assert core.next_deadline() == 0.1
    (stats,) = _stats(core.handle(TimePassed(0.1)))
    assert stats.plan_window == 3


def test_unchanged_stats_go_up_only_as_keepalives() -> None:
    core = _core(stats_interval=0.1, stats_keepalive=1.0)
    assert len(_stats(core.handle(TimePassed(0.0)))) == 1
    assert core.next_deadline() == 1.0, "nothing changed: the next report is the keepalive"
    assert not _stats(core.handle(TimePassed(0.5)))
    (keepalive,) = _stats(core.handle(TimePassed(1.0)))
    assert keepalive.writers == 0 and keepalive.max_checkpoint == -1
    (joined,) = _stats(_below(core, _persist("w1", 1), 1.02))
    assert (joined.writers, joined.max_checkpoint) == (1, 1), "a writer count goes up at once"
    assert not _stats(_below(core, _persist("w1", 2, rid=2), 1.05))
    (newer,) = _stats(core.handle(TimePassed(1.12)))
    assert newer.max_checkpoint == 2, "another change goes up after stats_interval"


# -- shutdown ------------------------------------------------------------------------------
def test_at_shutdown_the_batch_is_written_here_and_acked_after_the_write() -> None:
    core = _core(max_queued_bytes=10**6)
    _below(core, Register("w2"), 0.0)
    _below(core, _persist("w1", 1), 0.0)
    (write,) = [i for i in core.handle(ShuttingDown(0.01)) if isinstance(i, WriteObject)]
    assert not core.idle()
    refs = tuple(SegmentRef(i.meta, "/o", 0) for i in write.items)
    out = core.handle(ObjectWritten(0.02, write.object_id, "/o", refs))
    (ack,) = [i.message for i in out if isinstance(i, ReplyBelow)]
    assert ack.items[0].path == "/o"
    assert core.idle()


# -- bursts --------------------------------------------------------------------------------
def test_a_burst_handled_at_once_flushes_like_one_event_at_a_time() -> None:
    def run(burst: bool) -> list[Instruction]:
        core = NodeCore(NodeConfig("n", None, 1000, address=ME, persist_delay=0.05))
        events = [MessageFromBelow(0.0, CLIENT, Register(w)) for w in ("w1", "w2")]
        events += [
            MessageFromBelow(0.001, CLIENT, _persist(w, 1, rid=k))
            for k, w in enumerate(("w1", "w2"))
        ]
        if burst:
            return core.handle_many(events)
        return [i for e in events for i in core.handle(e)]

    (one,) = [i for i in run(False) if isinstance(i, WriteObject)]
    (many,) = [i for i in run(True) if isinstance(i, WriteObject)]
    assert [i.meta.log_id for i in many.items] == [i.meta.log_id for i in one.items]
