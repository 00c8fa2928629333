"""Malformed topology files: mutated copies of the shipped topologies (random byte
flips, insertions, deletions, truncations, spliced hostile snippets: deep nesting, alias
bombs, huge numbers, bad UTF-8, tags) load into a TopologyConfig or raise TopologyError,
nothing else; and each limit of topology/config.py is named in its error."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstltree.topology.config import (
    MAX_BRANCHING,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    TopologyConfig,
    TopologyError,
    load_topology,
    parse_topology,
)

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def _k8s_topologies() -> Iterator[bytes]:
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
                text = doc.get("data", {}).get("topology.yaml")
                if text:
                    yield text.encode()


SEEDS: list[bytes] = [
    *(p.read_bytes() for p in sorted((ROOT / "deploy").glob("*.yaml"))),
    *_k8s_topologies(),
    b"nodes:\n  - {id: r, host: 10.0.0.5, bind: 'tcp://0.0.0.0:7700'}\n"
    b"  - {id: a, host: 'fe80::1', bind: 'tcp://[fe80::1]:7700', parent: r}\n"
    b"  - {id: b, bind: 'tcp://0.0.0.0:7700', advertise: 'tcp://b.example:7700', parent: r}\n",
    b"hosts: [a, b, c, d]\nbranching: 3\nnode_port: 7700\nbind_all: true\nmetrics_port: 0\n",
    b"branching: 4\ntarget_object_bytes: 8MiB\nstorage_options: {key: &k [1, 2], other: *k}\n",
]
BOMB = b"".join(
    b"l%d: &l%d [%s]\n" % (i, i, b", ".join([b"*l%d" % (i - 1) if i else b"x"] * 8))
    for i in range(5)
)
# 9**7 values once expanded, from 54 aliases in a few hundred bytes
BIG_BOMB = "branching: 2\nstorage_options:\n" + "".join(
    f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(7)
)
SNIPPETS = [
    b"[" * (MAX_DEPTH + 5),
    b"{a: " * (MAX_DEPTH + 5),
    b"- " * 50,
    BOMB,
    b"\xff\xfe\x80",
    b"\x00",
    b"!!float x",
    b"!!int zz",
    b"!!timestamp x",
    b"!!binary ===",
    b"!!python/object/apply:os.system ['true']",
    b"!!set {a, b}",
    b"&a [1, *a]",
    b"*undefined",
    b"<<: *a",
    b"9" * 40,
    b"9" * 5000,
    b"1e400",
    b".inf",
    b"-.inf",
    b".nan",
    b"-1",
    b"0x7fffffffffffffffffff",
    b"branching: 1000000",
    b"executors: 99999999",
    b"hosts: [" + b",".join(b"h%d" % i for i in range(300)) + b"]",
    b"? [a, b]\n: c",
    b"%YAML 1.1\n---\n",
    b"\n---\n",
    b"'unterminated",
    b'"\\xff\\u0000"',
    b"\t",
    b": : :",
    b"x" * 5000,
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        pos = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "insert", "snippet", "delete", "truncate"]))
        if kind == "flip" and pos < len(data):
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "snippet":
            data[pos:pos] = draw(st.sampled_from(SNIPPETS))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 20))]
        else:
            del data[pos:]
    return bytes(data)


def _load_or_topology_error(path: Path) -> None:
    try:
        topo = load_topology(path)
    except TopologyError as e:
        assert str(e).startswith(str(path)), e
        return
    assert isinstance(topo, TopologyConfig)
    for executors in (1, 7, MAX_NODES + 1):
        with contextlib.suppress(TopologyError):
            topo.tree(executors)
    topo.model_dump()


@given(mutated())
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_topology_files_raise_only_topology_error(text: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.yaml"
        path.write_bytes(text)
        _load_or_topology_error(path)


def _write(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "t.yaml"
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("branching: 2\nstorage_options: " + "[" * 100_000, "line 2, column "),
        ("branching: 2\nstorage_options: " + "{a: " * 10_000 + "1", "nested deeper than"),
        (b"branching: 2\nbase_path: caf\xe9\n", "not UTF-8 at byte 27"),
        (BIG_BOMB, "storage_options: more than 200000 values"),
        ("a: &a [1]\n" + "".join(f"k{i}: *a\n" for i in range(101)), "more than 100 aliases"),
        ("branching: 2\nplan_window: 1" + "0" * 30, "plan_window"),
        ("branching: 2\ntarget_object_bytes: 100000000PiB", "target_object_bytes"),
        ("branching: 2\nmax_message_bytes: 1e400", "max_message_bytes"),
        ("branching: .inf", "branching"),
        (f"branching: {MAX_BRANCHING + 1}", "branching"),
        ("branching: " + "9" * 5000, "Exceeds the limit"),
        ("branching: !!float x", "not valid YAML"),
        ("branching: 2\nbase_path: " + "x" * 5000, "base_path: a string longer than"),
        ("hosts: [" + ",".join(["'a b'"] * 50) + "]\nbranching: 2\nnode_port: 1", "hosts[0]"),
    ],
)
def test_hostile_files_name_the_field_or_position(
    tmp_path: Path, text: str | bytes, needle: str
) -> None:
    with pytest.raises(TopologyError) as info:
        load_topology(_write(tmp_path, text))
    msg = str(info.value)
    assert needle in msg and str(tmp_path) in msg
    assert len(msg) < 2000 and "Traceback" not in msg


def test_oversized_file(tmp_path: Path) -> None:
    path = _write(tmp_path, b"branching: 2\n" + b"#" * MAX_FILE_BYTES)
    with pytest.raises(TopologyError, match="at most 4194304 bytes"):
        load_topology(path)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            {"nodes": [{"id": f"n{i}"} for i in range(MAX_NODES + 1)]},
            "nodes: List should have at most",
        ),
        (
            {"hosts": [f"h{i}" for i in range(MAX_NODES + 1)], "branching": 2, "node_port": 1},
            "hosts: List should have at most",
        ),
        ({"branching": 2, "storage_options": {"k" * 5000: 1}}, "storage_options: a string"),
    ],
)
def test_counts_beyond_the_limits_name_the_field(doc: dict[str, Any], needle: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_topology(doc)
    assert needle in str(info.value)


def test_executors_beyond_the_limit() -> None:
    topo = parse_topology({"branching": MAX_BRANCHING})
    assert len(topo.tree(MAX_NODES)) == MAX_NODES
    with pytest.raises(TopologyError, match="executors: at most 10000"):
        topo.tree(MAX_NODES + 1)


def test_a_tree_at_the_node_limit_loads() -> None:
    nodes = [{"id": "n0"}] + [
        {"id": f"n{i}", "parent": f"n{(i - 1) // 8}"} for i in range(1, MAX_NODES)
    ]
    topo = parse_topology({"nodes": nodes})
    assert len(topo.tree()) == MAX_NODES


def test_a_chain_at_the_node_limit_has_linear_depths() -> None:
    nodes = [{"id": "n0"}] + [{"id": f"n{i}", "parent": f"n{i - 1}"} for i in range(1, MAX_NODES)]
    tree = parse_topology({"nodes": nodes}).tree()
    assert tree.height() == MAX_NODES - 1 and tree.depth("n7") == 7  # O(n), not O(n**2)


@pytest.mark.parametrize("port", ["\u0661\u0662", "7700\u0663", "65536", "-1", "+80"])
def test_ports_are_ascii_digits_in_range(port: str) -> None:
    with pytest.raises(TopologyError, match=r"nodes\[0\]\.bind"):
        parse_topology({"nodes": [{"id": "r", "bind": f"tcp://127.0.0.1:{port}"}]})
