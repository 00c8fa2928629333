"""CURVE keypairs: the cluster key directory and the per-job keypair."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from dstltree.storage.errors import DstlError

NODE = "node"
WRITER = "writer"
_Z85_KEY_LEN = 40  # z85 of a 32-byte Curve25519 key


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


@dataclass(frozen=True)
class ClusterKeys:
    """The cluster's ``node`` and ``writer`` keypairs (a secret may be absent where it
    is not needed: nodes need the node secret, the nodes' clients the writer secret)."""

    node: Keypair
    writer: Keypair
    directory: Path | None = None

    @classmethod
    def generate(cls) -> ClusterKeys:
        return cls(Keypair.generate(), Keypair.generate())


def generate_key_dir(directory: str | Path, force: bool = False) -> ClusterKeys:
    """Create the cluster keys in ``directory`` (made 0700 if new): ``node.key``,
    ``writer.key`` (public, 0644) and ``node.key_secret``, ``writer.key_secret``
    (0600), with ``zmq.auth.create_certificates``. Raises KeyDirError if one of the
    files exists and ``force`` is False."""
    d = Path(directory)
    names = [f"{n}{s}" for n in (NODE, WRITER) for s in (".key", ".key_secret")]
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
    present, else the public key from ``<name>.key``. Raises KeyDirError (naming the
    file) if a name has neither file, a file is malformed, or a secret file is
    readable by group or others."""
    d = Path(directory)
    if not d.is_dir():
        raise KeyDirError(f"{d}: no such key directory (dstl keys generate {d})")
    return ClusterKeys(_load_pair(d, NODE), _load_pair(d, WRITER), d)


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
    secret and the writer's public key (shipped to executors, see
    :func:`write_key_files`). Raises KeyDirError without the node secret."""
    if keys.node.secret is None:
        raise KeyDirError("the node secret key is needed to start nodes")
    return {
        f"{NODE}.key_secret": _cert(keys.node),
        f"{WRITER}.key": _cert(keys.writer.public_only()),
    }


def write_key_files(files: dict[str, str], directory: str | Path) -> Path:
    """Write ``files`` (from :func:`key_files`) into ``directory`` (made 0700), each
    0600 from its creation; returns the directory."""
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, text in files.items():
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
