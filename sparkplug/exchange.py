"""The keyed exchange between the tasks of a job: every task's source reader sends
``(key, record)`` pairs to the task owning the key's group, and every task's keyed
operator receives from all P tasks (P input channels, one of them itself), with
checkpoint barriers taken aligned or unaligned across the channels
(sparkplug/barriers.py: Flink aligned checkpoints, FLIP-76 unaligned checkpoints).

Wire: one ZeroMQ PUSH socket per downstream task, connected to a PULL socket that the
downstream task bound for this sender alone, so a channel that waits for alignment is
simply left unread: its messages stay in ZeroMQ's queues, the sender's sends fail with
``zmq.Again`` (high-water marks, non-blocking sends), its bounded outbox fills and
:attr:`Exchange.backpressured` tells its task to stop reading the source. Nothing is
ever dropped, and the task thread never blocks on a send: one thread calls
``send``/``barrier``/``flush``/``receive`` in a loop. The channel to itself is an
in-memory queue of the same encoded frames, going through the same decoding and
barrier handling. Unaligned, a barrier is put ahead of the batches still queued in
this task (its outboxes and own queue; FLIP-76: barriers overtake in-flight data);
those batches are sent after it, and the caller persists them as output channel
state. Batches already handed to ZeroMQ stay before the barrier: the receiver reads
them ahead of its processing and persists them as input channel state.

Frames are msgpack: ``[0, [[key, record], ...]]`` for a batch of records,
``[1, checkpoint_id]`` for a barrier, ``[2, checkpoint_id]`` for a barrier that
demands alignment (a run's final checkpoint).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack
import zmq

from dstltree.security.curve import Curve, configure_client, configure_server
from dstltree.sparkplug.barriers import (
    BarrierEvent,
    BarriersComplete,
    CheckpointBarriers,
    ExchangeError,
    Mode,
    TakeSnapshot,
)
from dstltree.sparkplug.keygroups import canonical_key

__all__ = [
    "BarrierEvent",
    "BarriersComplete",
    "Exchange",
    "ExchangeError",
    "Records",
    "TakeSnapshot",
    "decode_batch",
    "encode_batch",
]

Key: TypeAlias = "None | bool | int | str | bytes | tuple[Key, ...]"
"""A record key: None, bool, int, str, bytes, or a (nested) tuple of those."""

_BATCH = 0
_BARRIER = 1
_ALIGNED_BARRIER = 2  # a barrier that demands alignment (a run's final checkpoint)
_CREDIT = 3  # a receiver's grant: the sender may send that many more batches
_MAX_CREDIT = 1 << 20
_UNPACK_ERRORS = (ValueError, TypeError, msgpack.UnpackException)


@dataclass(frozen=True, slots=True)
class Records:
    """One batch received on input ``channel`` (the sending task's index): ``items`` are
    ``(key, record)`` pairs in the order the sender sent them. ``inflight``: the
    checkpoint whose input channel state the batch is (FLIP-76: it was sent before that
    barrier and arrived after the snapshot), else None; ``frame``: the batch as
    received (what is persisted as channel state)."""

    channel: int
    items: list[tuple[Key, dict[str, Any]]]
    inflight: int | None = None
    frame: bytes = b""


def encode_batch(items: list[tuple[Key, dict[str, Any]]]) -> bytes:
    """The frame of a batch. Raises TypeError naming the key or column that msgpack
    cannot encode (or a record that is not a dict)."""
    try:
        return msgpack.packb([_BATCH, items], use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        pass
    for key, record in items:
        _check_encodable(key, "key", key)
        if not isinstance(record, dict):
            raise TypeError(f"record for key {key!r} is a {type(record).__name__}, not a dict")
        for column, value in record.items():
            _check_encodable(value, f"column {column!r}", key)
    raise TypeError("batch cannot be encoded by msgpack")  # pragma: no cover


def _check_encodable(value: Any, what: str, key: Any) -> None:
    try:
        msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(
            f"{what} of the record for key {key!r}: {type(value).__name__} cannot be "
            f"encoded by msgpack ({e})"
        ) from e


def decode_batch(frame: bytes, where: str) -> list[tuple[Key, dict[str, Any]]]:
    """The ``(key, record)`` pairs of a batch frame (as persisted in channel state).
    Raises ExchangeError naming ``where`` for anything but a batch."""
    kind, body = _decode(where, frame)
    if kind != _BATCH:
        raise ExchangeError(f"{where}: a barrier where a batch of records was expected")
    pairs: list[tuple[Key, dict[str, Any]]] = body
    return pairs


def _decode(channel: int | str, frame: bytes) -> tuple[int, Any]:
    """``(_BATCH, pairs)`` or ``(_BARRIER, checkpoint_id)``; raises ExchangeError naming
    ``channel`` for anything else."""
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        kind, body = msg
        if kind in (_BARRIER, _ALIGNED_BARRIER) and type(body) is int and body >= 0:
            return kind, body
        if kind == _CREDIT and type(body) is int and 0 < body <= _MAX_CREDIT:
            return kind, body
        if kind != _BATCH or type(body) is not list:
            raise ValueError(f"unknown message kind {kind!r}")
        pairs: list[tuple[Key, dict[str, Any]]] = []
        append = pairs.append
        for key, record in body:
            if type(record) is not dict:
                raise ValueError(f"record is a {type(record).__name__}")
            append((canonical_key(key) if type(key) is list else key, record))
        return _BATCH, pairs
    except _UNPACK_ERRORS as e:
        where = f"channel {channel}" if isinstance(channel, int) else channel
        raise ExchangeError(f"{where}: malformed frame ({len(frame)} B): {e}") from e


class Exchange:
    """The exchange endpoint of task ``task`` of ``parallelism`` tasks.

    Records to a target are batched (``batch_records`` pairs per frame); a batch closes
    when full, at :meth:`barrier`, and at :meth:`flush` once it has waited one flush.
    Each target has an outbox of closed batches not yet accepted by ZeroMQ;
    :attr:`backpressured` is True once one holds ``max_outbox_batches`` (or this task's
    own input queue does): the caller must then stop reading its source, but keep
    calling :meth:`flush` and :meth:`receive`. The bound is soft: sends and barriers
    are still accepted beyond it, never dropped. ``hwm`` is the ZeroMQ high-water mark
    (frames) of each socket, both ways; ``receive_batches`` bounds the frames one
    :meth:`receive` reads. Sockets bind on ``host`` at free ports; not thread-safe (one
    thread drives it). ``security``: CURVE with the per-job keys (``Curve.shared``):
    the PULL sockets serve, the PUSH sockets connect with them; None = plaintext.
    ``max_message_bytes``: the largest frame a PULL socket accepts (a larger one
    drops the connection). ``credits`` > 0: credit-based flow control (as Flink's
    network stack): a sender sends a channel at most that many batches its receiver
    has not processed yet (:meth:`consumed` grants more; barriers never wait), so
    what is queued on a channel stays bounded whatever ZeroMQ and the kernel buffer;
    0: ZeroMQ's high-water marks alone. ``mode`` and ``aligned_timeout`` (seconds):
    how barriers are taken (sparkplug/barriers.py); with ``mode="unaligned"`` and no
    timeout a barrier also overtakes the batches queued in this task's outboxes (FLIP-76: the
    sender's output channel state, returned by :meth:`barrier`). Raises ValueError for
    bad sizes.
    """

    def __init__(
        self,
        task: int,
        parallelism: int,
        *,
        host: str = "127.0.0.1",
        batch_records: int = 256,
        max_outbox_batches: int = 64,
        hwm: int = 8,
        receive_batches: int = 64,
        security: Curve | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        mode: Mode = "aligned",
        aligned_timeout: float = 0.0,
        credits: int = 0,
    ) -> None:
        if not 0 <= task < parallelism:
            raise ValueError(f"task {task} outside 0..{parallelism - 1}")
        if min(batch_records, max_outbox_batches, hwm, receive_batches) < 1 or credits < 0:
            raise ValueError(
                "batch_records, max_outbox_batches, hwm, receive_batches >= 1, credits >= 0"
            )
        self.task = task
        self.parallelism = parallelism
        self._batch_records = batch_records
        self._max_outbox = max_outbox_batches
        self._receive_batches = receive_batches
        self._hwm = hwm
        self._security = security
        self._max_message_bytes = max_message_bytes
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.barriers = CheckpointBarriers(parallelism, mode, aligned_timeout)
        """The input side's barriers (pending checkpoint, blocked and owing channels)."""
        self._overtake = mode == "unaligned" and aligned_timeout <= 0
        self._open: list[list[tuple[Key, dict[str, Any]]]] = [[] for _ in range(parallelism)]
        self._waited = [False] * parallelism
        # per target: closed frames not yet accepted by ZeroMQ, (is a barrier, frame)
        self._outbox: list[deque[tuple[bool, bytes]]] = [deque() for _ in range(parallelism)]
        self._inbox: deque[tuple[bool, bytes]] = deque()  # the channel to itself
        self._last_barrier: int | None = None
        self._connected = False
        self._closed = False
        # credit-based flow control (0: none): batches a channel may hold unprocessed;
        # _window drops to 0 (sends not gated) after the run's last, aligned barrier
        self._initial_window = self._window = credits
        self._credits = [credits] * parallelism  # per target: batches it may still be sent
        self._to_grant = [0] * parallelism  # per upstream: batches processed, not granted
        self._pull: list[zmq.Socket[bytes] | None] = [None] * parallelism
        self._push: list[zmq.Socket[bytes] | None] = [None] * parallelism
        self.addresses: list[str] = [""] * parallelism
        """Endpoint bound for each upstream task (``tcp://host:port``); own entry ""."""
        for upstream in range(parallelism):
            if upstream != task:
                sock = self._socket(zmq.PULL)
                self._pull[upstream] = sock
                try:
                    port = sock.bind_to_random_port(f"tcp://{host}")
                except zmq.ZMQError:
                    self.close()
                    raise
                self.addresses[upstream] = f"tcp://{host}:{port}"

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, self._hwm)
        if kind == zmq.PULL:
            sock.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
            configure_server(sock, self._security, "exchange")
        else:
            configure_client(sock, self._security)
        return sock

    def connect(self, addresses: list[list[str]]) -> None:
        """Connect to every downstream task: ``addresses[t]`` is task t's
        :attr:`addresses` (so ``addresses[t][self.task]`` is the endpoint bound for this
        sender). Raises ValueError for a wrong shape or a missing endpoint, or if
        already connected."""
        if self._connected:
            raise ValueError("exchange already connected")
        if len(addresses) != self.parallelism or any(len(a) != self.parallelism for a in addresses):
            raise ValueError(f"addresses must be {self.parallelism} lists of {self.parallelism}")
        for target in range(self.parallelism):
            if target == self.task:
                continue
            endpoint = addresses[target][self.task]
            if not endpoint:
                raise ValueError(f"task {target} has no endpoint for task {self.task}")
            sock = self._socket(zmq.PUSH)
            sock.connect(endpoint)
            self._push[target] = sock
        self._connected = True

    def send(self, target: int, key: Key, record: dict[str, Any]) -> None:
        """Queue ``(key, record)`` for task ``target`` (0..parallelism-1, this task
        included); never blocks. Raises TypeError (naming the column) if a record of the
        batch this send closes cannot be encoded by msgpack."""
        batch = self._open[target]
        batch.append((key, record))
        if len(batch) >= self._batch_records:
            self._close_batch(target)

    def barrier(self, checkpoint_id: int, aligned: bool = False) -> list[bytes]:
        """Put barrier ``checkpoint_id`` on every outgoing channel (this task's own
        included) after everything sent so far; never blocks. Unaligned (no timeout):
        the barrier overtakes the batches still queued here (after the earlier
        barriers); they are sent after it and returned, in order per channel, as this
        task's output channel state of the checkpoint (FLIP-76); else returns [].
        ``aligned``: the checkpoint is taken aligned whatever the mode (a run's final
        checkpoint: sparkplug/barriers.py); nothing is overtaken.
        Raises ValueError if it is not greater than the previous barrier, TypeError as
        :meth:`send`."""
        if self._last_barrier is not None and checkpoint_id <= self._last_barrier:
            raise ValueError(f"barrier {checkpoint_id} after barrier {self._last_barrier}")
        self._last_barrier = checkpoint_id
        if aligned:  # the run's last barrier: what precedes it flows as in aligned mode
            self._window = 0
        frame = msgpack.packb([_ALIGNED_BARRIER if aligned else _BARRIER, checkpoint_id])
        overtaken: list[bytes] = []
        for target in range(self.parallelism):
            if self._open[target]:
                self._close_batch(target)
            if aligned or not self._overtake:
                self._enqueue(target, frame, barrier=True)
                continue
            queue = self._inbox if target == self.task else self._outbox[target]
            overtaken.extend(_overtake(queue, frame))
            if target != self.task:
                self._drain_outbox(target)
        return overtaken

    def flush(self) -> bool:
        """Close the batches that were already open at the previous flush, and hand
        queued frames to ZeroMQ as far as it accepts them without blocking. Returns True
        when nothing is left queued (no open batch, every outbox empty). Raises
        TypeError as :meth:`send`."""
        for target in range(self.parallelism):
            if self._open[target]:
                if self._waited[target]:
                    self._close_batch(target)
                else:
                    self._waited[target] = True
        idle = True
        for target in range(self.parallelism):
            if target != self.task and not self._drain_outbox(target):
                idle = False
        self._grant()
        return idle and not any(self._open)

    def consumed(self, channel: int) -> None:
        """The caller processed a batch received on ``channel``: with credit-based flow
        control its sender may send one more (granted at :meth:`flush`, several at a
        time). Reading a batch ahead grants nothing: only processing does, so what a
        checkpoint reads ahead of its processing is not sent again behind it."""
        if self._credit_flow(channel):
            self._to_grant[channel] += 1

    def _credit_flow(self, channel: int) -> bool:
        return channel != self.task and self._initial_window > 0

    def _grant(self) -> None:
        """Send the credits of processed batches back to their senders, at least half
        a window at a time; a grant ZeroMQ refuses now goes at the next flush."""
        least = max(1, self._initial_window // 2)
        for channel, n in enumerate(self._to_grant):
            sock = self._push[channel]
            if n < least or sock is None:
                continue
            try:
                sock.send(msgpack.packb([_CREDIT, n]), zmq.NOBLOCK)
            except zmq.Again:
                continue
            self._to_grant[channel] = 0

    @property
    def backpressured(self) -> bool:
        """True when an outbox (or this task's own input queue) holds
        ``max_outbox_batches`` frames: stop reading the source until it is False."""
        limit = self._max_outbox
        return len(self._inbox) >= limit or any(len(q) >= limit for q in self._outbox)

    @property
    def aligning(self) -> int | None:
        """The checkpoint whose barrier arrived on some input channels but not all yet,
        or None."""
        return self.barriers.pending

    def receive(
        self, timeout: float, max_frames: int | None = None
    ) -> list[Records | BarrierEvent]:
        """What arrived on the input channels not blocked (sparkplug/barriers.py), in
        order per channel, up to ``max_frames`` frames (default ``receive_batches``);
        waits up to ``timeout`` seconds for the first one if none is there. Barrier
        events come in place: ``TakeSnapshot`` before the records the snapshot must not
        hold, ``BarriersComplete`` once the checkpoint's barrier arrived everywhere.
        Raises ExchangeError (naming the channel) for a malformed frame or an
        out-of-order barrier."""
        budget = self._receive_batches if max_frames is None else max_frames
        out: list[Records | BarrierEvent] = list(self.barriers.on_time(time.monotonic()))
        self._read_available(out, budget, range(self.parallelism))
        if out or timeout <= 0 or budget <= 0:
            return out
        waiting = [
            (sock, zmq.POLLIN)
            for channel, sock in enumerate(self._pull)
            if sock is not None and not self.barriers.blocked(channel)
        ]
        if waiting:
            if zmq.zmq_poll(waiting, int(timeout * 1000)):
                self._read_available(out, budget, range(self.parallelism))
        else:
            time.sleep(timeout)  # only the own channel: nothing can arrive meanwhile
        return out

    def receive_own(self, max_frames: int) -> list[Records | BarrierEvent]:
        """Read up to ``max_frames`` frames of this task's own channel, without waiting
        (unaligned: its barrier overtook the batches queued there, so the next frame is
        the barrier). Raises as :meth:`receive`."""
        out: list[Records | BarrierEvent] = []
        self._read_available(out, max_frames, (self.task,))
        return out

    def receive_inflight(self, max_frames: int) -> list[Records | BarrierEvent]:
        """Read ahead, without waiting, up to ``max_frames`` frames of the channels
        that still owe the pending unaligned checkpoint its barrier (their records are
        its input channel state): the checkpoint completes when their barriers arrive,
        not when the records before them are processed (FLIP-76). [] when no unaligned
        checkpoint is pending. Raises as :meth:`receive`."""
        out: list[Records | BarrierEvent] = []
        owing = self.barriers.owing()
        if owing:
            self._read_available(out, max_frames, owing)
        return out

    def close(self) -> None:
        """Close every socket (queued frames are discarded: LINGER 0). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sock in (*self._pull, *self._push):
            if sock is not None:
                sock.close(linger=0)

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_batch(self, target: int) -> None:
        items = self._open[target]
        self._open[target] = []
        self._waited[target] = False
        self._enqueue(target, encode_batch(items))

    def _enqueue(self, target: int, frame: bytes, barrier: bool = False) -> None:
        if target == self.task:
            self._inbox.append((barrier, frame))
            return
        outbox = self._outbox[target]
        outbox.append((barrier, frame))
        if len(outbox) == 1:
            self._drain_outbox(target)

    def _drain_outbox(self, target: int) -> bool:
        """Send queued frames to ``target`` until ZeroMQ refuses; True when empty."""
        outbox = self._outbox[target]
        sock = self._push[target]
        if sock is None:
            return not outbox
        credits = self._credits
        while outbox:
            barrier, frame = outbox[0]
            gated = self._window > 0 and not barrier  # barriers never wait for credits
            if gated and credits[target] <= 0:
                return False
            try:
                sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return False
            outbox.popleft()
            if gated:
                credits[target] -= 1
        return True

    def _next_frame(self, channel: int) -> bytes | None:
        if channel == self.task:
            return self._inbox.popleft()[1] if self._inbox else None
        sock = self._pull[channel]
        assert sock is not None
        try:
            return sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    def _read_available(
        self, out: list[Records | BarrierEvent], budget: int, channels: Any
    ) -> None:
        """Read ``channels`` that are not blocked round-robin, one frame each per round,
        until none has anything or ``budget`` frames were read."""
        progress = True
        barriers = self.barriers
        while progress and budget > 0:
            progress = False
            for channel in channels:
                if budget == 0 or barriers.blocked(channel):
                    continue
                frame = self._next_frame(channel)
                if frame is None:
                    continue
                progress = True
                budget -= 1
                kind, body = _decode(channel, frame)
                if kind == _BATCH:
                    if body:
                        out.append(Records(channel, body, barriers.inflight_for(channel), frame))
                elif kind == _CREDIT:  # the peer processed batches this task sent it
                    self._credits[channel] = min(
                        self._initial_window, self._credits[channel] + body
                    )
                else:
                    aligned = kind == _ALIGNED_BARRIER
                    out.extend(barriers.on_barrier(channel, body, time.monotonic(), aligned))


def _overtake(queue: deque[tuple[bool, bytes]], barrier: bytes) -> list[bytes]:
    """Put ``barrier`` into ``queue`` after its last barrier, ahead of the batches
    queued after that one; returns those batches (FLIP-76: a barrier overtakes the
    in-flight data of its channel)."""
    at = len(queue)
    while at > 0 and not queue[at - 1][0]:
        at -= 1
    overtaken = [frame for _, frame in list(queue)[at:]]
    queue.insert(at, (True, barrier))
    return overtaken
