"""A task's aggregator nodes in order of preference: its own, then a neighbour's
(sparkplug.task.find_nodes)."""

from __future__ import annotations

import pytest

from dstltree.sparkplug.api import Pipeline
from dstltree.sparkplug.task import TaskConfig, find_nodes


def _cfg(**placement) -> TaskConfig:  # type: ignore[no-untyped-def]
    return TaskConfig(Pipeline.__new__(Pipeline), "job", 0, 4, "/tmp/x", "tcp://c:1", **placement)


def test_local_mode_gives_the_task_s_node_then_the_next_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("DSTL_NODE", raising=False)
    cfg = _cfg(node_for_task={0: "tcp://a:1", 1: "tcp://b:1", 2: "tcp://a:1"})
    assert find_nodes(cfg, 0, None) == ("tcp://a:1", "tcp://b:1")
    assert find_nodes(cfg, 1, None) == ("tcp://b:1", "tcp://a:1")
    assert find_nodes(cfg, 2, None) == ("tcp://a:1", "tcp://b:1")  # wraps around


def test_by_host_the_next_host_s_node_is_the_second_way(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("DSTL_NODE", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.2")  # how the worker names its host
    cfg = _cfg(node_for_host={"10.0.0.1": "tcp://n0:1", "10.0.0.2": "tcp://n1:1"})
    assert find_nodes(cfg, 3, "10.0.0.2:4040") == ("tcp://n1:1", "tcp://n0:1")
    single = _cfg(node_for_executor={"10.0.0.1:1": "tcp://n0:1"})
    assert find_nodes(single, 0, "10.0.0.1:1") == ("tcp://n0:1",)


def test_the_environment_wins_and_may_list_several(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DSTL_NODE", "tcp://x:1, tcp://y:1")
    assert find_nodes(_cfg(node_for_task={0: "tcp://a:1"}), 0, None) == ("tcp://x:1", "tcp://y:1")


@pytest.mark.parametrize("placement", [{}, {"node_for_host": {"10.9.9.9": "tcp://z:1"}}])
def test_no_node_means_the_dfs(monkeypatch, placement) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("DSTL_NODE", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.1")
    assert find_nodes(_cfg(**placement), 0, "10.0.0.1:1") == ()


def test_an_executor_the_launcher_did_not_reach_uses_its_host_s_node(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """It registered after the launcher's stage: no node of its own, no DFS writes."""
    monkeypatch.delenv("DSTL_NODE", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.2")
    placement = {"10.0.0.1:7": "tcp://n0:1", "10.0.0.2:7": "tcp://n1:1"}
    cfg = _cfg(node_for_executor=placement)
    assert find_nodes(cfg, 5, "10.0.0.2:9") == ("tcp://n1:1", "tcp://n0:1")
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.3")  # a host without a node
    assert find_nodes(cfg, 0, "10.0.0.3:9") == ("tcp://n0:1", "tcp://n1:1")
    assert find_nodes(cfg, 1, "10.0.0.3:9") == ("tcp://n1:1", "tcp://n0:1")
