"""Every ``dstl`` command that takes a topology file answers a malformed one with ONE
error line on stderr naming the file (and the field or position) and exit code 2: no
traceback, no usage box."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstltree.cli.app import app

pytestmark = pytest.mark.timeout(60)

BAD = {
    "deep": ("branching: 2\nstorage_options: " + "[" * 50_000).encode(),
    "not_utf8": b"branching: 2\nbase_path: caf\xe9\n",
    "bomb": (
        "branching: 2\nstorage_options:\n"
        + "".join(
            f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(7)
        )
    ).encode(),
    "field": b"branching: 5000\n",
    "many_errors": b"nodes: [{id: a, bind: x}, {id: b, bind: y, parent: a}]\nbogus: 1\n",
    "yaml": b"nodes: [{id: a\n",
}
COMMANDS = {
    "plan": lambda p: ["plan", str(p), "--bytes-per-executor", "1MiB"],
    "bench": lambda p: ["bench", "--topology", str(p)],
    "simulate": lambda p: ["simulate", "--topology", str(p)],
    "node": lambda p: ["node", "--topology", str(p), "--node-id", "a"],
    "up": lambda p: ["up", "--topology", str(p)],
    "status": lambda p: ["status", "--topology", str(p), "--once"],
    "demo": lambda p: ["demo", "--topology", str(p), "--base-path", str(p.parent / "dfs")],
    "bench-job": lambda p: ["bench-job", "--topology", str(p)],
}


# every command with one malformed file, every malformed file with one command
CASES = sorted(
    {(c, "field") for c in COMMANDS}
    | {(c, b) for c, b in zip(sorted(COMMANDS), sorted(BAD), strict=False)}
)


@pytest.mark.parametrize(("command", "bad"), CASES)
def test_malformed_topology_is_one_line_and_exit_2(tmp_path: Path, command: str, bad: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_bytes(BAD[bad])
    result = CliRunner().invoke(app, COMMANDS[command](path))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and str(path) in lines[0]
    assert "Traceback" not in result.output
