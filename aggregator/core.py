"""The aggregator node as a pure state machine: ``handle(event) -> instructions``.

No sockets, threads or clocks here (pattern of dask/distributed's worker state machine):
``aggregator.node`` drives it over ZeroMQ; tests drive it directly.

Rules (docs/design.md, Data flow 3-4, The plan, Invariants):
- Items from below join the batch. The batch is flushed on size (>= target bytes),
  when every writer routed here has persisted for one checkpoint, or ``persist_delay``
  seconds after its first item (FLIP-158, Implementation notes).
- At a flush each item goes to its route: with a plan for the item's window, the
  planned collector (the node that writes the object: this node, or an ancestor
  reached directly: one hop); without a
  plan, the parent (hop by hop), except on a size flush, at the root or while the
  parent is unreachable, when this node writes ONE object itself.
- Frames are passed on untouched; acks go back to whoever sent the items.
- An item not acked within ``parent_timeout`` is written by this node itself; the
  unresponsive address is marked down and, if it was the parent, the node re-homes to
  its next configured parent (a DAG's second way up), else its next live ancestor
  (plans carry the ancestors); it returns to the most preferred configured parent
  once that one is usable again. A late ack is ignored; the
  duplicate copy becomes an orphan for cleanup.
- Acks are sent only after the object holding the item was fully written.
- Statistics flow up (residual writers and bytes per checkpoint, highest checkpoint
  seen, newest plan window held): at once when the residual writer count changes,
  at most every ``stats_interval`` seconds when anything else in them changed, and
  every ``stats_keepalive`` seconds otherwise (the parent's lease on this node);
  plans for window w+1 flow down during window w (FLIP-158, Future directions).

Hostile and malformed input (every refusal answers with an error and is counted):

- Checkpoint horizon. ``_max_cp`` (the highest checkpoint seen) is held by the live
  peers that reported a checkpoint within ``checkpoint_window`` of it: own writers (by
  their last persisted checkpoint) and children (by the ``max_checkpoint`` of their
  last Stats). A checkpoint id farther than the window from the horizon is refused
  (a Stats with an ``Error`` reply, a persist item with an error ack: the writer
  falls back to DFS) while a holder is alive. When no holder is alive any more (all
  unregistered or their leases ended), the horizon resets: the next checkpoint id,
  however small, starts it again (a long-lived node reused by a new job whose ids
  restart at 1), and the plans of the old horizon are forgotten. Advancing the
  horizon costs O(1) whatever the jump (at most ``ByteEstimator.history`` samples).
  Limits: the first checkpoint seen starts the horizon, so a peer that reports
  before the job's writers holds it while it stays alive, and a peer inside the
  window can move it by up to the window per message (authentication keeps such
  peers out; the writers refused fall back to DFS).
- Peers. At most ``max_writers`` own writers (``max_writers_per_peer`` per ROUTER
  identity) and ``max_children`` children (``max_children_per_peer`` node ids per
  identity); a new one beyond is refused.
- Back-pressure. :meth:`NodeCore.accepting` is False while the batch plus the objects
  being written hold ``max_queued_bytes`` or more: the shell stops reading from below.
- Plans. A plan is (re)sent to a child whenever its Stats arrive and it has not had
  it on its current identity (a reconnect gets a new ROUTER identity), when the Stats
  say it holds an older newest window than this node's, and after a failed delivery
  (ReplyFailed).
- Wire versions (client/wire.py). A ``hello`` is answered with the highest version
  common to it and ``wire_versions``, or refused (an ``Error`` naming both sides'
  versions, counted); a refused peer (ROUTER identity) gets that error for every
  other message (its persist items error acks) until a hello of it finds a common
  version. A peer that sent no hello speaks version 1: refused the same way only when
  this node does not speak version 1. At most ``_MAX_PEERS`` peers' versions and
  refusals are remembered (the oldest forgotten first).
- Liveness. A ``ping`` is answered with a ``pong`` by this core, i.e. from the node's
  loop: only a loop that makes progress answers. While the backlog is full (the shell
  does not read from below, so pings wait too) the core sends every version-2 peer a
  ``pong`` each ``ping_interval`` seconds: a node pushing back is slow, not dead.

Convention (dask/distributed worker_state_machine.py, shared with the coordinator's
core): events and instructions are frozen dataclasses (``aggregator.events``);
:meth:`NodeCore.handle` dispatches on the event type (``_handle_event``, one method per
type) and, when built with ``validate=True``, then calls :meth:`NodeCore.validate`,
which raises :class:`NodeInvariantError` naming the violated invariant.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import singledispatchmethod
from typing import Any, TypeVar

from dstltree.aggregator.events import (
    Event,
    Instruction,
    MalformedFromBelow,
    MessageFromBelow,
    MessageFromUpstream,
    ObjectFailed,
    ObjectWritten,
    ReplyBelow,
    ReplyFailed,
    SendUpstream,
    ShuttingDown,
    TimePassed,
    UpstreamLost,
    UpstreamUp,
    WriteObject,
)
from dstltree.aggregator.groups import GroupHold
from dstltree.aggregator.notes import NoteRouter
from dstltree.client.batching import Batch, PersistItem, RemoteOrigin
from dstltree.client.handle import SegmentRef
from dstltree.client.liveness import DEFAULT_LIVENESS_TIMEOUT, DEFAULT_PING_INTERVAL, check_timing
from dstltree.client.wire import (
    WIRE_VERSIONS,
    AckEntry,
    Error,
    Note,
    Persist,
    PersistAck,
    PersistRequest,
    Ping,
    Plan,
    Pong,
    Register,
    Stats,
    Unregister,
    WireHello,
    check_versions,
    common_version,
    persist_messages,
    refusal,
)
from dstltree.topology.plan import ByteEstimator, decide_local, window_of

_T = TypeVar("_T")
_K = TypeVar("_K")
SELF = ""  # route: write here
_PLANS_KEPT = 3  # plan windows remembered below the newest (bookkeeping bound)
_MAX_LOST = 1024  # upstream addresses remembered as lost (bookkeeping bound)
_MAX_PEERS = 8192  # peers whose wire version or refusal is remembered (bookkeeping bound)


class NodeInvariantError(RuntimeError):
    """:meth:`NodeCore.validate` found a violated invariant; the message names it."""


@dataclass(frozen=True)
class NodeConfig:
    """Thresholds of one node. Sizes in bytes, times in seconds. ``address`` is this
    node's own endpoint (passed down in plans); ``parent_address`` None at the root.
    ``fallback_addresses``: the further parents' endpoints in order of preference (a
    DAG's second ways up), tried before the plan's ancestors when the parent is lost.
    ``registration_lease``: a writer or child not heard from for this long is forgotten.
    ``parent_retry_after``: an upstream address that timed out or whose connection was
    lost is not used for this long, and after a lost connection not before the
    connection is back and stayed up for this long (hold-down); then the node returns
    to its configured parent if it had re-homed.
    ``stats_interval``: the least time between two Stats reports when something in
    them changed; ``stats_keepalive``: between two reports when nothing did (keep it
    well under the parent's ``registration_lease``).
    ``checkpoint_window``: checkpoint ids farther than this from the horizon are refused
    while the horizon is held; ``max_*``: peer bounds (module docstring);
    ``max_queued_bytes``: batch plus objects being written (bytes) before the node stops
    reading from below. ``max_forward_bytes``: segment bytes per Persist message sent
    upstream; a flush passing on more sends several messages (a message above the
    upstream node's size limit would be refused whole). ``wire_versions``: the wire
    protocol versions this node speaks (client/wire.py); ``ping_interval``: seconds
    between the pongs it sends its version-2 peers while its backlog is full (the
    module docstring, Liveness), and between the pings the shell sends upstream;
    ``liveness_timeout``: seconds without a message from an upstream node before the
    shell reports it lost (client/liveness.py). ``group_wait``: seconds a flush group's
    items are held for its missing parts at most (aggregator/groups.py). Raises ValueError for bad
    ``wire_versions`` or timings."""

    node_id: str
    parent_address: str | None
    target_bytes: int
    fallback_addresses: tuple[str, ...] = ()
    address: str = ""
    persist_delay: float = 0.05
    parent_timeout: float = 2.0
    parent_retry_after: float = 5.0
    registration_lease: float = 10.0
    stats_interval: float = 0.2
    stats_keepalive: float = 1.0
    plans: bool = True
    plan_window: int = 16
    checkpoint_window: int = 100_000
    max_writers: int = 4096
    max_writers_per_peer: int = 1024
    max_children: int = 256
    max_children_per_peer: int = 1
    max_queued_bytes: int = 256 * 1024 * 1024
    max_forward_bytes: int = 16 * 1024 * 1024
    wire_versions: tuple[int, ...] = WIRE_VERSIONS
    ping_interval: float = DEFAULT_PING_INTERVAL
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
    group_wait: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "wire_versions", check_versions(self.wire_versions))
        check_timing(self.ping_interval, self.liveness_timeout)

    @property
    def has_parent(self) -> bool:
        return self.parent_address is not None


@dataclass(frozen=True)
class NodeStatistics:
    """A snapshot of a node's counters (bytes are segment payload bytes)."""

    node_id: str
    writers_below: int
    objects_written: int
    bytes_written: int
    segments_written: int
    bytes_forwarded: int
    bytes_relayed: int
    bytes_received: int
    bytes_own: int
    queued_bytes: int
    in_flight_up: int
    parent_timeouts: int
    rejected_messages: int
    parent_down: bool
    plan_changes: int
    plan_window: int | None
    writes_for_window: bool
    messages_below: int = 0
    refused_checkpoints: int = 0
    refused_peers: int = 0
    horizon_resets: int = 0
    plans_resent: int = 0
    undeliverable_replies: int = 0
    backlog_bytes: int = 0
    undeliverable_upstream: int = 0
    malformed_upstream: int = 0
    backpressure_pauses: int = 0
    backpressure_seconds: float = 0.0
    upstream_losses: int = 0
    loop_writes: int = 0
    loop_takeovers: int = 0
    pings_answered: int = 0
    wire_refusals: int = 0
    upstream_silences: int = 0
    upstream_refusals: int = 0


@dataclass(slots=True)
class _Sent:
    item: PersistItem
    address: str
    deadline: float


@dataclass
class _Child:
    identity: bytes
    writers: int
    reported_bytes: float
    seen: float
    max_cp: int = -1


class NodeCore:
    """State of one node; see the module docstring for the rules. ``validate``: check
    the invariants after every event (:meth:`validate`; tests)."""

    def __init__(self, config: NodeConfig, validate: bool = False) -> None:
        self.config = config
        self.batch = Batch(config.target_bytes, config.persist_delay)
        self._groups = GroupHold(config.group_wait)  # flush groups written here, incomplete
        self._group_ready: list[PersistItem] = []  # complete groups: to batch and flush
        self._notes = NoteRouter(config.registration_lease)
        self._relay_check_at = config.max_forward_bytes  # batch bytes of the next relay check
        self.parent: str | None = config.parent_address
        self._validate = validate
        self._writers: dict[str, float] = {}  # own log_id -> last seen, oldest first
        self._writer_cp: dict[str, int] = {}  # own log_id -> last checkpoint
        self._writer_peer: dict[str, bytes] = {}  # own log_id -> ROUTER identity
        self._peer_writers: dict[bytes, int] = defaultdict(int)  # identity -> own writers
        self._children: dict[str, _Child] = {}  # in order of last report (expiry)
        self._peer_children: dict[bytes, int] = {}  # identity -> child node ids
        self._live: int | None = None  # cached _live_writers() (None: recompute)
        self._child_writers: int | None = None  # cached sum of the children's writers
        self._sent: dict[int, _Sent] = {}
        self._writing: dict[int, tuple[PersistItem, ...]] = {}
        self._ids: Iterator[int] = itertools.count(1)
        self._down: dict[str, float] = {}  # address -> down until
        self._lost: set[str] = set()  # connection lost, not re-established since
        self._plans: dict[int, tuple[str, str]] = {}  # window -> collector (id, address)
        self._pushed: dict[tuple[str, int], bytes] = {}  # (child, window) -> identity
        self._writing_bytes = 0
        self._ancestors: tuple[tuple[str, str], ...] = ()
        self._estimator = ByteEstimator(16)
        self._own_cp_bytes: dict[int, int] = defaultdict(int)
        self._max_cp = -1
        self._last_stats = 0.0
        self._reported_writers = -1
        self._stats_dirty = True  # something in the next Stats differs from the last
        self._counters: dict[str, int] = defaultdict(int)
        self._peer_versions: dict[bytes, int] = {}  # ROUTER identity -> agreed version
        self._refused: dict[bytes, str] = {}  # ROUTER identity -> why its hello was refused
        self._speaks_v1 = 1 in config.wire_versions
        self._keepalive_at = 0.0  # the next pongs while the backlog is full
        self._last: tuple[Event, dict[RemoteOrigin, str], list[Instruction]] | None = None
        self._dispatch = self._handle_event  # bound once: singledispatchmethod binds per call

    # -- public --------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; return what the shell must do, in order. Built with
        ``validate=True``, the invariants are checked afterwards (NodeInvariantError)."""
        before = self._item_states() if self._validate else {}
        out = self._dispatch(event)
        out += self._housekeeping(event.now)
        if self._validate:
            self._last = (event, before, out)
            self.validate()
        return out

    def handle_many(self, events: list[Event]) -> list[Instruction]:
        """Apply ``events`` (in time order) as :meth:`handle` would, but with the
        time-driven rules run once after the last one (and after any event that fills
        the batch to its target): the shell's cheap path for a burst of messages.
        Built with ``validate=True``, it is :meth:`handle` per event."""
        if self._validate:
            return [i for e in events for i in self.handle(e)]
        out: list[Instruction] = []
        for event in events:
            out += self._dispatch(event)
            if self.batch.nbytes >= self.config.target_bytes:
                out += self._housekeeping(event.now)
        if events:
            out += self._housekeeping(events[-1].now)
        return out

    @singledispatchmethod
    def _handle_event(self, event: Event) -> list[Instruction]:
        raise TypeError(f"unknown event {event!r}")

    @_handle_event.register
    def _(self, event: MessageFromBelow) -> list[Instruction]:
        self._counters["messages_below"] += 1
        return self._from_below(event.identity, event.message, event.now)

    @_handle_event.register
    def _(self, event: MalformedFromBelow) -> list[Instruction]:
        self._counters["messages_below"] += 1
        return self._reject(event.identity, event.reason)

    @_handle_event.register
    def _(self, event: MessageFromUpstream) -> list[Instruction]:
        msg = event.message
        if isinstance(msg, PersistAck):
            return self._relay_acks(event.address, msg.items)
        if isinstance(msg, Plan) and event.address == self.parent:
            return self._on_plan(msg, event.now)
        if isinstance(msg, Note):
            return self._on_note(None, msg, event.now)
        return []

    @_handle_event.register
    def _(self, event: UpstreamLost) -> list[Instruction]:
        return self._upstream_lost(event.address, event.now)

    @_handle_event.register
    def _(self, event: UpstreamUp) -> list[Instruction]:
        if event.address in self._lost:  # back: used again after the hold-down
            self._lost.discard(event.address)
            until = event.now + self.config.parent_retry_after
            self._down[event.address] = max(self._down.get(event.address, until), until)
        return []

    @_handle_event.register
    def _(self, event: ObjectWritten) -> list[Instruction]:
        return self._written(event.object_id, event.refs)

    @_handle_event.register
    def _(self, event: ObjectFailed) -> list[Instruction]:
        return self._failed(event.object_id, event.error)

    @_handle_event.register
    def _(self, event: TimePassed) -> list[Instruction]:
        return []

    @_handle_event.register
    def _(self, event: ReplyFailed) -> list[Instruction]:
        self._counters["undeliverable_replies"] += 1
        self._peer_versions.pop(event.identity, None)  # gone (or not reading)
        self._refused.pop(event.identity, None)
        if isinstance(event.message, Plan):  # forget it as pushed: the next Stats resend it
            window = event.message.window
            for key in [k for k, i in self._pushed.items() if i == event.identity]:
                if key[1] == window:
                    del self._pushed[key]
                    self._counters["plans_resent"] += 1
        return []

    @_handle_event.register
    def _(self, event: ShuttingDown) -> list[Instruction]:
        return self._write(self.batch.take() + self._groups.take_all())

    def accepting(self) -> bool:
        """False while the batch plus the objects being written hold
        ``config.max_queued_bytes`` or more (the shell stops reading from below)."""
        return self.backlog_bytes < self.config.max_queued_bytes

    def idle(self) -> bool:
        """Nothing batched, being written or awaiting an upstream ack (shutdown)."""
        return not self.batch.items and not self._writing and not self._sent and not self._groups

    @property
    def backlog_bytes(self) -> int:
        """Segment bytes batched or being written by this node (bytes)."""
        return self.batch.nbytes + self._writing_bytes + self._groups.nbytes

    def next_deadline(self) -> float | None:
        """The earliest time a TimePassed would change something (None: nothing pending)."""
        times = []
        if self._sent:  # in send order: the first one is due first
            times.append(next(iter(self._sent.values())).deadline)
        if (d := self.batch.deadline()) is not None:
            times.append(d)
        if (d := self._groups.deadline()) is not None:
            times.append(d)
        if self.parent is not None:
            times.append(self._stats_due_at())
        if self._peer_versions and not self.accepting():
            times.append(self._keepalive_at)
        return min(times) if times else None

    @property
    def writers_below(self) -> int:
        """Residual writers of this subtree: own plus the children's residual writers."""
        if self._child_writers is None:
            self._child_writers = sum(c.writers for c in self._children.values())
        return self._live_writers() + self._child_writers

    def _live_writers(self) -> int:
        """Own writers expected to persist for the next checkpoint: registered ones that
        persisted for the current or previous checkpoint, or have not persisted for any
        yet. A writer of a crashed task stops counting within two checkpoints, long
        before its lease ends, so the all-persisted rule works right after a recovery."""
        if self._live is None:
            recent = self._max_cp - 1
            self._live = sum(1 for w in self._writers if self._writer_cp.get(w, recent) >= recent)
        return self._live

    def expected_writers(self) -> int:
        """Writers whose persist requests reach this node's batch: with a plan naming
        another collector, the children send there directly and only this executor's
        own writers come here; otherwise the whole residual subtree does."""
        planned = self.collector_for(None)
        if planned is not None and planned[0] != self.config.node_id:
            return self._live_writers()
        return self.writers_below

    def collector_for(self, checkpoint: int | None) -> tuple[str, str] | None:
        """(collector id, address) planned for ``checkpoint``'s window (None: the
        highest checkpoint seen), or None without a plan."""
        if not self.config.plans:
            return None
        cp = self._max_cp if checkpoint is None else checkpoint
        if cp < 0:
            return None
        return self._plans.get(window_of(cp, self.config.plan_window))

    def statistics(self, now: float = 0.0, **shell: Any) -> NodeStatistics:
        """A snapshot of the counters; ``shell``: the fields the shell counts itself
        (``undeliverable_upstream``, ``malformed_upstream``, ``backpressure_*``)."""
        c = self._counters
        window = None if self._max_cp < 0 else window_of(self._max_cp, self.config.plan_window)
        return NodeStatistics(
            self.config.node_id,
            self.writers_below,
            c["objects"],
            c["bytes_written"],
            c["segments_written"],
            c["bytes_forwarded"],
            c["bytes_relayed"],
            c["bytes_received"],
            c["bytes_own"],
            self.batch.nbytes,
            len(self._sent),
            c["parent_timeouts"],
            c["rejected"],
            self.parent is not None and not self._up(self.parent, now),
            c["plan_changes"],
            window,
            self._collects(),
            c["messages_below"],
            c["refused_checkpoints"],
            c["refused_peers"],
            c["horizon_resets"],
            c["plans_resent"],
            c["undeliverable_replies"],
            self.backlog_bytes,
            upstream_losses=c["upstream_losses"],
            pings_answered=c["pings"],
            wire_refusals=c["wire_refusals"],
            **shell,
        )

    def _collects(self) -> bool:
        planned = self.collector_for(None)
        return planned is not None and planned[0] == self.config.node_id

    # -- invariants ----------------------------------------------------------------------
    def validate(self) -> None:
        """Check the invariants (docs/design.md, Invariants); raise NodeInvariantError
        naming the first one violated:

        - ``one-state``: every item with data is in exactly one of batched, sent
          upstream awaiting an ack, being written (acked items are in none);
        - ``ack-to-sender``, ``ack-once``, ``ack-after-write``: in the last event's
          output, an ack names a request pending at that sender, once, and reports
          success only for the object just written or the upstream that acked it;
        - ``bounded``: leases, deadlines, down marks and plans are pruned on time.
        """
        states = self._item_states()
        if self._last is not None:
            event, before, out = self._last
            self._check_acks(event, before, states, out)
            self._check_bounds(event.now)

    def _item_states(self) -> dict[RemoteOrigin, str]:
        states: dict[RemoteOrigin, str] = {}

        def put(item: PersistItem, state: str) -> None:
            origin = item.origin
            if item.data is None or not isinstance(origin, RemoteOrigin):
                return
            if origin in states:
                raise NodeInvariantError(f"one-state: {origin} is {states[origin]} and {state}")
            states[origin] = state

        for item in self.batch.items:
            put(item, "batched")
        for item in self._groups.items():
            put(item, "grouped")
        for sent in self._sent.values():
            put(sent.item, f"sent:{sent.address}")
        for oid, items in self._writing.items():
            for item in items:
                put(item, f"writing:{oid}")
        return states

    def _check_acks(
        self,
        event: Event,
        before: dict[RemoteOrigin, str],
        now_states: dict[RemoteOrigin, str],
        out: list[Instruction],
    ) -> None:
        by_key = {(o.identity, o.request_id): (o, st) for o, st in before.items()}
        done = {(o.identity, o.request_id) for o in now_states}
        seen: set[tuple[bytes, int]] = set()
        for ins in out:
            if not (isinstance(ins, ReplyBelow) and isinstance(ins.message, PersistAck)):
                continue
            for entry in ins.message.items:
                key = (ins.identity, entry.id)
                if _refusal(event, ins.identity, entry):
                    continue
                if key not in by_key:
                    raise NodeInvariantError(f"ack-to-sender: {key} was not pending there")
                if key in seen or key in done:
                    raise NodeInvariantError(f"ack-once: {key} acked twice or still pending")
                seen.add(key)
                if by_key[key][1] != _ack_source(event, entry):
                    raise NodeInvariantError(
                        f"ack-after-write: {key} was {by_key[key][1]} when acked by {event!r}"
                    )

    def _check_bounds(self, now: float) -> None:
        lease = self.config.registration_lease
        if any(now - seen > lease for seen in self._writers.values()) or any(
            now - c.seen > lease for c in self._children.values()
        ):
            raise NodeInvariantError("bounded: a registration outlived its lease")
        if any(s.deadline <= now for s in self._sent.values()):
            raise NodeInvariantError("bounded: an item sent upstream is past its deadline")
        if any(until <= now for until in self._down.values()):
            raise NodeInvariantError("bounded: an expired down mark is kept")
        if len(self._plans) > _PLANS_KEPT + 1:
            raise NodeInvariantError(f"bounded: {len(self._plans)} plan windows kept")
        if any(w not in self._plans for _, w in self._pushed):
            raise NodeInvariantError("bounded: a pushed plan is remembered without its plan")
        if any(i.data is None for items in self._writing.values() for i in items):
            raise NodeInvariantError("one-state: an item without data is being written")

    # -- messages from below -------------------------------------------------------------
    def _reject(self, identity: bytes, reason: str) -> list[Instruction]:
        self._counters["rejected"] += 1
        return [ReplyBelow(identity, Error(reason))]

    def _from_below(self, identity: bytes, msg: object, now: float) -> list[Instruction]:
        if isinstance(msg, WireHello):
            return self._on_hello(identity, msg)
        if identity in self._refused or (
            not self._speaks_v1 and identity not in self._peer_versions
        ):
            return self._refuse_message(identity, msg)
        match msg:
            case Ping(seq):
                self._counters["pings"] += 1
                return [ReplyBelow(identity, Pong(seq))]
            case Register(log_id):
                if not self._register(identity, log_id, now):  # counted there
                    return [ReplyBelow(identity, Error(f"too many writers; {log_id!r} refused"))]
                return []
            case Unregister(log_id):
                self._forget_writer(log_id)
                self._check_horizon()
                return []
            case Stats():
                return self._on_stats(identity, msg, now)
            case Persist(requests, via):
                return self._on_persist(identity, requests, via is not None, now)
            case Note():
                return self._on_note(identity, msg, now)
        return self._reject(identity, f"unexpected {type(msg).__name__} from below")

    def _on_hello(self, identity: bytes, msg: WireHello) -> list[Instruction]:
        """Answer with the highest common version (remembered for this peer), or refuse
        (remembered too: the module docstring, Wire versions)."""
        if msg.node is not None:  # an answer is what a node sends, not what it receives
            return self._reject(identity, "a hello from below lists versions, names no node")
        version = common_version(self.config.wire_versions, msg.versions)
        if version is None:
            why = refusal(self.config.wire_versions, msg.versions)
            _remember(self._refused, identity, why)
            self._peer_versions.pop(identity, None)
            self._counters["wire_refusals"] += 1
            return [ReplyBelow(identity, Error(why))]
        self._refused.pop(identity, None)
        _remember(self._peer_versions, identity, version)
        return [ReplyBelow(identity, WireHello((version,), self.config.node_id))]

    def _refuse_message(self, identity: bytes, msg: object) -> list[Instruction]:
        """A message of a peer whose versions this node refuses: the refusal again (as
        error acks for persist items, so the sender does not wait for them)."""
        why = self._refused.get(identity) or refusal(self.config.wire_versions, None)
        self._counters["wire_refusals"] += 1
        if isinstance(msg, Persist):
            entries = tuple(AckEntry(r.id, error=why) for r in msg.requests)
            return [ReplyBelow(identity, PersistAck(entries))]
        return [ReplyBelow(identity, Error(why))]

    def _keepalives(self, now: float) -> list[Instruction]:
        """While the backlog is full (the front is not read, pings wait): a pong to
        every version-2 peer each ``ping_interval`` seconds."""
        if now < self._keepalive_at:
            return []
        self._keepalive_at = now + self.config.ping_interval
        return [ReplyBelow(i, Pong(0)) for i, v in self._peer_versions.items() if v >= 2]

    def _on_persist(
        self, identity: bytes, requests: tuple[PersistRequest, ...], relayed: bool, now: float
    ) -> list[Instruction]:
        """Batch each request (refusals answered in one error ack); the batch is cut
        as soon as it reaches the target, so one message carrying many items still
        makes objects of about the target size."""
        out: list[Instruction] = []
        refused: list[AckEntry] = []
        target = self.config.target_bytes
        relay = self.parent is not None and target > self.config.max_forward_bytes
        for r in requests:
            if (why := self._accept(identity, r, relayed, now)) is not None:
                refused.append(AckEntry(r.id, error=why))
            elif self.batch.nbytes >= target:
                out += self._flush("size", now)
            elif relay and self.batch.nbytes >= self._relay_check_at:
                out += self._relay_cut(now)
        if refused:
            out.append(ReplyBelow(identity, PersistAck(tuple(refused))))
        if self._group_ready:
            out += self._flush_groups(self._group_ready, now)
            self._group_ready = []
        return out

    def _flush_groups(self, items: list[PersistItem], now: float) -> list[Instruction]:
        """Complete (or timed-out) flush groups: batched with whatever waits, flushed."""
        for item in items:
            self.batch.add(item, now)
        return self._flush("group", now)

    def _on_note(self, identity: bytes | None, note: Note, now: float) -> list[Instruction]:
        """Pass a note on (aggregator/notes.py): to this node's clients it names, the
        children and the parent the rules give."""
        children = [c.identity for c in self._children.values()]
        from_child = identity is not None and identity in self._peer_children
        parent_up = self.parent is not None and self._up(self.parent, now)
        routes = self._notes.route(note, identity, from_child, children, parent_up, now)
        self._counters["notes"] += 1
        passed = Note(note.to, note.frm, note.body, self.config.node_id)
        out: list[Instruction] = [ReplyBelow(i, passed) for i in routes.clients]
        out += [ReplyBelow(i, passed) for i in routes.children]
        if routes.up and self.parent is not None:
            out.append(SendUpstream(self.parent, passed))
        return out

    def _on_stats(self, identity: bytes, msg: Stats, now: float) -> list[Instruction]:
        node, cp = msg.node, msg.max_checkpoint
        child = self._children.get(node)
        if child is None and not self._child_room(identity):
            return self._refuse_peer(identity, f"too many children; {node!r} refused")
        if not self._admit_checkpoint(cp):
            return [ReplyBelow(identity, Error(self._out_of_window(cp)))]
        if child is not None and child.identity != identity:
            self._counters["plans_resent"] += sum(1 for k in self._pushed if k[0] == node)
        if child is None or child.reported_bytes != msg.bytes_per_checkpoint:
            self._stats_dirty = True  # this node's residual bytes changed
        self._drop_child(node)
        self._children[node] = _Child(identity, msg.writers, msg.bytes_per_checkpoint, now, cp)
        self._peer_children[identity] = self._peer_children.get(identity, 0) + 1
        self._see_checkpoint(cp)
        return self._push_plans_to(node, msg.plan_window)

    def _refuse_peer(self, identity: bytes, reason: str) -> list[Instruction]:
        self._counters["refused_peers"] += 1
        return [ReplyBelow(identity, Error(reason))]

    def _child_room(self, identity: bytes) -> bool:
        """Room for a new child node reporting on ROUTER ``identity``."""
        if len(self._children) >= self.config.max_children:
            return False
        return self._peer_children.get(identity, 0) < self.config.max_children_per_peer

    def _drop_child(self, node: str) -> None:
        child = self._children.pop(node, None)
        self._child_writers = None
        if child is not None:
            self._peer_children[child.identity] -= 1
            if self._peer_children[child.identity] <= 0:
                del self._peer_children[child.identity]

    def _register(self, identity: bytes, log_id: str, now: float) -> bool:
        """Register (or renew) own writer ``log_id`` of ROUTER ``identity``; False when
        the peer bounds refuse it (counted)."""
        old = self._writer_peer.get(log_id)
        if old != identity:
            full = old is None and len(self._writers) >= self.config.max_writers
            if full or self._peer_writers.get(identity, 0) >= self.config.max_writers_per_peer:
                self._counters["refused_peers"] += 1
                return False
            if old is not None:
                self._drop_peer_writer(old)
            else:
                self._live = None
            self._writer_peer[log_id] = identity
            self._peer_writers[identity] += 1
        self._writers.pop(log_id, None)  # re-inserted: the dict stays ordered by last seen
        self._writers[log_id] = now
        return True

    def _forget_writer(self, log_id: str) -> None:
        self._live = None
        self._writers.pop(log_id, None)
        self._writer_cp.pop(log_id, None)
        if (identity := self._writer_peer.pop(log_id, None)) is not None:
            self._drop_peer_writer(identity)

    def _drop_peer_writer(self, identity: bytes) -> None:
        self._peer_writers[identity] -= 1
        if self._peer_writers[identity] <= 0:
            del self._peer_writers[identity]

    def _accept(
        self, identity: bytes, request: PersistRequest, relayed: bool, now: float
    ) -> str | None:
        """Batch one request; the reason it is refused (an error ack), or None."""
        item = request.item.from_origin(RemoteOrigin(identity, request.id, relayed))
        log_id, cp, size = item.meta.log_id, item.checkpoint_id, item.size
        if item.writers is not None and not relayed:
            return "only a node sends a summary of writers"
        if not self._admit_checkpoint(cp):
            return self._out_of_window(cp)
        if not relayed:  # from this executor's own writers (a persist renews the lease)
            if not self._register(identity, log_id, now):
                return f"too many writers; {log_id!r} refused"
            if cp is not None and self._writer_cp.get(log_id) != cp:
                self._writer_cp[log_id] = cp
                self._live = None
            self._counters["bytes_own"] += size
            self._own_bytes(cp, size)
        self._counters["bytes_received"] += size
        if item.group is not None and self._route(cp, "group", now) == SELF:
            self._group_ready += self._groups.add(item, now)  # held here until complete
            return None
        self.batch.add(item, now)
        return None

    def _own_bytes(self, checkpoint: int | None, size: int) -> None:
        cp = self._max_cp + 1 if checkpoint is None else checkpoint
        if cp >= self._max_cp - self._estimator.history:  # older ones no longer matter
            self._own_cp_bytes[cp] += size
        self._see_checkpoint(cp if checkpoint is not None else -1)

    # -- the checkpoint horizon ----------------------------------------------------------
    def _admit_checkpoint(self, cp: int | None) -> bool:
        """True if ``cp`` lies in the window around the horizon, or resets a horizon no
        live peer holds any more; False (counted) otherwise."""
        if cp is None or cp < 0 or self._max_cp < 0:
            return True
        if abs(cp - self._max_cp) <= self.config.checkpoint_window:
            return True
        if self._horizon_held():
            self._counters["refused_checkpoints"] += 1
            return False
        self._reset_horizon()
        return True

    def _out_of_window(self, cp: int | None) -> str:
        return (
            f"checkpoint {cp} is outside the window of {self.config.checkpoint_window} "
            f"around checkpoint {self._max_cp}"
        )

    def _horizon_held(self) -> bool:
        """A live own writer or child reported a checkpoint within the window."""
        lo = self._max_cp - self.config.checkpoint_window
        hi = self._max_cp + self.config.checkpoint_window
        return any(lo <= c <= hi for c in self._writer_cp.values()) or any(
            lo <= c.max_cp <= hi for c in self._children.values()
        )

    def _check_horizon(self) -> None:
        """After peers left: reset the horizon if none of them holds it any more."""
        if self._max_cp >= 0 and not self._horizon_held():
            self._reset_horizon()

    def _reset_horizon(self) -> None:
        self._counters["horizon_resets"] += 1
        self._stats_dirty = True
        self._live = None
        self._max_cp = -1
        self._own_cp_bytes.clear()
        self._plans.clear()
        self._pushed.clear()

    def _see_checkpoint(self, cp: int) -> None:
        """Advance the horizon to ``cp``: O(1) in the jump (the estimator keeps only
        ``history`` samples, so at most that many zero samples for skipped ones)."""
        if cp <= self._max_cp:
            return
        done = sorted(c for c in self._own_cp_bytes if c < cp)
        for c in done:
            self._estimator.update({SELF: float(self._own_cp_bytes.pop(c))})
        if self._max_cp >= 0:
            skipped = cp - self._max_cp - 1 - sum(1 for c in done if c > self._max_cp)
            for _ in range(min(skipped, self._estimator.history)):
                self._estimator.update({SELF: 0.0})  # a checkpoint with no own bytes
        self._max_cp = cp
        self._live = None
        self._stats_dirty = True

    # -- messages from upstream ----------------------------------------------------------
    def _on_plan(self, plan: Plan, now: float) -> list[Instruction]:
        """The parent's collector for ``plan.window``: decide locally and pass down."""
        self._ancestors = plan.ancestors
        decision = decide_local(
            self.config.node_id,
            self._own_estimate(),
            self._child_reports(),
            self.config.target_bytes,
            is_root=False,
        )
        mine = (self.config.node_id, self.config.address)
        collector = mine if decision.writes else (plan.collector, plan.address)
        if self._plans.get(plan.window) != collector:
            self._counters["plan_changes"] += 1
        self._plans[plan.window] = collector
        self._stats_dirty = True  # the newest window held may have changed
        self._forget_old_plans(plan.window)
        return self._push_plans(now)

    def _relay_acks(self, address: str, entries: tuple[AckEntry, ...]) -> list[Instruction]:
        """Acks from ``address`` for items sent there: success goes back to each item's
        sender; an error means this node writes the item itself (never acked here)."""
        acks: list[tuple[PersistItem, AckEntry]] = []
        failed: list[PersistItem] = []
        for e in entries:
            sent = self._sent.get(e.id)
            if sent is None or sent.address != address:
                continue  # late ack after a timeout: this node wrote the item itself
            del self._sent[e.id]
            if e.error is not None:
                failed.append(sent.item)
            else:
                acks.append((sent.item, e))
        out = _acks_to_origins(acks)
        if failed:
            out += self._write(failed)
        return out

    # -- objects -------------------------------------------------------------------------
    def _written(self, oid: int, refs: tuple[SegmentRef, ...]) -> list[Instruction]:
        items = self._writing.pop(oid, ())
        if not items:
            return []
        nbytes = sum(i.size for i in items)
        self._writing_bytes -= nbytes
        self._counters["objects"] += 1
        self._counters["segments_written"] += len(items)
        self._counters["bytes_written"] += nbytes
        return _acks_to_origins(
            [(i, AckEntry(0, r.path, r.offset)) for i, r in zip(items, refs, strict=True)]
        )

    def _failed(self, oid: int, error: str) -> list[Instruction]:
        """The senders write the items again (a client falls back to DFS, a child node
        writes itself): an error ack, never a success."""
        items = self._writing.pop(oid, ())
        self._writing_bytes -= sum(i.size for i in items)
        entry = AckEntry(0, error=f"object write failed: {error}")
        return _acks_to_origins([(i, entry) for i in items])

    def _write(self, items: list[PersistItem]) -> list[Instruction]:
        data = tuple(i for i in items if i.data is not None)
        if not data:
            return []
        oid = next(self._ids)
        self._writing[oid] = data
        self._writing_bytes += sum(i.size for i in data)
        return [WriteObject(oid, data)]

    # -- routing and flushing ------------------------------------------------------------
    def _route(self, checkpoint: int | None, reason: str, now: float) -> str:
        """SELF or the upstream address at a flush for items of ``checkpoint``."""
        planned = self.collector_for(checkpoint)
        if planned is not None:
            node_id, address = planned
            if node_id == self.config.node_id or not address:
                return SELF
            if self._up(address, now):
                return address
        if reason == "size" or self.parent is None or not self._up(self.parent, now):
            return SELF
        return self.parent

    def _relay_cut(self, now: float) -> list[Instruction]:
        """The batch holds a whole message: send it at once if all of it goes upstream
        (:meth:`_relays_all`); if not, look again only once another message's worth
        has arrived (a batch of many checkpoints is not rescanned per request)."""
        if self._relays_all(now):
            return self._flush("forward", now)
        self._relay_check_at = self.batch.nbytes + self.config.max_forward_bytes
        return []

    def _relays_all(self, now: float) -> bool:
        """Every item of the batch goes upstream at a flush that is not a size cut (a
        relay whose target is above one message): a full message is sent at once, as
        waiting for the delay would only hold it (and stall a stream of pre-emptive
        uploads behind the in-flight limit of its writers)."""
        return all(self._route(cp, "forward", now) != SELF for cp in self.batch.checkpoints())

    def _flush(self, reason: str, now: float) -> list[Instruction]:
        self._relay_check_at = self.config.max_forward_bytes
        groups: dict[str, list[PersistItem]] = defaultdict(list)
        routes: dict[int | None, str] = {}  # the route depends on the checkpoint only
        for item in self.batch.take(reason, self.expected_writers()):
            cp = item.checkpoint_id
            if (dest := routes.get(cp)) is None:
                dest = routes[cp] = self._route(cp, reason, now)
            groups[dest].append(item)
        out: list[Instruction] = []
        for dest, items in groups.items():
            if dest == SELF:
                out += self._write(items) + self._markers_upstream(items, now)
            else:
                out += self._send(dest, items, now)
        return out

    def _markers_upstream(self, written: list[PersistItem], now: float) -> list[Instruction]:
        """Items written here that would otherwise have gone upstream (a size cut): the
        node upstream still counts their writers for the all-persisted rule, so it gets,
        per checkpoint, one data-less summary standing for them (own writers counted
        once by log id, summaries from below added) instead of waiting for its delay."""
        logs: dict[tuple[str, int], set[str]] = defaultdict(set)
        summed: dict[tuple[str, int], int] = defaultdict(int)
        upstream: dict[int, str | None] = {}
        for item in written:
            cp = item.checkpoint_id
            if cp is None:
                continue
            if cp not in upstream:
                upstream[cp] = self._upstream_of(cp, now)
            if (address := upstream[cp]) is None:
                continue
            if item.writers is None:
                logs[(address, cp)].add(item.meta.log_id)
            else:
                summed[(address, cp)] += item.writers
        by_address: dict[str, list[PersistItem]] = defaultdict(list)
        for key in sorted(logs.keys() | summed.keys()):
            n = len(logs.get(key, ())) + summed.get(key, 0)
            by_address[key[0]].append(PersistItem.summary(self.config.node_id, key[1], n))
        return [i for a, items in by_address.items() for i in self._send(a, items, now)]

    def _upstream_of(self, checkpoint: int, now: float) -> str | None:
        """Where items of ``checkpoint`` go when they are not written here: the planned
        collector, else the parent; None when that is this node or unreachable."""
        planned = self.collector_for(checkpoint)
        if planned is not None:
            node_id, address = planned
            if node_id == self.config.node_id or not address or not self._up(address, now):
                return None
            return address
        if self.parent is None or not self._up(self.parent, now):
            return None
        return self.parent

    def _send(self, address: str, items: list[PersistItem], now: float) -> list[Instruction]:
        """Persist messages to ``address`` of at most ``max_forward_bytes`` segment
        bytes each (client/wire.py ``persist_messages``)."""
        requests = []
        deadline = now + self.config.parent_timeout
        sent, ids = self._sent, self._ids
        forwarded = relayed = 0
        for item in items:
            fid = next(ids)
            if item.data is not None:
                sent[fid] = _Sent(item, address, deadline)
                size = item.size
                forwarded += size
                origin = item.origin
                if isinstance(origin, RemoteOrigin) and origin.relayed:
                    relayed += size
            requests.append(PersistRequest(fid, item))
        self._counters["bytes_forwarded"] += forwarded
        self._counters["bytes_relayed"] += relayed
        messages = persist_messages(requests, self.config.max_forward_bytes, self.config.node_id)
        return [SendUpstream(address, m) for m in messages]

    def _up(self, address: str, now: float) -> bool:
        return address not in self._lost and now >= self._down.get(address, float("-inf"))

    def configured_parents(self) -> tuple[str, ...]:
        """The parents' endpoints of the configuration, in order of preference (the
        first: the home parent; empty for a root)."""
        home = self.config.parent_address
        return () if home is None else (home, *self.config.fallback_addresses)

    def _return_home(self, now: float) -> None:
        """To the most preferred configured parent that is usable again (re-homed away
        from it after a timeout or a lost connection; module docstring)."""
        for address in self.configured_parents():
            if address == self.parent:
                return
            if self._up(address, now):
                self._move_to(address)
                return

    def _move_to(self, address: str) -> None:
        self.parent = address
        self._stats_dirty = True  # report to the new parent soon
        self._plans.clear()  # the next plan comes from the new parent
        self._pushed.clear()  # and goes down again, even for known windows

    def _expire_sent(self, now: float) -> list[Instruction]:
        if self._down:
            self._down = {a: until for a, until in self._down.items() if until > now}
        sent = self._sent
        if not sent or next(iter(sent.values())).deadline > now:  # the first is due first
            return []
        late = _expired(sent.items(), lambda s: s.deadline <= now)  # in send order: not empty
        self._counters["parent_timeouts"] += 1
        for address in {self._sent[fid].address for fid in late}:
            self._down[address] = now + self.config.parent_retry_after
        if self.parent is not None and not self._up(self.parent, now):
            self._rehome(now)
        return self._write([self._sent.pop(fid).item for fid in late])

    def _upstream_lost(self, address: str, now: float) -> list[Instruction]:
        """``address`` is gone now, not after ``parent_timeout``: it is marked down,
        the node re-homes if it was the parent, and the items it had not acknowledged
        go on along their route now (written here when there is none). A copy the lost
        node wrote anyway is never referenced: an orphan for cleanup."""
        self._down[address] = now + self.config.parent_retry_after
        if len(self._lost) >= _MAX_LOST:  # bounded: forget (they are retried on use)
            self._lost.clear()
        self._lost.add(address)
        if address == self.parent:
            self._rehome(now)
        lost = [fid for fid, s in self._sent.items() if s.address == address]
        if not lost:
            return []
        self._counters["upstream_losses"] += 1
        groups: dict[str, list[PersistItem]] = defaultdict(list)
        for fid in lost:
            item = self._sent.pop(fid).item
            groups[self._reroute(item.checkpoint_id, now)].append(item)
        out: list[Instruction] = []
        for dest, items in groups.items():
            if dest == SELF:
                out += self._write(items) + self._markers_upstream(items, now)
            else:
                out += self._send(dest, items, now)
        return out

    def _reroute(self, checkpoint: int | None, now: float) -> str:
        """Where an item sent to a lost node goes now: its planned collector or the
        (new) parent when up, else SELF."""
        if checkpoint is not None and (up := self._upstream_of(checkpoint, now)) is not None:
            return up
        if self.parent is not None and self._up(self.parent, now):
            return self.parent
        return SELF

    def _rehome(self, now: float) -> None:
        """The parent is unreachable: report to the next usable configured parent (in
        order of preference), else to the next live ancestor the plans named."""
        chain = (*self.configured_parents(), *(a for _, a in self._ancestors[1:]))
        for address in chain:
            if address and address != self.parent and self._up(address, now):
                self._move_to(address)
                return

    # -- time-driven rules ---------------------------------------------------------------
    def _housekeeping(self, now: float) -> list[Instruction]:
        out = self._expire_sent(now)
        if self.parent != self.config.parent_address:
            self._return_home(now)
        self._expire_leases(now)
        if self._groups and (late := self._groups.due(now)):
            out += self._flush_groups(late, now)
        reason = self.batch.due(now, self.expected_writers())
        if reason is not None:
            out += self._flush(reason, now)
        out += self._root_plans(now)
        out += self._report_stats(now)
        if self._peer_versions and not self.accepting():
            out += self._keepalives(now)
        return out

    def _expire_leases(self, now: float) -> None:
        lease = self.config.registration_lease
        writers, children = self._writers, self._children  # oldest first
        if (not writers or now - next(iter(writers.values())) <= lease) and (
            not children or now - next(iter(children.values())).seen <= lease
        ):
            return
        gone = _expired(self._writers.items(), lambda seen: now - seen > lease)
        for log_id in gone:
            self._forget_writer(log_id)
        left = _expired(self._children.items(), lambda c: now - c.seen > lease)
        for node in left:
            self._drop_child(node)
        if left:
            self._stats_dirty = True
            self._pushed = {k: v for k, v in self._pushed.items() if k[0] in self._children}
        if gone or left:
            self._check_horizon()

    def _own_estimate(self) -> float:
        return self._estimator.mean(SELF)

    def _child_reports(self) -> list[float]:
        return [c.reported_bytes for c in self._children.values()]

    def _root_plans(self, now: float) -> list[Instruction]:
        """The root (or a node acting as one) plans window w+1 from the middle of window
        w on, so that every node decides from half a window of byte estimates; window
        0 has no plan (hop by hop)."""
        if not self.config.plans or self.parent is not None or self._max_cp < 0:
            return []
        n = self.config.plan_window
        w = window_of(self._max_cp, n)
        mine = (self.config.node_id, self.config.address)
        due = [w] if w > 0 else []
        if self._max_cp - w * n >= n // 2:
            due.append(w + 1)
        changed = False
        for window in due:
            if window not in self._plans:
                self._plans[window] = mine
                changed = True
        if changed:
            self._forget_old_plans(w + 1)
        return self._push_plans(now) if changed else []

    def _forget_old_plans(self, newest: int) -> None:
        oldest = newest - (_PLANS_KEPT - 1)
        for window in [x for x in self._plans if x < oldest]:
            del self._plans[window]
        self._pushed = {k: v for k, v in self._pushed.items() if k[1] in self._plans}

    def _push_plans(self, now: float) -> list[Instruction]:
        """Send every plan a child has not had yet (with the ancestors chain)."""
        return [i for node in list(self._children) for i in self._push_plans_to(node)]

    def _push_plans_to(self, node: str, held: int | None = None) -> list[Instruction]:
        """The plans child ``node`` has not had on its current identity; ``held``: the
        newest window the child says it holds (None: not said), older than this node's
        newest means the plans after it were lost: they are sent again."""
        if not self._plans:
            return []
        child = self._children[node]
        if held is not None and held < max(self._plans):
            for key in [(node, w) for w in self._plans if w > held]:
                if self._pushed.pop(key, None) is not None:
                    self._counters["plans_resent"] += 1
        chain = ((self.config.node_id, self.config.address), *self._ancestors)
        out: list[Instruction] = []
        for window, (collector, address) in sorted(self._plans.items()):
            key = (node, window)
            if self._pushed.get(key) == child.identity:
                continue
            self._pushed[key] = child.identity
            out.append(ReplyBelow(child.identity, Plan(window, collector, address, chain)))
        return out

    def _stats_due_at(self) -> float:
        """When the next Stats report is due (seconds) unless the writers change."""
        c = self.config
        return self._last_stats + (c.stats_interval if self._stats_dirty else c.stats_keepalive)

    def _report_stats(self, now: float) -> list[Instruction]:
        """Stats to the parent at once when the residual writer count changes (the
        parent's all-persisted rule depends on it), at most every ``stats_interval``
        seconds when another field changed, every ``stats_keepalive`` seconds otherwise
        (the parent renews this node's lease on each)."""
        if self.parent is None:
            return []
        collects = self._collects()
        writers = 0 if collects else self.writers_below
        if writers == self._reported_writers and now < self._stats_due_at():
            return []
        self._last_stats = now
        self._reported_writers = writers
        self._stats_dirty = False
        residual = self._own_estimate() + sum(self._child_reports())
        held = max(self._plans) if self._plans else -1
        nbytes = 0.0 if collects else residual
        stats = Stats(self.config.node_id, writers, nbytes, self._max_cp, held)
        return [SendUpstream(self.parent, stats)]


def _remember(table: dict[bytes, _T], key: bytes, value: _T) -> None:
    """``table[key] = value`` as the newest entry, the oldest forgotten beyond
    _MAX_PEERS."""
    table.pop(key, None)
    if len(table) >= _MAX_PEERS:
        del table[next(iter(table))]
    table[key] = value


def _acks_to_origins(acks: list[tuple[PersistItem, AckEntry]]) -> list[Instruction]:
    """One PersistAck per sender: each entry renamed to the item's own request id."""
    replies: dict[bytes, list[AckEntry]] = defaultdict(list)
    for item, entry in acks:
        origin = item.origin
        if isinstance(origin, RemoteOrigin):
            replies[origin.identity].append(
                AckEntry(origin.request_id, entry.path, entry.offset, entry.error)
            )
    return [ReplyBelow(i, PersistAck(tuple(a))) for i, a in replies.items()]


def _expired(entries: Iterable[tuple[_K, _T]], old: Callable[[_T], bool]) -> list[_K]:
    """The keys of the leading ``entries`` (oldest first) that are ``old``: O(expired)."""
    out = []
    for key, value in entries:
        if not old(value):
            break
        out.append(key)
    return out


def _refusal(event: Event, identity: bytes, entry: AckEntry) -> bool:
    """An error ack refusing a request of the message being handled (never batched)."""
    return (
        entry.error is not None
        and isinstance(event, MessageFromBelow)
        and event.identity == identity
        and isinstance(event.message, Persist)
        and any(r.id == entry.id for r in event.message.requests)
    )


def _ack_source(event: Event, entry: AckEntry) -> str | None:
    """The state an item must have been in for ``event`` to ack it with ``entry``."""
    if isinstance(event, ObjectWritten) and entry.error is None:
        return f"writing:{event.object_id}"
    if isinstance(event, ObjectFailed) and entry.error is not None:
        return f"writing:{event.object_id}"
    if isinstance(event, MessageFromUpstream) and entry.error is None:
        return f"sent:{event.address}"
    return None
