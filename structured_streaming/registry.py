"""Where ``dstl status`` finds the bridges of this host: every bridge that listens
writes ``<uid dir>/bridges/<bridge id>.json`` (its socket, process id and metrics URL;
the directory 0700 like the default socket's) and removes it when it stops. A file
whose process is gone is stale: :func:`registered` skips and removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from dstltree.aggregator.respawn import pid_alive

MAX_ENTRY = 64 * 1024  # bytes of one registration file read at most
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def registry_dir() -> Path:
    """``/tmp/dstltree-<uid>/bridges``: beside the default socket."""
    return Path(f"/tmp/dstltree-{os.getuid()}/bridges")


def _entry_path(bridge_id: str, socket_path: Path) -> Path:
    name = _SAFE.sub("_", bridge_id or socket_path.name)[:100] or "bridge"
    return registry_dir() / f"{name}-{os.getpid()}.json"


def register(bridge_id: str, socket_path: Path, metrics_url: str | None = None) -> Path:
    """Write this process's entry for the bridge on ``socket_path`` (atomically: a
    temporary file renamed); its path. Raises OSError."""
    d = registry_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = _entry_path(bridge_id, socket_path)
    entry = {
        "bridge": bridge_id,
        "socket": str(Path(socket_path).absolute()),
        "pid": os.getpid(),
        "metrics": metrics_url,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)
    return path


def unregister(bridge_id: str, socket_path: Path) -> None:
    """Remove this process's entry (nothing if there is none)."""
    with contextlib.suppress(OSError):
        _entry_path(bridge_id, socket_path).unlink()


def registered() -> list[dict[str, Any]]:
    """The entries of the bridges of this host whose process lives, sorted by socket
    (``bridge``, ``socket``, ``pid``, ``metrics``); unreadable or malformed entries
    are skipped, those of dead processes removed."""
    out = []
    with contextlib.suppress(OSError):
        for p in sorted(registry_dir().glob("*.json")):
            entry = _read(p)
            if entry is None:
                continue
            if not pid_alive(entry["pid"]):
                with contextlib.suppress(OSError):
                    p.unlink()
                continue
            out.append(entry)
    return sorted(out, key=lambda e: e["socket"])


def _read(p: Path) -> dict[str, Any] | None:
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_ENTRY + 1)
        entry = json.loads(raw) if len(raw) <= MAX_ENTRY else None
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict):
        return None
    ok = (
        isinstance(entry.get("socket"), str)
        and isinstance(entry.get("pid"), int)
        and isinstance(entry.get("bridge"), str)
        and isinstance(entry.get("metrics"), str | None)
    )
    return entry if ok else None
