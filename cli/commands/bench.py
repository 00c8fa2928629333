"""``dstl bench``: the same synthetic changelog workload through the designs ``task``,
``executor``, ``tree`` and ``tree-noplan`` on the same machine and storage,
optionally on the fault-injecting wrapper or a local S3 server."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dstltree.cli.commands._common import (
    TOPOLOGY_HELP,
    load_tree,
    parse_size,
    target_bytes,
    topology_file,
)

if TYPE_CHECKING:
    from dstltree.bench.designs import BenchSettings
    from dstltree.bench.run import BenchResult
    from dstltree.bench.workload import Distribution
    from dstltree.storage.faults import FaultSpec

__all__ = ["register"]

DEFAULT_TOPOLOGY = Path("bench")  # a shipped topology (topology/catalog.py)


def register(app: typer.Typer) -> None:
    """``dstl bench`` (the designs, as before) with the sub-commands ``hotpath``,
    ``chaos``, ``materialization``, ``commit-floor``, ``structured-streaming`` and
    ``backpressure``."""
    from dstltree.cli.commands._backpressure import backpressure
    from dstltree.cli.commands._chaos import chaos
    from dstltree.cli.commands._commit_floor import commit_floor
    from dstltree.cli.commands._fencing_race import fencing_race
    from dstltree.cli.commands._hotpath import hotpath
    from dstltree.cli.commands._materialization import materialization
    from dstltree.cli.commands._soak import soak
    from dstltree.cli.commands._structured_streaming import structured_streaming

    group = typer.Typer(invoke_without_command=True, no_args_is_help=False)
    group.callback()(bench)
    group.command("hotpath")(hotpath)
    group.command("chaos")(chaos)
    group.command("materialization")(materialization)
    group.command("commit-floor")(commit_floor)
    group.command("structured-streaming")(structured_streaming)
    group.command("backpressure")(backpressure)
    group.command("soak")(soak)
    group.command("fencing-race")(fencing_race)
    app.add_typer(group, name="bench")


def _hedge(text: str) -> tuple[int, float]:
    """(attempts, upload timeout in s) from ``--hedge-timeout``: seconds or ``off``."""
    if text.strip().lower() in ("off", "none"):
        return 1, 1.0
    try:
        timeout = float(text)
    except ValueError:
        raise typer.BadParameter(f"--hedge-timeout: seconds or 'off', got {text!r}") from None
    if not timeout > 0:
        raise typer.BadParameter("--hedge-timeout: must be > 0 seconds (or 'off')")
    return 3, timeout


def bench(
    ctx: typer.Context,
    topology: Annotated[
        Path,
        typer.Option(
            help=f"{TOPOLOGY_HELP} Executor i uses node i in breadth-first order.",
            callback=topology_file,
        ),
    ] = DEFAULT_TOPOLOGY,
    executors: Annotated[
        int | None,
        typer.Option(
            min=1, help="Executors (default: every node; needed for a branching topology)."
        ),
    ] = None,
    writers: Annotated[int, typer.Option(min=1, help="Writers (W), spread evenly.")] = 28,
    bytes_per_checkpoint: Annotated[
        str, typer.Option(help="Bytes per writer per checkpoint (B), e.g. 256KiB.")
    ] = "256KiB",
    distribution: Annotated[
        str,
        typer.Option(
            help="constant | lognormal[:SIGMA] | skewed[:FRACTION:FACTOR] (hot executors)."
        ),
    ] = "constant",
    checkpoints: Annotated[int, typer.Option(min=1, help="Checkpoints (K).")] = 24,
    checkpoint_interval: Annotated[
        float,
        typer.Option(
            min=0.0, help="Seconds between checkpoint triggers (one checkpoint at a time)."
        ),
    ] = 0.1,
    designs: Annotated[
        str, typer.Option(help="Comma-separated designs.")
    ] = "task,executor,tree,tree-noplan",
    target_object_bytes: Annotated[
        str | None,
        typer.Option(help="Target object size of writer nodes (default: the topology's)."),
    ] = None,
    plan_window: Annotated[
        int | None,
        typer.Option(min=1, help="Checkpoints per plan window (default: the topology's)."),
    ] = None,
    base_path: Annotated[
        str | None,
        typer.Option(
            help="fsspec URL under which each design gets a fresh directory (default: a "
            "temporary local directory, deleted afterwards)."
        ),
    ] = None,
    storage_options: Annotated[str, typer.Option(help="fsspec storage options as JSON.")] = "{}",
    dfs_faults: Annotated[
        str | None,
        typer.Option(
            help="Fault injection on every DFS request: MODEL[,k=v...], e.g. "
            "flip158-s3,scale=0.1 (see client.faults)."
        ),
    ] = None,
    hedge_timeout: Annotated[
        str,
        typer.Option(help="Seconds before a hedged upload attempt starts (3 attempts), or 'off'."),
    ] = "1.0",
    s3_local: Annotated[
        bool,
        typer.Option("--s3-local", help="Start a local S3 server (moto) and write to s3://bench/."),
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the workload and the fault injection.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (one object per design).")
    ] = False,
) -> None:
    """Compare the designs on a synthetic workload.

    Runs one synthetic workload through the designs and compares objects and DFS
    requests per checkpoint, mean object size, persist latency, relayed bytes,
    throughput and CPU (docs/design.md, "Where numbers come from").

    The commands below run other suites instead (dstl bench hotpath: the hot-path
    suite)."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console

    from dstltree.bench.designs import BenchSettings
    from dstltree.bench.report import to_json
    from dstltree.bench.run import run_bench
    from dstltree.bench.storage import BenchStorage, start_local_s3
    from dstltree.bench.workload import Workload

    console = Console(stderr=True)
    chosen = _chosen_designs(designs)
    topo, tree = load_tree(topology, executors)
    dist, faults = _workload_faults(distribution, dfs_faults, seed)
    n_exec = _executor_count(executors, len(tree), writers)
    opts = _storage_options(storage_options)
    attempts, timeout = _hedge(hedge_timeout)
    workload = Workload(writers, n_exec, parse_size(bytes_per_checkpoint), checkpoints, dist, seed)
    settings = BenchSettings(
        workload=workload,
        topology=topo.model_dump(
            mode="json", exclude={"nodes", "branching", "hosts", "node_port", "bind_all"}
        ),
        tree=tree,
        target_object_bytes=target_bytes(target_object_bytes, topo),
        plan_window=plan_window or topo.plan_window,
        checkpoint_interval=checkpoint_interval,
        attempts=attempts,
        upload_timeout=timeout,
    )
    s3 = start_local_s3() if s3_local else None
    storage = BenchStorage(base_path, opts, faults, s3)
    title = _title(settings, bytes_per_checkpoint, storage.describe)
    result = run_bench(
        settings,
        chosen,
        storage,
        progress=None if as_json else lambda d: console.print(f"running {d}..."),
    )
    if as_json:
        typer.echo(to_json(result.metrics))
        return
    _print_results(result, title, settings.target_object_bytes)


def _chosen_designs(text: str) -> list[str]:
    """The designs of ``--designs`` (comma list, blanks skipped), in the given order."""
    from dstltree.bench import DESIGNS

    chosen = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DESIGNS]
    if unknown or not chosen:
        raise typer.BadParameter(
            f"unknown designs {unknown}; known: {','.join(DESIGNS)}", param_hint="--designs"
        )
    return chosen


def _workload_faults(
    distribution: str, dfs_faults: str | None, seed: int
) -> tuple[Distribution, FaultSpec | None]:
    """The parsed ``--distribution`` and ``--dfs-faults`` (None: no injection); a
    non-zero ``seed`` is added to the fault spec's own."""
    from dstltree.bench.workload import parse_distribution
    from dstltree.storage.faults import FaultSpec

    try:
        dist = parse_distribution(distribution)
        faults = FaultSpec.parse(dfs_faults) if dfs_faults else None
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if faults is not None and seed:
        faults = faults.with_seed(faults.seed + seed)
    return dist, faults


def _executor_count(executors: int | None, nodes: int, writers: int) -> int:
    """Executors: ``--executors``, else one per node of the tree (``nodes`` nodes);
    at most one per node and at least one writer each."""
    n_exec = executors or nodes
    if n_exec > nodes:
        raise typer.BadParameter(
            f"{n_exec} executors but the tree has {nodes} nodes", param_hint="--executors"
        )
    if writers < n_exec:
        raise typer.BadParameter(
            f"need at least one writer per executor ({n_exec})", param_hint="--writers"
        )
    return n_exec


def _storage_options(text: str) -> dict[str, Any]:
    """The fsspec storage options of ``--storage-options`` (a JSON object)."""
    try:
        opts: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="--storage-options") from None
    return opts


def _title(settings: BenchSettings, bytes_per_checkpoint: str, storage: str) -> str:
    """The table title: workload, target (MiB), plan window, hedging and ``storage``
    (its description); ``bytes_per_checkpoint`` as given on the command line."""
    wl = settings.workload
    hedging = "off" if settings.attempts == 1 else f"{settings.upload_timeout:g} s"
    return (
        f"dstl bench: {wl.writers} writers on {wl.executors} executors, {bytes_per_checkpoint} "
        f"({wl.distribution}) per writer per checkpoint, {wl.checkpoints} checkpoints, target "
        f"{settings.target_object_bytes / 2**20:g} MiB, plan window {settings.plan_window}, "
        f"hedging {hedging}, storage: {storage}"
    )


def _print_results(result: BenchResult, title: str, target: int) -> None:
    """The metrics table, then per tree design its plan windows (objects per checkpoint
    and writer nodes) and acceptance checks against ``target`` (bytes)."""
    from rich.console import Console

    from dstltree.bench.report import print_table

    print_table(result.metrics, title, Console())
    for design, acc in result.acceptance.items():
        windows = "; ".join(
            f"w{w['window']}: {w['objects_per_checkpoint']:.2f} obj/cp by {','.join(w['writers'])}"
            for w in result.metrics[design]["windows"]
        )
        Console().print(f"{design} plan windows: {windows}")
        _print_acceptance(Console(), design, acc, target)


def _print_acceptance(console: Any, design: str, acc: dict[str, Any], target: int) -> None:
    """One line of acceptance checks (ok/FAIL each), then the first violations."""

    def mark(ok: bool) -> str:
        return "[green]ok[/green]" if ok else "[red]FAIL[/red]"

    relay = acc["relay_fraction_after_first_window"]
    relay_text = "-" if math.isnan(relay) else f"{relay * 100:.2f} %"
    console.print(
        f"{design}, after the first plan window: relay fraction {relay_text} (<= 5 %) "
        f"{mark(acc['relay_ok'])}; max hops {acc['max_hops_after_first_window']} (<= 1) "
        f"{mark(acc['hops_ok'])}; objects <= ceil(bytes/target) + writer nodes "
        f"{mark(acc['objects_ok'])}; mean object >= target/2 = {target // 2} B "
        f"{mark(acc['mean_object_ok'])}"
    )
    for what in ("objects_bound_violations", "mean_object_violations"):
        if acc[what]:
            console.print(f"  {what}: {acc[what][:8]}")
