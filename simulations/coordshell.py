"""The coordinator of the simulator's tree designs: the real coordinator core,
:class:`dstltree.coordinator.state.CoordinatorState`, driven inside simpy; it triggers
and completes the checkpoints the node cores (:mod:`dstltree.simulations.nodeshell`)
persist.

The coordinator's rules (at most one checkpoint in flight, the next
``checkpoint_interval`` after the previous completed, FLIP-158; the checks of every
acknowledgement; the shared state registry and subsumption) are the core's own; only
the shell differs from ``coordinator.service``:

What the shell models:

* **Tasks.** ``executors x tasks_per_executor`` tasks, task ``t = i * tasks + j`` being
  writer ``t<i>.<j>`` of executor i, each on a ROUTER identity of its own (as
  ``coordinator.task_link``). At time 0 the attempt starts (``AttemptStarted``, attempt
  1) and every task says :class:`protocol.Hello` naming its executor's node. A
  ``TriggerCheckpoint`` reaches its task ``hop_latency_s`` after the core sent it; the
  task persists at once through its node (every task of an executor gets it at the
  same time, so their requests leave in one Persist message, as before). Once its
  writer has its ack, the task sends a real :class:`protocol.Ack` whose
  :class:`TaskCheckpoint` holds the task's key groups and its changelog handles since
  the start (materialization is off: every handle the task acknowledged stays), each
  segment named by the path of the object holding it, made by the store's own
  ``ObjectStore.new_object_path`` on a ``memory://`` job prefix, so every path passes
  the core's checks.
* **Coordinator CPU.** ``cpu_per_message_s`` per message received (Hellos and Acks),
  first come first served; a message is handled when its CPU is spent. When no
  message waits the shell ticks the core (the real loop ticks after draining its
  socket); it also ticks at ``startup_s`` and ``checkpoint_interval_s`` after each
  completion, when the next trigger is due, and while none is triggered again every
  ``LOOP_TICK_S`` (the real loop ticks every 10 ms).
* **Storage work.** ``PersistCheckpoint`` becomes ``CheckpointWritten`` after one
  request of the latency model for the metadata's size (estimated:
  ``METADATA_BYTES_PER_TASK`` per task plus ``METADATA_BYTES_PER_SEGMENT`` per
  segment reference, the JSON of ``CompletedCheckpoint.to_dict``); the metadata and
  the retained set are written as one request (the commit record), not throttled, not hedged, its
  latency drawn from a generator of its own.
  Deletions (``DeleteCheckpoint``, ``DeleteObjects``) and the cleanup at start
  (``CleanOrphans``) are answered at once, at no cost (the real storage worker runs
  them after the metadata write, off the checkpoint's path).

What it does not model: sending costs and message sizes (commands reach tasks
``hop_latency_s`` after they are sent, whatever their number), the time a task takes
between its trigger and its persist (barrier alignment, records), a sink, a source,
materialization, checkpoint timeouts and aborts (the timeout is infinite), failures
and further attempts. A message the core refuses, fences or ignores, or an aborted
checkpoint, is a bug of the shell: RuntimeError.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import simpy

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import (
    CompletedCheckpoint,
    TaskCheckpoint,
    job_object_prefixes,
)
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointCompleted,
    CheckpointDeleted,
    CheckpointTriggered,
    CheckpointWritten,
    CleanOrphans,
    DeleteCheckpoint,
    DeleteObjects,
    Event,
    Instruction,
    MessageFromTask,
    ObjectsDeleted,
    OrphansDeleted,
    PersistCheckpoint,
    SendToTask,
    Started,
    Tick,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.simulations.config import SimConfig, SimWorkload
from dstltree.simulations.nodeshell import NodeCoreCluster
from dstltree.sparkplug.keygroups import key_group_range
from dstltree.storage.store import ObjectStore
from dstltree.topology.latency import LatencyModel

__all__ = [
    "LOOP_TICK_S",
    "METADATA_BYTES_PER_SEGMENT",
    "METADATA_BYTES_PER_TASK",
    "SIM_JOB_URL",
    "CoordinatorCluster",
]

#: The job prefix the simulated objects are named under (nothing is written there).
SIM_JOB_URL = "memory://dstl-sim/job"
#: Seconds between the real coordinator loop's ticks (``Coordinator(tick=0.01)``).
LOOP_TICK_S = 0.01
#: Estimated checkpoint metadata (JSON) per task and per segment reference, bytes.
METADATA_BYTES_PER_TASK = 160
METADATA_BYTES_PER_SEGMENT = 150
_ATTEMPT = 1


class CoordinatorCluster:
    """The coordinator core and the tasks of ``nodes``' executors on ``env``.

    Call :meth:`start` once (after ``nodes.start()``); checkpoint ``c`` (the core's id
    ``c + 1``) is triggered by the core at ``triggered[c]`` and completes (metadata
    written) at ``completed[c]`` (seconds); ``finished`` succeeds when the last of
    ``cfg.warmup + cfg.checkpoints`` completed. ``workload`` gives each checkpoint's
    bytes per task when its trigger reaches the tasks; ``model`` the metadata write's
    latency. ``core`` is the :class:`CoordinatorState` (built with ``validate=True``
    when ``cfg.check_invariants``); ``messages`` counts the messages it received
    (hellos and acks). Object paths are the store's random names: no figure depends
    on them. Raises RuntimeError when the core refuses,
    fences or ignores a simulated message or aborts a checkpoint.
    """

    def __init__(
        self,
        cfg: SimConfig,
        env: simpy.Environment,
        nodes: NodeCoreCluster,
        workload: SimWorkload,
        model: LatencyModel,
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.nodes = nodes
        self.workload = workload
        self.model = model
        self.rng = random.Random(f"{cfg.seed}/coordinator")
        self.total = cfg.warmup + cfg.checkpoints
        self.per_executor = cfg.tasks_per_executor
        n = cfg.executors * cfg.tasks_per_executor
        self.num_tasks = n
        paths = ObjectStore(SIM_JOB_URL, prefixes=cfg.prefixes)
        nodes.object_path = paths.new_object_path
        nodes.on_writer_done = self._writer_done
        mp = max(128, n)
        self.core = CoordinatorState(
            CoordinatorConfig(
                checkpoint_interval=cfg.checkpoint_interval_s,
                materialization_interval=math.inf,
                checkpoint_timeout=math.inf,
                max_parallelism=mp,
                finish_when_source_done=False,
                object_prefixes=job_object_prefixes(paths),
            ),
            validate=cfg.check_invariants,
        )
        self.idents = [
            f"t{t // self.per_executor}.{t % self.per_executor}".encode() for t in range(n)
        ]
        self.key_groups = [_range(key_group_range(t, n, mp)) for t in range(n)]
        self.handles: list[list[ChangelogHandle]] = [[] for _ in range(n)]
        self.triggered: dict[int, float] = {}
        self.completed: dict[int, float] = {}
        self.messages = 0  # received by the coordinator
        self.finished = env.event()
        self.in_flight: int | None = None  # triggered, not completed
        self._cpu_free = 0.0
        self._queued = 0

    # -- the clock -----------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at time ``t`` (seconds; now if in the past)."""
        self.after(t - self.env.now, fn, *args)

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` ``delay`` seconds from now (the time is exactly
        ``now + delay``, as the core computes its due times)."""
        ev = self.env.timeout(max(0.0, delay))
        ev.callbacks.append(lambda _e: fn(*args))

    def start(self) -> None:
        """The coordinator starts, attempt 1 begins, every task says hello."""
        now = self.env.now
        self._feed(Started(now))
        self._feed(AttemptStarted(now, _ATTEMPT, self.num_tasks))
        ids = self.nodes.ids
        for t, ident in enumerate(self.idents):
            node = ids[t // self.per_executor]
            self._to_coordinator(ident, protocol.Hello(t, _ATTEMPT, node))
        self.after(self.cfg.startup_s, self._due_tick)

    # -- the coordinator -----------------------------------------------------------------
    def _feed(self, event: Event) -> None:
        self._run(self.core.handle(event))

    def _tick(self) -> None:
        if not self.finished.triggered:
            self._feed(Tick(self.env.now))

    def _due_tick(self) -> None:
        """A tick when the next trigger is due; while none happened (not every task
        said hello yet, not due yet), again every ``LOOP_TICK_S`` (the real loop's)."""
        self._tick()
        if self.in_flight is None and not self.finished.triggered:
            self.after(LOOP_TICK_S, self._due_tick)

    def _to_coordinator(self, ident: bytes, msg: protocol.Message) -> None:
        """A task's message reaches the coordinator one hop later and waits for its CPU
        (first come first served). Messages are sent in time order and the hop is
        fixed, so they arrive in the order sent: the time it is handled is known now
        (one simulation event per message)."""
        now = self.env.now
        arrival = now + self.cfg.hop_latency_s
        self._cpu_free = max(arrival, self._cpu_free) + self.cfg.cpu_per_message_s
        self._queued += 1
        self.messages += 1
        self.after(self._cpu_free - now, self._handle, ident, msg)

    def _handle(self, ident: bytes, msg: protocol.Message) -> None:
        self._queued -= 1
        self._feed(MessageFromTask(self.env.now, ident, msg))
        if self._queued == 0:
            self._tick()

    def _run(self, out: list[Instruction]) -> None:
        """Carry out the core's instructions (see the module docstring)."""
        triggered = None
        for ins in out:
            if isinstance(ins, SendToTask):
                if isinstance(ins.message, protocol.TriggerCheckpoint):
                    triggered = ins.message.checkpoint_id
                elif not isinstance(ins.message, protocol.CheckpointComplete):
                    raise RuntimeError(f"unexpected command to a simulated task: {ins}")
            elif isinstance(ins, PersistCheckpoint):
                cid = ins.checkpoint.checkpoint_id
                latency = self.model.sample(self.rng, _metadata_bytes(ins.checkpoint))
                self.after(latency, self._written, cid)
            elif isinstance(ins, CheckpointCompleted):
                self._completed(ins.checkpoint.checkpoint_id - 1)
            elif isinstance(ins, CheckpointTriggered):
                continue  # a notice for logs and metrics
            else:
                self._answer(ins)
        if triggered is not None:
            self._trigger(triggered - 1)

    def _answer(self, ins: Instruction) -> None:
        """Deletions and the cleanup: answered now, at no cost; anything else the
        simulated tasks should never cause."""
        now = self.env.now
        if isinstance(ins, DeleteCheckpoint):
            self.at(now, self._feed, CheckpointDeleted(now, ins.checkpoint_id))
        elif isinstance(ins, DeleteObjects):
            self.at(now, self._feed, ObjectsDeleted(now, ins.paths, len(ins.paths)))
        elif isinstance(ins, CleanOrphans):
            self.at(now, self._feed, OrphansDeleted(now, 0, 0))
        else:
            raise RuntimeError(f"the coordinator core said {ins!r} to the simulator")

    def _written(self, cid: int) -> None:
        self._feed(CheckpointWritten(self.env.now, cid))

    def _trigger(self, c: int) -> None:
        """Checkpoint ``c`` reaches every task one hop after the core's trigger."""
        if c >= self.total:
            return  # the run is over: nothing more is measured
        self.triggered[c] = self.env.now
        self.in_flight = c
        self.after(self.cfg.hop_latency_s, self._persist, c)

    def _persist(self, c: int) -> None:
        self.nodes.trigger(c, self.workload.next())

    def _completed(self, c: int) -> None:
        now = self.env.now
        self.completed[c] = now
        self.in_flight = None
        if c + 1 >= self.total:
            self.finished.succeed()
        else:
            self.after(self.cfg.checkpoint_interval_s, self._due_tick)

    # -- tasks ---------------------------------------------------------------------------
    def _writer_done(self, c: int, i: int, j: int, ref: SegmentRef | None) -> None:
        """Task (i, j)'s writer has its ack: the task acknowledges checkpoint ``c``."""
        t = i * self.per_executor + j
        handles = self.handles[t]
        if ref is not None:
            handles.append(ChangelogHandle(ref.log_id, (ref.sqn_from, ref.sqn_to), (ref,)))
        state = TaskCheckpoint(t, _ATTEMPT, 0, None, tuple(handles), key_groups=self.key_groups[t])
        self._to_coordinator(self.idents[t], protocol.Ack(t, _ATTEMPT, c + 1, state))


def _range(r: range) -> tuple[int, int]:
    return (r.start, r.stop)


def _metadata_bytes(cp: CompletedCheckpoint) -> int:
    """The estimated size of ``cp``'s metadata file, bytes."""
    segments = sum(
        len(h.segments) for tc in cp.tasks.values() for h in (*tc.changelog, *tc.channel_state)
    )
    return METADATA_BYTES_PER_TASK * len(cp.tasks) + METADATA_BYTES_PER_SEGMENT * segments
