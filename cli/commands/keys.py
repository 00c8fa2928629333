"""``dstl keys generate DIR``: the cluster's CURVE keys (dstltree.security)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

keys_app = typer.Typer(help="CURVE keys of a cluster's nodes and writers.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
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
