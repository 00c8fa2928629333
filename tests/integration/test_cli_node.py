"""``dstl node``: the one entry point of a node process (the launchers start nodes
through it too: tests/integration/test_tree_integration.py)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dstltree.cli.app import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_branching_topology_needs_depth_and_parent() -> None:
    result = CliRunner().invoke(
        app, ["node", "--topology", str(DEPLOY / "cluster.yaml"), "--node-id", "e0"]
    )
    assert result.exit_code == 2
    assert "--depth and --parent" in result.output


def test_unknown_node_is_named() -> None:
    result = CliRunner().invoke(
        app, ["node", "--topology", str(DEPLOY / "local.yaml"), "--node-id", "nope"]
    )
    assert result.exit_code == 2
    assert "'nope' is not in" in result.output
