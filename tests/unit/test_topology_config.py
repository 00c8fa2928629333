"""Topology YAML: validated with pydantic; errors name the field or node."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dstltree.topology import TopologyConfig, TopologyError, kary_tree, load_topology
from dstltree.topology.config import NodeSpec, parse_topology

ROOT = Path(__file__).resolve().parents[2]


def _load(tmp_path: Path, text: str):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    return load_topology(p)


def _deploy_topologies() -> list[tuple[str, dict]]:
    """Every topology shipped in deploy/: each YAML file (any folder) that is not a
    Kubernetes object, and the ``topology.yaml`` of every ConfigMap."""
    out = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        name = str(path.relative_to(ROOT))
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            if "kind" not in doc:
                out.append((name, doc))
            elif doc["kind"] == "ConfigMap" and "topology.yaml" in doc.get("data", {}):
                out.append((f"{name}:topology.yaml", yaml.safe_load(doc["data"]["topology.yaml"])))
    return out


def test_shipped_topologies_are_valid() -> None:
    local = load_topology(ROOT / "deploy/local.yaml")
    tree = local.tree()
    assert len(tree) == 7 and tree.root == "root" and tree.height() == 2
    cluster = load_topology(ROOT / "deploy/cluster.yaml")
    assert len(cluster.tree(executors=20)) == 20
    hosts = load_topology(ROOT / "deploy/cluster-hosts.yaml")
    assert len(hosts.host_nodes()) == 3 and hosts.tree().children("n0") == ["n1", "n2"]


@pytest.mark.parametrize(("name", "doc"), _deploy_topologies(), ids=lambda v: str(v)[:40])
def test_every_deploy_topology_loads_and_round_trips(name: str, doc: dict) -> None:
    topo = parse_topology(doc, source=name)
    again = parse_topology(topo.model_dump(mode="json", exclude_none=True), source=name)
    assert again == topo
    if topo.nodes is not None:
        assert len(topo.tree()) == len(topo.nodes)


def test_deploy_has_topologies() -> None:
    names = {n for n, _ in _deploy_topologies()}
    assert {"deploy/local.yaml", "deploy/cluster.yaml", "deploy/cluster-hosts.yaml"} <= names


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes: [{id: a}, {id: b, parent: zz}]", "nodes[1].parent: unknown node 'zz'"),
        ("nodes: [{id: a}, {id: a, parent: a}]", "nodes[1].id: duplicate"),
        ("nodes: [{id: a, parent: b}, {id: b, parent: a}]", "cycle through a -> b -> a"),
        ("nodes: [{id: r}, {id: a, parents: [r, zz]}]", "nodes[1].parents[1]: unknown node 'zz'"),
        ("nodes: [{id: r}, {id: a, parents: [r, a]}]", "nodes[1].parents[1]: node 'a' is its own"),
        ("nodes: [{id: r}, {id: a, parents: [r, r]}]", "names parent 'r' twice"),
        ("nodes: [{id: r}, {id: a, parent: r, parents: [b]}, {id: b}]", "nodes[1]: parents"),
        ("nodes: [{id: r}, {id: a, parents: []}]", "nodes[1].parents"),
        (
            "nodes: [{id: r}, {id: a, parents: [r, b]}, {id: b, parents: [r, c]},"
            " {id: c, parents: [r, a]}]",
            "parents form a cycle through",
        ),
        ("nodes: [{id: a, bind: 'http://x'}]", "nodes[0]"),
        ("branching: 0", "branching"),
        ("branching: 2\ntarget_object_bytes: lots", "target_object_bytes"),
        ("branching: 2\npersist_delay: -1", "persist_delay"),
        ("branching: 2\nnodes: [{id: a}]", "exactly one of"),
        ("branching: 2\nbogus: 1", "bogus"),
        ("- just a list", "mapping"),
        ("nodes: [{id: a, parent: b}, {id: b, parent: a}, {id: c}]", "nodes"),
        ("branching: 2\nupload_copies: 3\nupload_attempts: 2", "upload_copies"),
        ("branching: 2\nupload_adaptive_percentile: 0", "upload_adaptive_percentile"),
        ("branching: 2\nobject_prefixes: 0", "object_prefixes"),
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


def test_upload_settings_reach_the_node_policy_and_store(tmp_path: Path) -> None:
    from dstltree.aggregator.process import upload_policy

    t = _load(
        tmp_path,
        "branching: 4\nupload_adaptive_percentile: 75\nupload_copies: 2\n"
        "upload_copies_max_bytes: 4MiB\nthrottle_quiet: 5\nobject_prefixes: 16",
    )
    p = upload_policy(t)
    assert (p.adaptive_percentile, p.copies, p.copies_max_bytes) == (75, 2, 4 * 1024 * 1024)
    assert p.throttle_quiet == 5 and p.attempts == 3 and t.object_prefixes == 16
    default = upload_policy(_load(tmp_path, "branching: 4"))
    assert (default.adaptive_percentile, default.copies) == (None, 1)


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


# -- nodes by host ---------------------------------------------------------------------


def _hosts(n: int, **fields: object) -> TopologyConfig:
    doc = {"hosts": [f"10.0.0.{i + 1}" for i in range(n)], "branching": 2, "node_port": 7700}
    return parse_topology({**doc, **fields})


def test_hosts_generate_a_kary_tree_in_list_order() -> None:
    topo = _hosts(6)
    tree = topo.tree()
    assert tree.nodes == ["n0", "n1", "n2", "n3", "n4", "n5"]
    assert tree.children("n0") == ["n1", "n2"] and tree.children("n1") == ["n3", "n4"]
    assert tree.parent("n5") == "n2" and tree.depth("n5") == 2
    assert topo.tree(executors=99).nodes == tree.nodes  # executors: no meaning here
    n3 = topo.spec("n3")
    assert (n3.host, n3.bind, n3.advertise) == ("10.0.0.4", "tcp://10.0.0.4:7700", n3.bind)


def test_hosts_advertised_endpoints_and_lookups() -> None:
    topo = _hosts(3, bind_all=True)
    assert topo.spec("n1").bind == "tcp://0.0.0.0:7700"
    assert topo.host_nodes() == {
        "10.0.0.1": "tcp://10.0.0.1:7700",
        "10.0.0.2": "tcp://10.0.0.2:7700",
        "10.0.0.3": "tcp://10.0.0.3:7700",
    }
    assert topo.node_for_host("10.0.0.3") == "n2"
    assert topo.node_for_host("10.9.9.9") is None
    assert topo.advertised("n1") == "tcp://10.0.0.2:7700"
    with pytest.raises(KeyError):
        topo.advertised("zz")


def test_explicit_nodes_by_host() -> None:
    topo = parse_topology(
        {
            "nodes": [
                {"id": "r", "host": "worker-1", "bind": "tcp://0.0.0.0:7700"},
                {"id": "a", "host": "10.0.0.2", "bind": "tcp://10.0.0.2:7701", "parent": "r"},
                {"id": "b", "bind": "tcp://*:7702", "advertise": "tcp://b.lan:7702", "parent": "r"},
                {"id": "c", "bind": "auto", "parent": "r"},
                {"id": "d", "bind": "ipc:///tmp/d.sock", "parent": "r"},
                {"id": "v6", "host": "::1", "bind": "tcp://[::]:7703", "parent": "r"},
            ]
        }
    )
    assert topo.advertised("r") == "tcp://worker-1:7700"  # wildcard bind: the host
    assert topo.advertised("a") == "tcp://10.0.0.2:7701"  # concrete bind: itself
    assert topo.advertised("b") == "tcp://b.lan:7702"
    assert topo.advertised("c") is None  # a free port: known once the node runs
    assert topo.advertised("d") == "ipc:///tmp/d.sock"
    assert topo.advertised("v6") == "tcp://[::1]:7703"
    assert topo.node_for_host("WORKER-1") == "r" and topo.node_for_host("[::1]") == "v6"
    assert list(topo.host_nodes()) == ["worker-1", "10.0.0.2", "::1"]


def test_topologies_without_hosts_have_no_host_nodes() -> None:
    local = load_topology(ROOT / "deploy/local.yaml")
    assert local.host_nodes() == {} and local.node_for_host("127.0.0.1") is None
    assert local.advertised("a") is None
    cluster = load_topology(ROOT / "deploy/cluster.yaml")
    assert cluster.host_nodes() == {} and cluster.advertised("e3") is None
    with pytest.raises(TopologyError, match="executor count"):
        cluster.tree()


def test_host_topology_round_trips_through_model_dump() -> None:
    topo = _hosts(5, bind_all=True, metrics_port=9400)
    doc = topo.model_dump(mode="json", exclude_none=True)
    assert "nodes" not in doc and doc["hosts"][4] == "10.0.0.5" and doc["node_port"] == 7700
    again = parse_topology(yaml.safe_load(yaml.safe_dump(doc)))
    assert again == topo and again.nodes == topo.nodes
    explicit = parse_topology({"nodes": [n.model_dump() for n in topo.nodes or []]})
    assert explicit.host_nodes() == topo.host_nodes()
    assert parse_topology(explicit.model_dump()) == explicit


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"hosts": ["a", "b", "a"], "branching": 2, "node_port": 1}, "hosts[2]: duplicate host"),
        ({"hosts": ["a", "b c"], "branching": 2, "node_port": 1}, "hosts[1]: not a host"),
        ({"hosts": ["a", "tcp://x:1"], "branching": 2, "node_port": 1}, "hosts[1]"),
        ({"hosts": [], "branching": 2, "node_port": 1}, "hosts: at least one"),
        ({"hosts": ["a"], "branching": 2}, "node_port: needed with 'hosts'"),
        ({"hosts": ["a"], "node_port": 7700}, "branching: needed with 'hosts'"),
        ({"hosts": ["a"], "branching": 2, "node_port": 70000}, "node_port"),
        ({"hosts": ["a"], "branching": 2, "node_port": 0}, "node_port"),
        ({"hosts": ["a"], "branching": 2, "node_port": 1, "nodes": [{"id": "a"}]}, "not both"),
        ({"branching": 2, "node_port": 7700}, "node_port: only used with 'hosts'"),
        ({"branching": 2, "bind_all": True}, "bind_all: only used with 'hosts'"),
    ],
)
def test_host_list_errors_name_the_field(doc: dict, needle: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_topology(doc)
    assert needle in str(info.value)


_ROOT = {"id": "r", "bind": "auto"}


@pytest.mark.parametrize(
    ("node", "needle"),
    [
        ({"bind": "tcp://0.0.0.0:7700"}, "nodes[3].advertise: bind 'tcp://0.0.0.0:7700' listens"),
        ({"bind": "tcp://*:7700"}, "nodes[3].advertise: bind 'tcp://*:7700' listens"),
        ({"bind": "tcp://0.0.0.0:0", "host": "h"}, "nodes[3].advertise: node on host 'h'"),
        ({"host": "h"}, "nodes[3].advertise: node on host 'h' needs an endpoint"),
        ({"advertise": "tcp://0.0.0.0:7700"}, "nodes[3].advertise: advertise must be a concrete"),
        ({"advertise": "tcp://h:0"}, "nodes[3].advertise: advertise must be a concrete"),
        ({"advertise": "tcp://h"}, "nodes[3].advertise"),
        ({"advertise": "ipc:///tmp/x"}, "nodes[3].advertise: not a tcp endpoint"),
        ({"bind": "tcp://h:65536"}, "nodes[3].bind: port must be 0..65535"),
        ({"bind": "tcp://h:x"}, "nodes[3].bind: port must be"),
        ({"host": "a b", "bind": "tcp://h:1"}, "nodes[3].host: not a host"),
        ({"host": "0.0.0.0", "bind": "tcp://h:1"}, "nodes[3].host: not a host"),
        ({"host": "X1", "bind": "tcp://h:1"}, "nodes[3].host: duplicate host 'X1' (node 'x1')"),
    ],
)
def test_node_host_errors_name_the_field(node: dict, needle: str) -> None:
    nodes = [
        _ROOT,
        {"id": "x1", "host": "x1", "bind": "tcp://x1:7700", "parent": "r"},
        {"id": "x2", "bind": "auto", "parent": "r"},
        {"id": "bad", "parent": "r", **node},
    ]
    with pytest.raises(TopologyError) as info:
        parse_topology({"nodes": nodes})
    assert needle in str(info.value)


def test_node_spec_validates_on_its_own() -> None:
    assert NodeSpec(id="a", bind="tcp://0.0.0.0:7", host="h").advertised == "tcp://h:7"
    with pytest.raises(ValueError, match="advertise"):
        NodeSpec(id="a", bind="tcp://0.0.0.0:7")


def test_a_dag_of_nodes_with_second_parents_and_two_roots(tmp_path: Path) -> None:
    t = _load(
        tmp_path,
        "nodes: [{id: r1}, {id: r2}, {id: a, parent: r1}, {id: b, parents: [r2, a]},"
        " {id: c, parents: [a, b, r1]}]",
    )
    tree = t.tree()
    assert tree.roots == ("r1", "r2")
    assert tree.parents("b") == ("r2", "a")
    assert tree.parents("c") == ("a", "b", "r1")
    assert tree.parents("r2") == ()
    order = tree.topological()
    assert order.index("a") < order.index("b") < order.index("c")


def test_the_cycle_error_names_every_node_on_it(tmp_path: Path) -> None:
    with pytest.raises(TopologyError) as info:
        _load(
            tmp_path,
            "nodes: [{id: r}, {id: a, parents: [r, c]}, {id: b, parents: [r, a]},"
            " {id: c, parents: [r, b]}]",
        )
    message = str(info.value)
    assert "cycle" in message and all(f"{n}" in message for n in ("a -> ", "b -> ", "c -> "))


def test_generated_topologies_give_every_node_a_second_parent_in_another_subtree(
    tmp_path: Path,
) -> None:
    hosts = [f"10.0.0.{i}" for i in range(1, 8)]
    t = _load(tmp_path, f"hosts: {hosts}\nbranching: 2\nnode_port: 7700")
    tree = t.tree()
    for node in tree.nodes:
        parents = tree.parents(node)
        if len(parents) == 2:  # another subtree: a way up that avoids the first parent
            assert node not in tree.subtree(parents[1])
            assert parents[1] not in tree.ancestors(parents[0])
            if tree.parent(parents[0]) is not None:  # below the root: another subtree
                assert parents[1] not in tree.subtree(parents[0])
    assert sum(len(tree.parents(n)) == 2 for n in tree.nodes) == 5  # all but root and n1
    plain = _load(tmp_path, f"hosts: {hosts}\nbranching: 2\nnode_port: 7700\nsecond_parents: false")
    assert all(len(plain.tree().parents(n)) <= 1 for n in plain.tree().nodes)
    by_branching = _load(tmp_path, "branching: 3").tree(40)
    assert by_branching.fallbacks and len(by_branching.topological()) == 40
