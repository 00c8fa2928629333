"""The structured-streaming bridge against a REAL aggregator node, over its Unix socket:
files in and out, few objects, restarts, deletions, hostile frames, the node down."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstltree.client import ObjectStore
from dstltree.structured_streaming import wire
from dstltree.structured_streaming.bridge import Bridge, BridgeInUse
from tests.support.ss_client import BridgeClient
from tests.support.tree_fixtures import start
from tests.support.waiting import wait_until

ROOT = "file:/tmp/checkpoints/query-1"
ONE_NODE = [{"id": "root", "bind": "auto"}]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    with start(tmp_path, ONE_NODE, security={"curve": False}) as t:
        yield t


@pytest.fixture
def slow_tree(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    """One node whose batches close on its all-persisted rule, not on the delay:
    a busy machine cannot split a flush of the bridge into more objects."""
    with start(tmp_path, ONE_NODE, security={"curve": False}, persist_delay=5.0) as t:
        yield t


def _bridge(tmp_path: Path, tree, **kw) -> Bridge:  # type: ignore[no-untyped-def]
    node = None if tree is None else tree.address("root")
    return Bridge.open(tmp_path / "run" / "bridge.sock", str(tmp_path / "dfs"), node, **kw)


def _objects(tmp_path: Path) -> list[str]:
    """Written objects (a node keeps empty object files created ahead)."""
    store = ObjectStore(str(tmp_path / "dfs"))
    return [i.url for i in store.list_info(store.changelog_root()) if i.size > 0]


def test_files_in_and_out_through_the_node(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    big = os.urandom(3 * 1024 * 1024 + 17)  # four changes of at most 1 MiB
    with _bridge(tmp_path, tree) as b, BridgeClient(b.socket_path) as c:
        assert stat.S_IMODE(b.socket_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(b.socket_path.parent.stat().st_mode) == 0o700
        assert c.put(ROOT, "state/0/0/1.changelog", b"one")["length"] == 3
        assert c.read_all(ROOT, "state/0/0/1.changelog") == b"one"  # before durable
        assert c.put(ROOT, "state/0/0/2.zip", big, chunk=wire.MAX_PAYLOAD)["length"] == len(big)
        assert c.put(ROOT, "state/0/0/SSTs/000001-ab.sst", b"")["length"] == 0
        assert c.commit(ROOT)["ok"]
        assert c.read_all(ROOT, "state/0/0/2.zip") == big
        h, part = c.call(
            {"op": "read", "root": ROOT, "path": "state/0/0/2.zip", "offset": 5, "length": 7}
        )
        assert part == big[5:12] and h["length"] == 7
        assert c.stat(ROOT, "state/0/0/2.zip") == {"ok": True, "exists": True, "length": len(big)}
        assert c.stat(ROOT, "state/0/0/9.delta")["exists"] is False
        listed = c.list(ROOT, "state/0/0")
        names = [(f["name"], f["length"]) for f in listed["files"]]
        assert names == [("1.changelog", 3), ("2.zip", len(big))] and listed["dirs"] == ["SSTs"]
        assert c.list(ROOT, "state")["dirs"] == ["0"]
        assert c.put(ROOT, "state/0/0/1.changelog", b"replaced")["length"] == 8
        assert c.delete(ROOT, "state/0/0/SSTs/000001-ab.sst") is True
        assert c.delete(ROOT, "state/0/0/SSTs/000001-ab.sst") is False
        assert c.commit(ROOT)["ok"]
        assert c.read_all(ROOT, "state/0/0/1.changelog") == b"replaced"
        h, _ = c.call(
            {"op": "read", "root": ROOT, "path": "state/0/0/7.delta", "offset": 0, "length": 1}
        )
        assert h["code"] == "not-found"


def test_a_batch_of_the_committing_application_lands_in_one_object(  # type: ignore[no-untyped-def]
    tmp_path: Path, slow_tree
) -> None:
    """Once an application committed the root here (the driver's host), its files
    are held until its next commit and persisted together: 200 files, one object."""
    with _bridge(tmp_path, slow_tree) as b:
        clients = [BridgeClient(b.socket_path, app="app-1") for _ in range(4)]
        assert clients[0].commit(ROOT)["files"] == 0  # the driver's first commit
        assert clients[0].drive(ROOT)["ok"]  # offsets/<N>: the next batch runs

        def write(i: int) -> None:
            for p in range(50):
                clients[i].put(ROOT, f"state/0/{i * 50 + p}/1.changelog", b"x" * 500)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert b.files.counts["held"] == 200 and _objects(tmp_path) == []
        assert clients[1].read_all(ROOT, "state/0/7/1.changelog") == b"x" * 500  # held
        assert len(clients[1].list(ROOT, "state/0")["dirs"]) == 200
        h = clients[0].commit(ROOT)
        assert h["ok"] and h["files"] == 200  # files it waited for
        # one flush of 200 persists: the node closes its batch once all 200 persisted
        assert len(_objects(tmp_path)) == 1
        assert clients[0].drive(ROOT)["ok"]
        assert clients[2].delete(ROOT, "state/0/7/1.changelog") is True  # held too
        assert clients[0].commit(ROOT)["files"] == 1
        for c in clients:
            c.close()
    assert len(_objects(tmp_path)) == 2  # the deletion's tombstone: one more


def test_a_driver_announced_by_drive_has_its_first_batch_held(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    """``drive`` (the driver writes offsets/<N>) makes the application's puts held before
    its first commit: the first batch lands in one object too."""
    with _bridge(tmp_path, tree) as b, BridgeClient(b.socket_path, app="app-3") as c:
        boot = c.ok({"op": "drive", "root": ROOT})["boot"]
        assert boot == b.files.boot
        for p in range(20):
            c.put(ROOT, f"state/0/{p}/1.changelog", b"w" * 50)
        assert b.files.counts["held"] == 20 and _objects(tmp_path) == []
        h, _ = c.call({"op": "commit", "root": ROOT, "timeout": 5, "boot": "0123abcd"})
        assert h["code"] == "unavailable" and "restarted" in h["error"]  # not this process
    with _bridge(tmp_path, tree) as b, BridgeClient(b.socket_path, app="app-3") as c:
        c.ok({"op": "drive", "root": ROOT})
        for p in range(20, 40):
            c.put(ROOT, f"state/0/{p}/1.changelog", b"w" * 50)
        h, _ = c.call({"op": "commit", "root": ROOT, "timeout": 5, "boot": b.files.boot})
        assert h == {"ok": True, "files": 20}
    assert 2 <= len(_objects(tmp_path)) <= 4  # the first bridge's 20 persisted when it stopped


def test_files_of_an_application_committing_elsewhere_are_durable_at_the_reply(
    tmp_path: Path,
    tree,  # type: ignore[no-untyped-def]
) -> None:
    """An executor whose driver commits on another host: each put is durable before
    its reply, even after another application committed the root here."""
    with _bridge(tmp_path, tree) as b:
        with BridgeClient(b.socket_path, app="driver-here") as d:
            assert d.commit(ROOT)["ok"]
        with BridgeClient(b.socket_path, app="app-2") as c:
            for p in range(3):
                assert c.put(ROOT, f"state/0/{p}/1.changelog", b"y" * 100)["ok"]
                assert b.files.view.pending(ROOT) == set()  # durable at the reply
            assert b.files.counts["held"] == 0
    assert len(_objects(tmp_path)) >= 1


def test_held_writes_are_persisted_after_max_hold_without_a_commit(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    with _bridge(tmp_path, tree, manifest_interval=0.1) as b:
        b.files.max_hold = 0.2
        with BridgeClient(b.socket_path, app="a") as c:
            assert c.commit(ROOT)["ok"]
            assert c.drive(ROOT)["ok"]  # a batch runs and never commits
            c.put(ROOT, "state/0/0/1.changelog", b"z")
            assert b.files.counts["held"] == 1
            wait_until(lambda: not b.files.view.pending(ROOT), timeout=20)
    assert len(_objects(tmp_path)) == 1


def test_a_root_still_writing_is_not_cut_by_max_hold(tmp_path: Path, slow_tree) -> None:  # type: ignore[no-untyped-def]
    """``max_hold`` counts from a root's newest held write, not each write's own: a
    first batch on the S3 model at 200 partitions writes for over 5 minutes, and its
    oldest files were persisted one by one while the rest were still held."""
    import dataclasses

    with _bridge(tmp_path, slow_tree) as b, BridgeClient(b.socket_path, app="s") as c:
        assert c.commit(ROOT)["ok"] and c.drive(ROOT)["ok"]
        for p in range(5):
            c.put(ROOT, f"state/0/{p}/1.changelog", b"q" * 10)
        with b.files.cond:  # the first write held long ago, the last one just now
            held = b.files._held[ROOT]
            held[0] = dataclasses.replace(held[0], since=held[0].since - 1000)
        assert b.files.flush(older_than=b.files.max_hold) == 0
        with b.files.cond:  # now the whole root has been quiet for max_hold
            b.files._held[ROOT] = [dataclasses.replace(h, since=h.since - 1000) for h in held]
        assert b.files.flush(older_than=b.files.max_hold) == 5
        assert c.commit(ROOT)["ok"]
    assert len(_objects(tmp_path)) == 1


def _start_process(tmp_path: Path, tree, sock: Path, *more: str) -> subprocess.Popen:  # type: ignore[no-untyped-def,type-arg]
    topo = tmp_path / "topology.yaml"
    cmd = [sys.executable, "-m", "dstltree.structured_streaming.bridge", "--topology", str(topo)]
    cmd += ["--socket", str(sock), "--base-path", str(tmp_path / "dfs")]
    cmd += ["--node", tree.address("root"), "--ack-timeout", "2", *more]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    assert _line(proc) == f"bridge ready on {sock}"
    return proc


def _line(proc: subprocess.Popen) -> str:  # type: ignore[type-arg]
    """The process's next stdout line (stripped), waiting at most 60 s."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    assert lines, "no line within 60 s"
    return lines[0].strip()


def test_the_bridge_process_serves_prometheus_metrics(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    import urllib.request

    sock = tmp_path / "run" / "m.sock"
    proc = _start_process(tmp_path, tree, sock, "--metrics-port", "0")
    try:
        url = _line(proc).removeprefix("bridge metrics on ")
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        with BridgeClient(sock, app="m") as c:
            assert c.commit(ROOT)["ok"] and c.drive(ROOT)["ok"]
            c.put(ROOT, "state/0/0/1.changelog", b"12345")  # held: the driver is here

            def scrape() -> str:
                with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
                    return str(r.read().decode())

            text = scrape()
            assert "dstltree_bridge_puts_total 1.0" in text
            assert "dstltree_bridge_held_total 1.0" in text
            assert 'dstltree_bridge_bytes{kind="held"} 5.0' in text
            assert c.commit(ROOT)["files"] == 1
            text = scrape()
            assert "dstltree_bridge_durable_total 1.0" in text
            assert 'dstltree_bridge_bytes{kind="held"} 0.0' in text
            assert "dstltree_bridge_queries 1.0" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def _manifests(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "dfs" / "ss").rglob("manifest-*.json"))


def test_a_restarted_bridge_rebuilds_its_view_from_manifest_and_indexes(
    tmp_path: Path, tree
) -> None:  # type: ignore[no-untyped-def]
    sock = tmp_path / "run" / "b.sock"
    first = _start_process(tmp_path, tree, sock)
    try:
        with BridgeClient(sock) as c:
            for v in range(1, 4):
                c.put(ROOT, f"state/0/0/{v}.changelog", f"v{v}".encode())
            c.delete(ROOT, "state/0/0/1.changelog")
            assert c.commit(ROOT)["ok"]
            wait_until(lambda: len(_manifests(tmp_path)) >= 1, timeout=20)
            c.put(ROOT, "state/0/0/4.changelog", b"after the manifest")
            c.put(ROOT, "state/0/0/2.changelog", b"v2 again")
            c.delete(ROOT, "state/0/0/3.changelog")
            assert c.commit(ROOT)["ok"]
        other = Bridge.open(sock, str(tmp_path / "dfs"))
        with pytest.raises(BridgeInUse):  # the path is taken by a live bridge
            other.start()
        other.files.client.close()
    finally:
        os.kill(first.pid, signal.SIGKILL)  # a crash: no last manifest
        first.wait(30)
    second = _start_process(tmp_path, tree, sock)  # stale socket replaced
    try:
        with BridgeClient(sock) as c:
            names = [f["name"] for f in c.list(ROOT, "state/0/0")["files"]]
            assert names == ["2.changelog", "4.changelog"]
            assert c.read_all(ROOT, "state/0/0/2.changelog") == b"v2 again"
            assert c.read_all(ROOT, "state/0/0/4.changelog") == b"after the manifest"
            assert c.stat(ROOT, "state/0/0/4.changelog")["length"] == 18
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    assert not sock.exists()


def test_deletion_releases_objects(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    with _bridge(tmp_path, tree, manifest_interval=3600) as b, BridgeClient(b.socket_path) as c:
        paths = [f"state/1/{p}/5.delta" for p in range(20)]
        for p in paths:
            c.put(ROOT, p, b"data" * 100)
        assert c.commit(ROOT)["ok"]
        assert _objects(tmp_path)
        for p in paths:
            assert c.delete(ROOT, p)
        assert c.commit(ROOT)["ok"]

        def released() -> bool:
            b.files.housekeep()
            return not _objects(tmp_path)

        wait_until(released, timeout=30, interval=0.1)
        assert c.list(ROOT, "state/1")["dirs"] == []


def _copy_object(url: str, name: str) -> str:
    """A second copy of a written object, as a node leaves one when a writer sends a
    batch again after a silence or falls back to the DFS (same rows, another name)."""
    src = Path(url.removeprefix("file://"))
    dst = src.with_name(name)
    shutil.copyfile(src, dst)
    return str(dst)


def test_copies_of_writes_are_swept_and_the_originals_stay(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    from dstltree.cli.commands.inspect import inspect_base

    paths = [f"state/2/{p}/7.changelog" for p in range(3)]
    with _bridge(tmp_path, tree, manifest_interval=3600) as b, BridgeClient(b.socket_path) as c:
        for p in paths:
            c.put(ROOT, p, p.encode())
        assert c.commit(ROOT)["ok"]
        written = _objects(tmp_path)
        copies = [_copy_object(u, f"copy-{i}.dstl") for i, u in enumerate(written)]
        assert b.files.sweep(min_age=3600.0) == 0  # too young for a running bridge's sweep
        assert all(Path(u).exists() for u in copies)
        assert b.files.sweep(min_age=0.0) == len(copies)
        assert {Path(u).name for u in _objects(tmp_path)} == {Path(u).name for u in written}
        assert [c.read_all(ROOT, p) for p in paths] == [p.encode() for p in paths]
        copies = [_copy_object(u, f"late-{i}.dstl") for i, u in enumerate(written)]
    assert b.files.counts["orphans_deleted"] == 2 * len(written)  # the last ones at the stop
    assert not any(Path(u).exists() for u in copies)
    tree.stop()  # the node deletes the object files it keeps created ahead
    info = inspect_base(str(tmp_path / "dfs"), {})
    assert info["orphans"] == [] and info["missing"] == [] and info["present"]
    with _bridge(tmp_path, None) as again, BridgeClient(again.socket_path) as c:
        assert [c.read_all(ROOT, p) for p in paths] == [p.encode() for p in paths]


def _error(c: BridgeClient, raw: bytes) -> dict:  # type: ignore[type-arg]
    c.send_raw(raw)
    return c.recv()[0]


def test_hostile_frames_get_errors_and_others_keep_working(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    with _bridge(tmp_path, tree) as b, BridgeClient(b.socket_path) as good:
        good.put(ROOT, "state/0/0/1.changelog", b"ok")
        with BridgeClient(b.socket_path, hello=False) as c:
            assert c.call({"op": "stat", "root": ROOT, "path": "state/a"})[0]["code"] == "version"
            h = c.call({"op": "hello", "versions": [7, 9]})[0]
            assert h["code"] == "version" and h["versions"] == [1, 2]
            assert c.call({"op": "hello", "versions": [1]})[0] == {"ok": True, "version": 1}
            for path in ("../x", "/etc/passwd", "state/../../x", "state/a\\b", "offsets/0"):
                h = c.call({"op": "stat", "root": ROOT, "path": path})[0]
                assert h["code"] == "path", path
            assert _error(c, struct.pack("!I", 5) + b"nope!" + struct.pack("!I", 0))["code"] == (
                "malformed"
            )
            assert c.call({"op": "stat", "root": ROOT, "path": 5})[0]["code"] == "malformed"
            assert c.stat(ROOT, "state/0/0/1.changelog")["length"] == 2  # still served
            assert _error(c, struct.pack("!I", 1 << 30))["code"] == "too-large"
            assert c.sock.recv(1) == b""  # closed after a frame it cannot trust
        with BridgeClient(b.socket_path) as c:
            put = {"op": "put", "root": ROOT, "path": "state/../x", "offset": 0, "last": False}
            c.send_raw(wire.encode(put, b"abc"))
            assert c.recv()[0]["code"] == "path"
            assert c.sock.recv(1) == b""
        with BridgeClient(b.socket_path) as c:  # a connection closed mid-file writes nothing
            put = {"op": "put", "root": ROOT, "path": "state/0/0/2.changelog", "offset": 0}
            c.send_raw(wire.encode({**put, "last": False}, b"abc"))
            c.send_raw(wire.encode({**put, "offset": 1, "last": True}, b"d")[:-1])
        assert good.stat(ROOT, "state/0/0/2.changelog")["exists"] is False
        assert good.commit(ROOT)["ok"]
        assert good.read_all(ROOT, "state/0/0/1.changelog") == b"ok"


def test_files_stay_durable_with_the_node_down(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    tree.nodes["root"].kill()
    with _bridge(tmp_path, tree, ack_timeout=1.0) as b, BridgeClient(b.socket_path) as c:
        assert c.commit(ROOT)["files"] == 0  # the driver is here: the put is held
        assert c.drive(ROOT)["ok"]
        c.put(ROOT, "state/0/3/8.changelog", b"through the DFS")
        assert c.commit(ROOT, timeout=30) == {"ok": True, "files": 1}
    assert _objects(tmp_path)  # written straight to the DFS
    with _bridge(tmp_path, None) as b, BridgeClient(b.socket_path) as c:
        assert c.read_all(ROOT, "state/0/3/8.changelog") == b"through the DFS"


def _bridge_at(tmp_path: Path, tree, name: str, **kw) -> Bridge:  # type: ignore[no-untyped-def]
    sock = tmp_path / f"run-{name}" / "bridge.sock"
    return Bridge.open(sock, str(tmp_path / "dfs"), tree.address("root"), **kw)


def test_bridges_of_two_hosts_see_each_others_files_and_release_them(
    tmp_path: Path,
    tree,  # type: ignore[no-untyped-def]
) -> None:
    """Two hosts' bridges on one base path: each writes manifests of its own files, a
    miss on one refreshes from the other's manifests, a deletion on one releases the
    object the other wrote, and a third bridge rebuilds the union."""
    from dstltree.cli.commands.inspect import inspect_base

    path = "state/0/3/1.changelog"
    fast = {"manifest_interval": 0.1}
    with _bridge_at(tmp_path, tree, "a", **fast) as a, _bridge_at(tmp_path, tree, "b", **fast) as b:
        assert a.files.bridge_id != b.files.bridge_id
        with BridgeClient(b.socket_path, app="q") as cb:
            assert cb.stat(ROOT, path)["exists"] is False  # b loads the root first
        with BridgeClient(a.socket_path, app="q") as ca:
            ca.put(ROOT, path, b"written on host a")  # durable at the reply
        wait_until(lambda: len(_manifests(tmp_path)) >= 1, timeout=20)
        written = _objects(tmp_path)
        assert len(written) == 1
        with BridgeClient(b.socket_path, app="q") as cb:
            wait_until(lambda: cb.stat(ROOT, path)["exists"], timeout=20)  # refreshed
            assert cb.read_all(ROOT, path) == b"written on host a"
            assert cb.delete(ROOT, path) is True  # a tombstone written on host b
        # a takes b's manifest in, its segment dies, it releases its own object
        wait_until(lambda: written[0] not in _objects(tmp_path), timeout=30)
        wait_until(lambda: a.files.counts["objects_deleted"] == 1, timeout=10)  # counted after
    with _bridge_at(tmp_path, tree, "c") as c, BridgeClient(c.socket_path) as cc:
        assert cc.stat(ROOT, path)["exists"] is False  # the tombstone wins the rebuild
    tree.stop()  # the node deletes the object files it keeps created ahead
    info = inspect_base(str(tmp_path / "dfs"), {})
    assert info["ss_queries"] == [ROOT]
    assert info["orphans"] == [] and info["missing"] == []


def test_a_miss_finds_a_file_another_bridge_has_not_put_in_a_manifest_yet(
    tmp_path: Path,
    tree,  # type: ignore[no-untyped-def]
) -> None:
    path = "state/0/5/2.changelog"
    slow = {"manifest_interval": 600.0}  # no manifest while the test runs
    with _bridge_at(tmp_path, tree, "a", **slow) as a, _bridge_at(tmp_path, tree, "b", **slow) as b:
        with BridgeClient(b.socket_path) as cb, BridgeClient(a.socket_path) as ca:
            assert cb.stat(ROOT, "state/0/5/1.changelog")["exists"] is False  # loaded
            ca.put(ROOT, path, b"not in a manifest")  # durable at the reply
            assert all(path not in m.read_text() for m in _manifests(tmp_path))
            wait_until(lambda: cb.stat(ROOT, path)["exists"], timeout=20)  # an index scan
            assert cb.read_all(ROOT, path) == b"not in a manifest"
            listed = cb.list(ROOT, "state/0/5")["files"]
            assert [(f["name"], f["length"]) for f in listed] == [("2.changelog", 17)]
        assert b.files.view.get(ROOT, path).by == ""  # neither b's to list nor to release
        manifest = b.files.view.manifest(ROOT)
        assert manifest is None or path not in manifest["files"]


def test_dstl_status_lists_the_bridge_and_its_queries(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    """A bridge process registers itself; ``dstl status --bridges`` (and ``--json``)
    asks it over its socket: the query, its last batch, commits, objects per batch,
    held bytes and the plain files a JVM reported in its hello."""
    import json

    from dstltree.structured_streaming.registry import registered

    sock = tmp_path / "run" / "s.sock"
    proc = _start_process(tmp_path, tree, sock)
    dstl = [sys.executable, "-m", "dstltree.cli", "status"]
    try:
        assert [e["pid"] for e in registered() if e["socket"] == str(sock)] == [proc.pid]
        hello = {"op": "hello", "versions": [1, 2], "app": "app-s", "plain": 3, "jvm": "7@h"}
        with BridgeClient(sock, hello=False) as c:
            assert c.ok(hello)["version"] == 2
            assert c.commit(ROOT)["ok"] and c.drive(ROOT)["ok"]
            for p in range(3):
                c.put(ROOT, f"state/0/{p}/5.delta", b"x" * 100)  # batch 4, held
            out = subprocess.run(
                [*dstl, "--bridge", str(sock), "--json"], capture_output=True, text=True, timeout=60
            )
            assert out.returncode == 0, out.stderr
            (b,) = json.loads(out.stdout)["bridges"]
            assert b["up"] and b["pid"] == proc.pid and b["bytes"]["held"] == 300
            (q,) = b["queries"]
            assert q["root"] == ROOT and q["last_batch"] == 4 and q["held_bytes"] == 300
            assert q["commits"] == 1 and q["plain_files"] == 3 and q["apps"] == ["app-s"]
            assert c.commit(ROOT)["files"] == 3
        out = subprocess.run(
            [*dstl, "--bridge", str(sock), "--json"], capture_output=True, text=True, timeout=60
        )
        (q,) = json.loads(out.stdout)["bridges"][0]["queries"]
        assert q["commits"] == 2 and q["files_durable"] == 3 and q["held_bytes"] == 0
        assert q["objects_per_batch"] == 0.5  # no object in the first commit, one in the second
        wide = {**os.environ, "COLUMNS": "400"}
        table = subprocess.run(
            [*dstl, "--bridges", "--once"], capture_output=True, text=True, timeout=60, env=wide
        )
        assert table.returncode == 0, table.stderr
        assert str(sock) in table.stdout and b["bridge"] in table.stdout  # the registered one
        row = next(line for line in table.stdout.splitlines() if ROOT in line)
        assert "0.50" in row and "plain files" in table.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert all(e["socket"] != str(sock) for e in registered())  # unregistered at stop
    out = subprocess.run(
        [*dstl, "--bridge", str(sock), "--json"], capture_output=True, text=True, timeout=60
    )
    assert json.loads(out.stdout)["bridges"][0]["up"] is False
