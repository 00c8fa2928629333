"""``dstl bench chaos`` end to end, short: node processes killed hard and restarted, or
stopped for a while, under writers; nothing acknowledged is lost, duplicated or
reordered, every handle's objects exist and the sweep leaves no orphan."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstltree.bench.netns import unavailable
from dstltree.cli.app import app


def test_the_chaos_benchmark_loses_nothing_and_leaves_no_orphan(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## Hot path\n\nkept\n")
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "chaos",
            "--seconds",
            "4",
            "--json",
            str(out),
            "--markdown",
            str(md),
            "--workdir",
            str(tmp_path),
        ],
    )
    assert r.exit_code == 0, r.output
    cases = {c["case"]: c for c in json.loads(out.read_text())["cases"]}
    assert set(cases) == {"dag, no faults", "dag, kills and stops", "tree, kills and stops"}
    for c in cases.values():
        assert c["persists"] > 0 and c["persist_errors"] == 0, c
        assert (c["lost"], c["duplicated"], c["out_of_order"], c["missing_objects"]) == (
            0,
            0,
            0,
            0,
        ), c
        assert c["orphans_after_sweep"] == 0, c
        assert c["changes_checked"] == 3 * c["persists"], c  # every change acknowledged
    calm, faulty = cases["dag, no faults"], cases["dag, kills and stops"]
    # no faults injected; failovers are not asserted there: the bench's 0.15 s silence
    # can pass without a fault when another test suite loads the machine (the table
    # shows them), and a failover loses nothing (the assertions above)
    assert calm["kills"] == calm["stops"] == 0 and calm["detections"] == []
    assert faulty["kills"] + faulty["stops"] >= 1
    # every stop is either detected (a move away from it, while stopped) or counted as not
    assert len(faulty["detections"]) + faulty["undetected"] == faulty["stops"]
    text = md.read_text()
    assert "## Hot path\n\nkept" in text and "## Chaos" in text
    assert "| dag, kills and stops |" in text


def test_the_faults_option_names_known_faults_only(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["bench", "chaos", "--faults", "kills,naps"])
    assert r.exit_code != 0 and "kills, stops" in r.output


def test_network_faults_lose_nothing_and_remove_their_hosts(tmp_path: Path) -> None:
    """``--faults partitions,oneway``: every node on a host of its own (network
    namespaces, root only: skipped otherwise); hosts cut off and one-way cuts under the
    writers lose, duplicate and reorder nothing, and no namespace is left."""
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    out = tmp_path / "chaos.json"
    args = ["bench", "chaos", "--seconds", "6", "--faults", "partitions,oneway", "--seed", "3"]
    r = CliRunner().invoke(app, [*args, "--json", str(out), "--workdir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    cases = {c["case"]: c for c in json.loads(out.read_text())["cases"]}
    for c in cases.values():
        assert (c["lost"], c["duplicated"], c["out_of_order"], c["missing_objects"]) == (
            0,
            0,
            0,
            0,
        ), c
        assert c["orphans_after_sweep"] == 0, c
    faulty = cases["dag, partitions and oneway"]
    assert faulty["partitions"] + faulty["oneways"] >= 1
    assert len(faulty["detections"]) + faulty["undetected"] == (
        faulty["partitions"] + faulty["oneways"]
    )
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"dstl{os.getpid()}-" not in listed
