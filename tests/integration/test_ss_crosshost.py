"""The cross-host commit of a Structured Streaming batch through REAL aggregator nodes
(structured_streaming/crosshost.py): three bridges stand for the driver's host and two
executor hosts, each on its own node of a three-node tree, so every note crosses nodes.
Executors' files are held until the driver's commit, and the commit makes all of them
durable together in ONE object; a holder that restarted, or is gone, fails the commit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstltree.client import ObjectStore
from dstltree.client.reader import read_index
from dstltree.structured_streaming.bridge import Bridge
from tests.support.ss_client import BridgeClient
from tests.support.tree_fixtures import start
from tests.support.waiting import wait_until

ROOT = "file:/tmp/checkpoints/query-x"
APP = "app-20261202-0001"
NODES = [
    {"id": "root", "bind": "auto"},
    {"id": "a", "bind": "auto", "parent": "root"},
    {"id": "b", "bind": "auto", "parent": "root"},
]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    # a persist delay far below the spread of the hosts' flushes: only the flush group
    # keeps them in one object
    with start(tmp_path, NODES, security={"curve": False}, persist_delay=0.01) as t:
        yield t


def _bridge(tmp_path: Path, tree, name: str, node: str) -> Bridge:  # type: ignore[no-untyped-def]
    sock = tmp_path / name / "bridge.sock"
    return Bridge.open(
        sock, str(tmp_path / "dfs"), tree.address(node), bridge_id=name, manifest_interval=0.2
    )


def _objects(tmp_path: Path) -> list[str]:
    store = ObjectStore(str(tmp_path / "dfs"))
    return [i.url for i in store.list_info(store.changelog_root()) if i.size > 0]


def _paths_in(url: str, tmp_path: Path) -> set[str]:
    store = ObjectStore(str(tmp_path / "dfs"))
    return {r.log_id.split("/", 2)[2] for r in read_index(store, url)}


def _knows_committer(b: Bridge) -> bool:
    with b.files.cond:
        return b.files.crosshost.committer(ROOT, APP, 0.0) is not None


def _write(bridge: Bridge, partitions: range, version: int, app: str = APP) -> None:
    with BridgeClient(bridge.socket_path, app=app) as c:
        for p in partitions:
            assert c.put(ROOT, f"state/0/{p}/{version}.changelog", b"s" * 300)["ok"]


def test_every_hosts_files_of_a_batch_land_in_one_object(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    with (
        _bridge(tmp_path, tree, "driver-host", "root") as d,
        _bridge(tmp_path, tree, "host-a", "a") as ea,
        _bridge(tmp_path, tree, "host-b", "b") as eb,
        BridgeClient(d.socket_path, app=APP) as driver,
    ):
        for version in (1, 2, 3):
            boot = driver.ok({"op": "drive", "root": ROOT})["boot"]
            if version == 1:
                wait_until(lambda: _knows_committer(ea) and _knows_committer(eb), timeout=20)
            before = set(_objects(tmp_path))
            threads = [
                threading.Thread(target=_write, args=(ea, range(0, 100), version)),
                threading.Thread(target=_write, args=(eb, range(100, 200), version)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert set(_objects(tmp_path)) == before  # held on each host
            h = driver.ok({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})
            assert h["files"] == 200
            new = sorted(set(_objects(tmp_path)) - before)
            assert len(new) == 1, new  # both hosts' files, one object
            assert len(_paths_in(new[0], tmp_path)) == 200
        # another host reads a file the first one held (its manifest names it)
        with BridgeClient(eb.socket_path, app=APP) as c:
            wait_until(lambda: c.stat(ROOT, "state/0/7/3.changelog")["exists"], timeout=20)
            assert c.read_all(ROOT, "state/0/7/3.changelog") == b"s" * 300
    assert ea.files.counts["held"] == 300 and eb.files.counts["held"] == 300


def test_a_holder_that_restarted_fails_the_commit(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    with (
        _bridge(tmp_path, tree, "driver-host", "root") as d,
        BridgeClient(d.socket_path, app=APP) as driver,
    ):
        ea = _bridge(tmp_path, tree, "host-a", "a")
        ea.start()
        boot = driver.ok({"op": "drive", "root": ROOT})["boot"]
        wait_until(lambda: _knows_committer(ea), timeout=20)
        _write(ea, range(0, 10), 1)
        ea.stop()  # its held files are persisted at stop, but it is another process now
        ea2 = _bridge(tmp_path, tree, "host-a", "a")
        with ea2:
            d.files.crosshost.drives.clear()  # broadcast again: notes reach the new process
            driver.ok({"op": "drive", "root": ROOT})
            wait_until(lambda: _knows_committer(ea2), timeout=20)
            h, _ = driver.call({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})
            assert h["ok"] is False and h["code"] == "unavailable"
            assert "restarted" in h["error"]
        # a holder that is gone: no answer within the receipt wait
        ea3 = _bridge(tmp_path, tree, "host-a", "a")
        ea3.start()
        driver.ok({"op": "drive", "root": ROOT})
        d.files.crosshost.drives.clear()  # broadcast the drive again for the new process
        driver.ok({"op": "drive", "root": ROOT})
        wait_until(lambda: _knows_committer(ea3), timeout=20)
        _write(ea3, range(0, 10), 2)
        ea3.files.close_notes()  # it hears nothing any more
        ea3.files._notes = None
        h, _ = driver.call({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})
        assert h["ok"] is False and "did not answer" in h["error"]
        ea3.stop()


def test_an_application_without_a_committer_elsewhere_is_durable_at_the_reply(
    tmp_path: Path,
    tree,  # type: ignore[no-untyped-def]
) -> None:
    """A put of an application no bridge drives: persisted and waited for, as before."""
    with _bridge(tmp_path, tree, "host-a", "a") as ea:
        _write(ea, range(0, 3), 1, app="unknown-app")
        assert ea.files.counts["held"] == 0
        assert ea.files.view.pending(ROOT) == set()


def test_a_flush_on_one_host_is_not_cut_by_the_persist_delay(tmp_path: Path) -> None:
    """Issue 45: a commit's 300 held files reach the node over many milliseconds; with a
    persist delay of 1 ms only the flush group keeps them in one object."""
    nodes = [{"id": "root", "bind": "auto"}]
    with (
        start(tmp_path, nodes, security={"curve": False}, persist_delay=0.001) as t,
        _bridge(tmp_path, t, "driver-host", "root") as d,
        BridgeClient(d.socket_path, app=APP) as driver,
    ):
        boot = driver.ok({"op": "drive", "root": ROOT})["boot"]
        for p in range(300):
            driver.put(ROOT, f"state/0/{p}/1.changelog", bytes(2000))
        h = driver.ok({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})
        assert h["files"] == 300
        (obj,) = _objects(tmp_path)
        assert len(_paths_in(obj, tmp_path)) == 300


def test_only_the_committer_asked_answers_a_hold_and_bad_notes_are_counted(
    tmp_path: Path,
) -> None:
    import threading as th

    from dstltree.client.api import ChangelogClient
    from dstltree.client.wire import Note
    from dstltree.structured_streaming.crosshost import dump_body
    from dstltree.structured_streaming.files import TreeFiles

    client = ChangelogClient.open(str(tmp_path / "dfs"))  # no node: notes handled directly
    try:
        files = TreeFiles(client, bridge_id="host-a")
        asked = th.Event()
        files._announcing[ROOT] = ("driver-host", asked)
        files._handle_note(Note("host-a", "mallory", dump_body("held", root=ROOT)))
        assert not asked.is_set() and files.crosshost.announced == {}
        files._handle_note(Note("host-a", "driver-host", dump_body("held", root=ROOT)))
        assert asked.is_set() and files.crosshost.announced == {ROOT: "driver-host"}
        files._handle_note(Note("host-a", "mallory", b"\xc1not msgpack"))
        assert files.counts["notes_refused"] == 1
    finally:
        client.close()


def test_files_written_after_the_last_commit_become_one_object(tmp_path: Path, tree) -> None:  # type: ignore[no-untyped-def]
    """What Spark's state maintenance writes after a query's last commit (snapshots and
    their SST files, on every host) is held, and once no new write came for IDLE_QUIET
    s with no batch running, the committer flushes every host's part as one object:
    no commit follows to do it, and one object per file was the cost before."""
    with (
        _bridge(tmp_path, tree, "driver-host", "root") as d,
        _bridge(tmp_path, tree, "host-a", "a") as ea,
        _bridge(tmp_path, tree, "host-b", "b") as eb,
        BridgeClient(d.socket_path, app=APP) as driver,
    ):
        boot = driver.ok({"op": "drive", "root": ROOT})["boot"]
        wait_until(lambda: _knows_committer(ea) and _knows_committer(eb), timeout=20)
        _write(ea, range(0, 4), 1)
        driver.ok({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})  # the last
        before = set(_objects(tmp_path))
        for b, parts in ((ea, range(0, 20)), (eb, range(20, 40)), (d, range(40, 45))):
            with BridgeClient(b.socket_path, app=APP) as c:
                for p in parts:
                    assert c.put(ROOT, f"state/0/{p}/1.zip", b"z" * 200)["ok"]
                    assert c.put(ROOT, f"state/0/{p}/SSTs/{p:06d}-x.sst", b"t" * 300)["ok"]
        assert ea.files.counts["held"] == 44 and eb.files.counts["held"] == 40

        def flushed() -> bool:
            return all(not b.files.view.pending(ROOT) for b in (d, ea, eb))

        wait_until(flushed, timeout=30)
        new = sorted(set(_objects(tmp_path)) - before)
        assert len(new) == 1, new  # every host's files, one object
        assert len(_paths_in(new[0], tmp_path)) == 90
        assert d.files.counts["idle_flushes"] == 1
        # the next batch commits as before (and sees the idle flush durable)
        boot = driver.ok({"op": "drive", "root": ROOT})["boot"]
        _write(eb, range(20, 24), 2)
        h = driver.ok({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})
        assert h["files"] == 4


def test_a_holder_that_missed_the_drive_learns_it_while_the_batch_runs(
    tmp_path: Path, tree
) -> None:  # type: ignore[no-untyped-def]
    """Notes are not retried: a bridge that was not there for a batch's first ``drive``
    (here: started after it; on the S3 model, a node reconnecting lost it and the first
    batch's files were persisted one by one for a minute) hears it again within
    DRIVE_RENEW s while the batch runs, and holds its files from then on."""
    with (
        _bridge(tmp_path, tree, "driver-host", "root") as d,
        BridgeClient(d.socket_path, app=APP) as driver,
    ):
        boot = driver.ok({"op": "drive", "root": ROOT})["boot"]
        with _bridge(tmp_path, tree, "host-a", "a") as ea:
            wait_until(lambda: _knows_committer(ea), timeout=30)
            _write(ea, range(0, 10), 1)
            assert ea.files.counts["held"] == 10
            h = driver.ok({"op": "commit", "root": ROOT, "timeout": 30, "boot": boot})
            assert h["files"] == 10
