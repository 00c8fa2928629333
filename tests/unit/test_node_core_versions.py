"""The node core's wire versions and liveness (aggregator/core.py): a hello answered
with the highest common version or refused (naming both sides, counted, the peer then
refused until a hello matches), pings answered from the core, pongs to version-2 peers
while the backlog is full. Every core is built with ``validate=True``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dstltree.aggregator import core as core_module
from dstltree.aggregator.core import NodeConfig, NodeCore
from dstltree.aggregator.events import (
    Instruction,
    MalformedFromBelow,
    MessageFromBelow,
    ReplyBelow,
    ReplyFailed,
    TimePassed,
)
from dstltree.client.batching import PersistItem
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import (
    Error,
    Persist,
    PersistAck,
    PersistRequest,
    Ping,
    Pong,
    Register,
    WireHello,
)

CLIENT = b"client-1"
OTHER = b"client-2"


def _core(**kw) -> NodeCore:  # type: ignore[no-untyped-def]
    cfg = NodeConfig("n", None, 1000, address="tcp://n:1", persist_delay=0.05, plans=False)
    return NodeCore(replace(cfg, **kw), validate=True)


def _persist(log: str, size: int = 10, rid: int = 1, cp: int | None = 1) -> Persist:
    meta = SegmentMeta(log, 0, 1, (0,), size)
    return Persist((PersistRequest(rid, PersistItem(meta, cp, b"x" * size)),))


def _below(core: NodeCore, msg, now: float = 0.0, who: bytes = CLIENT) -> list[Instruction]:  # type: ignore[no-untyped-def]
    return core.handle(MessageFromBelow(now, who, msg))


def _replies(out: list[Instruction], who: bytes = CLIENT) -> list[object]:
    return [i.message for i in out if isinstance(i, ReplyBelow) and i.identity == who]


def test_a_hello_is_answered_with_the_highest_common_version_and_the_node_id() -> None:
    core = _core()
    assert _replies(_below(core, WireHello((1, 2, 3)))) == [WireHello((2,), "n")]
    assert _replies(_below(core, WireHello((1,)), who=OTHER), OTHER) == [WireHello((1,), "n")]
    assert core.statistics().wire_refusals == 0


def test_a_ping_is_answered_by_the_core_with_a_pong_of_the_same_sequence() -> None:
    core = _core()
    assert _replies(_below(core, Ping(41))) == [Pong(41)]
    assert _replies(_below(core, Ping(42))) == [Pong(42)]  # no hello needed
    assert core.statistics().pings_answered == 2


def test_no_common_version_is_refused_naming_both_sides_and_the_peer_stays_refused() -> None:
    core = _core(wire_versions=(3,))
    (err,) = _replies(_below(core, WireHello((1, 2))))
    assert err == Error("no common wire version: this node speaks [3], the peer [1, 2]")
    # everything else of that peer gets the refusal; persist items as error acks
    assert _replies(_below(core, Register("w"))) == [err]
    assert _replies(_below(core, Ping(1))) == [err]
    (ack,) = _replies(_below(core, _persist("w")))
    assert isinstance(ack, PersistAck) and [e.error for e in ack.items] == [err.message]
    assert core.statistics().bytes_received == 0 and core.writers_below == 0
    assert core.statistics().wire_refusals == 4
    # a hello that matches lifts the refusal
    assert _replies(_below(core, WireHello((2, 3)))) == [WireHello((3,), "n")]
    assert _replies(_below(core, _persist("w"))) == []
    assert core.statistics().bytes_received == 10


def test_a_node_not_speaking_version_1_refuses_a_peer_that_sent_no_hello() -> None:
    core = _core(wire_versions=(2,))
    (err,) = _replies(_below(core, Register("w")))
    assert isinstance(err, Error)
    assert err.message.endswith("this node speaks [2], the peer [1] (it sent no hello)")
    _below(core, WireHello((2,)), who=OTHER)
    assert _replies(_below(core, Register("w2"), who=OTHER), OTHER) == []


def test_a_node_speaking_version_1_serves_a_peer_without_hello_as_before() -> None:
    core = _core()
    assert _replies(_below(core, _persist("w"))) == []
    assert core.statistics().bytes_received == 10


def test_hostile_version_messages_get_an_error_and_the_node_keeps_serving() -> None:
    core = _core()
    (err,) = _replies(_below(core, WireHello((2,), "impostor")))  # an answer, from below
    assert isinstance(err, Error) and "names no node" in err.message
    (err,) = _replies(_below(core, Pong(3)))  # nobody pinged it
    assert isinstance(err, Error) and "unexpected Pong" in err.message
    (err,) = _replies(core.handle(MalformedFromBelow(0.0, CLIENT, "bad 'hello' message")))
    assert isinstance(err, Error)
    assert _replies(_below(core, Ping(1))) == [Pong(1)]
    assert _replies(_below(core, _persist("w"))) == []
    assert core.statistics().bytes_received == 10
    assert core.statistics().rejected_messages == 3


def test_a_full_backlog_sends_pongs_to_version_2_peers_every_ping_interval() -> None:
    """The shell stops reading from below while the backlog is full, so pings wait: the
    core tells its version-2 peers it makes progress all the same."""
    core = _core(max_queued_bytes=100, ping_interval=0.1)
    _below(core, WireHello((1, 2)))
    _below(core, Register("old"), who=OTHER)  # a version-1 peer: never gets a pong
    _below(core, Register("w2"))  # never persists: the batch waits for its delay
    out = _below(core, _persist("w", size=120), now=0.0)
    assert not core.accepting()
    assert _replies(out) == [Pong(0)] and _replies(out, OTHER) == []
    assert _replies(core.handle(TimePassed(0.05))) == []
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= 0.1
    assert _replies(core.handle(TimePassed(0.1))) == [Pong(0)]


def test_an_undeliverable_reply_forgets_the_peer_s_version() -> None:
    core = _core(max_queued_bytes=100)
    _below(core, WireHello((2,)))
    core.handle(ReplyFailed(0.0, CLIENT, Pong(0)))
    _below(core, Register("w2"), who=OTHER)
    _below(core, _persist("w", size=120), who=OTHER)
    assert not core.accepting()
    assert _replies(core.handle(TimePassed(1.0))) == []


def test_the_peers_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_module, "_MAX_PEERS", 4)
    core = _core(wire_versions=(3,))
    for k in range(10):
        _below(core, WireHello((1,)), who=f"p{k}".encode())
    assert len(core._refused) == 4  # the newest four
    # the oldest forgotten: it speaks version 1 again, which this node refuses all the same
    (err,) = _replies(_below(core, Register("w"), who=b"p0"), b"p0")
    assert isinstance(err, Error) and "(it sent no hello)" in err.message


def test_bad_wire_versions_in_the_config_are_refused() -> None:
    with pytest.raises(ValueError, match="wire_versions"):
        NodeConfig("n", None, 1, wire_versions=())
    with pytest.raises(ValueError, match="liveness_timeout"):
        NodeConfig("n", None, 1, ping_interval=1.0, liveness_timeout=0.5)
    assert NodeConfig("n", None, 1, wire_versions=(2, 1, 2)).wire_versions == (1, 2)


def test_the_topology_carries_the_wire_settings_to_the_node_config() -> None:
    from dstltree.aggregator.process import node_config
    from dstltree.client.wire import WIRE_VERSIONS
    from dstltree.topology.config import TopologyError, parse_topology

    nodes = [{"id": "root"}]
    cfg = node_config(parse_topology({"nodes": nodes}), "root", 0, None)
    assert (cfg.wire_versions, cfg.ping_interval, cfg.liveness_timeout) == (WIRE_VERSIONS, 0.1, 0.5)
    doc = {"nodes": nodes, "wire_versions": [1], "ping_interval": 0.2, "liveness_timeout": 1.0}
    cfg = node_config(parse_topology(doc), "root", 0, None)
    assert (cfg.wire_versions, cfg.ping_interval, cfg.liveness_timeout) == ((1,), 0.2, 1.0)
    for bad, field in (
        ({"wire_versions": [0]}, "wire_versions"),
        ({"wire_versions": [2, 2]}, "wire_versions"),
        ({"wire_versions": []}, "wire_versions"),
        ({"ping_interval": 0}, "ping_interval"),
        ({"ping_interval": 0.5, "liveness_timeout": 0.2}, "liveness_timeout"),
    ):
        with pytest.raises(TopologyError, match=field):
            parse_topology({"nodes": nodes, **bad})
