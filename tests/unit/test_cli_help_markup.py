"""Every ``dstl`` help page is plain text: no reST markup from a docstring (double
backquotes, ``:func:`` and other roles) reaches a user, and every command and
sub-command says what it does.

The command tree is walked from the click command behind the typer app, so a command
added later is checked without touching this file.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from dstltree.cli.app import app
from tests.unit.test_cli_help import TREE, _name

pytestmark = pytest.mark.timeout(120)

ENV = {"COLUMNS": "80", "TERMINAL_WIDTH": "80"}
# reST inline markup: literals, interpreted-text roles (:func:`x`, :class:`~a.B`, ...)
MARKUP = re.compile(r"``|:(?:func|class|mod|meth|attr|data|exc|obj|ref|doc|py:\w+):`?")


def test_every_command_is_walked() -> None:
    names = {_name(path) for path, _ in TREE}
    assert {"dstl node", "dstl status", "dstl up", "dstl bench", "dstl cluster down"} <= names
    assert len(TREE) > 10


@pytest.mark.parametrize(("path", "command"), TREE, ids=[_name(p) for p, _ in TREE])
def test_help_is_plain_text_and_not_empty(path: tuple[str, ...], command: object) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    found = [line for line in result.output.splitlines() if MARKUP.search(line)]
    assert not found, f"{_name(path)} --help shows reST markup:\n" + "\n".join(found)
    text = (getattr(command, "help", None) or "").strip()
    assert text, f"{_name(path)} has no help text"
    first = text.split("\n", 1)[0].split()[:3]  # the first words, however it wraps
    assert " ".join(first) in " ".join(result.output.split()), result.output


def test_the_pattern_finds_docstring_markup() -> None:
    for text in ("see ``dstl up``", ":func:`node`", ":class:`~a.B`", ":mod:`x`"):
        assert MARKUP.search(text), text
    for text in ("dstl up --topology F", "security: {curve: false}", "host:port", "a `b`"):
        assert not MARKUP.search(text), text
