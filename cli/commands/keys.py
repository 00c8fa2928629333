"""``dstl keys generate DIR``: the cluster's CURVE keys (dstltree.security); ``dstl keys
rotate start|promote|finish|abort DIR`` and ``dstl keys status DIR``: rotating them without
downtime (dstltree.security.rotation)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

keys_app = typer.Typer(help="CURVE keys of a cluster's nodes and writers.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")


@keys_app.command("generate", short_help="Write a new cluster key directory.")
def generate(
    directory: Annotated[Path, typer.Argument(help="Key directory (created 0700).")],
    force: Annotated[bool, typer.Option(help="Replace existing key files.")] = False,
) -> None:
    """Write node.key, node.key_secret, writer.key, writer.key_secret (secrets 0600) to
    DIRECTORY: name it in the topology (security: {keys: DIRECTORY}) and copy it to
    every host running a node; hosts of tasks only need writer.key_secret and
    node.key. Refuses to overwrite without --force (exit 1)."""
    from dstltree.security import KeyDirError, generate_key_dir

    try:
        keys = generate_key_dir(directory, force=force)
    except (KeyDirError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(f"cluster keys in {directory}")
    typer.echo(f"  node public key:   {keys.node.public.decode()}")
    typer.echo(f"  writer public key: {keys.writer.public.decode()}")


rotate_app = typer.Typer(
    short_help="Rotate the cluster keys without downtime.",
    help=(
        "Rotate the cluster keys without downtime: start, promote, finish (restarting "
        "nodes and jobs one at a time between steps; docs/deploy.md, Rotating keys)."
    ),
    no_args_is_help=True,
)
keys_app.add_typer(rotate_app, name="rotate")

_DIR_HELP = "The full key directory (all four files), copied to the hosts after each step."


def _run_step(step: str, directory: Path) -> None:
    """Run rotation ``step`` on ``directory`` and print the new status; exit 1 with the
    error (naming the state and the step due) when it fails."""
    from dstltree.security import (
        KeyDirError,
        abort_rotation,
        finish_rotation,
        promote_rotation,
        start_rotation,
    )

    steps = {
        "start": start_rotation,
        "promote": promote_rotation,
        "finish": finish_rotation,
        "abort": abort_rotation,
    }
    try:
        status = steps[step](directory)
    except (KeyDirError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    for line in status.lines():
        typer.echo(line)


@rotate_app.command("start", short_help="Generate the next generation beside the current.")
def rotate_start(directory: Annotated[Path, typer.Argument(help=_DIR_HELP)]) -> None:
    """Generate the next generation of keys beside the current one. Nodes restarted
    afterwards still serve with the current node key and also accept the next
    generation's clients; clients restarted afterwards also know the next node key.
    Exit 1 when a rotation is under way already."""
    _run_step("start", directory)


@rotate_app.command("promote", short_help="Make the next generation current.")
def rotate_promote(directory: Annotated[Path, typer.Argument(help=_DIR_HELP)]) -> None:
    """Make the next generation current: nodes restarted afterwards serve with it,
    clients restarted afterwards connect with it; the previous generation is still
    accepted and known. Exit 1 without a started rotation."""
    _run_step("promote", directory)


@rotate_app.command("finish", short_help="Remove the previous generation.")
def rotate_finish(directory: Annotated[Path, typer.Argument(help=_DIR_HELP)]) -> None:
    """Remove the previous generation: nodes restarted afterwards accept only the
    current keys. Every node and job must have been restarted since promote. Exit 1
    without a promoted rotation."""
    _run_step("finish", directory)


@rotate_app.command("abort", short_help="Undo the rotation's last step.")
def rotate_abort(directory: Annotated[Path, typer.Argument(help=_DIR_HELP)]) -> None:
    """Undo the rotation under way. Before promote: the next generation is removed.
    After promote: the previous generation is current again and the aborted one
    previous; restart every job, then every node (one at a time), then run finish to
    remove it. Exit 1 without a rotation under way."""
    _run_step("abort", directory)


@keys_app.command("status", short_help="Rotation state, fingerprints, next step.")
def status(directory: Annotated[Path, typer.Argument(help="Key directory.")]) -> None:
    """The key directory's rotation state, its generations' key fingerprints, what a
    node and a client started now would do, and the next step. Exit 1 when the
    directory cannot be read."""
    from dstltree.security import KeyDirError, key_dir_status

    try:
        st = key_dir_status(directory)
    except (KeyDirError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    for line in st.lines():
        typer.echo(line)
