"""Topology YAML: validated with pydantic; errors name the field or node."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.topology import TopologyConfig, TopologyError, kary_tree, load_topology

ROOT = Path(__file__).resolve().parents[2]


def _load(tmp_path: Path, text: str):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    return load_topology(p)


def test_shipped_topologies_are_valid() -> None:
    local = load_topology(ROOT / "deploy/local.yaml")
    tree = local.tree()
    assert len(tree) == 7 and tree.root == "root" and tree.height() == 2
    cluster = load_topology(ROOT / "deploy/cluster.yaml")
    assert len(cluster.tree(executors=20)) == 20


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes: [{id: a}, {id: b, parent: zz}]", "nodes[1].parent: unknown node 'zz'"),
        ("nodes: [{id: a}, {id: a, parent: a}]", "nodes[1].id: duplicate"),
        ("nodes: [{id: a}, {id: b}]", "exactly one root"),
        ("nodes: [{id: a, bind: 'http://x'}]", "nodes[0]"),
        ("branching: 0", "branching"),
        ("branching: 2\ntarget_object_bytes: lots", "target_object_bytes"),
        ("branching: 2\npersist_delay: -1", "persist_delay"),
        ("branching: 2\nnodes: [{id: a}]", "exactly one of"),
        ("branching: 2\nbogus: 1", "bogus"),
        ("- just a list", "mapping"),
        ("nodes: [{id: a, parent: b}, {id: b, parent: a}, {id: c}]", "nodes"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(TopologyError) as info:
        _load(tmp_path, text)
    assert needle in str(info.value)


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="not valid YAML"):
        _load(tmp_path, "nodes: [")
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")


def test_sizes_accept_units(tmp_path: Path) -> None:
    t = _load(tmp_path, "branching: 4\ntarget_object_bytes: 8MiB")
    assert int(t.target_object_bytes) == 8 * 1024 * 1024


def test_kary_tree_shape() -> None:
    t = kary_tree(13, 3)
    assert t.root == "e0" and t.children("e0") == ["e1", "e2", "e3"]
    assert t.ancestors("e12") == ["e3", "e0"]
    with pytest.raises(TopologyError):
        kary_tree(0, 2)


def test_ack_timeout_grows_with_depth_so_ancestors_give_up_first() -> None:
    topo = TopologyConfig(branching=2, parent_timeout=1.5)
    assert [topo.ack_timeout(d) for d in range(4)] == [1.5, 1.5, 3.0, 4.5]
    with pytest.raises(ValueError, match="depth"):
        topo.ack_timeout(-1)


def test_the_tree_module_does_not_import_the_schema() -> None:
    """topology.tree is imported by topology.config, never the other way round."""
    import ast

    def imports(name: str) -> set[str]:
        tree = ast.parse((ROOT / "topology" / f"{name}.py").read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}

    assert "dstltree.topology.tree" in imports("config")
    assert not {m for m in imports("tree") if m.startswith("dstltree.")}
