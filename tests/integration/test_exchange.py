"""The keyed exchange over real ZeroMQ on loopback: aligned and unaligned barriers, order,
exact counts, channel state, back-pressure, key round-trips and refused input."""

from __future__ import annotations

import datetime
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgpack
import pytest
import zmq

from dstltree.sparkplug.exchange import (
    BarriersComplete,
    Exchange,
    ExchangeError,
    Records,
    TakeSnapshot,
    decode_batch,
)
from tests.support.waiting import wait_until

Event = tuple[str, int, int, int]  # ("rec", channel, seq, phase) or ("aligned", -1, 0, cp)


@contextmanager
def exchanges(parallelism: int, **options: Any) -> Iterator[list[Exchange]]:
    """``parallelism`` connected exchanges on loopback, closed at the end."""
    group = [Exchange(t, parallelism, **options) for t in range(parallelism)]
    try:
        for ex in group:
            ex.connect([other.addresses for other in group])
        yield group
    finally:
        for ex in group:
            ex.close()


def _collect(ex: Exchange, events: list[Event], timeout: float = 0.0) -> int:
    """Receive once into ``events``; returns the number of records received."""
    n = 0
    for item in ex.receive(timeout):
        if isinstance(item, TakeSnapshot):
            assert not item.unaligned
            continue
        if isinstance(item, BarriersComplete):
            events.append(("aligned", -1, 0, item.checkpoint_id))
            continue
        for key, record in item.items:
            assert key == (record["src"], record["seq"])
            events.append(("rec", item.channel, record["seq"], record["phase"]))
            n += 1
    return n


class _Threaded(ABC):
    """A task's loop (:meth:`_loop`) on its own thread; what it raises is kept in
    ``error`` for the test thread."""

    def __init__(self, ex: Exchange, per_phase: int, barriers: int, deadline: float) -> None:
        self.ex, self.per_phase, self.barriers, self.deadline = ex, per_phase, barriers, deadline
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # reported by the test thread
            self.error = e

    @abstractmethod
    def _loop(self) -> None:
        """The task's loop, until its work is done."""


def _deadline() -> float:
    return time.monotonic() + 60


DriverT = TypeVar("DriverT", bound=_Threaded)


def _run_drivers(drivers: list[DriverT]) -> list[DriverT]:
    """Start ``drivers``, wait for each until its deadline (plus 5 s), raise the first
    error one met; returns them."""
    for d in drivers:
        d.thread.start()
    for d in drivers:
        d.thread.join(timeout=max(0.0, d.deadline - time.monotonic()) + 5)
        assert not d.thread.is_alive(), "driver did not finish"
    for d in drivers:
        if d.error is not None:
            raise d.error
    return drivers


class Driver(_Threaded):
    """One task's loop on its own thread: send ``per_phase`` records per target before
    each barrier 1..``barriers`` and after the last, flush, receive; never blocks on a
    send and stops reading its 'source' while back-pressured."""

    def __init__(self, ex: Exchange, per_phase: int, barriers: int, deadline: float) -> None:
        super().__init__(ex, per_phase, barriers, deadline)
        self.events: list[Event] = []
        self.received = 0
        self.backpressured_seen = False

    def _loop(self) -> None:
        ex, p = self.ex, self.ex.parallelism
        expected = p * self.per_phase * (self.barriers + 1)  # per_phase from each, per phase
        phase, sent_in_phase, seq = 0, 0, 0
        while True:
            assert time.monotonic() < self.deadline, "driver timed out"
            while phase <= self.barriers and sent_in_phase < self.per_phase * p:
                if ex.backpressured:
                    self.backpressured_seen = True
                    break
                target = seq % p
                ex.send(target, (ex.task, seq), {"src": ex.task, "seq": seq, "phase": phase})
                seq += 1
                sent_in_phase += 1
            if sent_in_phase == self.per_phase * p and phase < self.barriers:
                phase += 1
                sent_in_phase = 0
                ex.barrier(phase)
            elif sent_in_phase == self.per_phase * p:
                phase = self.barriers + 1  # all sent
            idle = ex.flush()
            self.received += _collect(ex, self.events, timeout=0.002)
            done = phase > self.barriers and idle and self.received == expected
            if done and ("aligned", -1, 0, self.barriers) in self.events:
                return


def _check_receiver(events: list[Event], parallelism: int, per_phase: int, barriers: int) -> None:
    aligned = [cp for kind, _, _, cp in events if kind == "aligned"]
    assert aligned == list(range(1, barriers + 1))
    current = 0  # checkpoints aligned so far
    last_seq: dict[int, int] = {}
    counts: dict[tuple[int, int], int] = {}
    for kind, channel, seq, phase in events:
        if kind == "aligned":
            current = phase
            continue
        # sent after barrier `phase` and before barrier `phase + 1`
        assert phase == current, f"record of phase {phase} delivered after Aligned({current})"
        assert seq > last_seq.get(channel, -1), "order per channel broken"
        last_seq[channel] = seq
        counts[channel, phase] = counts.get((channel, phase), 0) + 1
    for channel in range(parallelism):
        for phase in range(barriers + 1):
            assert counts.get((channel, phase), 0) == per_phase, (channel, phase)


def test_three_tasks_align_barriers_in_order_exactly_once() -> None:
    per_phase, barriers = 150, 5
    with exchanges(3, batch_records=7, max_outbox_batches=3, hwm=2, receive_batches=5) as group:
        drivers = _run_drivers([Driver(ex, per_phase, barriers, _deadline()) for ex in group])
    for d in drivers:
        _check_receiver(d.events, 3, per_phase, barriers)
        assert d.received == 3 * per_phase * (barriers + 1)
        assert d.backpressured_seen  # its own channel alone fills within one burst


def _payload_record(seq: int) -> dict[str, Any]:
    return {"src": 0, "seq": seq, "phase": 0, "pad": b"x" * 1024}


def _fill_until_backpressured(sender: Exchange, target: int, seq: int = 0) -> int:
    """Send to ``target`` records ``seq``, ``seq + 1``, ... until the sender is
    back-pressured; returns the next seq."""
    limit = seq + 50_000
    while not sender.backpressured:
        assert seq < limit, "never back-pressured"
        sender.send(target, (0, seq), _payload_record(seq))
        seq += 1
        if seq % 16 == 0:
            sender.flush()
    return seq


def _saturate(sender: Exchange, target: int, between: Callable[[], None]) -> int:
    """Fill ``sender`` towards ``target`` until it stays back-pressured after a flush
    (still queued, not dropped), calling ``between`` after each fill; returns the
    records sent."""
    sent = 0

    def saturated() -> bool:
        nonlocal sent
        sent = _fill_until_backpressured(sender, target, sent)
        between()
        return not sender.flush() and sender.backpressured

    wait_until(saturated, timeout=30, interval=0.0)
    return sent


def _drain(sender: Exchange, receiver: Exchange, events: list[Event], expected: int) -> None:
    got = [0]

    def all_arrived() -> bool:
        sender.flush()
        got[0] += _collect(receiver, events, timeout=0.01)
        return got[0] >= expected and sender.flush()

    wait_until(all_arrived, timeout=30, interval=0.0)
    assert got[0] == expected
    assert not sender.backpressured


def test_slow_receiver_backpressures_then_gets_everything() -> None:
    with exchanges(2, batch_records=16, max_outbox_batches=4, hwm=2) as (a, b):
        sent = _saturate(a, 1, lambda: None)  # b reads nothing yet
        events: list[Event] = []
        _drain(a, b, events, sent)
    assert [seq for _, _, seq, _ in events] == list(range(sent))
    assert {ch for _, ch, _, _ in events} == {0}


def test_channel_blocked_by_alignment_backpressures_its_sender() -> None:
    with exchanges(2, batch_records=16, max_outbox_batches=4, hwm=2) as (a, b):
        a.barrier(1)

        def b_blocked() -> bool:
            assert b.receive(0.01) == []
            return b.aligning == 1

        wait_until(b_blocked, timeout=10, interval=0.0)

        def nothing_read() -> None:  # the blocked channel is not read
            assert b.receive(0.005) == []

        sent = _saturate(a, 1, nothing_read)
        b.barrier(1)  # b's own channel delivers barrier 1: aligned, channel 0 read again
        events: list[Event] = []
        _drain(a, b, events, sent)
    assert events[0] == ("aligned", -1, 0, 1)
    assert [seq for kind, _, seq, _ in events if kind == "rec"] == list(range(sent))


def test_own_channel_is_bounded_and_aligned_too() -> None:
    with exchanges(1, batch_records=2, max_outbox_batches=3) as (a,):
        assert a.addresses == [""]
        for seq in range(6):
            a.send(0, (0, seq), {"src": 0, "seq": seq, "phase": 0})
        assert a.backpressured
        a.barrier(1)
        a.send(0, (0, 6), {"src": 0, "seq": 6, "phase": 1})
        assert a.flush() is False and a.flush() is True
        events: list[Event] = []
        wait_until(lambda: _collect(a, events) == 0 and len(events) == 8, timeout=5)
        assert not a.backpressured
    assert events == [("rec", 0, s, 0) for s in range(6)] + [
        ("aligned", -1, 0, 1),
        ("rec", 0, 6, 1),
    ]


KEYS: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**63 - 1,
    "",
    "tail-N123",
    b"",
    b"\x00\xff",
    (),
    ("N1", 2),
    (None, (b"x", (1, "y")), True),
]


@pytest.mark.parametrize("target", [0, 1], ids=["own", "remote"])
def test_keys_and_records_round_trip(target: int) -> None:
    with exchanges(2, batch_records=5) as (a, b):
        records = [
            {"i": i, "tags": [1, "a"], "m": {"k": 1.5}, "raw": b"\x01"} for i in range(len(KEYS))
        ]
        for key, record in zip(KEYS, records, strict=True):
            a.send(target, key, record)
        receiver = (a, b)[target]
        items: list[tuple[Any, dict[str, Any]]] = []

        def arrived() -> bool:
            a.flush()
            for item in receiver.receive(0.01):
                assert isinstance(item, Records) and item.channel == 0
                items.extend(item.items)
            return len(items) == len(KEYS)

        wait_until(arrived, timeout=10, interval=0.0)
    assert [k for k, _ in items] == KEYS
    assert [type(k) for k, _ in items] == [type(k) for k in KEYS]
    assert [r for _, r in items] == records


@pytest.mark.parametrize("target", [0, 1], ids=["own", "remote"])
def test_record_msgpack_cannot_encode_names_the_column(target: int) -> None:
    with exchanges(2, batch_records=2) as (a, _b):
        a.send(target, "k1", {"ok": 1})
        with pytest.raises(TypeError, match=r"column 'when' of the record for key 'k2'"):
            a.send(target, "k2", {"ok": 2, "when": datetime.datetime(2024, 1, 1)})
        a.send(target, "k3", {"big": 2**70})
        with pytest.raises(TypeError, match=r"column 'big'"):
            a.flush() or a.flush()


def _receive_error(ex: Exchange) -> ExchangeError:
    errors: list[ExchangeError] = []

    def failed() -> bool:
        try:
            ex.receive(0.01)
        except ExchangeError as e:
            errors.append(e)
            return True
        return False

    wait_until(failed, timeout=10, interval=0.0)
    return errors[0]


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1garbage",
        msgpack.packb({"not": "a message"}),
        msgpack.packb([0, [["k", "not a dict"]]]),
        msgpack.packb([0, [["k"]]]),
        msgpack.packb([1, "cp"]),
        msgpack.packb([9, 1]),
    ],
    ids=["bytes", "map", "record", "pair", "barrier", "kind"],
)
def test_garbage_frame_raises_exchange_error_naming_the_channel(frame: bytes) -> None:
    with exchanges(3) as (_a, _b, c):
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(c.addresses[1])
            sock.send(frame)
            error = _receive_error(c)
        finally:
            sock.close()
    assert "channel 1" in str(error)


def test_bad_use_is_refused() -> None:
    with pytest.raises(ValueError):
        Exchange(2, 2)
    with pytest.raises(ValueError):
        Exchange(0, 2, batch_records=0)
    with exchanges(2) as (a, b):
        with pytest.raises(ValueError, match="already connected"):
            a.connect([a.addresses, b.addresses])
        a.barrier(3)
        with pytest.raises(ValueError, match="barrier 3 after barrier 3"):
            a.barrier(3)
    with Exchange(0, 2) as lone, pytest.raises(ValueError, match="addresses"):
        lone.connect([lone.addresses])


class UnalignedDriver(_Threaded):
    """One task's loop in unaligned mode: sends ``per_phase`` records to each target per
    phase (barriers 1..``barriers`` between phases), processes what arrives at once,
    and keeps what a checkpoint's snapshot holds, its input channel state and the
    output channel state its barriers overtook."""

    def __init__(self, ex: Exchange, per_phase: int, barriers: int, deadline: float) -> None:
        super().__init__(ex, per_phase, barriers, deadline)
        self.processed: list[tuple[int, int]] = []  # (src, seq), in processing order
        self.snapshot: dict[int, set[tuple[int, int]]] = {}
        self.inflight: dict[int, list[tuple[int, int]]] = {}
        self.output: dict[int, list[dict[str, Any]]] = {}  # records overtaken by barrier cp
        self.completed: list[int] = []

    def _loop(self) -> None:
        ex, p = self.ex, self.ex.parallelism
        total = p * self.per_phase * (self.barriers + 1)
        phase, sent, seq = 0, 0, 0
        idle = False
        while not (idle and len(self.processed) == total and len(self.completed) == self.barriers):
            assert time.monotonic() < self.deadline, "driver timed out"
            while phase <= self.barriers and sent < self.per_phase * p and not ex.backpressured:
                target = seq % p
                record = {"src": ex.task, "seq": seq, "phase": phase, "dst": target}
                ex.send(target, (ex.task, seq), record)
                seq, sent = seq + 1, sent + 1
            if sent == self.per_phase * p and phase < self.barriers:
                phase, sent = phase + 1, 0
                frames = ex.barrier(phase)
                self.output[phase] = [r for f in frames for _, r in decode_batch(f, "out")]
            elif sent == self.per_phase * p:
                phase = self.barriers + 1
            idle = ex.flush() and phase > self.barriers  # everything sent
            for item in ex.receive(0.002):
                if isinstance(item, TakeSnapshot):
                    assert item.unaligned
                    self.snapshot[item.checkpoint_id] = set(self.processed)
                elif isinstance(item, BarriersComplete):
                    self.completed.append(item.checkpoint_id)
                else:
                    pairs = [(r["src"], r["seq"]) for _, r in item.items]
                    if item.inflight is not None:
                        assert decode_batch(item.frame, "in") == item.items
                        self.inflight.setdefault(item.inflight, []).extend(pairs)
                    self.processed.extend(pairs)
                    ex.consumed(item.channel)


def test_unaligned_every_record_is_in_the_snapshot_or_in_flight_exactly_once() -> None:
    """FLIP-76 over real sockets: for each checkpoint and receiver, the records sent to it
    before the barriers are either processed before its snapshot, or its input channel
    state, or a sender's output channel state, each exactly once; none sent after."""
    per_phase, barriers, p = 120, 4, 3
    options = dict(batch_records=5, max_outbox_batches=4, hwm=4, receive_batches=3, credits=2)
    with exchanges(p, mode="unaligned", **options) as group:
        deadline = _deadline()
        drivers = _run_drivers([UnalignedDriver(ex, per_phase, barriers, deadline) for ex in group])
    overtaken_total = sum(len(v) for d in drivers for v in d.output.values())
    assert overtaken_total > 0, "no barrier overtook anything: the test proves little"
    for receiver, d in enumerate(drivers):
        assert d.completed == list(range(1, barriers + 1))
        assert len(d.processed) == len(set(d.processed)) == p * per_phase * (barriers + 1)
        for cp in range(1, barriers + 1):
            # records sent to this receiver before barrier cp: phase < cp (seq encodes it)
            before = {
                (src, seq)
                for src in range(p)
                for seq in range(cp * per_phase * p)
                if seq % p == receiver
            }
            output = [
                (r["src"], r["seq"])
                for s in drivers
                for r in s.output.get(cp, ())
                if r["dst"] == receiver
            ]
            parts = [d.snapshot[cp], d.inflight.get(cp, []), output]
            union = set().union(*map(set, parts))
            assert sum(len(x) for x in parts) == len(union), f"checkpoint {cp}: counted twice"
            assert union == before, f"checkpoint {cp}: lost or late records"


def test_credits_bound_the_batches_a_channel_holds_unprocessed() -> None:
    """Credit-based flow control (unaligned mode): a sender has at most ``credits``
    batches on a channel that its receiver has not processed; reading them ahead grants
    nothing, processing does; barriers never wait for credits."""
    with exchanges(2, mode="unaligned", credits=2, batch_records=4, max_outbox_batches=64) as (
        a,
        b,
    ):
        for seq in range(40):  # ten batches for b
            a.send(1, (0, seq), {"src": 0, "seq": seq, "phase": 0})
        got: list[Any] = []

        def rounds(n: int) -> None:
            for _ in range(n):
                assert a.receive(0) == []  # reads b's grants (b sends a nothing else)
                a.flush()
                got.extend(i for i in b.receive(0.002) if isinstance(i, Records))

        wait_until(lambda: rounds(1) or len(got) >= 2, timeout=10, interval=0.0)
        rounds(50)  # a's flushes find no credit left: nothing more comes
        assert len(got) == 2 and not a.flush()
        b.consumed(0)
        b.consumed(0)
        b.flush()  # grants 2
        wait_until(lambda: rounds(1) or len(got) >= 4, timeout=10, interval=0.0)
        rounds(50)
        assert len(got) == 4
        a.barrier(1)  # ahead of the six batches waiting for credits
        events: list[Any] = []
        wait_until(lambda: a.flush() or events.extend(b.receive(0.002)) or bool(events), timeout=10)
        assert isinstance(events[0], TakeSnapshot) and events[0].checkpoint_id == 1
    assert [r["seq"] for batch in got for _, r in batch.items] == list(range(16))
