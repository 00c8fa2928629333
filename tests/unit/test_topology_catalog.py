"""The shipped topologies and their short names (topology/catalog.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.topology import load_topology
from dstltree.topology.catalog import named_topologies, topology_path
from dstltree.topology.tree import TopologyError

REPO = Path(__file__).resolve().parents[2]


def test_every_deploy_topology_is_shipped_under_its_short_name() -> None:
    names = named_topologies()
    assert set(names) == {"bench", "cluster", "cluster-hosts", "local", "s3"}
    for name, path in names.items():
        assert (REPO / "deploy" / f"{name}.yaml").resolve() == path.resolve()
        assert load_topology(name).nodes is not None or load_topology(name).branching


def test_a_name_a_name_with_suffix_and_a_path_all_resolve(tmp_path: Path) -> None:
    assert topology_path("local") == named_topologies()["local"]
    assert topology_path("s3.yaml") == named_topologies()["s3"]
    own = tmp_path / "local"  # a file of that name wins over the shipped one
    own.write_text("branching: 2\n")
    assert topology_path(own) == own
    assert load_topology(own).branching == 2


@pytest.mark.parametrize("spec", ["nope", "../local", "deploy/nope.yaml", "LOCAL"])
def test_an_unknown_name_lists_the_shipped_ones(spec: str) -> None:
    with pytest.raises(TopologyError, match="shipped: bench, cluster-hosts, cluster, local, s3"):
        topology_path(spec)
