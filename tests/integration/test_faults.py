"""The fault-injecting filesystem: spec parsing, determinism, error kinds, stalls."""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from botocore.exceptions import ClientError
from fsspec.implementations.local import LocalFileSystem

from dstltree.storage.errors import RetryableStorageError, StorageError
from dstltree.storage.faults import FAULT_KINDS, FaultSpec, FaultyFileSystem
from dstltree.storage.store import NO_RETRY, ObjectExistsError, ObjectStore, RetryPolicy
from tests.support.s3_server import S3Target

pytestmark = pytest.mark.timeout(60)


class _Clock:
    """Records waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def _memory() -> fsspec.AbstractFileSystem:
    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    fs.store = {}
    fs.pseudo_dirs = [""]
    return fs


def _store(spec: str | FaultSpec, retry: RetryPolicy = NO_RETRY) -> tuple[ObjectStore, Any]:
    clock = _Clock()
    fs = FaultyFileSystem(_memory(), spec, sleep=clock)
    return ObjectStore(f"memory://f-{uuid.uuid4().hex[:8]}", fs=fs, retry=retry), clock


# -- spec --------------------------------------------------------------------------------
def test_parse_model_only_and_full() -> None:
    s = FaultSpec.parse("flip158-s3")
    assert s.model == "flip158-s3" and s.throttle == 0 and s.scale == 1
    full = FaultSpec.parse(
        "flip158-s3-hedged, throttle=0.05,error500=0.01,timeout=0.01,reset=0.01,"
        "stall=0.01,stall_s=5,scale=0.1,seed=7,ops=put+get"
    )
    assert (full.throttle, full.error500, full.timeout, full.reset, full.stall) == (
        0.05,
        0.01,
        0.01,
        0.01,
        0.01,
    )
    assert (full.stall_s, full.scale, full.seed, full.ops) == (5.0, 0.1, 7, ("put", "get"))
    assert FaultSpec.parse(str(full)) == full
    assert str(FaultSpec.parse("flip158-s3,scale=0.05,throttle=0.02")) == (
        "flip158-s3,throttle=0.02,scale=0.05"
    )
    model = full.latency_model()
    assert model is not None and model.max_s == pytest.approx(
        FaultSpec.parse("flip158-s3-hedged").latency_model().max_s * 0.1  # type: ignore[union-attr]
    )
    assert FaultSpec.parse("none,throttle=1").latency_model() is None
    assert FaultSpec.parse("local,scale=0").latency_model() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("flip158-s3,thrtle=0.1", "unknown or malformed key 'thrtle'"),
        ("flip158-s3,throttle", "unknown or malformed key 'throttle'"),
        ("flip158-s3,throttle=lots", "bad value for throttle"),
        ("flip158-s3,throttle=1.5", "throttle=1.5 must be in"),
        ("flip158-s3,throttle=0.6,stall=0.6", "sum to 1.2"),
        ("flip158-s3,scale=-1", "scale=-1"),
        ("flip158-s3,ops=put+write", "ops must be"),
        ("s4-fast", "unknown latency model 's4-fast'"),
        ("scale=0.1", "must start with a latency model"),
        ("", "must start with a latency model"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("+", r"\+")):
        FaultSpec.parse(text)


def test_parse_error_lists_known_keys() -> None:
    with pytest.raises(ValueError) as info:
        FaultSpec.parse("local,bogus=1")
    assert "--dfs-faults" in str(info.value)
    for key in ("throttle", "error500", "timeout", "reset", "stall", "stall_s", "scale"):
        assert key in str(info.value)


# -- determinism and rates ----------------------------------------------------------------
def _run(spec: str) -> list[tuple[str, str | None, float]]:
    store, _ = _store(spec)
    out = []
    for i in range(200):
        url = store.join(f"o{i}")
        with contextlib.suppress(RetryableStorageError):
            store.put(url, b"x" * (1000 * i))
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    for e in fs.events:
        out.append((e.op, e.fault, e.delay_s))
    return out


def test_same_seed_same_faults_and_latencies() -> None:
    spec = (
        "flip158-s3,throttle=0.1,error500=0.05,reset=0.05,timeout=0.05,stall=0.05,"
        "lost_reply=0.05,seed=42"
    )
    a, b = _run(spec), _run(spec)
    assert a == b
    assert {f for _, f, _ in a} == {None, *FAULT_KINDS}
    c = _run(spec.replace("seed=42", "seed=43"))
    assert c != a


def test_rates_are_roughly_honoured() -> None:
    store, _ = _store("none,throttle=0.3,seed=1")
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    for i in range(1000):
        with contextlib.suppress(RetryableStorageError):
            store.put(store.join(f"o{i}"), b"x")
    assert 240 <= fs.counts["throttle"] <= 360
    assert fs.counts["put"] == 1000


def test_latency_is_scaled_and_size_dependent() -> None:
    store, clock = _store("flip158-s3,scale=0.01,seed=3")
    store.put(store.join("small"), b"x")
    store.put(store.join("big"), b"x" * 20_000_000)
    small, big = clock.waits
    model = FaultSpec.parse("flip158-s3,scale=0.01").latency_model()
    assert model is not None
    assert 0 < small <= model.quantile(100, 1)
    # 20 MB more at the model's (scaled) bandwidth is the floor of the difference
    assert big >= model.quantile(0, 20_000_000)


# -- error kinds -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "cause_type"),
    [
        ("throttle", OSError),
        ("error500", OSError),
        ("timeout", TimeoutError),
        ("reset", ConnectionResetError),
    ],
)
def test_injected_errors_are_retryable(fault: str, cause_type: type[BaseException]) -> None:
    store, _ = _store("local")
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    fs.inject("put", fault)
    url = store.new_object_path()
    with pytest.raises(RetryableStorageError) as info:
        store.put(url, b"data")
    assert isinstance(info.value.__cause__, cause_type)
    if fault in ("throttle", "error500"):
        assert isinstance(info.value.__cause__.__cause__, ClientError)
        assert ("[SlowDown]" if fault == "throttle" else "[InternalError]") in str(info.value)
    assert not store.exists(url), "a failed write writes nothing"
    store.put(url, b"data")
    assert store.read(url) == b"data"


def test_store_retries_through_injected_throttling() -> None:
    store, _ = _store("none", RetryPolicy(max_attempts=3, initial_backoff=0.001))
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    fs.inject("put", "throttle", times=2)
    fs.inject("get", "reset")
    url = store.new_object_path()
    store.put(url, b"abc")
    assert store.read(url) == b"abc"
    assert store.stats.snapshot()["retries"] == {"put": 2, "read": 1}


def test_inject_validates() -> None:
    fs = FaultyFileSystem(_memory(), "local")
    with pytest.raises(ValueError, match="unknown op"):
        fs.inject("write", "stall")
    with pytest.raises(ValueError, match="unknown fault"):
        fs.inject("put", "fire")


def test_ops_filter_keeps_reads_clean() -> None:
    store, _ = _store("none,throttle=1,ops=put")
    with pytest.raises(RetryableStorageError):
        store.put(store.join("a"), b"x")
    assert store.list_objects() == []


# -- stalls --------------------------------------------------------------------------------------
def test_stall_waits_then_succeeds() -> None:
    store, clock = _store("none,stall_s=5,scale=0.5")
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    fs.inject("put", "stall")
    url = store.new_object_path()
    store.put(url, b"late")
    assert clock.waits == [2.5]
    assert store.read(url) == b"late"
    assert fs.counts["stall"] == 1


def test_release_ends_a_real_stall() -> None:
    fs = FaultyFileSystem(_memory(), "none,stall_s=120")
    store = ObjectStore("memory://stall", fs=fs)
    fs.inject("put", "stall")
    url = store.new_object_path()
    t = threading.Thread(target=store.put, args=(url, b"x"), daemon=True)
    t.start()
    fs.release()
    t.join(timeout=10)
    assert not t.is_alive()
    assert store.read(url) == b"x"


# -- wrapping real filesystems -----------------------------------------------------------------
def test_local_inner(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path), fs=FaultyFileSystem(fsspec.filesystem("file"), "local"))
    url = store.new_object_path()
    assert url.startswith(str(tmp_path)), "local paths stay plain under the wrapper"
    store.put(url, [b"a", b"b"])
    assert store.list_objects() == [url]
    assert [p.name for p in Path(url).parent.iterdir()] == [Path(url).name], "no temp left"
    # the chained ``faulty::`` URL form: tests/integration/test_fsspec_entry_point.py


def test_every_request_is_logged_by_kind_from_every_opener(tmp_path: Path) -> None:
    """Two openers of one ``faulty::`` URL (as two nodes) append to one request log,
    a failed try counting as a request."""
    log = tmp_path / "requests.log"
    opts = {"faulty": {"spec": "none", "request_log": str(log)}}
    base = f"faulty::file://{tmp_path / 'dfs'}"
    one, two = (ObjectStore(base, opts, retry=NO_RETRY) for _ in range(2))
    url = one.new_object_path()
    one.put(url, [b"ab"])
    assert two.read(url) == b"ab"
    two.fs.inject("put", "throttle")
    with pytest.raises(RetryableStorageError):
        two.put(two.new_object_path(), [b"c"])
    assert one.list_objects() == [url]
    kinds = [line.split("\t")[0] for line in log.read_text().splitlines()]
    assert kinds.count("put") == 2 and kinds.count("get") >= 1 and "list" in kinds, kinds
    assert set(kinds) <= {"put", "get", "head", "list", "delete"}, kinds
    assert all(line.split("\t")[1] for line in log.read_text().splitlines())


@pytest.mark.s3
def test_faults_over_s3(s3: S3Target) -> None:
    import s3fs

    inner = s3fs.S3FileSystem(**s3.storage_options)
    fs = FaultyFileSystem(inner, "local,scale=0.1")
    store = ObjectStore(f"{s3.base_url}/faulty", fs=fs, retry=RetryPolicy(3, 0.001, 0.01))
    fs.inject("put", "throttle")
    fs.inject("meta", "error500")
    url = store.new_object_path()
    assert url.startswith(f"{s3.base_url}/faulty/changelog/")
    store.put(url, b"payload")
    assert store.size(url) == 7
    assert ObjectStore(s3.base_url, s3.storage_options).read(url) == b"payload"
    assert store.stats.snapshot()["retries"] == {"put": 1, "stat": 1}


def test_a_conditional_create_through_the_wrapper_is_one_request_of_its_model(
    tmp_path: Path,
) -> None:
    """Exclusive creates (commit records) pay the model's latency and faults too."""
    waits: list[float] = []
    fs = FaultyFileSystem(LocalFileSystem(), "flip158-s3,error500=1.0,ops=put", sleep=waits.append)
    store = ObjectStore(str(tmp_path), fs=fs)
    with pytest.raises(StorageError):
        store.put(store.join("checkpoints", "c"), b"x", exclusive=True)
    assert not (tmp_path / "checkpoints" / "c").exists() and fs.counts["put"] >= 1
    ok = FaultyFileSystem(LocalFileSystem(), "flip158-s3,ops=put", sleep=waits.append)
    store = ObjectStore(str(tmp_path), fs=ok)
    before = len(waits)
    store.put(store.join("checkpoints", "c"), b"x", exclusive=True)
    assert len(waits) > before and min(waits[before:]) > 0  # the model's latency
    with pytest.raises(ObjectExistsError):
        store.put(store.join("checkpoints", "c"), b"y", exclusive=True)


# -- ambiguous answers: the request landed, its reply was lost ---------------------------------
def test_a_put_whose_reply_was_lost_lands_once_and_its_retry_succeeds() -> None:
    store, _ = _store("none", retry=RetryPolicy(max_attempts=3, initial_backoff=0.0))
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    fs.inject("put", "lost_reply")
    url = store.join("o1")
    store.put(url, b"payload")
    assert store.read(url) == b"payload"
    assert fs.counts["lost_reply"] == 1 and fs.counts["put"] == 2  # landed, then retried


def test_without_a_retry_a_lost_reply_is_a_retryable_error_though_the_object_is_there() -> None:
    store, _ = _store("none")
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    fs.inject("put", "lost_reply")
    url = store.join("o1")
    with pytest.raises(RetryableStorageError, match="landed"):
        store.put(url, b"payload")
    assert store.read(url) == b"payload"


def test_a_commit_record_whose_create_landed_with_its_reply_lost_commits_once() -> None:
    """The conditional create of a commit record lands, its reply is lost: the retry
    finds the record there, compares it with its own bytes and takes it as its write
    (coordinator/store.py); the checkpoint is committed, the driver not fenced."""
    from dstltree.coordinator.store import CheckpointStore
    from dstltree.coordinator.testing import completed

    store, _ = _store("none", retry=RetryPolicy(max_attempts=3, initial_backoff=0.0))
    fs = store.fs
    assert isinstance(fs, FaultyFileSystem)
    cps = CheckpointStore(store, owner="d0")
    cps.claim()
    fs.inject("put", "lost_reply")
    path = cps.add(completed(1, {0: ["a"]}))
    assert fs.counts["lost_reply"] == 1
    assert cps.fenced is None
    cps.verify_owner()
    assert store.exists(path)
    assert CheckpointStore(store).load_latest() == completed(1, {0: ["a"]})
    cps.add(completed(2, {0: ["b"]}))  # and goes on
    assert CheckpointStore(store).latest_id() == 2
