"""Work directories of nodes that no process owns any more, found and deleted.

A launcher makes a node's work directory under the system's temporary directory
(``dstl-node-*`` on an executor, ``dstl-nodes-*`` for a local tree) with the topology
copy, the address and statistics files and, with CURVE, the key files (0600 secrets).
The process that deletes it when the nodes stop for good (``dstl node --remove-dir``,
a respawner included; :class:`~dstltree.aggregator.launcher.LocalTree`) owns it: it
holds an exclusive ``flock`` on the directory's ``owner.lock`` for its lifetime. A
process killed with SIGKILL cannot delete the directory, but the kernel releases its
lock; so whoever starts nodes on the host next (:func:`sweep_stale_workdirs`) can tell a
left-over directory from a live one without trusting PIDs, which are reused and differ
between PID namespaces sharing one temporary directory. A respawner's node inherits the
lock (``flock`` locks belong to the open file, shared by inherited descriptors): a node
that outlives its SIGKILLed respawner keeps its directory, key files included, until
it ends too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

OWNER_LOCK = "owner.lock"
#: name prefixes of the work directories launchers make (tempfile.mkdtemp): an
#: executor's node, a local tree
NODE_WORKDIR_PREFIX, TREE_WORKDIR_PREFIX = "dstl-node-", "dstl-nodes-"
WORKDIR_PREFIXES = (NODE_WORKDIR_PREFIX, TREE_WORKDIR_PREFIX)
#: seconds an unlocked ``owner.lock`` is spared after its creation (its owner locks it
#: right after creating it)
_OWNER_START_S = 60.0
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class WorkdirOwner:
    """The exclusive lock on ``directory/owner.lock`` (created 0600), held until
    :meth:`release` or this process ends. Raises BlockingIOError if another process
    owns the directory, OSError if the file cannot be made."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        fd = os.open(directory / OWNER_LOCK, _LOCK_FLAGS, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def fileno(self) -> int:
        """The lock's descriptor (-1 once released). A child process that inherits it
        (``subprocess.Popen(pass_fds=...)``) shares the lock: the directory stays owned
        until this process and every such child have ended."""
        return -1 if self._fd is None else self._fd

    def release(self) -> None:
        """Let the lock go (idempotent): call it after deleting the directory."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def own_workdir(directory: Path) -> WorkdirOwner | None:
    """:class:`WorkdirOwner` of ``directory``, or None (logged) when it cannot be owned
    (another process owns it, a filesystem without ``flock``): the directory is still
    deleted by whoever made it, only a sweep after a SIGKILL will not find it."""
    try:
        return WorkdirOwner(directory)
    except OSError as e:
        log.warning("cannot own the work directory %s: %s", directory, e)
        return None


def sweep_stale_workdirs(parent: Path | None = None, *, now: float | None = None) -> list[Path]:
    """Delete the node work directories under ``parent`` (default: the system's
    temporary directory) that belong to this user and whose owner is gone: their
    ``owner.lock`` exists, is older than a minute at ``now`` (epoch seconds, default
    the present) and nobody holds its lock. A directory without the file is left
    alone (its launcher has not started its owner yet, or an older version made it).
    Returns what was deleted; never raises for a directory it cannot read or delete."""
    root = Path(tempfile.gettempdir()) if parent is None else parent
    wall = time.time() if now is None else now
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name.startswith(WORKDIR_PREFIXES) and _sweep(entry, wall):
                removed.append(Path(entry.path))
                log.info("deleted the work directory %s (its owner is gone)", entry.path)
    return removed


def _sweep(entry: os.DirEntry[str], wall: float) -> bool:
    """Delete ``entry`` if it is this user's directory and no process owns it (under
    its owner's lock, so that nobody takes it meanwhile); whether it was deleted."""
    try:
        st = entry.stat(follow_symlinks=False)
        if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
            return False
        lock = os.path.join(entry.path, OWNER_LOCK)
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # gone, not ours, or no owner yet
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # an owner creates the file, then locks it: give that instant a margin
        if wall - os.fstat(fd).st_mtime <= _OWNER_START_S:
            return False
        return _delete(entry.path)
    except OSError:  # locked: its owner runs
        return False
    finally:
        os.close(fd)  # the lock, if taken, goes with the descriptor


def _delete(path: str) -> bool:
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)
