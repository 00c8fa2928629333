"""``dstl inspect PATH``: what is on DFS under a base path, or inside one object.

For a base path: the latest completed checkpoint, the objects the retained checkpoints
and the Structured Streaming bridges' newest manifests reference (changelog objects and
snapshots), the objects present and the orphans.
For an object path (``*.dstl``): its segments, read from the object's index.
"""

from __future__ import annotations

import json
import posixpath
from typing import Annotated, Any

import typer

from dstltree.storage.store import OBJECT_SUFFIX


def _options(storage_options: str | None) -> dict[str, Any]:
    if not storage_options:
        return {}
    try:
        opts = json.loads(storage_options)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="--storage-options") from e
    if not isinstance(opts, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--storage-options")
    return opts


def inspect_base(path: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """Summary of a base path: keys ``latest_checkpoint`` (id or None),
    ``retained_checkpoints`` (ids), ``ss_queries`` (the checkpoint roots of the
    Structured Streaming queries with a bridge manifest), ``referenced`` (by retained
    checkpoints and by each query's newest manifest), ``present``, ``orphans``,
    ``missing`` and ``reservations`` (sorted path lists; an object a manifest names only
    as holding older versions awaiting release is neither an orphan nor missing; a
    reservation, an empty object file created ahead, is none of the others: the orphan
    sweep deletes those a dead process left). Raises StorageError /
    CorruptCheckpointError."""
    from dstltree.coordinator.cleanup import data_files_and_reservations, normalize
    from dstltree.coordinator.store import CheckpointStore
    from dstltree.storage.store import ObjectStore
    from dstltree.structured_streaming.inventory import manifest_object_roles, newest_manifests

    store = ObjectStore(path, storage_options)
    retained = CheckpointStore(store).list_retained()
    refs = {normalize(store, p) for c in retained for p in c.referenced_paths()}
    manifests = newest_manifests(store)  # Structured Streaming queries' bridges
    waiting: set[str] = set()
    for doc in manifests:
        required, older = manifest_object_roles(doc)
        refs.update(normalize(store, u) for u in required)
        waiting.update(normalize(store, u) for u in older)
    referenced = sorted(refs)
    present, reservations = data_files_and_reservations(store)
    present_set = set(present)
    ref_set = set(referenced)
    return {
        "base_path": store.base_url,
        "latest_checkpoint": retained[-1].checkpoint_id if retained else None,
        "retained_checkpoints": [c.checkpoint_id for c in retained],
        "ss_queries": sorted({str(doc.get("root")) for doc in manifests}),
        "referenced": referenced,
        "present": present,
        "orphans": [p for p in present if p not in ref_set and p not in waiting],
        "missing": [p for p in referenced if p not in present_set],
        "reservations": reservations,
    }


def inspect_object(path: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """The segments of one object from its index: ``path``, ``size_bytes`` and
    ``segments`` (log_id, sqn [from, to), key_groups, offset, length, crc32). The whole
    object is read and every index entry cross-checked against its segment, so an
    index that lies is reported. Raises CorruptObjectError (path, offset) or
    StorageError."""
    from dstltree.client.reader import read_index
    from dstltree.storage.store import ObjectStore

    store = ObjectStore(posixpath.dirname(path.rstrip("/")) or "/", storage_options)
    url = store.url(str(store.fs._strip_protocol(path)))
    entries = read_index(store, url)
    return {
        "path": url,
        "size_bytes": store.size(url),
        "segments": [
            {
                "log_id": e.log_id,
                "sqn": [e.sqn_from, e.sqn_to],
                "key_groups": list(e.key_groups),
                "offset": e.offset,
                "length": e.length,
                "crc32": e.crc32,
            }
            for e in entries
        ],
    }


def _print_base(info: dict[str, Any]) -> None:
    typer.echo(f"base path:           {info['base_path']}")
    typer.echo(f"latest checkpoint:   {info['latest_checkpoint']}")
    typer.echo(f"retained:            {info['retained_checkpoints']}")
    typer.echo(f"ss queries:          {len(info['ss_queries'])}")
    for key in ("referenced", "present", "orphans", "missing"):
        typer.echo(f"{key + ':':<20} {len(info[key])}")
        for p in info[key]:
            typer.echo(f"  {p}")
    typer.echo(f"{'reservations:':<20} {len(info['reservations'])}")


def _print_object(info: dict[str, Any]) -> None:
    typer.echo(f"{info['path']}: {info['size_bytes']} bytes, {len(info['segments'])} segments")
    typer.echo(f"{'log_id':<24} {'sqn':>15} {'offset':>10} {'length':>10}  key groups")
    for s in info["segments"]:
        sqn = f"[{s['sqn'][0]}, {s['sqn'][1]})"
        kgs = ",".join(str(k) for k in s["key_groups"])
        typer.echo(f"{s['log_id']:<24} {sqn:>15} {s['offset']:>10} {s['length']:>10}  {kgs}")


def register(app: typer.Typer) -> None:
    """Add ``dstl inspect`` to ``app``."""

    @app.command("inspect")
    def inspect(
        path: Annotated[str, typer.Argument(help="A base path, or an object path (*.dstl).")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        storage_options: Annotated[
            str | None, typer.Option("--storage-options", help="fsspec options as JSON.")
        ] = None,
    ) -> None:
        """Show a base path's checkpoints, or one object.

        Shows the checkpoints, referenced objects and orphans of a base path, or the
        segments of one object.

        Exit code 1 for a corrupt object (a failed checksum, or an index entry that
        does not match its segment) or checkpoint, 2 for a storage error; the error
        line names the path and offset."""
        from dstltree.client.errors import CorruptObjectError, StorageError
        from dstltree.coordinator.errors import CheckpointStoreError

        opts = _options(storage_options)
        try:
            if path.endswith(OBJECT_SUFFIX):
                info = inspect_object(path, opts)
                show = _print_object
            else:
                info = inspect_base(path, opts)
                show = _print_base
        except (CorruptObjectError, CheckpointStoreError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
        except StorageError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        if as_json:
            typer.echo(json.dumps(info, indent=2))
        else:
            show(info)
