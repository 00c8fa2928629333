"""The key directory's rotation state machine (dstltree.security.rotation): start,
promote and finish in order, out-of-order steps refused naming the state, what nodes
and clients started at each step use, interrupted steps, file modes, and key
directories of ``dstl keys generate`` read as before."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path

import pytest
import zmq.auth
from typer.testing import CliRunner

from dstltree.cli.app import app
from dstltree.security import (
    ClusterKeys,
    Curve,
    JobSecurity,
    KeyDirError,
    RotationError,
    abort_rotation,
    fingerprint,
    finish_rotation,
    generate_key_dir,
    key_dir_status,
    key_files,
    load_key_dir,
    promote_rotation,
    start_rotation,
    write_key_files,
)
from dstltree.security import rotation as rotation_module
from dstltree.security.keys import load_generation


@pytest.fixture
def key_dir(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    generate_key_dir(d)
    return d


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_key_dir_of_generate_reads_as_before(tmp_path: Path) -> None:
    """The files zmq.auth writes (what ``dstl keys generate`` wrote before rotation
    existed), no rotation.json: one generation, the same settings as always."""
    d = tmp_path / "old"
    d.mkdir(mode=0o700)
    for name in ("node", "writer"):
        _, secret = zmq.auth.create_certificates(d, name)
        os.chmod(secret, 0o600)
    keys = load_key_dir(d)
    assert keys.rotation is None
    assert keys.node_keys() == (keys.node.public,)
    node = Curve.for_node(keys)
    assert node.server_keys == (keys.node.public,)
    assert node.clients == frozenset({keys.node.public, keys.writer.public})
    assert Curve.for_writer(keys).server_keys == (keys.node.public,)
    status = key_dir_status(d)
    assert status.state == "stable" and status.top_level_current
    assert status.serves == fingerprint(keys.node.public)
    assert status.tries == (fingerprint(keys.node.public),)


def test_start_promote_finish(key_dir: Path) -> None:
    old = load_key_dir(key_dir)

    started = start_rotation(key_dir)
    keys = load_key_dir(key_dir)
    assert started.state == "started" and keys.rotation is not None
    new_node, new_writer = keys.rotation.other_node, keys.rotation.other_writer
    # nodes started now: serve the current key, accept both generations' clients
    assert keys.node == old.node and keys.writer == old.writer
    assert Curve.for_node(keys).keypair == old.node
    assert Curve.for_node(keys).clients == frozenset(
        {old.node.public, old.writer.public, new_node.public, new_writer.public}
    )
    # clients started now: the current writer key, both node keys (current first)
    assert Curve.for_writer(keys).server_keys == (old.node.public, new_node.public)
    assert load_generation(key_dir) == ClusterKeys(
        old.node, old.writer, key_dir
    )  # earlier versions
    assert [g[0] for g in started.generations] == ["current", "next"]

    promoted = promote_rotation(key_dir)
    keys = load_key_dir(key_dir)
    assert promoted.state == "promoted" and keys.rotation is not None
    assert keys.node.public == new_node.public and keys.node.secret is not None
    assert keys.writer.public == new_writer.public and keys.writer.secret is not None
    assert Curve.for_writer(keys).server_keys == (new_node.public, old.node.public)
    assert Curve.for_writer(keys).keypair.public == new_writer.public
    assert Curve.for_node(keys).clients == frozenset(
        {old.node.public, old.writer.public, new_node.public, new_writer.public}
    )
    assert load_generation(key_dir).node == keys.node  # the top-level files follow
    assert promoted.top_level_current
    assert [g[0] for g in promoted.generations] == ["current", "previous"]

    finished = finish_rotation(key_dir)
    keys = load_key_dir(key_dir)
    assert finished.state == "stable" and keys.rotation is None
    assert keys.node.public == new_node.public and keys.writer.public == new_writer.public
    assert Curve.for_node(keys).clients == frozenset({new_node.public, new_writer.public})
    assert sorted(p.name for p in key_dir.iterdir()) == [
        "node.key",
        "node.key_secret",
        "rotation.json",
        "writer.key",
        "writer.key_secret",
    ]
    assert json.loads((key_dir / "rotation.json").read_text()) == {"format": 1, "state": "stable"}
    start_rotation(key_dir)  # the next rotation may begin
    assert load_key_dir(key_dir).node.public == new_node.public


@pytest.mark.parametrize(
    ("done", "step", "message"),
    [
        ((), promote_rotation, r"state: stable\): dstl keys rotate start"),
        ((), finish_rotation, r"state: stable\): dstl keys rotate start"),
        ((start_rotation,), start_rotation, r"already under way \(state: started\)"),
        ((start_rotation,), finish_rotation, r"not promoted yet \(state: started\)"),
        ((start_rotation, promote_rotation), start_rotation, r"state: promoted"),
        ((start_rotation, promote_rotation), promote_rotation, r"already promoted"),
        ((), abort_rotation, r"no rotation to abort \(state: stable\)"),
    ],
)
def test_a_step_out_of_order_is_refused_naming_the_state(
    key_dir: Path, done: tuple, step: object, message: str
) -> None:
    for s in done:
        s(key_dir)
    before = _files(key_dir)
    with pytest.raises(RotationError, match=message):
        step(key_dir)  # type: ignore[operator]
    assert _files(key_dir) == before  # nothing changed


def test_abort_before_promote_leaves_the_directory_as_it_was(key_dir: Path) -> None:
    before = _files(key_dir)
    start_rotation(key_dir)
    status = abort_rotation(key_dir)
    assert status.state == "stable" and status.top_level_current
    after = _files(key_dir)
    assert json.loads(after.pop("rotation.json")) == {"format": 1, "state": "stable"}
    assert after == before  # the current generation's files, nothing of the next one
    start_rotation(key_dir)  # a new rotation may begin


def test_abort_after_promote_makes_the_previous_generation_current_again(
    key_dir: Path,
) -> None:
    old = load_key_dir(key_dir)
    start_rotation(key_dir)
    promote_rotation(key_dir)
    new = load_key_dir(key_dir)
    status = abort_rotation(key_dir)
    keys = load_key_dir(key_dir)
    assert status.state == "promoted" and status.top_level_current
    assert keys.node == old.node and keys.writer == old.writer  # current again
    assert load_generation(key_dir).node == old.node  # the top-level files follow
    # the aborted generation is still accepted and known until finish
    assert Curve.for_writer(keys).server_keys == (old.node.public, new.node.public)
    assert new.writer.public in Curve.for_node(keys).clients
    assert [g[0] for g in status.generations] == ["current", "previous"]
    finish_rotation(key_dir)
    keys = load_key_dir(key_dir)
    assert keys.rotation is None and keys.node == old.node
    assert Curve.for_node(keys).clients == frozenset({old.node.public, old.writer.public})


def test_the_cli_steps_and_status(key_dir: Path) -> None:
    runner = CliRunner()
    refused = runner.invoke(app, ["keys", "rotate", "promote", str(key_dir)])
    assert refused.exit_code == 1 and "state: stable" in refused.output
    for step, state in (("start", "started"), ("promote", "promoted"), ("finish", "stable")):
        result = runner.invoke(app, ["keys", "rotate", step, str(key_dir)])
        assert result.exit_code == 0, result.output
        status = runner.invoke(app, ["keys", "status", str(key_dir)])
        assert status.exit_code == 0 and f": {state}" in status.output
        keys = load_key_dir(key_dir)
        assert f"serves with node key {fingerprint(keys.node.public)}" in status.output
    assert runner.invoke(app, ["keys", "rotate", "start", str(key_dir)]).exit_code == 0
    aborted = runner.invoke(app, ["keys", "rotate", "abort", str(key_dir)])
    assert aborted.exit_code == 0 and ": stable" in aborted.output
    again = runner.invoke(app, ["keys", "rotate", "abort", str(key_dir)])
    assert again.exit_code == 1 and "no rotation to abort" in again.output
    missing = runner.invoke(app, ["keys", "status", str(key_dir / "nope")])
    assert missing.exit_code == 1 and "no such key directory" in missing.output


def test_modes_of_every_file_and_directory(key_dir: Path) -> None:
    start_rotation(key_dir)
    for step in (None, promote_rotation):
        if step is not None:
            step(key_dir)
        assert _mode(key_dir) == 0o700
        assert len(list(key_dir.glob("gen-*"))) == 8  # two generations, plain files
        for path in key_dir.rglob("*"):
            assert path.is_file(), path
            if path.name.endswith("_secret"):
                assert _mode(path) == 0o600, path
            else:
                assert _mode(path) == 0o644, path
        assert not list(key_dir.rglob(".*"))  # no temporary file or lock file left


def test_an_interrupted_promote_is_completed_by_running_it_again(
    key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rotation.json is the commit point: a promote interrupted after it leaves the
    state promoted (new code reads the generations), the top-level files behind;
    status says so and promote again completes them."""
    start_rotation(key_dir)
    following = load_key_dir(key_dir).rotation.other  # type: ignore[union-attr]

    def crash(d: Path, name: str) -> None:
        raise OSError("disk gone")

    with monkeypatch.context() as m:
        m.setattr(rotation_module, "_sync_top_level", crash)
        with pytest.raises(OSError, match="disk gone"):
            promote_rotation(key_dir)
    keys = load_key_dir(key_dir)
    assert keys.rotation is not None and keys.rotation.state == "promoted"
    assert fingerprint(keys.node.public) == following
    assert not key_dir_status(key_dir).top_level_current
    assert any("interrupted promote" in line for line in key_dir_status(key_dir).lines())
    assert promote_rotation(key_dir).top_level_current
    with pytest.raises(RotationError, match="already promoted"):
        promote_rotation(key_dir)


def test_an_interrupted_start_leaves_the_directory_stable(
    key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = load_key_dir(key_dir)

    def crash(gens: Path) -> str:
        raise OSError("killed")

    with monkeypatch.context() as m:
        m.setattr(rotation_module, "_new_generation", crash)
        with pytest.raises(OSError, match="killed"):
            start_rotation(key_dir)
    assert load_key_dir(key_dir) == before and key_dir_status(key_dir).state == "stable"
    start_rotation(key_dir)  # what the crash left is replaced
    assert len(list(key_dir.glob("gen-*"))) == 8


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    target.write_text("old")

    def broken(fd: int) -> None:
        raise OSError("no space")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="no space"):
        rotation_module._write_atomic(target, "new", 0o600)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_one_step_at_a_time(key_dir: Path) -> None:
    fd = os.open(key_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(RotationError, match="another rotation step"):
            start_rotation(key_dir)
    finally:
        os.close(fd)
    assert start_rotation(key_dir).state == "started"


def test_generate_refuses_a_directory_in_rotation(key_dir: Path) -> None:
    start_rotation(key_dir)
    with pytest.raises(KeyDirError, match="rotation is under way"):
        generate_key_dir(key_dir, force=True)


def test_rotation_needs_the_full_key_directory(tmp_path: Path) -> None:
    node_host = write_key_files(key_files(ClusterKeys.generate()), tmp_path / "host")
    with pytest.raises(RotationError, match="full key directory"):
        start_rotation(node_host)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{", "not JSON"),
        ('{"format": 2, "state": "stable"}', "format 1"),
        ('{"format": 1, "state": "rotating"}', "none of stable"),
        ('{"format": 1, "state": "started", "current": "../../etc", "next": "0"}', "current"),
        (json.dumps({"format": 1, "state": "stable", "pad": "x" * 5000}), "4 KiB"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_file(
    key_dir: Path, doc: str, message: str
) -> None:
    (key_dir / "rotation.json").write_text(doc)
    with pytest.raises(KeyDirError, match=f"rotation.json: .*{message}"):
        load_key_dir(key_dir)


def test_a_missing_generation_is_named(key_dir: Path) -> None:
    start_rotation(key_dir)
    following = load_key_dir(key_dir).rotation.other  # type: ignore[union-attr]
    for path in key_dir.glob(f"gen-{following}.node.*"):
        path.unlink()
    with pytest.raises(KeyDirError, match=f"neither gen-{following}.node.key_secret"):
        load_key_dir(key_dir)


def test_keys_shipped_to_executor_nodes_carry_the_rotation(key_dir: Path, tmp_path: Path) -> None:
    start_rotation(key_dir)
    promote_rotation(key_dir)
    keys = load_key_dir(key_dir)
    shipped = load_key_dir(write_key_files(key_files(keys), tmp_path / "shipped"))
    assert shipped.node == keys.node and shipped.writer == keys.writer.public_only()
    assert shipped.rotation == keys.rotation
    assert Curve.for_node(shipped) == Curve.for_node(keys)
    for path in (tmp_path / "shipped").iterdir():
        assert path.is_file() and _mode(path) == 0o600, path
        assert not path.name.endswith("writer.key_secret")
    for bad in ("../escape", "sub/file", ".."):
        with pytest.raises(KeyDirError, match="not a plain file name"):
            write_key_files({bad: "x"}, tmp_path / "bad")


def test_the_tasks_get_both_node_keys_during_a_rotation(key_dir: Path) -> None:
    start_rotation(key_dir)
    keys = load_key_dir(key_dir)
    nodes = JobSecurity.make(True, keys).nodes
    assert nodes is not None and nodes.keypair == keys.writer
    assert nodes.server_keys == keys.node_keys() and len(nodes.server_keys) == 2
