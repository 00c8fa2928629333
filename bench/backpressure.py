"""The back-pressure benchmark (``dstl bench backpressure``): aligned against unaligned
checkpoints (FLIP-76) in a keyed job slowed on one task, figures from one run.

The job, through the public API (``StreamingJob``, Parquet ``FileSource``, a keyed
function counting per key in a value state): ``parallelism`` tasks on a local Spark
session, the source unthrottled, checkpoints every ``checkpoint_interval`` seconds,
the tasks' changelog and in-flight records through one aggregator node into objects
on the local filesystem. Its keyed function sleeps on task 0 only, on average
``sleep_ms`` per record (FLIP-76's "sleepy map": the time is owed per record and
slept once a millisecond is owed, oversleeping paid back), so that task back-pressures
every reader. After a warm-up run (``warmup_seconds``, not measured: Spark's Python
workers start), each mode runs ``seconds`` at each sleep, ``repeats`` times in the
order A B B A (the runs of a mode and sleep pooled, so that a shared machine's drift
weighs on both modes alike); each run
ends with a graceful stop (its final checkpoint is always aligned and is left out of
the durations: it measures the stop, not the job under back-pressure).

Per run: checkpoints completed and aborted (``checkpoint_timeout``, 10 s, passed);
the duration of the completed ones (trigger to metadata written) p50, p99 and max;
the longest alignment and start delay of each checkpoint at any task (p99);
in-flight bytes persisted per checkpoint (mean, p99); records per second
(from the first completed checkpoint to the first holding every record read);
objects per checkpoint (distinct changelog objects the checkpoints seen reference,
state changes and channel state, per checkpoint seen).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dstltree.bench.materialization import write_updates
from dstltree.sparkplug import FileSource, KeyedProcessFunction, StreamingJob
from dstltree.stats import percentile

__all__ = ["BackpressureSettings", "SleepyCount", "markdown_section", "run_backpressure"]

TOPOLOGY = """\
# dstl bench backpressure: one aggregator node for every task
base_path: {base}
target_object_bytes: 4MiB
persist_delay: 0.05
nodes:
  - {{id: root, bind: auto}}
"""


class SleepyCount(KeyedProcessFunction):
    """Counts records per key (value state); on task ``hot_task`` it sleeps on average
    ``sleep_ms`` milliseconds per record (owed per record, slept a millisecond or more
    at a time, what ``time.sleep`` oversleeps paid back by the next records)."""

    def __init__(self, sleep_ms: float, hot_task: int = 0) -> None:
        self.sleep_s = sleep_ms / 1000.0
        self.hot_task = hot_task

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("n")
        self.hot = ctx.task == self.hot_task and self.sleep_s > 0
        self.owed = 0.0

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        self.count.set((self.count.get() or 0) + 1)
        if self.hot:
            self.owed += self.sleep_s
            if self.owed >= 0.001:
                t0 = time.perf_counter()
                time.sleep(self.owed)
                self.owed -= time.perf_counter() - t0


@dataclass(frozen=True)
class BackpressureSettings:
    """Sleeps (ms per record on the slow task), modes, seconds per run, tasks, the
    checkpoint interval (s), records of the input and its keys, the seed."""

    sleeps_ms: tuple[float, ...] = (0.0, 0.01, 0.1)
    modes: tuple[str, ...] = ("aligned", "unaligned")
    seconds: float = 20.0
    parallelism: int = 4
    checkpoint_interval: float = 0.3
    records: int = 3_000_000
    keys: int = 10_000
    seed: int = 76
    warmup_seconds: float = 5.0
    repeats: int = 2


@dataclass
class RunFigures:
    """One run's figures (module docstring); seconds and bytes."""

    mode: str
    sleep_ms: float
    checkpoints: int
    aborted: int
    duration_p50_s: float
    duration_p99_s: float
    duration_max_s: float
    alignment_p99_s: float
    start_delay_p99_s: float
    inflight_bytes_mean: float
    inflight_bytes_p99: float
    unaligned_checkpoints: int
    records_per_second: float
    objects_per_checkpoint: float
    records: int
    durations_s: list[float] = field(default_factory=list)


def run_backpressure(
    spark: Any,
    work: Path,
    settings: BackpressureSettings,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every (mode, sleep) run of ``settings`` under ``work``; returns
    ``{"settings", "runs": [RunFigures as dicts], "targets": {...}}`` (see
    :func:`targets`). Raises JobFailedError if a run fails."""
    data = work / "in"
    write_updates(data, settings.keys, settings.records, settings.seed, files=8)
    (data / "_SUCCESS").touch()
    if settings.warmup_seconds > 0:  # Spark's Python workers and the JIT, not measured
        if progress is not None:
            progress(f"warm-up: {settings.warmup_seconds:g} s, not measured")
        _run(spark, work, settings, settings.modes[0], 0.0, settings.warmup_seconds)
        shutil.rmtree(work / "run", ignore_errors=True)
    results: dict[tuple[str, float], list[Any]] = {}
    for sleep_ms in settings.sleeps_ms:
        for mode in _order(settings):
            if progress is not None:
                progress(f"{mode} checkpoints, {sleep_ms:g} ms per record on task 0")
            results.setdefault((mode, sleep_ms), []).append(
                _run(spark, work, settings, mode, sleep_ms)
            )
            shutil.rmtree(work / "run", ignore_errors=True)
    runs = [figures(rs, mode, sleep_ms) for (mode, sleep_ms), rs in results.items()]
    doc: dict[str, Any] = {"settings": asdict(settings), "runs": [asdict(r) for r in runs]}
    doc["targets"] = targets(runs, settings)
    return doc


def _order(settings: BackpressureSettings) -> list[str]:
    """The modes in the order they run at one sleep: ``repeats`` times, every other
    time reversed (A B B A ...), so that drift of a shared machine weighs on both."""
    out: list[str] = []
    for n in range(settings.repeats):
        out += list(settings.modes if n % 2 == 0 else reversed(settings.modes))
    return out


def _run(
    spark: Any,
    work: Path,
    settings: BackpressureSettings,
    mode: str,
    sleep_ms: float,
    seconds: float | None = None,
) -> Any:
    run = work / "run"
    run.mkdir(parents=True)
    topology = run / "topology.yaml"
    topology.write_text(TOPOLOGY.format(base=run / "dfs"))
    job = StreamingJob(
        spark,
        name=f"{mode}-{sleep_ms:g}",
        checkpoint_dir=str(run / "dfs"),
        topology=str(topology),
        parallelism=settings.parallelism,
        checkpoint_interval=settings.checkpoint_interval,
        checkpointing=mode,
    )
    job.source(FileSource(str(work / "in"), format="parquet")).key_by("key").process(
        SleepyCount(sleep_ms)
    )
    return job.run(until=settings.seconds if seconds is None else seconds)


def figures(results: list[Any], mode: str, sleep_ms: float) -> RunFigures:
    """The figures of the runs of one mode and sleep from their JobResults, pooled:
    checkpoints of all of them (each run's final checkpoint left out), records per
    second and objects per checkpoint averaged over the runs."""
    durations: list[float] = []
    aligns: list[tuple[float, float, int, bool]] = []
    rates, objects = [], []
    for result in results:
        stats, observed = result.run.stats, result.run.observed
        d, a = list(stats.checkpoint_durations_s), list(stats.checkpoint_alignments)
        if result.finished and d:  # the graceful stop's final, aligned checkpoint
            d, a = d[:-1], a[:-1]
        durations += d
        aligns += a
        rates.append(_rate(observed.samples))
        objects.append(len(observed.objects) / max(1, len(observed.checkpoint_ids)))
    inflight = [float(a[2]) for a in aligns]
    return RunFigures(
        mode=mode,
        sleep_ms=sleep_ms,
        checkpoints=len(durations),
        aborted=sum(r.checkpoints_aborted for r in results),
        duration_p50_s=_q(durations, 50),
        duration_p99_s=_q(durations, 99),
        duration_max_s=round(max(durations, default=0.0), 3),
        alignment_p99_s=_q([a[0] for a in aligns], 99),
        start_delay_p99_s=_q([a[1] for a in aligns], 99),
        inflight_bytes_mean=round(sum(inflight) / len(inflight), 1) if inflight else 0.0,
        inflight_bytes_p99=round(percentile(inflight, 99), 1) if inflight else 0.0,
        unaligned_checkpoints=sum(1 for a in aligns if a[3]),
        records_per_second=round(sum(rates) / len(rates), 1),
        objects_per_checkpoint=round(sum(objects) / len(objects), 2),
        records=sum(r.records for r in results),
        durations_s=[round(d, 4) for d in durations],
    )


def _rate(samples: list[tuple[float, int]]) -> float:
    """Records per second from the first checkpoint seen to the first that holds every
    record of the run (a run that read all its input idles after it)."""
    if len(samples) < 2:
        return 0.0
    last = samples[-1][1]
    end = next(i for i, (_, n) in enumerate(samples) if n == last)
    t0, n0 = samples[0]
    t1, n1 = samples[max(end, 1)]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def _q(values: list[float], q: float) -> float:
    return round(percentile(values, q), 3) if values else 0.0


def targets(runs: list[RunFigures], settings: BackpressureSettings) -> dict[str, Any]:
    """The targets of unaligned checkpoints from ``runs``: unaligned p99 at the largest
    sleep at most 2x its p99 at no sleep and at most a third of aligned p99 at the
    largest sleep; unaligned
    records/s at no sleep at least 0.9x aligned; objects per checkpoint of unaligned
    not above aligned at the largest sleep (in-flight bytes in the same objects).
    Empty when a run is missing."""
    by = {(r.mode, r.sleep_ms): r for r in runs}
    hi, lo = max(settings.sleeps_ms), min(settings.sleeps_ms)
    need = [(m, s) for m in ("aligned", "unaligned") for s in (hi, lo)]
    if any(k not in by for k in need):
        return {}
    u_hi, u_lo = by["unaligned", hi], by["unaligned", lo]
    a_hi, a_lo = by["aligned", hi], by["aligned", lo]
    p99_vs_idle = u_hi.duration_p99_s / max(u_lo.duration_p99_s, 1e-9)
    p99_vs_aligned = u_hi.duration_p99_s / max(a_hi.duration_p99_s, 1e-9)
    rate = u_lo.records_per_second / max(a_lo.records_per_second, 1e-9)
    objects = u_hi.objects_per_checkpoint / max(a_hi.objects_per_checkpoint, 1e-9)
    return {
        "unaligned_p99_vs_its_idle_p99": round(p99_vs_idle, 2),
        "unaligned_p99_vs_its_idle_p99_ok": p99_vs_idle <= 2.0,
        "unaligned_p99_vs_aligned_p99": round(p99_vs_aligned, 3),
        "unaligned_p99_vs_aligned_p99_ok": p99_vs_aligned <= 1 / 3,
        "unaligned_rate_vs_aligned_rate_idle": round(rate, 3),
        "unaligned_rate_vs_aligned_rate_idle_ok": rate >= 0.9,
        "unaligned_objects_vs_aligned_objects": round(objects, 2),
        "unaligned_objects_vs_aligned_objects_ok": objects <= 1.0 + 1e-9,
    }


HEADERS = [
    "mode",
    "sleep ms/rec",
    "checkpoints (aborted)",
    "duration p50 / p99 / max s",
    "alignment p99 s",
    "start delay p99 s",
    "in-flight B/cp mean / p99",
    "records/s",
    "objects/cp",
]


def markdown_section(doc: dict[str, Any], meta: dict[str, str]) -> str:
    """The "Back-pressure: aligned and unaligned checkpoints" section of BENCHMARKS.md
    for ``doc`` (run_backpressure's figures) and ``meta`` (command, commit, date)."""
    from dstltree.bench.hotpath import markdown_table

    s, t = doc["settings"], doc["targets"]
    rows = [
        [
            r["mode"],
            f"{r['sleep_ms']:g}",
            f"{r['checkpoints']} ({r['aborted']})",
            f"{r['duration_p50_s']} / {r['duration_p99_s']} / {r['duration_max_s']}",
            str(r["alignment_p99_s"]),
            str(r["start_delay_p99_s"]),
            f"{r['inflight_bytes_mean']:,.0f} / {r['inflight_bytes_p99']:,.0f}",
            f"{r['records_per_second']:,.0f}",
            str(r["objects_per_checkpoint"]),
        ]
        for r in doc["runs"]
    ]

    def ok(key: str) -> str:
        return "met" if t.get(f"{key}_ok") else "NOT met"

    return "\n".join(
        [
            f"## {SECTION}",
            "",
            f"Command: `{meta['command']}`, commit {meta['commit']}, {meta['date']}.",
            "",
            f"{s['parallelism']} tasks on a local Spark session, source unthrottled, "
            f"checkpoints every {s['checkpoint_interval']} s, {s['seconds']:g} s per run, "
            "one aggregator node, local filesystem; the keyed function sleeps on task 0 "
            "only (a sleepy task, FLIP-76). The final checkpoint of each run (the stop, "
            "always aligned) is left out; aborted checkpoints (their 10 s timeout passed) "
            "are counted apart, not in the durations.",
            "",
            *markdown_table(HEADERS, rows),
            "",
            f"- unaligned p99 at the largest sleep / its p99 at none: "
            f"{t['unaligned_p99_vs_its_idle_p99']}x (target <= 2x): "
            f"{ok('unaligned_p99_vs_its_idle_p99')}",
            f"- unaligned p99 / aligned p99 at the largest sleep: "
            f"{t['unaligned_p99_vs_aligned_p99']}x (target <= 0.333x): "
            f"{ok('unaligned_p99_vs_aligned_p99')}",
            f"- records/s unaligned / aligned at no sleep: "
            f"{t['unaligned_rate_vs_aligned_rate_idle']}x (target >= 0.9x): "
            f"{ok('unaligned_rate_vs_aligned_rate_idle')}",
            f"- objects per checkpoint unaligned / aligned at the largest sleep: "
            f"{t['unaligned_objects_vs_aligned_objects']}x (target <= 1x: in-flight bytes "
            f"in the same objects): {ok('unaligned_objects_vs_aligned_objects')}",
            "",
        ]
    )


SECTION = "Back-pressure: aligned and unaligned checkpoints (FLIP-76)"
