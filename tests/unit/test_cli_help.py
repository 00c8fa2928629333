"""Every ``dstl`` help page reads in an 80-column terminal.

The command tree is walked from the click command behind the typer app, so a command
or option added later is checked without touching this file. Each ``--help`` runs
in-process with ``COLUMNS=80`` (read by rich's console and by click's formatter alike)
and must keep every line within 80 characters, show each option name whole at the
start of its own row, and list each sub-command of a group on ONE line holding its
whole summary (``short_help``, or else the first sentence of its docstring).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import pytest
import typer
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

from dstltree.cli.app import app

pytestmark = pytest.mark.timeout(120)

WIDTH = 80
ENV = {"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)}
# a row of a table starts within this many characters of the line's start (after a
# panel border and the column of rich's required marker); wrapped text continues
# further right (past the first column and its padding)
ROW_INDENT = 5


def _walk(command: object, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], object]]:
    yield path, command
    if isinstance(command, TyperGroup):
        for name in sorted(command.commands):
            yield from _walk(command.commands[name], (*path, name))


TREE = list(_walk(typer.main.get_command(app), ()))
GROUPS = [(path, cmd) for path, cmd in TREE if isinstance(cmd, TyperGroup)]


def _name(path: tuple[str, ...]) -> str:
    return " ".join(("dstl", *path))


def _help(path: tuple[str, ...]) -> list[str]:
    result = CliRunner().invoke(app, [*path, "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _whole(word: str) -> re.Pattern[str]:
    """``word`` not glued to more name characters (``--fresh`` is not in ``--fresh-x``,
    ``--checkpoint-interval`` is not in ``--checkpoint-inte…``)."""
    return re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])")


def _row_start(line: str) -> str | None:
    """The text a table row starts with, or None for a line that continues a cell."""
    text = line.lstrip(" │")
    if len(line) - len(text) > ROW_INDENT:
        return None
    if text.startswith("*"):  # rich's marker of a required parameter
        text = text[1:].lstrip()
    return text


def _rows(lines: list[str], names: list[str]) -> list[int]:
    """Indices of the lines that start a row with one of ``names``."""
    found = []
    for i, line in enumerate(lines):
        start = _row_start(line)
        if start is not None and any(_whole(n).match(start) for n in names):
            found.append(i)
    return found


def test_the_tree_is_walked() -> None:
    names = {_name(path) for path, _ in TREE}
    assert {"dstl", "dstl demo", "dstl bench", "dstl bench chaos", "dstl keys"} <= names


@pytest.mark.parametrize(("path", "command"), TREE, ids=[_name(p) for p, _ in TREE])
def test_help_fits_and_names_every_option_whole(path: tuple[str, ...], command: object) -> None:
    lines = _help(path)
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{_name(path)} --help: lines wider than {WIDTH}:\n" + "\n".join(wide)
    params = getattr(command, "params", [])
    for param in params:
        if not isinstance(param, TyperOption) or param.hidden:
            continue
        names = [*param.opts, *param.secondary_opts]
        rows = _rows(lines, names)
        whole = [i for i in rows if all(_whole(n).search(lines[i]) for n in names)]
        assert whole, (
            f"{_name(path)} --help: no row shows {' / '.join(names)} whole:\n" + "\n".join(lines)
        )


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=[_name(p) for p, _ in GROUPS])
def test_group_lists_each_command_on_one_line(path: tuple[str, ...], group: TyperGroup) -> None:
    lines = _help(path)
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        summary = command.get_short_help_str(limit=sys.maxsize)
        rows = [i for i in _rows(lines, [name]) if summary in lines[i]]
        assert rows, (
            f"{_name(path)} --help: {name!r} is not listed on one line with its whole summary "
            f"{summary!r}:\n" + "\n".join(lines)
        )
        after = lines[rows[0] + 1] if rows[0] + 1 < len(lines) else ""
        assert not after.strip(" │") or _row_start(after) is not None, (
            f"{_name(path)} --help: {name!r}'s summary runs over more than one line:\n"
            + "\n".join(lines)
        )
