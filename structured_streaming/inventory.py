"""Which tree objects the Structured Streaming bridges' manifests reference, for
``dstl inspect``: the newest manifest of every bridge of every query (``<base>/ss/<query key>/
manifest-<bridge>-<seq>.json``) names, per file it wrote, the object holding the file's
newest segment (a tombstone's for a deleted file) and the objects holding its older
versions not yet released. Objects the bridge has not written into a manifest yet
(files not durable at the manifest's time) are not named: inspect a base path after
its bridges stopped (a bridge writes its last manifests when it stops).
"""

from __future__ import annotations

import json
from typing import Any

from dstltree.storage.store import ObjectStore

SS_DIR = "ss"


def newest_manifests(store: ObjectStore) -> list[dict[str, Any]]:
    """The newest manifest of every bridge of every query under ``<base>/ss/`` (parsed
    JSON, object URLs absolute; ``manifest-<bridge>-<seq>.json``, or format 1's
    ``manifest-<seq>.json``), in
    the order of their folders and bridges (one listing). Raises StorageError;
    ValueError for a manifest that is not JSON."""
    from dstltree.structured_streaming.files import manifest_name

    newest: dict[tuple[str, str], tuple[int, str]] = {}
    for info in store.list_info(store.join(SS_DIR)):
        named = manifest_name(info.url)
        if named is None:
            continue
        key = (info.url.rsplit("/", 1)[0], named[0])
        if key not in newest or named[1] > newest[key][0]:
            newest[key] = (named[1], info.url)
    from dstltree.structured_streaming.view import manifest_from_store

    return [
        manifest_from_store(json.loads(store.read(newest[k][1])), store.base_url, newest[k][1])
        for k in sorted(newest)
    ]


def manifest_objects(doc: dict[str, Any]) -> set[str]:
    """Every object URL one manifest names (as written, not normalized): both sets of
    :func:`manifest_object_roles`."""
    required, waiting = manifest_object_roles(doc)
    return required | waiting


def manifest_object_roles(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The object URLs one manifest references (as written, not normalized):
    ``(required, waiting)``. Required: each file's newest segment's object (a deleted
    file's tombstone included), which must exist. Waiting: the objects holding older
    versions, which the bridge releases later; one may be gone already (the bridge
    deleted it after its last look at the tombstone), so it is not missing, but while
    present it is not an orphan either."""
    required: set[str] = set()
    waiting: set[str] = set()
    for entry in doc.get("files", {}).values():
        required.add(entry["segment"]["path"])
        waiting.update(entry.get("older", []))
    return required, waiting - required
