"""The ``dstl`` command line (typer). Sub-commands live in ``sparkplug/commands/*.py``,
each with a ``register(app: typer.Typer)`` function; heavy imports stay inside commands."""

from __future__ import annotations

import importlib
import pkgutil

import typer

import dstltree.cli.commands

app = typer.Typer(
    name="dstl",
    help="dstltree: a tree-aggregated Durable Short-term Log for stateful Spark jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(dstltree.cli.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared helpers, no command
            continue
        module = importlib.import_module(f"dstltree.cli.commands.{info.name}")
        module.register(app)


_register_commands()

if __name__ == "__main__":
    app()
