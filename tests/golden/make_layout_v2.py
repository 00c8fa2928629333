"""Writes tests/golden/layout-v2/: a job folder as the checkpoint store of 3002318 (the
last layout with ``chk-<id>.json`` metadata and ``LATEST-<n>`` pointers) left it, with
real changelog objects, so that tests/unit/test_checkpoint_layouts.py checks this
version still restores it. Run once, on 3002318, from the repository root:
``python tests/golden/make_layout_v2.py``; the files it wrote are committed. Object
URLs inside the metadata are written relative to ``@BASE@``, the folder the test
copies the layout to."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from dstltree.client.api import ChangelogClient
from dstltree.coordinator.checkpoint import CompletedCheckpoint, TaskCheckpoint
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug.sources.base import EnumeratorState, Split, SplitState
from dstltree.storage.store import ObjectStore

OUT = Path(__file__).parent / "layout-v2"


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    base = str(tmp / "job")
    store = ObjectStore(base)
    client = ChangelogClient.open(base, node=None)
    cps = []
    for task in (0, 1):
        w = client.create_writer(f"golden-t{task}-a0", range(task * 4, task * 4 + 4))
        w.append(task * 4, f"t{task}-change-1".encode())
        h1 = w.persist_durably(after=0, checkpoint_id=1).result()
        w.append(task * 4 + 1, f"t{task}-change-2".encode())
        h2 = w.persist_durably(after=0, checkpoint_id=2).result()
        cps.append((h1, h2))
    split = Split("f-0001.parquet", "landing/f-0001.parquet")
    done = Split("f-0000.parquet", "landing/f-0000.parquet")
    enum = EnumeratorState(
        pending=(), assigned={split.id: (0, SplitState(split, 0))}, finished=frozenset({done.id})
    )
    store_cs = CheckpointStore(store, owner="golden-driver")
    store_cs.claim()
    for cid in (1, 2):
        tasks = {
            t: TaskCheckpoint(
                t,
                0,
                10 * cid,
                None,
                (cps[t][cid - 1],),
                (t * 4, t * 4 + 4),
                (SplitState(split, 5 * cid),) if t == 0 else (),
            )
            for t in (0, 1)
        }
        cp = CompletedCheckpoint(cid, 0, 0, 1_700_000_000.0 + cid, 0.25, tasks, 2, 8, enum)
        store_cs.add(cp)
    client.close()
    if OUT.exists():
        shutil.rmtree(OUT)
    prefix = ObjectStore(base).base_url.rstrip("/")
    for f in sorted(Path(base).rglob("*")):
        if f.is_file():
            dest = OUT / f.relative_to(base)
            dest.parent.mkdir(parents=True, exist_ok=True)
            data = f.read_bytes()
            if f.parent.name == "checkpoints":
                data = data.replace(prefix.encode(), b"@BASE@")
            dest.write_bytes(data)
    expected = {
        "latest": 2,
        "retained": [1, 2],
        "changes": {
            "golden-t0-a0": {"0": ["t0-change-1"], "1": ["t0-change-2"]},
            "golden-t1-a0": {"4": ["t1-change-1"], "5": ["t1-change-2"]},
        },
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
