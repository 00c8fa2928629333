"""``dstl bench soak`` end to end, short: two "minutes" of 3 s (the hidden ``--minute-s``)
of writers in task processes through node processes, a node restarted each minute;
every process is sampled each minute, nothing fails, the registry deletes what no
retained checkpoint references and no orphan survives the sweep."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dstltree.bench.chaos import DAG
from dstltree.cli.app import app

PROCESSES = {("node", n) for n in DAG} | {("task", f"task{i}") for i in range(4)}


def test_the_soak_samples_every_process_each_minute_and_leaves_no_orphan(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## Soak\n\nold figures\n\n## Chaos\n\nkept\n")
    args = ["bench", "soak", "--minutes", "2", "--minute-s", "3", "--json", str(out)]
    args += ["--markdown", str(md), "--workdir", str(tmp_path)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    minutes = doc["minutes"]
    assert [m["minute"] for m in minutes] == [1, 2]
    for m in minutes:
        seen = {(p["role"], p["name"]) for p in m["processes"]}
        assert seen == PROCESSES and len(m["processes"]) == len(PROCESSES), m["minute"]
        for p in m["processes"]:
            assert p["rss_mib"] > 0 and p["fds"] > 0 and p["threads"] > 0, p
        assert m["nodes"]["rss_mib"]["max"] <= m["nodes"]["rss_mib"]["sum"]
        assert m["persists"] > 0 and m["persists_failed"] == 0, m
        assert 0 < m["p50_ms"] <= m["p99_ms"], m
        assert m["objects"] >= m["reserved"] >= 0
    # a node restarted each minute, never the witness, each a new process
    assert [m["restarts"] for m in minutes] == [1, 2] and doc["restarts"] == 2
    assert doc["crashes"] == 0
    for m in minutes:
        node = m["restarted"].split()[0]
        assert node in DAG and node != "a", m["restarted"]
    assert doc["persists_failed"] == 0 and doc["errors"] == []
    # the registry released checkpoints and deleted their objects; nothing retained lost
    assert doc["completed"] > doc["settings"]["retained"] and doc["deleted"] > 0
    assert doc["retained_objects"] > 0 and doc["missing_objects"] == 0
    assert doc["orphans_after_sweep"] == 0
    # a short run compares the last minute with the first; a verdict per process, metric
    assert doc["baseline_minute"] == 1
    assert all(1 <= v["since"] <= 2 for v in doc["verdicts"]), doc["verdicts"]
    verdicts = {(v["process"], v["metric"]) for v in doc["verdicts"]}
    assert verdicts == {
        (f"{r} {n}", x) for r, n in PROCESSES for x in ("RSS MiB", "fds", "threads")
    }
    text = md.read_text()
    assert "old figures" not in text and "## Chaos\n\nkept" in text
    assert "## Soak" in text and "| 2 |" in text and "the first full minute (1)" in text
    assert "orphans after the nodes stopped" in r.output
