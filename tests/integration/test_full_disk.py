"""A full disk (ENOSPC) under the DFS a node writes to: a tmpfs of 8 MiB mounted for
the test (root only: skipped otherwise; unmounted by its path afterwards). A persist
while the disk is full fails with an error naming the object's path and the cause;
nothing acknowledged before is lost; once space returns the same node serves the next
persist, which covers the changes of the failed one, and every change reads back once,
in order."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES
from dstltree.client.errors import PersistError
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.reader import iter_changes

pytestmark = pytest.mark.timeout(120)

DISK_BYTES = 8 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_BYTES at ``tmp_path/dfs``."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "dfs"
    d.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(d)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True, timeout=30)


def _fill(disk: Path) -> Path:
    """A file taking every free byte of ``disk`` (written unbuffered until ENOSPC, in
    smaller and smaller pieces)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_fails_the_persist_by_name_and_the_node_serves_once_space_returns(
    small_disk: Path,
) -> None:
    store = ObjectStore(str(small_disk))
    node = Node(NodeConfig("a", None, 1 << 20, persist_delay=0.01, plans=False), store)
    thread = node.start()
    client = ChangelogClient(
        store, NodeUploader([node.address], store, ack_timeout=10.0), DEFAULT_PREEMPTIVE_BYTES
    )
    try:
        w = client.create_writer("w0", range(2))
        w.append(0, b"before")
        w.persist_durably(0, checkpoint_id=1).result(timeout=30)
        filler = _fill(small_disk)
        w.append(1, b"x" * 65536)  # does not fit
        with pytest.raises(PersistError) as info:
            w.persist_durably(0, checkpoint_id=2).result(timeout=60)
        text = "".join(str(e) for e in _chain(info.value))
        assert str(small_disk) in text and "No space left on device" in text, text
        filler.unlink()  # space returns
        w.append(0, b"after")
        handle = w.persist_durably(0, checkpoint_id=3).result(timeout=30)
        got = [(kg, c) for _, kg, c in iter_changes(store, handle)]
        assert got == [(0, b"before"), (1, b"x" * 65536), (0, b"after")]
        assert node.address in [client.uploader.address]  # type: ignore[attr-defined]
        assert client.uploader.statistics().acked_by_node >= 2  # type: ignore[attr-defined]
    finally:
        client.close()
        node.stop()
        thread.join(timeout=10)


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__
