"""Checkpoints written by earlier versions restore (tests/golden/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dstltree.client.reader import read_changes
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.testing import completed
from dstltree.storage.store import ObjectStore

GOLDEN = Path(__file__).parent.parent / "golden"


def _copy(name: str, dest: Path) -> ObjectStore:
    """The golden layout ``name`` at ``dest``, its ``@BASE@`` URLs pointing there."""
    shutil.copytree(GOLDEN / name, dest)
    store = ObjectStore(str(dest))
    base = store.base_url.rstrip("/")
    for f in (dest / "checkpoints").iterdir():
        f.write_bytes(f.read_bytes().replace(b"@BASE@", base.encode()))
    return store


def test_the_layout_of_3002318_restores(tmp_path: Path) -> None:
    store = _copy("layout-v2", tmp_path / "job")
    expected = json.loads((tmp_path / "job" / "expected.json").read_text())
    cs = CheckpointStore(store)
    retained = cs.list_retained()
    assert [c.checkpoint_id for c in retained] == expected["retained"]
    latest = cs.load_latest()
    assert latest is not None and latest.checkpoint_id == expected["latest"]
    assert latest.enumerator is not None and latest.enumerator.finished == {"f-0000.parquet"}
    for tc in latest.tasks.values():
        for h in tc.changelog:
            want = expected["changes"][h.log_id]
            for kg, changes in want.items():
                got = [c.decode() for c in read_changes(store, h, int(kg))]
                assert got == changes
    # A driver of this version takes the job over and goes on in the new layout.
    state = CoordinatorState(CoordinatorConfig(object_prefixes=()), retained, validate=True)
    assert state.next_checkpoint_id == 3
    assert cs.claim() == 1
    cs.add(completed(3, {0: ["x"]}))
    assert cs.retained_ids() == [1, 2, 3]
    assert CheckpointStore(store).load(1) == retained[0]
