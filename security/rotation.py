"""Rotating the cluster keys of a key directory without downtime.

Three steps, each a command run on the full key directory (all four files), which is
then copied to the hosts; nodes and jobs pick a step up when they are restarted, one
at a time (docs/deploy.md, "Rotating keys"):

- :func:`start_rotation` ("stable" -> "started"): a next generation is generated beside
  the current one. Nodes started now serve with the current node key and accept the
  clients of both generations; clients started now connect with the current writer key
  and know both generations' node keys.
- :func:`promote_rotation` ("started" -> "promoted"): the next generation becomes the
  current one. Nodes started now serve with it, clients started now connect with it;
  the previous generation is still accepted and known.
- :func:`finish_rotation` ("promoted" -> "stable"): the previous generation is removed.
- :func:`abort_rotation` undoes the last step: before promote ("started" -> "stable")
  the next generation is removed; after it ("promoted" -> "promoted") the previous
  generation becomes the current one again, the aborted one previous, and restarting
  jobs and nodes, then ``finish``, removes it.

On disk (see :mod:`dstltree.security.keys`), all plain files in the one directory:
the four files of ``dstl keys generate`` per generation, prefixed ``gen-<name>.`` (the
name is the node key's fingerprint), ``rotation.json`` (the state and the generations'
names; its atomic replacement is each step's commit point: an interrupted step leaves
the previous state or the new one, and files of no generation it names are ignored),
and the unprefixed files, kept equal to the current generation for earlier versions
(replaced one by one after the commit). Every file is written to a temporary file and
renamed; secrets are 0600, the directory 0700. A step out of order raises
:class:`RotationError` naming the state and the step due.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

from dstltree.security.keys import (
    GENERATION_PREFIX,
    NODE,
    PROMOTED,
    ROTATION_FILE,
    STABLE,
    STARTED,
    WRITER,
    KeyDirError,
    fingerprint,
    generation_prefix,
    load_generation,
    load_key_dir,
    manifest_text,
    read_manifest,
)

__all__ = [
    "KeyDirStatus",
    "RotationError",
    "abort_rotation",
    "finish_rotation",
    "key_dir_status",
    "promote_rotation",
    "start_rotation",
]

_FILES = {  # file name -> mode
    f"{NODE}.key": 0o644,
    f"{NODE}.key_secret": 0o600,
    f"{WRITER}.key": 0o644,
    f"{WRITER}.key_secret": 0o600,
}
_GENERATION_FILE = re.compile(
    re.escape(GENERATION_PREFIX) + r"[0-9a-f]{16}\.(node|writer)\.key(_secret)?"
)
NEXT_STEP = {
    STABLE: "no rotation under way (dstl keys rotate start DIR begins one)",
    STARTED: (
        "copy DIR to every host, restart every node (one at a time); then "
        "dstl keys rotate promote DIR"
    ),
    PROMOTED: (
        "copy DIR to every host, restart every job and other client, then every node "
        "(one at a time); then dstl keys rotate finish DIR"
    ),
}


class RotationError(KeyDirError):
    """A rotation step that does not follow from the key directory's state (the
    message names the state and the step due), or a directory a rotation cannot use
    (secrets missing, another step running)."""


@dataclass(frozen=True)
class KeyDirStatus:
    """What ``dstl keys status`` shows: the ``state``; ``generations``: (role, name,
    node key fingerprint, writer key fingerprint) with role "current", "next" or
    "previous"; what a node started now does (``serves``: node key fingerprint,
    ``accepts``: client key fingerprints) and a client started now (``connects_with``:
    writer key fingerprint, ``tries``: node key fingerprints in order);
    ``top_level_current``: whether the top-level files (read by earlier versions) are
    the current generation's."""

    directory: Path
    state: str
    generations: tuple[tuple[str, str, str, str], ...]
    serves: str
    accepts: tuple[str, ...]
    connects_with: str
    tries: tuple[str, ...]
    top_level_current: bool

    def lines(self) -> list[str]:
        """The status as text lines."""
        out = [f"key directory {self.directory}: {self.state}"]
        for role, name, node, writer in self.generations:
            out.append(f"  {role:<9} generation {name}: node key {node}, writer key {writer}")
        out.append(f"  a node started now serves with node key {self.serves}")
        out.append(f"    and accepts clients with keys {', '.join(self.accepts)}")
        out.append(f"  a client started now connects with writer key {self.connects_with}")
        out.append(f"    and tries node keys {', '.join(self.tries)} (in this order)")
        if not self.top_level_current:
            out.append(
                "  the top-level files are not the current generation's (an interrupted "
                "promote): run dstl keys rotate promote DIR again"
            )
        out.append(f"  next: {NEXT_STEP[self.state]}")
        return out


def key_dir_status(directory: str | Path) -> KeyDirStatus:
    """The rotation state of ``directory`` and what processes started now would do.
    Raises KeyDirError when the directory cannot be loaded."""
    d = Path(directory)
    keys = load_key_dir(d)
    gens: list[tuple[str, str, str, str]] = []
    r = keys.rotation
    name = fingerprint(keys.node.public) if r is None else r.current
    gens.append(("current", name, fingerprint(keys.node.public), fingerprint(keys.writer.public)))
    if r is not None:
        role = "next" if r.state == STARTED else "previous"
        gens.append(
            (role, r.other, fingerprint(r.other_node.public), fingerprint(r.other_writer.public))
        )
    top = keys if r is None else load_generation(d)
    return KeyDirStatus(
        d,
        STABLE if r is None else r.state,
        tuple(gens),
        fingerprint(keys.node.public),
        tuple(sorted(fingerprint(k) for k in keys.accepted())),
        fingerprint(keys.writer.public),
        tuple(fingerprint(k) for k in keys.node_keys()),
        top.node.public == keys.node.public and top.writer.public == keys.writer.public,
    )


def start_rotation(directory: str | Path) -> KeyDirStatus:
    """Generate the next generation beside the current one ("stable" -> "started").
    Raises RotationError when a rotation is under way or the current generation lacks
    a secret file, KeyDirError when the directory cannot be loaded, OSError."""
    d = Path(directory)
    with _locked(d):
        state = read_manifest(d)["state"]
        if state != STABLE:
            raise RotationError(
                f"{d}: a rotation is already under way (state: {state}); next: {NEXT_STEP[state]}"
            )
        keys = load_key_dir(d)
        if keys.node.secret is None or keys.writer.secret is None:
            raise RotationError(
                f"{d}: rotate the full key directory (node.key_secret and "
                "writer.key_secret), then copy it to the hosts"
            )
        _remove_generations(d)  # left by an interrupted start: named by no manifest
        current = _copy_generation(d)
        following = _new_generation(d)
        if following == current:
            raise RotationError(f"{d}: the new generation's node key equals the current one")
        _write_atomic(d / ROTATION_FILE, manifest_text(STARTED, current, following), 0o644)
    return key_dir_status(d)


def promote_rotation(directory: str | Path) -> KeyDirStatus:
    """Make the next generation the current one ("started" -> "promoted"), then the
    top-level files its copies. Run again after an interruption it completes the
    top-level files. Raises RotationError out of order (state "stable", or "promoted"
    with the top-level files complete), KeyDirError, OSError."""
    d = Path(directory)
    with _locked(d):
        manifest = read_manifest(d)
        state = manifest["state"]
        if state == STABLE:
            raise RotationError(
                f"{d}: no rotation to promote (state: stable): dstl keys rotate start DIR first"
            )
        if state == PROMOTED:
            if key_dir_status(d).top_level_current:
                raise RotationError(
                    f"{d}: already promoted (state: promoted); next: {NEXT_STEP[PROMOTED]}"
                )
            _sync_top_level(d, manifest["current"])
            return key_dir_status(d)
        _make_current(d, manifest["next"], manifest["current"])
    return key_dir_status(d)


def finish_rotation(directory: str | Path) -> KeyDirStatus:
    """Remove the previous generation ("promoted" -> "stable"): the top-level files
    stay (they are the current generation's), ``rotation.json`` says "stable", the
    ``gen-*`` files go. Raises RotationError out of order (state "stable" or
    "started"), KeyDirError, OSError."""
    d = Path(directory)
    with _locked(d):
        manifest = read_manifest(d)
        state = manifest["state"]
        if state == STABLE:
            raise RotationError(
                f"{d}: no rotation to finish (state: stable): dstl keys rotate start DIR first"
            )
        if state == STARTED:
            raise RotationError(
                f"{d}: the next generation is not promoted yet (state: started); next: "
                f"{NEXT_STEP[STARTED]}"
            )
        _sync_top_level(d, manifest["current"])  # completes an interrupted promote
        _write_atomic(d / ROTATION_FILE, manifest_text(STABLE), 0o644)
        _remove_generations(d)
    return key_dir_status(d)


def abort_rotation(directory: str | Path) -> KeyDirStatus:
    """Undo the rotation under way. "started" -> "stable": the next generation's
    files go (no client connects with them yet; a node restarted since accepts them
    until its next restart). "promoted" -> "promoted" with the generations swapped:
    the previous generation is current again (the top-level files its copies), the
    aborted one previous, still accepted and known until ``finish``. Raises
    RotationError in state "stable", KeyDirError, OSError."""
    d = Path(directory)
    with _locked(d):
        manifest = read_manifest(d)
        state = manifest["state"]
        if state == STABLE:
            raise RotationError(f"{d}: no rotation to abort (state: stable)")
        if state == STARTED:
            _sync_top_level(d, manifest["current"])
            _write_atomic(d / ROTATION_FILE, manifest_text(STABLE), 0o644)
            _remove_generations(d)
            return key_dir_status(d)
        _make_current(d, manifest["previous"], manifest["current"])
    return key_dir_status(d)


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    """One rotation step at a time on ``d`` (an exclusive flock on the directory
    itself: no lock file to copy to the hosts; RotationError if another step holds
    it)."""
    if not d.is_dir():
        raise KeyDirError(f"{d}: no such key directory (dstl keys generate {d})")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise RotationError(f"{d}: another rotation step is running on it") from e
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove_generations(d: Path) -> None:
    """Remove every generation's files (``gen-<name>.*``) of ``d``."""
    for path in d.iterdir():
        if _GENERATION_FILE.fullmatch(path.name):
            path.unlink()
    _fsync_dir(d)


def _copy_generation(d: Path) -> str:
    """Copy the top-level files to ``gen-<name>.*`` (name: the node key's fingerprint)."""
    name = fingerprint(load_generation(d).node.public)
    for file, mode in _FILES.items():
        if (d / file).exists():
            _write_atomic(d / (generation_prefix(name) + file), (d / file).read_text(), mode)
    return name


def _new_generation(d: Path) -> str:
    """Generate a keypair generation (``zmq.auth.create_certificates``, as ``dstl keys
    generate``, in a private temporary directory) into ``gen-<name>.*``; returns the
    name."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=d))
    try:
        for who in (NODE, WRITER):
            zmq.auth.create_certificates(tmp, who)
        name = fingerprint(zmq.auth.load_certificate(tmp / f"{NODE}.key")[0])
        for file, mode in _FILES.items():
            _write_atomic(d / (generation_prefix(name) + file), (tmp / file).read_text(), mode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return name


def _check_complete(d: Path, name: str) -> None:
    prefix = generation_prefix(name)
    missing = [prefix + f for f in _FILES if not (d / (prefix + f)).exists()]
    if missing:
        raise RotationError(f"{d}: {', '.join(missing)} missing: rotate the full key directory")
    load_generation(d, name)  # parses, checks the secrets' modes


def _make_current(d: Path, current: str, previous: str) -> None:
    """State "promoted" with generation ``current`` current and ``previous`` kept
    (``rotation.json`` the commit point), then the top-level files ``current``'s."""
    _check_complete(d, current)
    _write_atomic(d / ROTATION_FILE, manifest_text(PROMOTED, current, previous), 0o644)
    _sync_top_level(d, current)


def _sync_top_level(d: Path, name: str) -> None:
    """Make the top-level files copies of generation ``name``'s (each replaced
    atomically; one missing there is removed here)."""
    prefix = generation_prefix(name)
    for file, mode in _FILES.items():
        if (d / (prefix + file)).exists():
            _write_atomic(d / file, (d / (prefix + file)).read_text(), mode)
        else:
            with contextlib.suppress(FileNotFoundError):
                (d / file).unlink()


def _write_atomic(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to a temporary file of mode ``mode`` beside ``path`` (flushed to
    disk), then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
