"""A hypothesis state machine of the node core: random persists from a client and a
child, the clock, object writes that succeed or fail, upstream acks and errors. The core
runs with ``validate=True`` (its invariants checked after every event); the model checks
from outside that no item is acknowledged before a write holding it completed, and that
at the end every item was answered exactly once (acked, or an error: written again)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dstltree.aggregator.core import NodeConfig, NodeCore
from dstltree.aggregator.events import (
    Event,
    Instruction,
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
from dstltree.client.batching import PersistItem, RemoteOrigin
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import AckEntry, Persist, PersistAck, PersistRequest, Register

CLIENT, CHILD = b"client", b"child"
PARENT = "tcp://parent:1"
Key = tuple[bytes, int]


class NodeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        cfg = NodeConfig("n", PARENT, 50, persist_delay=0.05, parent_timeout=1.0, plans=False)
        self.core = NodeCore(cfg, validate=True)
        self.now = 0.0
        self.rid = 0
        self.submitted: set[Key] = set()
        self.answered: dict[Key, str] = {}  # key -> "ack" | "error"
        self.writes: dict[int, tuple[PersistItem, ...]] = {}
        self.forwarded: dict[int, PersistItem] = {}  # upstream request id -> item
        self.holders: dict[str, set[Key]] = {}  # path -> keys it holds

    # -- driving -----------------------------------------------------------------------
    def _handle(self, event: Event, completes: str | None = None) -> None:
        out = self.core.handle(event)
        self._observe(out, completes)

    def _observe(self, out: list[Instruction], completes: str | None) -> None:
        for ins in out:
            if isinstance(ins, WriteObject):
                self.writes[ins.object_id] = ins.items
                self.holders[f"/obj{ins.object_id}"] = {_key(i) for i in ins.items}
            elif isinstance(ins, SendUpstream) and isinstance(ins.message, Persist):
                for r in ins.message.requests:
                    if r.item.data is not None:
                        self.forwarded[r.id] = r.item
                        self.holders[f"/up{r.id}"] = {_key(r.item)}
            elif isinstance(ins, ReplyBelow) and isinstance(ins.message, PersistAck):
                for e in ins.message.items:
                    self._answered((ins.identity, e.id), e, completes)

    def _answered(self, key: Key, entry: AckEntry, completes: str | None) -> None:
        assert key in self.submitted, f"ack for {key}, never sent by that sender"
        assert key not in self.answered, f"{key} answered twice"
        if entry.error is None:
            assert entry.path == completes, f"{key} acked at {entry.path} during {completes}"
            assert key in self.holders[entry.path], f"{key} is not in {entry.path}"
        self.answered[key] = "ack" if entry.error is None else "error"

    # -- rules -------------------------------------------------------------------------
    @rule(log=st.sampled_from(["w1", "w2", "w3"]))
    def register(self, log: str) -> None:
        self._handle(MessageFromBelow(self.now, CLIENT, Register(log)))

    @rule(
        child=st.booleans(),
        log=st.sampled_from(["w1", "w2", "w3"]),
        cp=st.integers(0, 3),
        size=st.integers(0, 40),
    )
    def persist(self, child: bool, log: str, cp: int, size: int) -> None:
        self.rid += 1
        who = CHILD if child else CLIENT
        meta = SegmentMeta(log, cp, cp + 1, (0,), size)
        item = PersistItem(meta, cp, b"x" * size if size else None)
        if size:
            self.submitted.add((who, self.rid))
        msg = Persist((PersistRequest(self.rid, item),), "child" if child else None)
        self._handle(MessageFromBelow(self.now, who, msg))

    @rule(dt=st.sampled_from([0.01, 0.06, 0.5, 1.1, 6.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self._handle(TimePassed(self.now))

    @rule()
    def parent_lost(self) -> None:
        """The socket monitor saw the parent's connection drop: items in flight there
        go on at once (written here: no ancestors without plans); late acks for them
        are ignored."""
        self._handle(UpstreamLost(self.now, PARENT))

    @rule()
    def parent_back(self) -> None:
        """Its connection is re-established (used again after the hold-down)."""
        self._handle(UpstreamUp(self.now, PARENT))

    @precondition(lambda self: bool(self.writes))
    @rule(data=st.data(), ok=st.booleans())
    def object_done(self, data: st.DataObject, ok: bool) -> None:
        oid = data.draw(st.sampled_from(sorted(self.writes)))
        self._finish_write(oid, ok)

    @precondition(lambda self: bool(self.forwarded))
    @rule(data=st.data(), ok=st.booleans())
    def upstream_answers(self, data: st.DataObject, ok: bool) -> None:
        fid = data.draw(st.sampled_from(sorted(self.forwarded)))
        self._answer_upstream(fid, ok)

    def _finish_write(self, oid: int, ok: bool) -> None:
        items = self.writes.pop(oid)
        path = f"/obj{oid}"
        if ok:
            refs = tuple(SegmentRef(i.meta, path, 0) for i in items)
            self._handle(ObjectWritten(self.now, oid, path, refs), completes=path)
        else:
            self._handle(ObjectFailed(self.now, oid, "injected"))

    def _answer_upstream(self, fid: int, ok: bool) -> None:
        self.forwarded.pop(fid)
        path = f"/up{fid}"
        entry = AckEntry(fid, path, 0) if ok else AckEntry(fid, error="injected")
        self._handle(MessageFromUpstream(self.now, PARENT, PersistAck((entry,))), completes=path)

    @invariant()
    def nothing_answered_twice(self) -> None:
        assert set(self.answered) <= self.submitted

    def teardown(self) -> None:
        """Let every write and forward complete: each item is answered exactly once."""
        for _ in range(20):
            for fid in sorted(self.forwarded):
                self._answer_upstream(fid, True)
            for oid in sorted(self.writes):
                self._finish_write(oid, True)
            self.now += 10.0
            self._handle(TimePassed(self.now))
            if not self.writes and not self.forwarded:
                break
        assert set(self.answered) == self.submitted, "an item was never answered"


def _key(item: PersistItem) -> Key:
    assert isinstance(item.origin, RemoteOrigin)
    return (item.origin.identity, item.origin.request_id)


NodeMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_node_core_state_machine = NodeMachine.TestCase
