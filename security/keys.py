"""CURVE keypairs: the cluster key directory and the per-job keypair.

A key directory written by ``dstl keys generate`` holds one generation of cluster keys
(``node.key``, ``node.key_secret``, ``writer.key``, ``writer.key_secret``). While a key
rotation is under way (:mod:`dstltree.security.rotation`) it also holds
``rotation.json`` (the state and the generations' names) and the same four files per
generation, prefixed ``gen-<name>.`` (``gen-<name>.node.key`` ...: plain files beside
the others, so that a directory copy, a Kubernetes Secret made ``--from-file`` or
systemd credentials carry them); the unprefixed files stay the current generation, so
that earlier versions keep reading the directory as before."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from dstltree.storage.errors import DstlError

NODE = "node"
WRITER = "writer"
_Z85_KEY_LEN = 40  # z85 of a 32-byte Curve25519 key

ROTATION_FILE = "rotation.json"
GENERATION_PREFIX = "gen-"
STABLE, STARTED, PROMOTED = "stable", "started", "promoted"
_OTHER = {STARTED: "next", PROMOTED: "previous"}  # the manifest's field of the other generation
_GENERATION_NAME = re.compile(r"[0-9a-f]{16}")
_MAX_MANIFEST_BYTES = 4096


class KeyDirError(DstlError):
    """A key directory cannot be used: missing, unreadable, malformed or incomplete
    (the message names the directory and file), or it exists where it must not."""


@dataclass(frozen=True, repr=False)
class Keypair:
    """A CURVE keypair, z85 bytes (40 each); ``secret`` None = public key only.
    Raises ValueError for a key of another length. The repr hides the secret."""

    public: bytes
    secret: bytes | None = None

    def __post_init__(self) -> None:
        for name, key in (("public", self.public), ("secret", self.secret)):
            if key is not None and len(key) != _Z85_KEY_LEN:
                raise ValueError(f"{name} key: {len(key)} bytes, not a z85 key of 40")

    @classmethod
    def generate(cls) -> Keypair:
        """A fresh keypair (``zmq.curve_keypair``)."""
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    def public_only(self) -> Keypair:
        return Keypair(self.public)

    def __repr__(self) -> str:
        hidden = "None" if self.secret is None else "'***'"
        return f"Keypair(public={self.public.decode()!r}, secret={hidden})"


def job_keys() -> Keypair:
    """The per-job keypair the driver makes for the coordinator and the exchange."""
    return Keypair.generate()


def fingerprint(public: bytes) -> str:
    """A short name of a z85 public key: the first 16 hex digits of the SHA-256 of its
    32 bytes (what ``dstl keys status`` shows). Raises ValueError for a malformed key."""
    if len(public) != _Z85_KEY_LEN:
        raise ValueError(f"public key: {len(public)} bytes, not a z85 key of 40")
    return hashlib.sha256(z85.decode(public)).hexdigest()[:16]


@dataclass(frozen=True)
class Rotation:
    """A key rotation under way: ``state`` is "started" (the other generation is the
    next one: nodes accept its keys and clients know its node key, nobody uses it yet)
    or "promoted" (the other generation is the previous one: still accepted and known,
    no longer used by processes started now). ``current`` and ``other`` name the
    generations (their files ``gen-<name>.*``); ``other_node`` and ``other_writer`` are
    the other generation's public keys."""

    state: str
    current: str
    other: str
    other_node: Keypair
    other_writer: Keypair


@dataclass(frozen=True)
class ClusterKeys:
    """The cluster's ``node`` and ``writer`` keypairs (a secret may be absent where it
    is not needed: nodes need the node secret, the nodes' clients the writer secret),
    those of the generation in use; ``rotation``: the other generation during a key
    rotation (None: no rotation under way)."""

    node: Keypair
    writer: Keypair
    directory: Path | None = None
    rotation: Rotation | None = None

    @classmethod
    def generate(cls) -> ClusterKeys:
        return cls(Keypair.generate(), Keypair.generate())

    def node_keys(self) -> tuple[bytes, ...]:
        """The node public keys a client tries, in order: the one nodes started now
        serve with, then the other generation's during a rotation."""
        if self.rotation is None:
            return (self.node.public,)
        return (self.node.public, self.rotation.other_node.public)

    def accepted(self) -> frozenset[bytes]:
        """The client public keys a node accepts: node and writer keys of the
        generation in use and, during a rotation, of the other one."""
        keys = {self.node.public, self.writer.public}
        if self.rotation is not None:
            keys |= {self.rotation.other_node.public, self.rotation.other_writer.public}
        return frozenset(keys)


def generate_key_dir(directory: str | Path, force: bool = False) -> ClusterKeys:
    """Create the cluster keys in ``directory`` (made 0700 if new): ``node.key``,
    ``writer.key`` (public, 0644) and ``node.key_secret``, ``writer.key_secret``
    (0600), with ``zmq.auth.create_certificates``. Raises KeyDirError if one of the
    files exists and ``force`` is False."""
    d = Path(directory)
    names = [f"{n}{s}" for n in (NODE, WRITER) for s in (".key", ".key_secret")]
    if d.is_dir() and (state := read_manifest(d)["state"]) != STABLE:
        raise KeyDirError(
            f"{d}: a key rotation is under way (state: {state}); finish it "
            "(dstl keys status shows the next step) before generating new keys"
        )
    existing = [n for n in names if (d / n).exists()]
    if existing and not force:
        raise KeyDirError(f"{d}: {', '.join(existing)} exist; give --force to replace them")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    # created in a private (0700) directory, permissions set, then moved in place: no
    # window in which a secret is readable by others
    tmp = Path(tempfile.mkdtemp(prefix=".dstl-keys-", dir=d))
    try:
        for name in (NODE, WRITER):
            public, secret = zmq.auth.create_certificates(tmp, name)
            os.chmod(secret, 0o600)
            os.chmod(public, 0o644)
        for n in names:
            os.replace(tmp / n, d / n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_key_dir(d)


def load_key_dir(directory: str | Path) -> ClusterKeys:
    """The cluster keys of ``directory``: each keypair from ``<name>.key_secret`` if
    present, else the public key from ``<name>.key``; during a key rotation
    (``rotation.json``) those of the current generation (``gen-<name>.node.key``, ...)
    and the other generation's public keys (:attr:`ClusterKeys.rotation`). Raises
    KeyDirError (naming the file) if a name has neither file, a file is malformed, or a
    secret file is readable by group or others."""
    d = Path(directory)
    if not d.is_dir():
        raise KeyDirError(f"{d}: no such key directory (dstl keys generate {d})")
    manifest = read_manifest(d)
    state = manifest["state"]
    if state == STABLE:
        return load_generation(d)
    current, other = manifest["current"], manifest[_OTHER[state]]
    here, there = load_generation(d, current), load_generation(d, other)
    rotation = Rotation(state, current, other, there.node.public_only(), there.writer.public_only())
    return ClusterKeys(here.node, here.writer, d, rotation)


def load_generation(directory: Path, name: str | None = None) -> ClusterKeys:
    """The keypairs of generation ``name`` of ``directory`` (its files
    ``gen-<name>.node.key_secret`` ...; None: the unprefixed files, what earlier
    versions read), as :func:`load_key_dir` reads them, rotation ignored. Raises
    KeyDirError naming a missing or bad file."""
    prefix = "" if name is None else generation_prefix(name)
    return ClusterKeys(
        _load_pair(directory, prefix + NODE), _load_pair(directory, prefix + WRITER), directory
    )


def generation_prefix(name: str) -> str:
    """What the file names of generation ``name`` start with (``gen-<name>.``)."""
    return f"{GENERATION_PREFIX}{name}."


def read_manifest(directory: Path) -> dict[str, str]:
    """The rotation state of a key directory: ``{"state": "stable"}`` without
    ``rotation.json`` (a directory of ``dstl keys generate``), else its fields:
    ``state`` ("stable", "started" or "promoted"), ``current`` and ``next`` (started)
    or ``previous`` (promoted), each a generation name (16 hex digits). Raises
    KeyDirError naming the file when it is unreadable, too long or malformed."""
    path = directory / ROTATION_FILE
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return {"state": STABLE}
    except OSError as e:
        raise KeyDirError(f"{path}: unreadable: {e}") from e
    try:
        doc = json.loads(raw) if len(raw) <= _MAX_MANIFEST_BYTES else None
    except ValueError as e:
        raise KeyDirError(f"{path}: not JSON: {e}") from e
    return _check_manifest(path, doc)


def _check_manifest(path: Path, doc: object) -> dict[str, str]:
    if not isinstance(doc, dict) or doc.get("format") != 1:
        raise KeyDirError(f"{path}: not a rotation manifest of format 1 (at most 4 KiB)")
    state = doc.get("state")
    if state == STABLE:
        return {"state": STABLE}
    if state not in _OTHER:
        raise KeyDirError(f"{path}: state {state!r} is none of stable, started, promoted")
    out = {"state": state}
    for field in ("current", _OTHER[state]):
        name = doc.get(field)
        if not isinstance(name, str) or not _GENERATION_NAME.fullmatch(name):
            raise KeyDirError(f"{path}: {field}: not a generation name (16 hex digits)")
        out[field] = name
    if out["current"] == out[_OTHER[state]]:
        raise KeyDirError(f"{path}: current and {_OTHER[state]} are the same generation")
    return out


def manifest_text(state: str, current: str | None = None, other: str | None = None) -> str:
    """The ``rotation.json`` of ``state`` (``other``: the next generation when
    started, the previous one when promoted)."""
    doc: dict[str, object] = {"format": 1, "state": state}
    if state != STABLE:
        doc.update({"current": current, _OTHER[state]: other})
    return json.dumps(doc, indent=1) + "\n"


def _load_pair(d: Path, name: str) -> Keypair:
    secret_file, public_file = d / f"{name}.key_secret", d / f"{name}.key"
    path = secret_file if secret_file.exists() else public_file
    if not path.exists():
        raise KeyDirError(f"{d}: neither {secret_file.name} nor {public_file.name}")
    if path is secret_file and path.stat().st_mode & 0o077:
        raise KeyDirError(f"{path}: a secret key readable by others (chmod 600 {path})")
    try:
        public, secret = zmq.auth.load_certificate(path)
        return Keypair(public, secret)
    except (OSError, ValueError) as e:
        raise KeyDirError(f"{path}: not a key file: {e}") from e


def key_files(keys: ClusterKeys) -> dict[str, str]:
    """What a node process needs of ``keys`` as file contents by file name: the node
    secret and the writer's public key; during a rotation also ``rotation.json`` and
    the two generations' files (the current one's as above, the other's public keys),
    so that :func:`load_key_dir` reads the same rotation (shipped to executors, see
    :func:`write_key_files`). Raises KeyDirError without the node secret."""
    if keys.node.secret is None:
        raise KeyDirError("the node secret key is needed to start nodes")
    files = {
        f"{NODE}.key_secret": _cert(keys.node),
        f"{WRITER}.key": _cert(keys.writer.public_only()),
    }
    r = keys.rotation
    if r is not None:
        here, there = generation_prefix(r.current), generation_prefix(r.other)
        for name in files.copy():
            files[here + name] = files[name]
        files[f"{there}{NODE}.key"] = _cert(r.other_node.public_only())
        files[f"{there}{WRITER}.key"] = _cert(r.other_writer.public_only())
        files[ROTATION_FILE] = manifest_text(r.state, r.current, r.other)
    return files


def write_key_files(files: dict[str, str], directory: str | Path) -> Path:
    """Write ``files`` (from :func:`key_files`) into ``directory`` (made 0700), each
    0600 from its creation; returns the directory. Raises KeyDirError for a name that
    is not a plain file name."""
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, text in files.items():
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise KeyDirError(f"key file {name!r}: not a plain file name")
        path = d / name
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return d


def _cert(pair: Keypair) -> str:
    text = f'metadata\ncurve\n    public-key = "{pair.public.decode()}"\n'
    if pair.secret is not None:
        text += f'    secret-key = "{pair.secret.decode()}"\n'
    return text
