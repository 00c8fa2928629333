"""``dstl bench fencing-race``: two drivers of one job start at once, round after
round, on a store whose conditional create is atomic (dstltree/bench/fencing_race.py);
exactly one winner per round, nothing acknowledged lost."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["fencing_race"]


def fencing_race(
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (a fresh job prefix each).")] = 1000,
    checkpoints: Annotated[
        int, typer.Option(min=1, help="Checkpoints each driver commits per round.")
    ] = 3,
    s3: Annotated[
        bool,
        typer.Option(
            "--s3-local/--local",
            help="moto's S3 server with serialized writes (atomic conditional create), "
            "or the local file system (POSIX link).",
        ),
    ] = False,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here.")
    ] = None,
) -> None:
    """Two drivers of one job, racing.

    Per round both drivers commit checkpoints through their own checkpoint stores at
    once, then each tries one more: exactly one may (the newest claimer), the other is
    fenced. Every commit a driver was told succeeded must be its own record in the
    store. Prints rounds, rounds without exactly one winner, acknowledged and lost
    commits, drivers fenced mid-round and the time. Exit code 1 when a round had no
    single winner or an acknowledged commit was lost."""
    from rich.console import Console

    from dstltree.bench.fencing_race import run_race
    from dstltree.storage.store import NO_RETRY, ObjectStore

    console = Console()
    with tempfile.TemporaryDirectory(prefix="dstl-race-") as tmp:
        if s3:
            from dstltree.storage.targets import start_local_s3

            server = start_local_s3("race", atomic=True)
            try:
                result = run_race(
                    lambda k: ObjectStore(
                        server.url(f"job{k}"), server.storage_options, retry=NO_RETRY
                    ),
                    rounds,
                    checkpoints,
                )
            finally:
                server.stop()
        else:
            result = run_race(lambda k: ObjectStore(f"{tmp}/job{k}"), rounds, checkpoints)
    bad = sum(w != 1 for w in result.winners)
    store = "moto S3, serialized writes" if s3 else "local file system"
    console.print(
        f"fencing race on {store}: {result.rounds} rounds, {bad} without exactly one "
        f"winner, {result.acked} commits acknowledged, {result.lost} lost, "
        f"{result.fenced_mid_round} drivers fenced mid-round, {result.seconds:.1f} s"
    )
    if json_file is not None:
        doc = {**vars(result), "store": store, "rounds_without_one_winner": bad}
        doc.pop("winners")
        json_file.write_text(json.dumps(doc, indent=2) + "\n")
    if not result.ok:
        raise typer.Exit(1)
