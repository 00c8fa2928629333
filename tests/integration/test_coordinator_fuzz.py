"""Fuzz: a real coordinator on a loopback port, over a real local ObjectStore, takes
more than 100,000 forged and malformed messages while legitimate tasks keep
checkpointing. Outsiders (plain DEALER sockets) send random frames, truncated and
multi-frame messages, commands, numbers out of range, forged Hellos, Acks, Reports and
SplitsFinished of the legitimate tasks naming paths outside the job, ``../`` paths and
files that exist under the job's prefixes. A compromised task (bound, so its messages
reach the validators) sends acknowledgements and reports with bad paths, SQN ranges,
key groups and sizes around its valid ones. The coordinator keeps serving, every
checkpoint holds exactly what the legitimate tasks acknowledged, and no file is
deleted but those the shared state registry released."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from dstltree.client import ChangelogClient
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator import (
    ApplyMaterialization,
    CheckpointComplete,
    CompletedCheckpoint,
    Coordinator,
    ErrorReply,
    Materialize,
    MaterializedRef,
    TaskCheckpoint,
    TaskLink,
    TriggerCheckpoint,
    protocol,
)
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug.keygroups import key_group_range
from dstltree.storage.store import ObjectStore
from tests.support.waiting import wait_until

FORGED = 100_000
OUTSIDERS = 3
COMPROMISED_SHARE = 12_000  # forged messages of the bound, compromised task
TASKS = 3  # 0 and 1 are legitimate, 2 is compromised
MAXP = 128
BAD = 2  # the compromised task


@dataclass
class Sent:
    """What the legitimate side sent: task -> checkpoint id -> its acknowledged state,
    every path it wrote, and anything that went wrong."""

    acks: dict[int, dict[int, TaskCheckpoint]] = field(default_factory=dict)
    paths: set[str] = field(default_factory=set)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, cid: int, tc: TaskCheckpoint) -> None:
        with self.lock:
            self.acks.setdefault(tc.task, {})[cid] = tc
            self.paths |= tc.referenced_paths()


def _legit(address: str, base: str, task: int, stop: threading.Event, sent: Sent) -> None:
    """A stateful task: appends, acknowledges every trigger with its real handle,
    materializes on command; any ErrorReply is a failure (it must never be refused)."""
    try:
        client = ChangelogClient.open(base)
        kgs = key_group_range(task, TASKS, MAXP)
        writer = client.create_writer(f"fuzz-t{task}", kgs)
        link = TaskLink(address, task, 0)
        offset, materialized, after = 0, None, writer.next_sqn()
        while not stop.is_set():
            writer.append(kgs.start + offset % len(kgs), str(offset).encode())
            offset += 1
            for cmd in link.poll(timeout=0.002):
                if isinstance(cmd, TriggerCheckpoint):
                    h = writer.persist_durably(after).result(timeout=10)
                    tc = TaskCheckpoint(task, 0, offset, materialized, (h,), (kgs.start, kgs.stop))
                    sent.ack(cmd.checkpoint_id, tc)
                    link.ack_checkpoint(cmd.checkpoint_id, tc)
                elif isinstance(cmd, Materialize):
                    sqn, path = writer.next_sqn(), client.store.new_snapshot_path()
                    size = client.store.put(path, str(offset).encode())
                    with sent.lock:
                        sent.paths.add(path)
                    link.report_materialization(cmd.epoch, MaterializedRef(path, sqn, size))
                elif isinstance(cmd, ApplyMaterialization):
                    materialized, after = cmd.ref, cmd.ref.sqn
                    writer.truncate(cmd.ref.sqn)
                elif not isinstance(cmd, CheckpointComplete):
                    raise AssertionError(f"task {task} got {cmd}")
        link.close()
        client.close()
    except BaseException as e:  # noqa: BLE001 - reported to the test thread
        sent.errors.append(e)


# -- forged content ----------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Paths a forger names: files outside the job, files of the job nobody
    references (victims), traversal and foreign-scheme spellings."""

    base: str
    sentinel: str
    victims: tuple[str, ...]

    def paths(self, rng: random.Random) -> str:
        """A victim (valid but not the sender's) or a bad path."""
        return rng.choice([*self.victims, self.bad_path(rng)])

    def bad_path(self, rng: random.Random) -> str:
        """A path no acknowledgement may name."""
        cl = f"{self.base}/changelog/"
        return rng.choice(
            [
                f"{self.sentinel}/keep-0",
                f"{cl}../../sentinel/keep-1",
                f"{cl}zz/../../../sentinel/keep-2",
                f"file://{self.victims[0]}",
                f"s3://other-bucket{self.victims[0]}",
                f"{cl}zz//victim-0.dstl",
                f"{cl}zz/victim-0.dstl?versionId=1",
                f"{cl}zz/victim-0.dstl#x",
                f"{cl}zz/%2e%2e/x",
                f"{cl}.hidden",
                cl,
                "",
                "x" * 5000,
            ]
        )


def _seg(path: str, lo: int, hi: int, log: str = "log", **kw: int) -> SegmentRef:
    meta = SegmentMeta(log, lo, hi, (kw.get("kg", 0),), kw.get("length", 10), 0)
    return SegmentRef(meta, path, kw.get("offset", 0))


def _bad_state(rng: random.Random, t: Targets, task: int) -> TaskCheckpoint:
    """A state that is wrong in exactly one way the coordinator must notice."""
    good = t.victims[0]
    big = rng.choice([2**63, 2**64 - 1, -1, -(2**63)])
    variants = [
        ChangelogHandle("log", (0, 1), (_seg(t.bad_path(rng), 0, 1),)),
        ChangelogHandle("log", (5, 1), (_seg(good, 0, 1),)),
        ChangelogHandle("log", (0, big), (_seg(good, 0, 1),)),
        ChangelogHandle("log", (0, 4), (_seg(good, 2, 4), _seg(good, 0, 3))),
        ChangelogHandle("log", (0, 1), (_seg(good, 0, 1, offset=big),)),
        ChangelogHandle("log", (0, 1), (_seg(good, 0, 1, length=big),)),
        ChangelogHandle("log", (0, 1), (_seg(good, 0, 1, kg=MAXP + 7),)),
    ]
    tc = TaskCheckpoint(task, 0, 0, None, (rng.choice(variants),), (0, 0))
    other = rng.randrange(4)
    if other == 0:
        return replace(tc, records=big if big < 0 else tc.records - 1)
    if other == 1:
        return replace(tc, changelog=(), materialized=MaterializedRef(t.bad_path(rng), 0, 1))
    if other == 2:
        return replace(tc, changelog=(), key_groups=(0, MAXP * 2))
    return tc


def _raw(d: dict) -> bytes:  # type: ignore[type-arg]
    return bytes(msgpack.packb(d, use_bin_type=True))


def _outsider_frames(rng: random.Random, t: Targets, n: int) -> list[list[bytes]]:
    """``n`` forged messages (each a list of frames) of many kinds."""
    valid_ack = protocol.dump(protocol.Ack(0, 0, 1, _bad_state(rng, t, 0)))
    makers = [
        lambda: [os.urandom(rng.randrange(0, 80))],
        lambda: [valid_ack[: rng.randrange(len(valid_ack))]],
        lambda: [b"a", b"b"] if rng.random() < 0.5 else [],
        lambda: [protocol.dump(rng.choice(_commands(rng, t)))],
        lambda: [protocol.dump(protocol.Hello(rng.randrange(TASKS), 0, "tcp://evil:1"))],
        lambda: [protocol.dump(protocol.Hello(0, -rng.randrange(1, 10)))],
        lambda: [
            protocol.dump(
                protocol.Ack(
                    task := rng.randrange(TASKS),
                    0,
                    rng.randrange(1, 60),
                    _bad_state(rng, t, task)
                    if rng.random() < 0.5
                    else TaskCheckpoint(task, 0, 0, None, (_good_handle(t),), (0, 0)),
                )
            )
        ],
        lambda: [
            protocol.dump(
                protocol.Report(
                    rng.randrange(TASKS),
                    0,
                    rng.randrange(1, 6),
                    MaterializedRef(rng.choice([t.victims[-1], t.paths(rng)]), 2**62, 1),
                )
            )
        ],
        lambda: [protocol.dump(protocol.SplitsFinished(rng.randrange(TASKS), 0, ("s",)))],
        lambda: [_raw({"t": "hello", "task": 2**64 - 1, "attempt": -(2**63)})],
        lambda: [_raw({"t": "ack", "task": 0, "attempt": 0, "checkpoint_id": 1.5})],
        lambda: [_raw({"t": "report", "task": 0, "attempt": 0, "epoch": 1, "ref": {}})],
        lambda: [_raw({"t": "hello", "task": float("inf"), "attempt": 0})],
        lambda: [_raw({"t": rng.choice(["nope", "", None, 7]), "x": [1] * 10})],
        lambda: [_raw([1, 2, {"t": "hello"}])],
    ]
    out = []
    while len(out) < n:
        frames = rng.choice(makers)()
        if frames:
            out.append(frames)
    return out


def _good_handle(t: Targets) -> ChangelogHandle:
    """A handle that would pass every check but the sender's identity."""
    return ChangelogHandle("log", (0, 1), (_seg(t.victims[0], 0, 1),))


def _commands(rng: random.Random, t: Targets) -> list[protocol.Message]:
    ref = MaterializedRef(t.paths(rng), 2**62, 1)
    return [
        TriggerCheckpoint(rng.randrange(1, 2**40)),
        Materialize(rng.randrange(1, 9)),
        ApplyMaterialization(1, ref),
        CheckpointComplete(rng.randrange(2**62)),
        protocol.Finish(1),
        protocol.Fenced(0),
        ErrorReply("x" * rng.randrange(1000)),
        protocol.AssignSplits(()),
    ]


def _drain(sock: zmq.Socket) -> list[protocol.Message]:  # type: ignore[type-arg]
    got = []
    while True:
        try:
            got.append(protocol.load(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return got


def _outsider(
    address: str, t: Targets, n: int, seed: int, probe: int, go: Any, results: Any
) -> None:
    """In a process of its own (no lock shared with the coordinator's): once ``go`` is
    set, send ``n`` forged messages (drawn from a pool of distinct ones), reading
    replies as they come, then a probe whose Fenced reply proves the coordinator
    handled everything sent before it; puts ``(probe, sent, error or "")`` on
    ``results``."""
    rng = random.Random(seed)
    pool = _outsider_frames(rng, t, min(n, 4000))
    frames = pool + rng.choices(pool, k=n - len(pool))
    go.wait(60)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 10_000)
    sock.connect(address)
    try:
        for i, fr in enumerate(frames):
            sock.send_multipart(fr)
            if i % 32 == 0:
                _drain(sock)
        sock.send(protocol.dump(protocol.Hello(0, probe)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sock.poll(100) and protocol.Fenced(probe) in _drain(sock):
                results.put((probe, len(frames), ""))
                return
        results.put((probe, len(frames), f"no answer to probe {probe}"))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put((probe, 0, repr(e)))
    finally:
        sock.close()


def _compromised(
    address: str, store: ObjectStore, t: Targets, stop: threading.Event, sent: Sent, done: Any
) -> None:
    """Task 2, bound but hostile: around each valid ack and report it sends forged ones
    (which reach the validators); ``done.value``: how many forged messages it sent."""
    rng = random.Random(2)
    link = TaskLink(address, BAD, 0)
    count = last = 0
    materialized: MaterializedRef | None = None
    try:
        while not stop.is_set():
            for cmd in link.poll(timeout=0.002):
                if isinstance(cmd, TriggerCheckpoint):
                    cid = last = cmd.checkpoint_id
                    for _ in range(40):
                        bad = _bad_state(rng, t, BAD)
                        link._sock.send(protocol.dump(protocol.Ack(BAD, 0, cid, bad)))
                    count += 40
                    tc = TaskCheckpoint(BAD, 0, 0, materialized, (), (0, 0))
                    sent.ack(cid, tc)
                    link.ack_checkpoint(cid, tc)
                    link._sock.send(protocol.dump(protocol.Ack(BAD, 0, cid + 10**6, tc)))
                    count += 1
                elif isinstance(cmd, Materialize):
                    for _ in range(5):
                        ref = MaterializedRef(t.bad_path(rng), rng.choice([0, 2**63, -1]), 1)
                        link.report_materialization(cmd.epoch, ref)
                    count += 5
                    path = store.new_snapshot_path()
                    store.put(path, b"0")
                    with sent.lock:
                        sent.paths.add(path)
                    link.report_materialization(cmd.epoch, MaterializedRef(path, 0, 1))
                elif isinstance(cmd, ApplyMaterialization):
                    materialized = cmd.ref
            if count < COMPROMISED_SHARE and last:
                for _ in range(5):
                    bad = _bad_state(rng, t, BAD)  # a duplicate of the pending, or ignored
                    link._sock.send(protocol.dump(protocol.Ack(BAD, 0, last, bad)))
                count += 5
            done.value = count
    except BaseException as e:  # noqa: BLE001 - reported to the test thread
        sent.errors.append(e)
    finally:
        link.close()


def _tasks(
    address: str, base: str, t: Targets, go: Any, stop: Any, done: Any, results: Any
) -> None:
    """In a process of its own (the coordinator's process runs nothing but it): from
    ``go`` on, the two legitimate tasks and the compromised one until ``stop`` is set;
    then puts ``(acks, paths, errors)`` of :class:`Sent` on ``results``."""
    go.wait(60)
    sent, halt = Sent(), threading.Event()
    store = ObjectStore(base)
    threads = [threading.Thread(target=_legit, args=(address, base, i, halt, sent)) for i in (0, 1)]
    threads.append(
        threading.Thread(target=_compromised, args=(address, store, t, halt, sent, done))
    )
    for th in threads:
        th.start()
    stop.wait(60)
    halt.set()
    for th in threads:
        th.join(15)
    results.put((sent.acks, sent.paths, [repr(e) for e in sent.errors]))


# -- the test ----------------------------------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _targets(tmp_path: Path, store: ObjectStore) -> Targets:
    """A sentinel directory outside the job (made now) and victim files inside its
    prefixes (made by :func:`_make_victims`, after the start's orphan cleanup)."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    for i in range(3):
        (sentinel / f"keep-{i}").write_bytes(f"keep {i}".encode())
    victims = [store.join("changelog", "zz", f"victim-{i}.dstl") for i in range(3)]
    victims.append(store.join("materialized", "zz", "victim.snap"))
    return Targets(store.root, str(sentinel), tuple(victims))


def _make_victims(store: ObjectStore, t: Targets) -> None:
    for v in t.victims:
        store.put(v, b"victim")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_forged_messages_change_no_checkpoint_and_delete_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="dstltree.coordinator.service")  # a warning per refusal
    started = time.monotonic()
    base = str(tmp_path / "job")
    store = ObjectStore(base)
    targets = _targets(tmp_path, store)
    address = f"tcp://127.0.0.1:{_free_port()}"
    # Children are forked before the coordinator's threads exist (fast, and safe).
    fork = multiprocessing.get_context("fork")
    results, stop, by_task = fork.Queue(), fork.Event(), fork.Value("i", 0)
    ready, flood_go = fork.Event(), fork.Event()
    tasks = fork.Process(
        target=_tasks, args=(address, base, targets, ready, stop, by_task, results)
    )
    per = (FORGED - COMPROMISED_SHARE) // OUTSIDERS + 1
    outsiders = [
        fork.Process(
            target=_outsider, args=(address, targets, per, i, -1000 - i, flood_go, results)
        )
        for i in range(OUTSIDERS)
    ]
    for proc in [tasks, *outsiders]:
        proc.start()
    answers: list[tuple[int, int, str]] = []
    sent = Sent()
    seen: dict[int, CompletedCheckpoint] = {}
    coord = Coordinator(
        store,
        TASKS,
        checkpoint_interval=0.05,
        materialization_interval=0.4,
        checkpoint_timeout=5.0,
        bind=address,
        max_parallelism=MAXP,
    )

    def observe() -> None:
        latest = coord.latest_checkpoint()
        if latest is not None:
            seen[latest.checkpoint_id] = latest

    try:
        coord.start()  # cleans orphans: the victims come after
        _make_victims(store, targets)
        before = _files(tmp_path / "sentinel") | {v: b"victim" for v in targets.victims}
        coord.begin_attempt(0)
        ready.set()
        # The tasks said hello (a checkpoint completed) before any outsider connects:
        # without CURVE, the first Hello of a task binds it, whoever sends it.
        wait_until(lambda: coord.statistics().checkpoints_completed >= 1, 30)
        flood = time.monotonic()
        flood_go.set()
        while len(answers) < OUTSIDERS:
            observe()
            assert time.monotonic() - started < 60, "outsiders did not finish"
            with contextlib.suppress(queue.Empty):
                answers.append(results.get(timeout=0.01))
        flood = time.monotonic() - flood
        during = coord.statistics()
        wait_until(lambda: by_task.value >= COMPROMISED_SHARE, 15)
        # After the flood: checkpoints and materializations still complete.
        wait_until(
            lambda: (
                (observe() or True)
                and coord.statistics().checkpoints_completed >= during.checkpoints_completed + 3
                and coord.statistics().materializations_completed >= 1
            ),
            timeout=15,
        )
        stop.set()
        sent.acks, sent.paths, errors = results.get(timeout=30)
    finally:
        ready.set()
        flood_go.set()
        stop.set()
        for proc in [tasks, *outsiders]:
            proc.join(10)
            if proc.is_alive():
                proc.kill()  # by its PID
                proc.join(5)
        coord.stop()
    elapsed = time.monotonic() - started
    assert not errors and [a[2] for a in answers] == [""] * OUTSIDERS, (errors, answers)
    forged = sum(a[1] for a in answers) + by_task.value
    stats = coord.statistics()
    print(
        f"\nfuzz: {forged} forged messages, the flood took {flood:.1f} s, the test"
        f" {elapsed:.1f} s; {stats.checkpoints_completed}"
        f" checkpoints, {stats.materializations_completed} materializations, "
        f"{stats.messages_rejected} rejected, {stats.messages_fenced} fenced;"
        f" refusals by kind {dict(coord._state.rejections)}"
    )
    assert forged >= FORGED
    assert stats.messages_rejected + stats.messages_fenced >= 0.85 * forged
    _check_checkpoints(store, sent, seen)
    _check_files(tmp_path, targets, before, sent, store, stats.objects_deleted)


def _check_checkpoints(
    store: ObjectStore, sent: Sent, seen: dict[int, CompletedCheckpoint]
) -> None:
    """Every checkpoint seen in memory and every one on DFS holds exactly the state the
    legitimate side acknowledged for it."""
    retained = CheckpointStore(store).list_retained()
    assert retained and len(seen) >= 3
    for cp in [*seen.values(), *retained]:
        assert set(cp.tasks) == set(range(TASKS)), cp.checkpoint_id
        for t, tc in cp.tasks.items():
            assert sent.acks[t][cp.checkpoint_id] == tc, (cp.checkpoint_id, t)


def _check_files(
    tmp_path: Path,
    t: Targets,
    before: dict[str, bytes],
    sent: Sent,
    store: ObjectStore,
    deleted: int,
) -> None:
    """The sentinel directory and the victims are untouched; of the legitimate files
    only what no retained checkpoint references is gone, and no more than the
    registry's deletions."""
    after = _files(tmp_path / "sentinel") | {v: Path(v).read_bytes() for v in t.victims}
    assert after == before
    retained = CheckpointStore(store).list_retained()
    live = set().union(*(cp.referenced_paths() for cp in retained))
    missing = {p for p in sent.paths if not os.path.exists(p)}
    assert not missing & live
    assert len(missing) <= deleted
