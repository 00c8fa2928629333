"""``dstl simulate``: the discrete-event cluster simulator, single runs and
sweeps over branching factor and target object size."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from dstltree.cli.commands._common import (
    TOPOLOGY_HELP,
    echo_json,
    load_tree,
    parse_size,
    parse_sizes,
    topology_file,
    wide_console,
)
from dstltree.cli.commands._sim_failures import run_failures
from dstltree.topology.designs import DESIGNS, TREE_DESIGNS

if TYPE_CHECKING:
    from dstltree.simulations.cluster import SimResult
    from dstltree.simulations.config import SimConfig
    from dstltree.topology.tree import Tree

__all__ = ["register"]


def _ints(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise typer.BadParameter(f"expected integers >= 1, got {text!r}")
    return out


def _hedge(text: str) -> float | None:
    if text.strip().lower() in ("off", "none", "0"):
        return None
    try:
        v = float(text)
    except ValueError:
        raise typer.BadParameter(
            f"--hedge-timeout: a number of seconds or 'off', got {text!r}"
        ) from None
    if v <= 0:
        raise typer.BadParameter("--hedge-timeout must be > 0 (or 'off')")
    return v


def _designs(text: str | None, default: tuple[str, ...]) -> list[str]:
    if text is None:
        return list(default)
    names: list[str] = list(DESIGNS) if text == "all" else [t.strip() for t in text.split(",")]
    bad = [n for n in names if n not in DESIGNS]
    if bad:
        raise typer.BadParameter(f"--design: unknown {bad}; known: {', '.join(DESIGNS)}, all")
    return names


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _print_table(results: list[Any], best: Any | None) -> None:
    from rich.table import Table

    t = Table(title="dstl simulate (checkpoint latency in ms)")
    for col in (
        "design",
        "branching",
        "target",
        "p50",
        "p90",
        "p99",
        "p999",
        "req/ckpt",
        "req/s",
        "mean object",
        "relay",
        "throttled",
        "hedged",
    ):
        t.add_column(col, justify="left" if col == "design" else "right")
    for r in results:
        flat = r.design not in TREE_DESIGNS
        ms = r.checkpoint_ms
        mark = " *" if r is best else ""
        t.add_row(
            r.design + mark,
            "-" if flat else str(r.branching),
            "-" if flat else _mib(r.target_object_bytes),
            *(f"{ms[k]:.0f}" for k in ("p50", "p90", "p99", "p999")),
            f"{r.requests_per_checkpoint:.1f}",
            f"{r.requests_per_second:.0f}",
            _mib(r.mean_object_bytes),
            f"{r.relay_fraction:.3f}",
            str(r.throttled_requests),
            str(r.hedged_requests),
        )
    console = wide_console(180)
    console.print(t)
    if best is not None:
        where = (
            ""
            if best.design not in TREE_DESIGNS
            else f" branching={best.branching} target={_mib(best.target_object_bytes)}"
        )
        console.print(
            f"best (fewest requests with p99 within 5 % of the lowest, no throttling; *): "
            f"{best.design}{where} p99={best.checkpoint_ms['p99']:.0f} ms"
        )


_SECOND_PARENTS = (
    "k-ary tree: a second parent per node and a neighbour's node per executor's writers "
    "(a real topology's default); --no-second-parents: a tree."
)
_FAILURES = (
    "Tree designs: each node (root included) dies this often per hour and restarts; "
    "compares a tree and a DAG without and with the failures."
)
_DETECTION = "Seconds until a death is noticed (heartbeats)."
_HOLD_DOWN = "Seconds a returned node waits before it is used again."


def simulate_command(
    executors: Annotated[int, typer.Option(help="Executors (one node each).")] = 7,
    tasks_per_executor: Annotated[int, typer.Option(help="Tasks (writers) per executor.")] = 4,
    branching: Annotated[int, typer.Option(help="k-ary tree branching factor.")] = 4,
    topology: Annotated[
        Path | None,
        typer.Option(help=f"{TOPOLOGY_HELP} Instead of --branching.", callback=topology_file),
    ] = None,
    bytes_per_checkpoint: Annotated[
        str, typer.Option(help="Bytes per task per checkpoint.")
    ] = "256KiB",
    distribution: Annotated[str, typer.Option(help="constant, lognormal or skewed.")] = "constant",
    sigma: Annotated[float, typer.Option(help="lognormal shape.")] = 1.0,
    hot_fraction: Annotated[float, typer.Option(help="skewed: fraction of hot executors.")] = 0.1,
    hot_factor: Annotated[
        float, typer.Option(help="skewed: bytes factor of hot executors.")
    ] = 10.0,
    checkpoints: Annotated[int, typer.Option(help="Measured checkpoints.")] = 20,
    checkpoint_interval: Annotated[float, typer.Option(help="Seconds between checkpoints.")] = 1.0,
    target_object_bytes: Annotated[
        str | None,
        typer.Option(help="Writer-node target object size (default: topology's, else 4MiB)."),
    ] = None,
    design: Annotated[
        str | None,
        typer.Option(
            help="task, executor, tree, tree-noplan, comma list or 'all' "
            "(default: tree; all for sweeps)."
        ),
    ] = None,
    dfs_latency: Annotated[
        str, typer.Option(help="Latency model: flip158-s3, flip158-s3-hedged, local.")
    ] = "flip158-s3",
    hedge_timeout: Annotated[str, typer.Option(help="Seconds, or 'off'.")] = "1.0",
    max_attempts: Annotated[int, typer.Option(help="Hedged attempts at most.")] = 3,
    put_rate_limit: Annotated[float, typer.Option(help="PUT/s per prefix.")] = 3500.0,
    prefixes: Annotated[int, typer.Option(help="Object-store prefixes.")] = 1,
    hedge_copies: Annotated[
        int, typer.Option(help="Writes at once of objects up to 8 MiB (the first wins).")
    ] = 1,
    hedge_adaptive: Annotated[
        float | None,
        typer.Option(help="Hedge after this percentile of recent latencies (default: off)."),
    ] = None,
    throttle_aware: Annotated[
        bool,
        typer.Option(
            help="No hedges while the store throttles (--no-throttle-aware: hedge anyway)."
        ),
    ] = True,
    stats_interval: Annotated[
        float, typer.Option(help="Seconds between a node's Stats reports (the node's: 0.2).")
    ] = 0.2,
    coordinator: Annotated[
        bool,
        typer.Option(
            help="Tree designs: the coordinator core triggers each checkpoint an interval "
            "after the previous completed, latency to its completion (default "
            "--no-coordinator: fixed triggers, latency to the last writer's ack)."
        ),
    ] = False,
    plan_window: Annotated[
        int | None, typer.Option(help="Checkpoints per plan window (default: topology's, else 4).")
    ] = None,
    hop_latency: Annotated[float, typer.Option(help="Seconds per network hop.")] = 0.0005,
    node_bandwidth: Annotated[str, typer.Option(help="Per node NIC, bytes/s each way.")] = "1.25GB",
    cpu_per_message: Annotated[float, typer.Option(help="Seconds per message received.")] = 50e-6,
    second_parents: Annotated[bool, typer.Option(help=_SECOND_PARENTS)] = True,
    node_failures_per_hour: Annotated[float, typer.Option(min=0.0, help=_FAILURES)] = 0.0,
    restart: Annotated[float, typer.Option(min=0.001, help="Seconds a dead node is down.")] = 2.0,
    failure_detection: Annotated[float, typer.Option(min=0.0, help=_DETECTION)] = 0.3,
    hold_down: Annotated[float, typer.Option(min=0.0, help=_HOLD_DOWN)] = 5.0,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    sweep_branching: Annotated[str | None, typer.Option(help="e.g. 2,4,8,16.")] = None,
    sweep_target: Annotated[str | None, typer.Option(help="e.g. 1MiB,4MiB,16MiB.")] = None,
    jobs: Annotated[int, typer.Option(help="Processes for sweeps.")] = 1,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of the sweep.")] = None,
    emit_topology: Annotated[
        Path | None,
        typer.Option(
            help="Write the recommended topology YAML (deploy/*.yaml format): the best "
            "tree setting of the sweep (fewest requests with p99 within 5 % of the lowest, no "
            "throttling), else the tree run."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate",
            help="Run the real 7-node tree (dstl bench machinery, faulty FS on the FLIP-158 "
            "model x0.1) and the simulator on the same configuration; print both. Uses "
            "--seed and --json only.",
        ),
    ] = False,
) -> None:
    """Simulate the checkpoints of a cluster per design.

    Runs them through the task, executor and tree designs: checkpoint latency, DFS
    requests, throttling and hedging (FLIP-158 S3 model by default)."""
    if validate:
        _validate(seed, as_json)
        return

    from dstltree.simulations.config import SimConfig
    from dstltree.simulations.sweep import best

    _check_model(dfs_latency)
    shape = _shape(topology, executors, branching, target_object_bytes, plan_window)
    sweeping = sweep_branching is not None or sweep_target is not None
    designs = _designs(design, DESIGNS if sweeping else ("tree",))
    try:
        base = SimConfig(
            executors=shape.executors,
            tasks_per_executor=tasks_per_executor,
            branching=shape.branching,
            tree=shape.tree,
            bytes_per_checkpoint=parse_size(bytes_per_checkpoint),
            distribution=distribution,
            sigma=sigma,
            hot_fraction=hot_fraction,
            hot_factor=hot_factor,
            checkpoints=checkpoints,
            checkpoint_interval_s=checkpoint_interval,
            plan_window=shape.plan_window or 4,
            target_object_bytes=shape.target or 4 * 2**20,
            design=designs[0],  # type: ignore[arg-type]
            dfs_latency=dfs_latency,
            hedge_timeout_s=_hedge(hedge_timeout),
            max_attempts=max_attempts,
            put_rate_limit=put_rate_limit,
            prefixes=prefixes,
            hedge_copies=hedge_copies,
            hedge_adaptive_percentile=hedge_adaptive,
            throttle_aware=throttle_aware,
            coordinator=coordinator,
            stats_interval_s=stats_interval,
            hop_latency_s=hop_latency,
            node_bandwidth=float(parse_size(node_bandwidth)),
            cpu_per_message_s=cpu_per_message,
            second_parents=second_parents,
            node_failures_per_hour=node_failures_per_hour,
            restart_s=restart,
            failure_detection_s=failure_detection,
            hold_down_s=hold_down,
            seed=seed,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if base.failures and not sweeping:
        run_failures(base, designs, as_json)
        return
    results = _run(base, designs, sweep_branching, sweep_target, jobs)
    chosen = best(results, base.prefixes)
    if plot is not None:
        _plot(results, plot, base, f"{bytes_per_checkpoint}/task")
    _print_results(results, chosen, sweeping, as_json, plot)
    if emit_topology is not None:
        _emit(emit_topology, base, results, sweeping, as_json)


def _plot(results: list[SimResult], path: Path, base: SimConfig, per_task: str) -> None:
    """The sweep's PNG at ``path``, titled by the cluster of ``base``."""
    from dstltree.simulations.sweep import floor_ms
    from dstltree.simulations.sweep import plot as plot_results

    plot_results(
        results,
        path,
        title=f"{base.executors} executors x {base.tasks_per_executor} "
        f"tasks, {per_task}, {base.dfs_latency}",
        prefixes=base.prefixes,
        floor_ms=floor_ms(base.dfs_latency),
    )


def _check_model(name: str) -> None:
    """BadParameter for an unknown latency model."""
    from dstltree.topology.latency import get_model

    try:
        get_model(name)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--dfs-latency") from None


class _Shape(NamedTuple):
    """The cluster of a run: ``tree`` from ``--topology`` (None: k-ary by
    ``branching``), executors, branching factor, and the target object size (bytes)
    and plan window (checkpoints) when given by a flag or the topology (None: the
    defaults)."""

    tree: Tree | None
    executors: int
    branching: int
    target: int | None
    plan_window: int | None


def _shape(
    topology: Path | None,
    executors: int,
    branching: int,
    target_object_bytes: str | None,
    plan_window: int | None,
) -> _Shape:
    """The flags, completed from the topology file if one is given (its tree fixes the
    executor count; flags win over its target and plan window)."""
    target = parse_size(target_object_bytes) if target_object_bytes else None
    if topology is None:
        return _Shape(None, executors, branching, target, plan_window)
    topo, tree = load_tree(topology, executors, param_hint="--topology")
    return _Shape(
        tree,
        len(tree),
        topo.branching or branching,
        target or int(topo.target_object_bytes),
        plan_window or topo.plan_window,
    )


def _run(
    base: SimConfig,
    designs: list[str],
    sweep_branching: str | None,
    sweep_target: str | None,
    jobs: int,
) -> list[SimResult]:
    """Simulate ``base`` for each design, or sweep branching factors and/or target
    sizes (a comma list of integers and of sizes) over the designs with ``jobs``
    processes."""
    from dataclasses import replace

    from dstltree.simulations.sweep import sweep

    if base.tree is not None and sweep_branching is not None:
        raise typer.BadParameter("--sweep-branching needs --branching, not --topology")
    if sweep_branching is not None or sweep_target is not None:
        return sweep(
            base,
            _ints(sweep_branching) if sweep_branching else None,
            parse_sizes(sweep_target) if sweep_target else None,
            designs,  # type: ignore[arg-type]
            jobs=jobs,
        )
    from dstltree.simulations.cluster import simulate

    return [simulate(replace(base, design=d)) for d in designs]  # type: ignore[arg-type]


def _print_results(
    results: list[SimResult],
    chosen: SimResult | None,
    sweeping: bool,
    as_json: bool,
    plot: Path | None,
) -> None:
    """JSON (a sweep: every result and the best; else one result, or one per design
    keyed by name) or the table, the best marked in a sweep."""
    if as_json:
        if sweeping:
            out: Any = {
                "results": [r.to_dict() for r in results],
                "best": chosen.to_dict() if chosen else None,
            }
        elif len(results) == 1:
            out = results[0].to_dict()
        else:
            out = {r.design: r.to_dict() for r in results}
        echo_json(out)
    else:
        _print_table(results, chosen if sweeping else None)
        if sweeping and chosen is None:
            typer.echo("no setting stays within the request-rate limit")
        if plot is not None:
            typer.echo(f"plot written to {plot}")


def _emit(
    path: Path, base: SimConfig, results: list[SimResult], sweeping: bool, quiet: bool
) -> None:
    """Write the topology of the best tree result (a sweep) or of the tree run."""
    from dataclasses import replace

    from dstltree.simulations.emit import write_topology
    from dstltree.simulations.sweep import best

    trees = [r for r in results if r.design in TREE_DESIGNS]
    pick = best(trees, base.prefixes) if sweeping else (trees[0] if trees else None)
    if pick is None:
        raise typer.BadParameter(
            "no tree setting to emit (none ran, or none stays within the request-rate limit)",
            param_hint="--emit-topology",
        )
    cfg = replace(
        base,
        design=pick.design,  # type: ignore[arg-type]
        branching=pick.branching,
        target_object_bytes=pick.target_object_bytes,
    )
    write_topology(path, pick, cfg)
    if not quiet:
        typer.echo(f"topology written to {path}")


def _validate(seed: int, as_json: bool) -> None:
    from rich.console import Console

    from dstltree.bench.report import to_json
    from dstltree.bench.validate import ValidateSettings, print_validation, run_validation

    err = Console(stderr=True)
    doc = run_validation(
        ValidateSettings(seed=seed), None if as_json else lambda m: err.print(f"{m}...")
    )
    if as_json:
        typer.echo(to_json(doc))
    else:
        print_validation(doc)


def register(app: typer.Typer) -> None:
    """Add ``dstl simulate`` to ``app``."""
    app.command("simulate")(simulate_command)
