"""The bare coordinator state trusts nothing it did not make: a task is bound to the
connection of its first Hello, and acknowledgements and reports with paths outside
the job's prefixes, inconsistent SQN ranges, foreign key groups or unbounded numbers
are refused (an ErrorReply, counted by kind) without changing anything."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import (
    MaterializedRef,
    TaskCheckpoint,
    job_object_prefixes,
    path_problem,
)
from dstltree.coordinator.cleanup import normalize
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointWritten,
    DeleteObjects,
    Instruction,
    MaterializationApplied,
    MessageFromTask,
    MessageIgnored,
    PersistCheckpoint,
    Reply,
    SendToTask,
    Started,
    Tick,
)
from dstltree.coordinator.metrics import CoordinatorMetrics
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.testing import completed, handle
from dstltree.storage.store import ObjectStore
from tests.support.coordinator_events import feed, ident, of_type, sends

CL, MAT = "/job/changelog/", "/job/materialized/"
CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=10.0,
    checkpoint_timeout=5.0,
    retained_checkpoints=1,
    max_parallelism=8,
    object_prefixes=(CL, MAT),
)
EVIL = b"evil"


def _state(num_tasks: int = 2, retained: tuple = ()) -> CoordinatorState:
    s = CoordinatorState(CFG, retained, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, num_tasks))
    for t in range(num_tasks):
        assert feed(s, _msg(t, protocol.Hello(t, 0))) == []
    return s


def _msg(task: int, m: protocol.Message, identity: bytes | None = None) -> MessageFromTask:
    return MessageFromTask(0.0, ident(task, 0) if identity is None else identity, m)


def _tc(task: int, lo: int = 0, hi: int = 1, **kw: object) -> TaskCheckpoint:
    """Task ``task``'s state: log ``log-<task>`` over [lo, hi), one object per SQN,
    key groups of task ``task`` of 2 (max parallelism 8)."""
    paths = [f"{CL}{task}{i:03d}.dstl" for i in range(lo, hi)]
    h = handle(f"log-{task}", paths, lo)
    kg = (task * 4, task * 4 + 4)
    segs = tuple(replace(sg, meta=replace(sg.meta, key_groups=(kg[0],))) for sg in h.segments)
    base = TaskCheckpoint(task, 0, 0, None, (replace(h, segments=segs),), kg)
    return replace(base, **kw)  # type: ignore[arg-type]


def _ack(task: int, cid: int, tc: TaskCheckpoint, identity: bytes | None = None) -> MessageFromTask:
    return _msg(task, protocol.Ack(task, 0, cid, tc), identity)


def _refused(out: list[Instruction], identity: bytes, words: str) -> None:
    (reply,) = out
    assert isinstance(reply, Reply) and reply.identity == identity, out
    assert isinstance(reply.message, protocol.ErrorReply) and words in reply.message.reason, out


def _triggered(s: CoordinatorState, now: float = 1.0) -> int:
    feed(s, Tick(now))
    assert s.in_flight()
    return s.in_flight()[-1]


# -- identity ----------------------------------------------------------------------------


def test_a_second_hello_is_refused_from_any_connection() -> None:
    s = _state()
    _refused(feed(s, _msg(0, protocol.Hello(0, 0))), ident(0, 0), "already said hello on this")
    _refused(feed(s, _msg(0, protocol.Hello(0, 0), EVIL)), EVIL, "on another connection")
    # A connection bound to task 0 cannot take another task of the next attempt either.
    s2 = CoordinatorState(CFG, validate=True)
    feed(s2, Started(0.0), AttemptStarted(0.0, 0, 2), _msg(0, protocol.Hello(0, 0), EVIL))
    _refused(feed(s2, _msg(1, protocol.Hello(1, 0), EVIL)), EVIL, "bound to another task")
    assert s.rejections == {"hello": 2} and s.messages_rejected == 2
    # Commands still go to the bound connections.
    assert {i.identity for i in feed(s, Tick(1.0)) if isinstance(i, SendToTask)} == {
        ident(0, 0),
        ident(1, 0),
    }


def test_messages_of_a_task_from_another_connection_change_nothing() -> None:
    s = _state()
    cid = _triggered(s)
    _refused(feed(s, _ack(0, cid, _tc(0), EVIL)), EVIL, "bound to another connection")
    assert s.in_flight() and s.acks_of(s.in_flight()[-1]) == {}
    feed(s, Tick(10.0), Tick(10.5))  # checkpoint 1 times out; epoch 1 starts
    ref = MaterializedRef(f"{MAT}s0.snap", 0, 1)
    _refused(feed(s, _msg(0, protocol.Report(0, 0, 1, ref), EVIL)), EVIL, "another connection")
    assert s._epoch is not None and s._epoch.reports == {}
    fin = protocol.SplitsFinished(1, 0, ("x",))
    _refused(feed(s, _msg(1, fin, EVIL)), EVIL, "another connection")
    assert s.rejections == {"identity": 3}


def test_unknown_tasks_and_stale_attempts_keep_their_answers() -> None:
    s = _state()
    (ign,) = feed(s, _ack(7, 1, _tc(1), EVIL))
    assert isinstance(ign, MessageIgnored)
    feed(s, AttemptStarted(1.0, 1, 2))
    assert feed(s, _msg(0, protocol.Hello(0, 0), EVIL)) == [Reply(EVIL, protocol.Fenced(0))]
    # Early hellos: only of the next attempt and a possible task (memory stays bounded).
    assert isinstance(feed(s, _msg(0, protocol.Hello(0, 9), EVIL))[0], MessageIgnored)
    assert isinstance(feed(s, _msg(0, protocol.Hello(99, 2), EVIL))[0], MessageIgnored)
    assert feed(s, _msg(0, protocol.Hello(0, 2), EVIL)) == []
    assert s.messages_rejected == 0


# -- a forged report cannot make tasks truncate ------------------------------------------


def _epoch_started(s: CoordinatorState, now: float = 10.0) -> int:
    for i in feed(s, Tick(now)):
        if isinstance(i, SendToTask) and isinstance(i.message, protocol.Materialize):
            return i.message.epoch
    raise AssertionError("no epoch")


def test_a_report_is_applied_only_within_what_its_task_acknowledged() -> None:
    s = _state(num_tasks=1)
    cid = _triggered(s)
    feed(s, _ack(0, cid, _tc(0, 0, 5)), CheckpointWritten(1.1, cid))
    epoch = _epoch_started(s)
    ahead = MaterializedRef(f"{MAT}s.snap", 9, 10)
    assert feed(s, _msg(0, protocol.Report(0, 0, epoch, ahead))) == []  # waits for acks
    assert s.materializations_completed == 0
    cid = _triggered(s, 11.0)
    out = feed(s, _ack(0, cid, _tc(0, 0, 9)))
    assert of_type(out, MaterializationApplied)
    assert sends(out, protocol.ApplyMaterialization) == {
        0: protocol.ApplyMaterialization(epoch, ahead)
    }


@pytest.mark.parametrize(
    ("epoch", "ref", "words"),
    [
        (5, MaterializedRef(f"{MAT}s.snap", 0, 1), "never started"),
        (1, MaterializedRef("/etc/passwd", 0, 1), "outside"),
        (1, MaterializedRef(f"{MAT}../../x", 0, 1), "not canonical"),
        (1, MaterializedRef(f"{MAT}s.snap", -1, 1), "out of range"),
        (1, MaterializedRef(f"{MAT}s.snap", 0, 2**60), "out of range"),
        (1, MaterializedRef(f"{MAT}s.snap", 2**64, 1), "out of range"),
    ],
)
def test_bad_reports_are_refused(epoch: int, ref: MaterializedRef, words: str) -> None:
    s = _state(num_tasks=1)
    assert _epoch_started(s) == 1
    _refused(feed(s, _msg(0, protocol.Report(0, 0, epoch, ref))), ident(0, 0), words)
    assert s._epoch is not None and s._epoch.reports == {}


def test_a_second_report_and_a_snapshot_moving_back_are_refused() -> None:
    s = _state(num_tasks=1)
    cid = _triggered(s)
    feed(s, _ack(0, cid, _tc(0, 0, 9)), CheckpointWritten(1.1, cid))
    first = MaterializedRef(f"{MAT}a.snap", 5, 1)
    out = feed(s, _msg(0, protocol.Report(0, 0, _epoch_started(s), first)))
    assert of_type(out, MaterializationApplied)
    epoch = _epoch_started(s, 20.0)
    back = MaterializedRef(f"{MAT}b.snap", 4, 1)
    _refused(feed(s, _msg(0, protocol.Report(0, 0, epoch, back))), ident(0, 0), "moves back")
    ahead = MaterializedRef(f"{MAT}c.snap", 20, 1)
    assert feed(s, _msg(0, protocol.Report(0, 0, epoch, ahead))) == []  # waits for acks
    again = protocol.Report(0, 0, epoch, MaterializedRef(f"{MAT}c.snap", 6, 1))
    _refused(feed(s, _msg(0, again)), ident(0, 0), "already reported")
    assert s._epoch is not None and s._epoch.reports == {0: ahead}


# -- acknowledgements --------------------------------------------------------------------


def _seg(
    path: str,
    lo: int,
    hi: int,
    offset: int = 0,
    length: int = 10,
    kgs: tuple[int, ...] = (0,),
    log: str = "log-0",
) -> SegmentRef:
    return SegmentRef(SegmentMeta(log, lo, hi, kgs, length, 0), path, offset)


def _with_handles(*handles: ChangelogHandle) -> TaskCheckpoint:
    return TaskCheckpoint(0, 0, 0, None, handles, (0, 4))


P = f"{CL}ab/obj.dstl"
CS = "log-0-cs"  # task 0's channel-state log


def _with_channel_state(*segments: SegmentRef, lo: int = 0) -> TaskCheckpoint:
    """Task 0 took the checkpoint unaligned: its in-flight records in ``segments``."""
    hi = max((sg.sqn_to for sg in segments), default=lo)
    h = ChangelogHandle(CS, (lo, hi), segments)
    return replace(_with_handles(), channel_state=(h,), unaligned=True, inflight_bytes=10)


@pytest.mark.parametrize(
    ("tc", "kind"),
    [
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg("/etc/passwd", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(f"{CL}../x", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(f"{CL}a//b", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(f"{CL}a?v=1", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(f"file://{P}", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg("s3://b/job/x", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(f"{CL}.tmp", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(f"{CL}a\nb", 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(CL + "a" * 2000, 0, 1),))), "path"),
        (_with_handles(ChangelogHandle("log-0", (3, 1), (_seg(P, 0, 1),))), "sqn"),
        (_with_handles(ChangelogHandle("log-0", (-1, 1), (_seg(P, 0, 1),))), "sqn"),
        (_with_handles(ChangelogHandle("log-0", (0, 2**64), (_seg(P, 0, 1),))), "sqn"),
        (_with_handles(ChangelogHandle("log-0", (0, 4), (_seg(P, 0, 3), _seg(P, 2, 4)))), "sqn"),
        (_with_handles(ChangelogHandle("log-0", (0, 4), (_seg(P, 2, 4), _seg(P, 0, 2)))), "sqn"),
        (_with_handles(ChangelogHandle("log-0", (0, 4), (_seg(P, 3, 1),))), "sqn"),
        (
            _with_handles(
                ChangelogHandle("log-0", (0, 2), (_seg(P, 0, 2),)),
                ChangelogHandle("log-0", (3, 4), (_seg(P, 3, 4),)),
            ),
            "sqn",
        ),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(P, 0, 1, offset=-1),))), "bounds"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(P, 0, 1, length=2**62),))), "bounds"),
        (_with_handles(ChangelogHandle("log-0", (0, 1), (_seg(P, 0, 1, kgs=(5,)),))), "key_groups"),
        (
            _with_handles(ChangelogHandle("log-0", (0, 1), (_seg(P, 0, 1, kgs=(-1,)),))),
            "key_groups",
        ),
        (_with_handles(ChangelogHandle("x" * 300, (0, 1), ())), "bounds"),
        (replace(_with_handles(), key_groups=(4, 8)), "key_groups"),  # task 1's
        (replace(_with_handles(), key_groups=(0, 99)), "key_groups"),
        (replace(_with_handles(), key_groups=(3, 1)), "key_groups"),
        (replace(_with_handles(), records=-1), "bounds"),
        (replace(_with_handles(), materialized=MaterializedRef(f"{CL}../s", 0, 1)), "path"),
        (replace(_with_handles(), materialized=MaterializedRef(f"{MAT}s", 0, -1)), "bounds"),
        (replace(_with_handles(), task=1), "identity"),
        # channel state (FLIP-76): checked as changelog handles
        (_with_channel_state(_seg("/etc/passwd", 0, 1, log=CS)), "path"),
        (_with_channel_state(_seg(f"{CL}../x", 0, 1, log=CS)), "path"),
        (_with_channel_state(_seg(f"{MAT}a//b", 0, 1, log=CS)), "path"),
        (_with_channel_state(_seg(P, 0, 3, log=CS), _seg(P, 2, 4, log=CS)), "sqn"),
        (_with_channel_state(_seg(P, 0, 1, log="log-0")), "sqn"),  # another log's segment
        (_with_channel_state(_seg(P, 0, 1, length=2**62, log=CS)), "bounds"),
        (_with_channel_state(_seg(P, 0, 1, kgs=(8,), log=CS)), "key_groups"),  # not the job's
        (replace(_with_handles(), alignment_s=-0.001), "bounds"),
        (replace(_with_handles(), alignment_s=float("nan")), "bounds"),
        (replace(_with_handles(), alignment_s=86_400.5), "bounds"),
        (replace(_with_handles(), start_delay_s=-1.0), "bounds"),
        (replace(_with_handles(), start_delay_s=float("inf")), "bounds"),
        (replace(_with_handles(), inflight_bytes=-1), "bounds"),
        (replace(_with_handles(), inflight_bytes=2**43 + 1), "bounds"),
    ],
)
def test_bad_acknowledgements_are_refused_and_change_nothing(tc: TaskCheckpoint, kind: str) -> None:
    s = _state()
    cid = _triggered(s)
    out = feed(s, _ack(0, cid, tc))
    assert isinstance(out[0], Reply) and isinstance(out[0].message, protocol.ErrorReply)
    assert s.rejections == {kind: 1}
    assert s.in_flight() and s.acks_of(s.in_flight()[-1]) == {}


def test_valid_acknowledgements_of_several_forms_are_accepted() -> None:
    s = _state(num_tasks=1)
    cid = _triggered(s)
    tc = TaskCheckpoint(
        0,
        0,
        3,
        MaterializedRef(f"{MAT}ab/x.snap", 2, 10),
        (
            ChangelogHandle(
                "old",
                (0, 5),
                (_seg(P, 0, 3, kgs=(1, 2), log="old"), _seg(P, 3, 9, 10, 5, log="old")),
            ),
            ChangelogHandle("log-0", (2, 4), (_seg(f"{CL}cd/y.dstl", 1, 4),)),
            ChangelogHandle("log-0", (4, 4), ()),
            ChangelogHandle("log-1", (7, 7), ()),
        ),
        (0, 8),  # one task of max parallelism 8: every key group
    )
    (persist,) = feed(s, _ack(0, cid, tc))
    assert isinstance(persist, PersistCheckpoint) and persist.checkpoint.tasks[0] == tc


@pytest.mark.parametrize(
    ("tc", "field"),
    [
        (replace(_with_handles(), alignment_s=-1.0), "alignment_s"),
        (replace(_with_handles(), start_delay_s=1e9), "start_delay_s"),
        (replace(_with_handles(), inflight_bytes=-5), "inflight_bytes"),
        (_with_channel_state(_seg("s3://b/job/x", 0, 1, log=CS)), "channel state"),
    ],
)
def test_a_refusal_names_the_field(tc: TaskCheckpoint, field: str) -> None:
    s = _state()
    _refused(feed(s, _ack(0, _triggered(s), tc)), ident(0, 0), field)


def test_channel_state_of_any_sqns_and_key_groups_of_the_job_is_accepted() -> None:
    s = _state(num_tasks=2)
    cid = _triggered(s)
    first = replace(
        _tc(0, 0, 2),
        channel_state=(
            # input channel state, then output channel state bound for task 1's key
            # groups (4..7), in the object of its state changes; a second handle of the
            # log that does not continue the first
            ChangelogHandle(CS, (5, 7), (_seg(P, 5, 6, log=CS), _seg(P, 6, 7, kgs=(6,), log=CS))),
            ChangelogHandle(CS, (9, 10), (_seg(f"{CL}cs/a.dstl", 9, 10, kgs=(0, 7), log=CS),)),
        ),
        unaligned=True,
        alignment_s=0.25,
        start_delay_s=0.01,
        inflight_bytes=30,
    )
    assert feed(s, _ack(0, cid, first)) == []
    (persist,) = feed(s, _ack(1, cid, _tc(1)))
    assert isinstance(persist, PersistCheckpoint) and persist.checkpoint.tasks[0] == first
    feed(s, CheckpointWritten(1.1, cid))
    # the next checkpoint's channel state starts anywhere: it continues nothing
    cid = _triggered(s, 2.1)
    second = replace(
        _tc(0, 0, 3), channel_state=(ChangelogHandle(CS, (0, 1), (_seg(P, 0, 1, log=CS),)),)
    )
    assert feed(s, _ack(0, cid, second)) == []
    assert s.rejections == {}


def test_channel_state_sqns_do_not_let_a_snapshot_run_ahead_of_the_state() -> None:
    s = _state(num_tasks=1)
    cid = _triggered(s)
    tc = replace(
        _tc(0, 0, 5), channel_state=(ChangelogHandle(CS, (0, 50), (_seg(P, 0, 50, log=CS),)),)
    )
    feed(s, _ack(0, cid, tc), CheckpointWritten(1.1, cid))
    epoch = _epoch_started(s)
    # state acknowledged up to SQN 5: a snapshot at 20 waits, whatever the channel
    # state's SQNs (they are not state SQNs: truncating there would lose changes)
    ahead = MaterializedRef(f"{MAT}s.snap", 20, 10)
    assert feed(s, _msg(0, protocol.Report(0, 0, epoch, ahead))) == []
    assert s.materializations_completed == 0
    cid = _triggered(s, 11.0)
    assert of_type(feed(s, _ack(0, cid, _tc(0, 0, 20))), MaterializationApplied)


def test_never_triggered_checkpoints_and_second_acks_are_refused() -> None:
    s = _state()
    cid = _triggered(s)
    _refused(feed(s, _ack(0, cid + 5, _tc(0))), ident(0, 0), "never triggered")
    assert feed(s, _ack(0, cid, _tc(0))) == []
    _refused(feed(s, _ack(0, cid, _tc(0, 0, 3))), ident(0, 0), "already acknowledged")
    assert s.in_flight() and s.acks_of(s.in_flight()[-1])[0] == _tc(0)


def test_sqns_never_move_back_in_an_attempt_nor_from_the_restored_checkpoint() -> None:
    s = _state()
    cid = _triggered(s)
    feed(s, _ack(0, cid, _tc(0, 2, 6)), _ack(1, cid, _tc(1, 0, 3)), CheckpointWritten(1.1, cid))
    cid = _triggered(s, 2.1)
    _refused(feed(s, _ack(0, cid, _tc(0, 2, 5))), ident(0, 0), "moves back")
    _refused(feed(s, _ack(0, cid, _tc(0, 1, 7))), ident(0, 0), "moves back")
    assert feed(s, _ack(0, cid, _tc(0, 3, 7))) == []  # truncated and grown: fine
    # A new attempt restored from checkpoint 1: its logs do not move back from there.
    feed(s, AttemptStarted(3.0, 1, 2))
    for t in (0, 1):
        feed(s, MessageFromTask(3.0, ident(t, 1), protocol.Hello(t, 1)))
    cid = _triggered(s, 4.0)
    back = replace(_tc(1, 0, 2), attempt=1)
    (reply,) = feed(s, MessageFromTask(4.0, ident(1, 1), protocol.Ack(1, 1, cid, back)))
    assert isinstance(reply, Reply) and "moves back" in str(reply.message)
    same = replace(_tc(1, 0, 3), attempt=1)
    assert feed(s, MessageFromTask(4.0, ident(1, 1), protocol.Ack(1, 1, cid, same))) == []


# -- deletion ----------------------------------------------------------------------------


def test_only_registry_released_paths_under_the_prefixes_are_deleted() -> None:
    outside = completed(1, {0: ["/etc/passwd", f"{CL}a.dstl"]})
    s = CoordinatorState(CFG, [outside, completed(2, {0: [f"{CL}b.dstl"]})], validate=True)
    out = feed(s, Started(0.0))
    assert of_type(out, DeleteObjects) == [DeleteObjects((f"{CL}a.dstl",), frozenset({"log-0"}))]
    assert s.deletions_refused == 1
    # Refused and aborted acknowledgements never turn into deletions.
    feed(s, AttemptStarted(0.0, 0, 1), _msg(0, protocol.Hello(0, 0)))
    cid = _triggered(s)
    bad = _with_handles(ChangelogHandle("log-0", (0, 1), (_seg("/etc/passwd", 0, 1),)))
    out = feed(s, _ack(0, cid, bad), Tick(7.0), Tick(9.0))
    assert not of_type(out, DeleteObjects) and s.checkpoints_aborted == 1


def test_objects_of_channel_state_are_released_with_the_channel_state_logs() -> None:
    """An object holding only in-flight records is the job's like any: released once no
    retained checkpoint references it, named with the channel-state log among the job's
    logs (so the object of a shared node holding it may be deleted), never one outside
    the prefixes."""
    cs = ChangelogHandle(
        CS, (0, 2), (_seg(f"{CL}cs.dstl", 0, 1, log=CS), _seg("/etc/x", 1, 2, log=CS))
    )
    first = completed(1, {0: [f"{CL}a.dstl"]})
    first = replace(first, tasks={0: replace(first.tasks[0], channel_state=(cs,))})
    s = CoordinatorState(CFG, [first, completed(2, {0: [f"{CL}a.dstl"]})], validate=True)
    out = feed(s, Started(0.0))
    logs = frozenset({"log-0", CS})
    assert of_type(out, DeleteObjects) == [DeleteObjects((f"{CL}cs.dstl",), logs)]
    assert s.deletions_refused == 1  # /etc/x
    assert s.registry.counts() == {f"{CL}a.dstl": 1}


# -- paths and metrics -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("ab./_-?#%\\:=+ \x00"), max_size=14))
def test_an_accepted_path_is_its_own_canonical_form_under_the_prefix(rest: str) -> None:
    store = ObjectStore("/tmp/dstl-trust-base")  # no I/O: only URLs are built
    prefixes = job_object_prefixes(store)
    path = prefixes[0] + rest
    if path_problem(path, prefixes) is None:
        assert normalize(store, path) == path and "/.." not in path
        assert path.startswith(prefixes[0]) and len(path) > len(prefixes[0])


def test_job_prefixes_are_canonical_and_refuse_bad_extras(tmp_path: Path) -> None:
    store = ObjectStore(f"file://{tmp_path}/")
    base = str(tmp_path)
    assert job_object_prefixes(store, ["s3://other/x"]) == (
        f"{base}/changelog/",
        f"{base}/materialized/",
        "s3://other/x/",
    )
    assert path_problem(store.new_object_path(), job_object_prefixes(store)) is None
    assert path_problem(store.new_snapshot_path(), job_object_prefixes(store)) is None
    with pytest.raises(ValueError, match="not canonical"):
        job_object_prefixes(store, ["s3://b/x/../y"])
    with pytest.raises(ValueError, match="must end"):
        CoordinatorConfig(object_prefixes=("/x",))


def test_refusals_reach_the_metric_by_kind() -> None:
    m = CoordinatorMetrics(None)
    s = _state()
    feed(s, _msg(0, protocol.Hello(0, 0)), _msg(0, protocol.Materialize(1), EVIL))
    m.refusals(s.rejections)
    m.refusals(s.rejections)  # only what is new counts
    got = {
        smp.labels["kind"]: smp.value
        for metric in m.registry.collect()
        if metric.name == "dstl_messages_refused"
        for smp in metric.samples
        if smp.name.endswith("_total")
    }
    assert got == {"hello": 1.0, "type": 1.0}
