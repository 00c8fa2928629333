"""The main job (``dstl demo``, quick mode) on a Spark standalone cluster whose two
workers are hosts with their own network stacks (network namespaces on one bridge,
dstltree.bench.netns; the master and the driver on the bridge's address), under a
network fault of 10 s once checkpoints are being made: one worker host cut off, or the
driver cut off from every worker while the workers still see each other. The job
finishes with state and sink equal to the batch answer, no duplicate, nothing missing.
Root only (skipped with the reason otherwise); its own ``.ci/run`` step (marker
``net_faults``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dstltree.bench.netns import NetHosts, unavailable
from dstltree.cli.commands.cluster import StandaloneCluster, start_cluster
from tests.support.demo_run import QUICK, ROOT, checkpoint_dir
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.net_faults,
    pytest.mark.timeout(1500),
]

FAULT_S = 10.0  # seconds a fault lasts
DEMO_TIMEOUT = 600.0  # seconds for one demo run, the fault included


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[NetHosts, StandaloneCluster]]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    net = NetHosts(["w0", "w1"])
    try:
        c = start_cluster(tmp_path / "cluster", 2, 1, "1g", python_path=[str(ROOT)], net=net)
        try:
            yield net, c
        finally:
            c.stop()
    finally:
        assert net.close() == []


def _demo_under(
    tmp_path: Path, net: NetHosts, c: StandaloneCluster, fault: Callable[[], Callable[[], None]]
) -> dict:
    """Run the demo on ``c``; once its commit records reached sequence number 5,
    ``fault()`` (it returns its undo) for FAULT_S seconds. Returns the demo's report."""
    base = str(tmp_path / "dfs")
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "dstltree.cli.app", "demo", "--base-path", base]
    cmd += ["--report", str(report), *QUICK, "--master", c.master_url, "--tasks", "2"]
    env = {**os.environ, "SPARK_LOCAL_IP": net.gateway}
    log = (tmp_path / "demo.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        records = Path(checkpoint_dir(base)) / "checkpoints"

        def checkpoints_made() -> bool:
            assert proc.poll() is None, (tmp_path / "demo.log").read_text()[-4000:]
            seqs = [int(p.stem.split("-")[1]) for p in records.glob("commit-*.json")]
            return max(seqs, default=0) >= 5

        wait_until(checkpoints_made, timeout=DEMO_TIMEOUT, interval=0.1)
        undo = fault()
        try:
            cut_at = time.monotonic()
            wait_until(lambda: time.monotonic() - cut_at >= FAULT_S, timeout=FAULT_S + 5)
        finally:
            undo()
        assert proc.poll() is None, "the job ended within the fault: it did not live through it"
        assert proc.wait(timeout=DEMO_TIMEOUT) == 0, (tmp_path / "demo.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
    result: dict = json.loads(report.read_text())
    return result


def _check(r: dict) -> None:
    assert r["state_matches_batch"] is True, r["mismatched_keys"]
    assert r["sink_matches_batch"] is True and r["sink_duplicate_rows"] == 0
    assert r["records"] == r["sink_rows"] == 30000
    assert r["missing"] == 0, r


def test_the_job_finishes_exactly_once_after_a_worker_host_was_cut_off(
    tmp_path: Path, cluster: tuple[NetHosts, StandaloneCluster]
) -> None:
    net, c = cluster

    def cut() -> Callable[[], None]:
        net.cut("w1")
        return lambda: net.heal("w1")

    _check(_demo_under(tmp_path, net, c, cut))


def test_the_job_finishes_exactly_once_after_the_driver_was_cut_off_from_the_workers(
    tmp_path: Path, cluster: tuple[NetHosts, StandaloneCluster]
) -> None:
    """Every worker drops what it sends to the driver's host; the workers still reach
    each other (their nodes, the other executor)."""
    net, c = cluster

    def cut() -> Callable[[], None]:
        for w in net.hosts:
            net.block(w, "gateway")
        return lambda: [net.unblock(w, "gateway") for w in net.hosts] and None

    _check(_demo_under(tmp_path, net, c, cut))
