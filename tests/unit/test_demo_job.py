"""The demo's driver parts without Spark: the verdicts from dicts, the report figures
merged across runs, options, the progress hook, the runs with and without a rescale (the
job itself replaced by a fake), a failed producer stopping the job."""

from __future__ import annotations

import datetime
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dstltree.cli.commands.demo import passed
from dstltree.demo import job as job_module
from dstltree.demo.checks import BatchStats, SinkSummary, compare, mismatched, sort_keys
from dstltree.demo.job import (
    DemoOptions,
    RescaleStop,
    RunExistsError,
    _stop_when_set,
    check_new_run,
    clear,
    driver_progress,
    new_run_id,
    run_jobs,
)
from dstltree.demo.producer import FlightsProducer, ProducerError
from dstltree.demo.report import run_figures
from tests.support.waiting import wait_until

STATS = {"N1": [2, 3, 4, 100, 9, "JFK", "LAX"], None: [1, 0, 0, 50, 5, "EWR", "ORD"]}
ROUTES = {"N1": {"JFK-LAX": 2}, None: {"EWR-ORD": 1}}
BATCH = BatchStats(STATS, ROUTES, records=3)


def _restored(**changes: Any) -> dict[str, dict[Any, Any]]:
    stats = {k: list(v) for k, v in STATS.items()}
    stats.update(changes)
    return {"stats": stats, "routes": {k: dict(v) for k, v in ROUTES.items()}}


def test_everything_matches() -> None:
    sink = SinkSummary(rows=3, duplicate_rows=0, latest={k: list(v) for k, v in STATS.items()})
    v = compare(BATCH, sink, _restored())
    assert v == {
        "state_matches_batch": True,
        "sink_matches_batch": True,
        "sink_rows": 3,
        "sink_duplicate_rows": 0,
        "mismatched_keys": [],
        "keys": 2,
    }
    assert passed(v)


def test_mismatches_are_named() -> None:
    sink = SinkSummary(rows=3, duplicate_rows=0, latest={"N1": STATS["N1"]})  # None missing
    v = compare(BATCH, sink, _restored(N1=[2, 3, 4, 100, 9, "JFK", "SFO"]))
    assert not v["state_matches_batch"] and not v["sink_matches_batch"]
    assert v["mismatched_keys"] == [None, "N1"]
    assert not passed(v)
    assert not compare(BATCH, sink, {})["state_matches_batch"]  # no checkpoint


def test_duplicates_or_missing_rows_fail_the_sink() -> None:
    latest = {k: list(v) for k, v in STATS.items()}
    dup = compare(BATCH, SinkSummary(4, 1, latest), _restored())
    assert dup["state_matches_batch"] and not dup["sink_matches_batch"]
    assert dup["mismatched_keys"] == [] and dup["sink_duplicate_rows"] == 1
    assert not compare(BATCH, SinkSummary(2, 0, latest), _restored())["sink_matches_batch"]


def test_key_helpers() -> None:
    assert sort_keys(["b", None, "a"]) == [None, "a", "b"]
    assert mismatched({"a": (1, [2])}, {"a": [1, (2,)]}) == []  # tuples equal lists
    assert mismatched({"a": 1}, {"b": 1}) == ["a", "b"]


def _result(records: int, cps: list[int], objects: set[str], rescaled: int | None) -> Any:
    stats = SimpleNamespace(
        checkpoint_durations_s=(0.01, 0.02),
        checkpoint_phases_s=((0.001, 0.009), (0.002, 0.018)),
        checkpoint_alignments=((0.004, 0.001, 0, False), (0.05, 0.002, 3000, True)),
        checkpoint_intervals_s=(0.3,),
        completion_requests=(1, 1),
        metadata_bytes=(900, 1000),
        max_concurrent_checkpoints=2,
        checkpoints_in_flight_max=2,
        materializations=((0.5, 1000, 400),),
        materializations_completed=1,
        objects_deleted=2,
        deletes_refused=1,
        shared_objects_kept=5,
        orphans_deleted=3,
        tasks_without_node=0,
    )
    observed = SimpleNamespace(
        objects=objects,
        segments={(o, 0, 10) for o in objects},
        writers={f"w{records}"},
        checkpoint_ids=set(cps),
    )
    run = SimpleNamespace(stats=stats, observed=observed, nodes=7, metrics=None, latest=None)
    return SimpleNamespace(
        records=records,
        checkpoints_completed=len(cps),
        checkpoints_aborted=0,
        recoveries=1,
        source_files=5,
        rescaled_from=rescaled,
        run=run,
    )


def test_run_figures_merge_runs() -> None:
    first = _result(100, [1, 2], {"a", "b"}, None)
    second = _result(50, [3], {"b", "c"}, 4)
    f = run_figures([first, second], 2, "local[2]", {"a", "b", "c", "orphan"})
    assert f["records"] == 150 and f["checkpoints_completed"] == 3 and f["recoveries"] == 2
    assert f["objects_referenced"] == 3 and f["objects_written"] == 4
    assert f["changelog_bytes"] == 30 and f["writers"] == 2 and f["nodes"] == 7
    assert f["objects_per_checkpoint"] == 1.0
    assert f["checkpoint_duration_ms"] == {"p50": pytest.approx(15.0, abs=5), "p99": 20.0}
    assert f["tasks"] == 2 and f["rescaled_from"] == 4 and f["source_files"] == 5
    assert f["orphans_deleted_at_start"] == 3 and f["objects_deleted"] == 4
    assert f["deletes_refused"] == 2 and f["shared_objects_kept"] == 10
    assert f["checkpoint_sync_ms"]["p99"] == pytest.approx(2.0, abs=0.1)
    assert f["checkpoint_async_ms"]["p99"] == pytest.approx(18.0, abs=0.3)
    assert f["materialized_bytes_last"] == 1000 and f["materialization_written_bytes"] == 800
    assert f["materialization_reused_bytes"] == 1200
    assert f["checkpoint_interval_ms"] == {"p50": 300.0, "p99": 300.0}
    assert f["completion_requests_per_checkpoint"] == {"mean": 1.0, "max": 1}
    assert f["checkpoint_metadata_bytes"] == {"first": 900, "last": 1000, "max": 1000}
    assert f["max_concurrent_checkpoints"] == 2 and f["checkpoints_in_flight_max"] == 2
    assert f["checkpoint_alignment_ms"]["p99"] == pytest.approx(50.0, abs=1)
    assert f["checkpoint_start_delay_ms"]["p99"] == pytest.approx(2.0, abs=0.1)
    assert f["inflight_bytes"] == {"mean": 1500, "p99": pytest.approx(3000, abs=30)}
    assert f["checkpoints_unaligned"] == 2
    with pytest.raises(ValueError):
        run_figures([], 2, "local[2]", set())


def test_options_urls(tmp_path: Path) -> None:
    rel = DemoOptions(base_path="data/demo", run_id="r1")
    assert rel.url("sink") == os.path.abspath("data/demo") + "/r1/sink"
    assert DemoOptions(base_path="s3://b/p/", run_id="r1").url("landing") == "s3://b/p/r1/landing"
    faulty = DemoOptions(base_path=str(tmp_path), run_id="r1", dfs_faults="flip158-s3,scale=0.05")
    url, options = faulty.checkpoint_target()
    assert url == f"faulty::file://{tmp_path}/r1/checkpoints" and "faulty" in options
    with pytest.raises(ValueError):
        DemoOptions(base_path=str(tmp_path), dfs_faults="bogus=1").checkpoint_target()


def test_each_run_gets_its_own_prefix() -> None:
    assert new_run_id(datetime.datetime(2026, 1, 2, 3, 4, 5)) == "run-20260102-030405"
    opts = DemoOptions(base_path="s3://b/p")
    assert opts.run_id.startswith("run-") and opts.prefix() == f"s3://b/p/{opts.run_id}"
    assert not DemoOptions(base_path="s3://b/p").fresh  # off by default


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../x", "a b", "x" * 129])
def test_run_ids_are_one_path_segment(bad: str) -> None:
    with pytest.raises(ValueError, match="run id"):
        DemoOptions(base_path="data/demo", run_id=bad)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_fresh_removes_only_this_runs_prefix(tmp_path: Path) -> None:
    for rel in ("r1/sink/a", "r1/checkpoints/plane-stats/b", "r10/sink/c", "landing/d", "e"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    opts = DemoOptions(base_path=str(tmp_path), run_id="r1")
    with pytest.raises(RunExistsError, match="--fresh"):
        check_new_run(opts)  # files of an earlier r1 and no --fresh: refused, nothing deleted
    assert len(_files(tmp_path)) == 5
    check_new_run(DemoOptions(base_path=str(tmp_path), run_id="r1", fresh=True))
    assert _files(tmp_path) == ["e", "landing/d", "r10/sink/c"]
    check_new_run(DemoOptions(base_path=str(tmp_path), run_id="r2"))  # a new run id: fine
    assert clear(DemoOptions(base_path=str(tmp_path), run_id="nothing-here")) == 0


def test_driver_progress() -> None:
    calls: list[tuple[int, int, Any]] = []
    hook = driver_progress(lambda *a: calls.append(a), total=10, every_s=0.0)
    stats = object()
    hook(
        SimpleNamespace(
            observed=SimpleNamespace(records=4), coord=SimpleNamespace(statistics=lambda: stats)
        )
    )
    hook(SimpleNamespace())  # a driver without those attributes is skipped
    assert calls == [(4, 10, stats)]


def test_stop_when_set() -> None:
    event, stopped = threading.Event(), threading.Event()
    with _stop_when_set(event, stopped.set):
        event.set()
        wait_until(stopped.is_set, timeout=10)
    with _stop_when_set(None, stopped.set):
        pass


def _fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def run_job(spark: Any, opts: Any, landing: str, sink: str, until: Any, **kw: Any) -> Any:
        calls.append({"landing": landing, "sink": sink, "until": until, **kw})
        return SimpleNamespace(until=until)

    monkeypatch.setattr(job_module, "run_job", run_job)
    return calls


def test_runs_with_and_without_rescale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_runs(monkeypatch)
    producer = FlightsProducer(str(tmp_path / "landing"), limit_records=10)
    opts = DemoOptions(base_path=str(tmp_path), run_id="r")
    assert len(run_jobs(None, opts, producer, None)) == 1
    assert calls[0]["until"] == "end" and calls[0]["drill"] is True
    assert calls[0]["landing"] == producer.url and calls[0]["sink"] == f"{tmp_path}/r/sink"
    assert calls[0]["stop"] is producer.failed
    calls.clear()
    opts = DemoOptions(base_path=str(tmp_path), rescale_to=2, rescale_after_s=5.0)
    assert len(run_jobs(None, opts, producer, lambda *a: None)) == 2
    assert [c["until"] for c in calls] == [None, "end"]  # the first: RescaleStop
    assert isinstance(calls[0]["stop"], RescaleStop) and calls[1]["stop"] is producer.failed
    assert calls[0]["drill"] is True and "drill" not in calls[1]
    assert calls[1]["parallelism"] == 2 and callable(calls[1]["progress"])


class _Stats:
    def __init__(self, completed: int) -> None:
        self.checkpoints_completed = completed


class _Driver:
    def __init__(self) -> None:
        self.completed = 0
        self.coord = self

    def statistics(self) -> _Stats:
        return _Stats(self.completed)


def test_the_rescale_stop_counts_from_the_first_checkpoint() -> None:
    now = [100.0]
    failed = threading.Event()
    stop, driver = RescaleStop(5.0, failed, clock=lambda: now[0]), _Driver()
    stop.hook(object())  # no statistics yet: skipped
    stop.hook(driver)
    now[0] = 160.0  # a minute of Spark start-up: not counted
    stop.hook(driver)
    assert not stop.is_set() and stop.first_checkpoint_at is None
    driver.completed = 1
    stop.hook(driver)
    assert stop.first_checkpoint_at == 160.0
    now[0] = 164.9
    driver.completed = 9
    stop.hook(driver)
    assert not stop.is_set() and stop.first_checkpoint_at == 160.0
    now[0] = 165.0
    assert stop.is_set()
    early = RescaleStop(5.0, failed)
    failed.set()  # the producer failed: stop at once
    assert early.is_set()


def test_a_failed_producer_is_raised_after_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_runs(monkeypatch)
    producer = FlightsProducer(str(tmp_path / "landing"), limit_records=10)
    producer.error = OSError("disk full")
    producer.failed.set()
    with pytest.raises(ProducerError, match="disk full"):
        run_jobs(None, DemoOptions(base_path=str(tmp_path)), producer, None)


def test_cli_refuses_a_used_run_id_without_fresh(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dstltree.cli.app import app

    (tmp_path / "r1" / "sink").mkdir(parents=True)
    (tmp_path / "r1" / "sink" / "part-0").write_text("an earlier run's output")
    args = ["demo", "--base-path", str(tmp_path), "--report", str(tmp_path / "r.json")]
    result = CliRunner().invoke(app, [*args, "--run-id", "r1"])
    assert result.exit_code == 2, result.output
    assert "--fresh" in result.output and (tmp_path / "r1" / "sink" / "part-0").exists()
    assert CliRunner().invoke(app, [*args, "--run-id", "../x"]).exit_code == 2  # BadParameter


def test_cli_refuses_an_unknown_compression(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dstltree.cli.app import app

    args = ["demo", "--base-path", str(tmp_path), "--compression", "lz4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--compression" in result.output, result.output
    assert list(tmp_path.iterdir()) == []  # nothing started


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--engine", "structured-streaming", "--checkpoint-location", "s3"], "files, dstl"),
        (["--engine", "structured-streaming", "--dfs-faults", "flip158-s3"], "dstl"),
        (["--checkpoint-location", "dstl"], "structured-streaming"),
    ],
)
def test_cli_checkpoint_location_choices(tmp_path: Path, extra: list[str], named: str) -> None:
    from typer.testing import CliRunner

    from dstltree.cli.app import app

    result = CliRunner().invoke(app, ["demo", "--base-path", str(tmp_path), *extra])
    assert result.exit_code == 2 and named in result.output, result.output
    assert list(tmp_path.iterdir()) == []  # nothing started
