"""The ``dstl`` command line (typer). Sub-commands live in ``cli/commands/*.py``, each
with a ``register(app: typer.Typer)`` function; heavy imports stay inside commands.

Help pages use click's plain formatter (``rich_markup_mode=None``, inherited by every
command and group below ``app``): it never cuts an option name, wraps help text to the
terminal (``COLUMNS``, at most 80 columns) and lists each sub-command with one line, its
``short_help`` or else the first sentence of its docstring. Rich's option table shares
the width between four columns and truncates long option names ("--checkpoint-inte…")
at 80 columns, and lists a command with its whole first paragraph.
tests/unit/test_cli_help.py checks every help page of the tree at 80 columns."""

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
    rich_markup_mode=None,
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
