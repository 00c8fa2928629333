"""The bridge's frames (docs/structured-streaming.md, "Bridge protocol"): pure encoding,
an incremental reader and typed, fully checked requests.

A frame is ``u32 header_length | header (UTF-8 JSON object) | u32 payload_length |
payload``, lengths big-endian. Nothing read is trusted: every length is bounded before
anything is allocated, every field's type and range is checked, and every path is
checked to stay below the query's root (relative, normalized, no ``..``). Every failure is a
:class:`WireError` carrying the reply code.
"""

from __future__ import annotations

import json
import posixpath
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

PROTOCOL_VERSIONS: Final = (1, 2)
"""Protocol versions this side speaks, ascending. 1: state files only (a client of
version 1 sends nothing else); 2: every file of a checkpoint location, and a commit
that carries its ``commits/<N>`` file."""
MAX_HEADER: Final = 64 * 1024  # bytes of a frame's JSON header
MAX_PAYLOAD: Final = 8 * 1024 * 1024  # bytes of a frame's payload
MAX_ROOT: Final = 4096  # bytes of a root URI (UTF-8)
MAX_PATH: Final = 4096  # bytes of a relative path (UTF-8)
MAX_TIMEOUT: Final = 3600.0  # seconds a commit may ask to wait
MAX_APP: Final = 256  # characters of a hello's application id
CODES: Final = frozenset(
    {"version", "malformed", "too-large", "path", "not-found", "unavailable", "internal"}
)
_LEN = struct.Struct("!I")

Header = dict[str, Any]
Recv = Callable[[int], bytes]
"""``recv(n)``: up to ``n`` bytes (b"" at the end of the stream), like ``socket.recv``."""


class WireError(Exception):
    """A request the bridge refuses; ``code`` is the reply's code (:data:`CODES`),
    ``fatal`` says whether the connection must be closed after the reply (a frame
    whose bounds cannot be trusted leaves the stream out of step)."""

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        assert code in CODES, code
        self.code = code
        self.fatal = fatal


class ConnectionClosed(Exception):
    """The peer closed the stream at a frame boundary (a clean end)."""


# -- frames ------------------------------------------------------------------------------


def dump(header: Header, payload: bytes = b"") -> list[bytes]:
    """The frame of ``header`` and ``payload`` as buffers to send back to back.
    Raises WireError(``too-large``) when either exceeds its bound."""
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) > MAX_HEADER:
        raise WireError("too-large", f"header of {len(raw)} bytes > {MAX_HEADER}")
    if len(payload) > MAX_PAYLOAD:
        raise WireError("too-large", f"payload of {len(payload)} bytes > {MAX_PAYLOAD}")
    return [_LEN.pack(len(raw)), raw, _LEN.pack(len(payload)), payload]


def encode(header: Header, payload: bytes = b"") -> bytes:
    """:func:`dump` joined into one bytes object."""
    return b"".join(dump(header, payload))


def _read_exact(recv: Recv, n: int, started: bool) -> bytes:
    """Exactly ``n`` bytes from ``recv``. Raises ConnectionClosed for an end before the
    first byte of a frame, WireError(``malformed``, fatal) for an end inside one."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = recv(min(n - got, 1 << 20))
        if not chunk:
            if not started and got == 0:
                raise ConnectionClosed
            raise WireError("malformed", f"truncated frame: {got} of {n} bytes", fatal=True)
        parts.append(chunk)
        got += len(chunk)
        started = True
    return b"".join(parts)


def read_frame(source: Recv | Any) -> tuple[Header, bytes]:
    """Read one frame from ``source`` (a ``recv``-like callable, or a socket or binary
    file: its ``recv`` or ``read`` is used). Returns (header dict, payload bytes).
    Lengths are checked before the bytes are read. Raises ConnectionClosed at a clean
    end, WireError(``too-large`` or ``malformed``, fatal) otherwise."""
    recv: Recv = source if callable(source) else getattr(source, "recv", None) or source.read
    (hlen,) = _LEN.unpack(_read_exact(recv, 4, False))
    if hlen > MAX_HEADER:
        raise WireError("too-large", f"header length {hlen} > {MAX_HEADER}", fatal=True)
    raw = _read_exact(recv, hlen, True)
    (plen,) = _LEN.unpack(_read_exact(recv, 4, True))
    if plen > MAX_PAYLOAD:
        raise WireError("too-large", f"payload length {plen} > {MAX_PAYLOAD}", fatal=True)
    payload = _read_exact(recv, plen, True)
    return _load_header(raw), payload


def _load_header(raw: bytes) -> Header:
    """The JSON object of a header. Raises WireError(``malformed``): the frame's bounds
    were fine, so the stream stays in step (not fatal)."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError("malformed", f"header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise WireError("malformed", "header is not a JSON object")
    return header


def error_header(code: str, message: str, **extra: Any) -> Header:
    """A reply header for a refused request."""
    return {"ok": False, "error": message[:1000], "code": code, **extra}


# -- requests ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """``versions``: the protocol versions the client speaks; ``app``: the Spark
    application the connection writes for (``spark.app.id``; optional, "" when not
    sent), which decides whether its files wait for a commit (docs/structured-streaming.md,
    "Durability"). ``plain`` and ``jvm`` (optional): the state files the JVM ``jvm``
    (``<pid>@<host>``) wrote as plain files so far because no bridge answered, which
    ``dstl status`` shows as fallbacks."""

    versions: tuple[int, ...]
    app: str = ""
    plain: int = 0
    jvm: str = ""


@dataclass(frozen=True)
class Put:
    """One chunk of a file: ``offset`` = bytes sent before it, ``last`` ends the file."""

    root: str
    path: str
    offset: int
    last: bool
    data: bytes


@dataclass(frozen=True)
class Stat:
    root: str
    path: str


@dataclass(frozen=True)
class Read:
    """Up to ``length`` bytes (capped at MAX_PAYLOAD) at ``offset``."""

    root: str
    path: str
    offset: int
    length: int


@dataclass(frozen=True)
class List:
    """Direct children of directory ``dir`` ("": the root itself)."""

    root: str
    dir: str


@dataclass(frozen=True)
class Delete:
    root: str
    path: str


@dataclass(frozen=True)
class Commit:
    """Wait until every file accepted for ``root`` is durable, at most ``timeout`` s;
    with ``path``, first accept that file (``data``), persisted in the same flush as
    the batch's state files (protocol 2). ``boot``: the bridge process the driver's
    ``drive`` reply named (None: not sent); another one means the bridge restarted
    since and may have lost held files."""

    root: str
    timeout: float
    boot: str | None = None
    path: str | None = None  # the commit file (``commits/<N>``), its bytes the payload
    data: bytes = b""


@dataclass(frozen=True)
class Drive:
    """The connection's application drives ``root`` from this host: its driver is
    about to run a batch (it writes ``offsets/<N>``) and will commit here."""

    root: str


@dataclass(frozen=True)
class Status:
    """The bridge's figures and those of the queries it serves (``dstl status``)."""


Request = Hello | Put | Stat | Read | List | Delete | Commit | Drive | Status
_NO_PAYLOAD = {"hello", "stat", "read", "list", "delete", "drive", "status"}


def parse_request(header: Header, payload: bytes = b"") -> Request:
    """The typed request of a frame. Raises WireError: ``malformed`` (unknown op,
    missing, extra or mistyped field, payload where none belongs), ``too-large``,
    ``path`` (see :func:`check_path`)."""
    op = header.get("op")
    parser = _PARSERS.get(op) if isinstance(op, str) else None
    if parser is None:
        raise WireError("malformed", f"unknown op {op!r}")
    if op in _NO_PAYLOAD and payload:
        raise WireError("malformed", f"{op} carries no payload, got {len(payload)} bytes")
    return parser(header, payload)


def _fields(header: Header, *names: str) -> list[Any]:
    extra = set(header) - {"op", *names}
    if extra:
        raise WireError("malformed", f"unknown fields {sorted(extra)}")
    missing = [n for n in names if n not in header]
    if missing:
        raise WireError("malformed", f"missing fields {missing}")
    return [header[n] for n in names]


def _uint(x: Any, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0 or x >= 1 << 63:
        raise WireError("malformed", f"{what}: expected an integer in [0, 2**63), got {x!r}")
    return x


def _bool(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise WireError("malformed", f"{what}: expected true or false, got {x!r}")
    return x


def check_root(root: Any) -> str:
    """``root`` if it is a URI string of 1..MAX_ROOT UTF-8 bytes without NUL or
    control characters. Raises WireError (``malformed`` for a non-string, ``path``)."""
    if not isinstance(root, str):
        raise WireError("malformed", f"root: expected a string, got {type(root).__name__}")
    size = len(root.encode("utf-8", "surrogatepass"))
    if not 0 < size <= MAX_ROOT:
        raise WireError("path", f"root of {size} bytes: must be 1..{MAX_ROOT}")
    if any(ord(c) < 0x20 or c == "\x7f" for c in root) or not root.isprintable():
        raise WireError("path", "root holds control characters")
    return root


def check_path(path: Any, what: str = "path", *, allow_root: bool = False) -> str:
    """``path`` if it is relative, ``/``-separated and normalized (a file below the
    query root; "" for the root itself only with ``allow_root``, for listings). Raises
    WireError: ``malformed`` for a non-string, ``path`` for anything else wrong
    (absolute, ``..``, ``.``, empty component, NUL, backslash, too long)."""
    if not isinstance(path, str):
        raise WireError("malformed", f"{what}: expected a string, got {type(path).__name__}")
    if path == "" and allow_root:
        return path
    if not path or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise WireError("path", f"{what}: must be 1..{MAX_PATH} bytes")
    if "\x00" in path or "\\" in path or not path.isprintable():
        raise WireError("path", f"{what}: NUL, backslash or control character")
    if path.startswith("/"):
        raise WireError("path", f"{what}: absolute path {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or posixpath.normpath(path) != path:
        raise WireError("path", f"{what}: not normalized: {path!r}")
    return path


def _hello(h: Header, _: bytes) -> Hello:
    app, jvm = h.get("app", ""), h.get("jvm", "")
    plain = _uint(h.get("plain", 0), "plain")
    (versions,) = _fields({k: v for k, v in h.items() if k not in _HELLO_OPTIONAL}, "versions")
    if not isinstance(versions, list) or not 0 < len(versions) <= 64:
        raise WireError("malformed", "versions: expected a list of 1..64 integers")
    for name, text in (("app", app), ("jvm", jvm)):
        if not isinstance(text, str) or len(text) > MAX_APP or not text.isprintable():
            raise WireError(
                "malformed", f"{name}: expected a printable string of 0..{MAX_APP} characters"
            )
    return Hello(tuple(_uint(v, "versions") for v in versions), app, plain, jvm)


_HELLO_OPTIONAL = {"app", "plain", "jvm"}


def _status(h: Header, _: bytes) -> Status:
    _fields(h)
    return Status()


def _put(h: Header, payload: bytes) -> Put:
    root, path, offset, last = _fields(h, "root", "path", "offset", "last")
    return Put(
        check_root(root), check_path(path), _uint(offset, "offset"), _bool(last, "last"), payload
    )


def _stat(h: Header, _: bytes) -> Stat:
    root, path = _fields(h, "root", "path")
    return Stat(check_root(root), check_path(path))


def _read(h: Header, _: bytes) -> Read:
    root, path, offset, length = _fields(h, "root", "path", "offset", "length")
    return Read(
        check_root(root), check_path(path), _uint(offset, "offset"), _uint(length, "length")
    )


def _list(h: Header, _: bytes) -> List:
    root, d = _fields(h, "root", "dir")
    return List(check_root(root), check_path(d, "dir", allow_root=True))


def _delete(h: Header, _: bytes) -> Delete:
    root, path = _fields(h, "root", "path")
    return Delete(check_root(root), check_path(path))


def _commit(h: Header, payload: bytes) -> Commit:
    boot, path = h.get("boot"), h.get("path")
    rest = {k: v for k, v in h.items() if k not in ("boot", "path")}
    root, timeout = _fields(rest, "root", "timeout")
    ok = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if not ok or not 0 <= timeout <= MAX_TIMEOUT:
        raise WireError("malformed", f"timeout: expected seconds in [0, {MAX_TIMEOUT}]")
    if boot is not None and not (isinstance(boot, str) and 0 < len(boot) <= 64 and boot.isalnum()):
        raise WireError("malformed", "boot: expected 1..64 letters and digits")
    if path is None and payload:
        raise WireError(
            "malformed", f"commit without a path carries no payload, got {len(payload)}"
        )
    checked = None if path is None else check_path(path)
    return Commit(check_root(root), float(timeout), boot, checked, payload)


def _drive(h: Header, _: bytes) -> Drive:
    (root,) = _fields(h, "root")
    return Drive(check_root(root))


_PARSERS: dict[str, Callable[[Header, bytes], Request]] = {
    "hello": _hello,
    "put": _put,
    "stat": _stat,
    "read": _read,
    "list": _list,
    "delete": _delete,
    "commit": _commit,
    "drive": _drive,
    "status": _status,
}


def check_v1(req: Request) -> None:
    """Refuse what protocol 1 does not have: a path outside ``state/`` (a listing of
    ``state`` itself aside), a commit carrying a file. Raises WireError(``path``)."""
    path = getattr(req, "dir", None) if isinstance(req, List) else getattr(req, "path", None)
    if isinstance(req, Commit):
        if path is not None:
            raise WireError("path", "protocol 1: a commit carries no file")
        return
    if path is None or path == "state" and isinstance(req, List):
        return
    if not path.startswith("state/"):
        raise WireError("path", f"protocol 1: {path!r} is not below state/")


def negotiate(client_versions: tuple[int, ...]) -> int:
    """The highest version both sides speak. Raises WireError(``version``) naming both
    sides' versions when there is none."""
    common = set(client_versions) & set(PROTOCOL_VERSIONS)
    if not common:
        raise WireError(
            "version",
            f"no common protocol version: client {sorted(set(client_versions))}, "
            f"bridge {list(PROTOCOL_VERSIONS)}",
        )
    return max(common)
