"""``dstl bench commit-floor``: the least work of one checkpoint on the completion
path's storage, for the floor of the checkpoint duration (dstltree/bench/commit_floor.py)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["commit_floor"]


def commit_floor(
    dfs_faults: Annotated[
        str, typer.Option(help="Fault spec of the store, as demo --dfs-faults.")
    ] = "flip158-s3",
    checkpoints: Annotated[int, typer.Option(min=1, max=2000, help="Checkpoints.")] = 150,
    interval: Annotated[float, typer.Option(min=0.0, help="Seconds between starts.")] = 0.3,
) -> None:
    """The commit floor: one object, then one create.

    One changelog object (100 KB) then one conditional create (6 KB) per checkpoint through
    the fault-injecting store, checkpoints overlapping; prints the object's and the pair's
    p50 / p99 (seconds), with the create hedged as the coordinator hedges it and without."""
    from rich.console import Console
    from rich.table import Table

    from dstltree.bench.commit_floor import commit_floor as run

    try:
        figures = run(dfs_faults, checkpoints, interval)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--dfs-faults") from e
    table = Table(title=f"commit floor: {dfs_faults}, {checkpoints} checkpoints")
    for col in ("create", "object p50/p99 s", "object+create p50/p99 s", "max s"):
        table.add_column(col, justify="right")
    for f in figures:
        table.add_row(
            "hedged" if f.hedged else "once",
            f"{f.object_p50:.3f} / {f.object_p99:.3f}",
            f"{f.total_p50:.3f} / {f.total_p99:.3f}",
            f"{f.total_max:.3f}",
        )
    Console().print(table)
