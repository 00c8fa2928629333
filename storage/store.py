"""The DFS boundary: every object-store access goes through :class:`ObjectStore`.

Storage is addressed only by fsspec URLs plus ``storage_options`` (``/tmp/x``,
``file:///tmp/x``, ``s3://bucket/prefix``, ``memory://x``). fsspec, OS, s3fs and
botocore errors are translated here (:func:`translate`) into :class:`StorageError`, or
:class:`RetryableStorageError` for throttling (503 SlowDown), 5xx, timeouts and
connection resets, with the cause chained.

Writes: :meth:`ObjectStore.put` is atomic; with ``exclusive=True`` it is a conditional
create that fails with :class:`ObjectExistsError` when the object exists (local POSIX:
a hard link of the written temporary file, which the OS creates only if the name is
free; S3: ``PUT`` with ``If-None-Match: *``, s3fs's ``pipe_file(mode="create")``, on
AWS S3, MinIO and moto; ``memory://``: fsspec's exclusive mode; other stores: a check
then a write, which is not safe against a simultaneous writer). Durability: on a local
POSIX filesystem the object's bytes are fsynced before its name exists, and its
directory (and the parents of directories the write created) after, before
:meth:`ObjectStore.put` returns: two fsyncs per object, a third the first time a
directory is created (a store remembers the directories it knows; a directory is made
for its first object, never ahead); on S3 an object is durable when its
``PUT`` completes; ``memory://`` is never durable.

Retries: every store operation is retried with tenacity, only on
RetryableStorageError, with exponential backoff and full jitter, up to
:attr:`RetryPolicy.max_attempts` attempts (default 3); any other error is raised at
once. The first attempt runs without tenacity; the retries go through one
``Retrying`` per store. Underneath, s3fs retries SlowDown and connection errors
itself (class attribute ``S3FileSystem.retries``, 5) and so does botocore; pass
``config_kwargs={"retries": {"max_attempts": 1}}`` in ``storage_options`` to leave
botocore's share to this layer.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from dstltree.storage.errors import RetryableStorageError, StorageError
from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.reserve import ObjectReservations

Buffer = bytes | bytearray | memoryview
"""What the store writes: bytes-like parts, written back to back."""

# The layout of a base path: changelog objects, snapshots, checkpoint metadata. The
# store names objects (``new_object_path``) but never reads what is inside them.
OBJECT_SUFFIX = ".dstl"
CHANGELOG_DIR = "changelog"
SNAPSHOT_DIR = "materialized"
SNAPSHOT_SUFFIX = ".snap"
CHECKPOINT_DIR = "checkpoints"
#: hashed prefixes changelog objects are spread over (``ObjectStore(prefixes=...)``):
#: S3 admits about 3,500 PUT/s per prefix (AWS S3 performance guidelines), so 256
#: prefixes leave room for far more objects per second than a tree writes; it is also
#: the two-hex-digit layout of earlier versions
DEFAULT_PREFIXES = 256
#: object files a node's or a direct client's local store keeps created ahead
#: (``ObjectStore(reserve_objects=...)``, :mod:`dstltree.storage.reserve`)
RESERVED_OBJECTS = 32

T = TypeVar("T")


class ObjectExistsError(StorageError):
    """An exclusive :meth:`ObjectStore.put` found the object already there."""


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: ``url``, ``size`` in bytes, ``mtime`` in epoch seconds (the
    store's clock: local mtime, S3 ``LastModified``; None when the store gives none)."""

    url: str
    size: int
    mtime: float | None


def is_reservation(info: ObjectInfo) -> bool:
    """Whether ``info`` is a reservation: a changelog object file created ahead and not
    written yet (:mod:`dstltree.storage.reserve`), i.e. an empty ``*.dstl`` file. It is
    no object (an object holds at least its index and footer, never zero bytes), but it
    is a file of the job: orphan cleanup lists and deletes it like any other."""
    return info.size == 0 and info.url.endswith(OBJECT_SUFFIX)


def _mtime(info: dict[str, Any]) -> float | None:
    """Modification time (epoch seconds) of an fsspec info dict, None if it has none."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def object_prefix(key: str, prefixes: int) -> str:
    """The prefix directory of an object whose id is ``key``, one of ``prefixes`` (>= 1)
    names spread evenly by a hash of the key: ``prefixes - 1`` written in hex, all of
    the same width (``00``..``ff`` for 256). The simulated store places its objects
    with it too. Raises ValueError for ``prefixes < 1``."""
    if prefixes < 1:
        raise ValueError(f"prefixes must be >= 1, got {prefixes}")
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return f"{h % prefixes:0{len(f'{prefixes - 1:x}')}x}"


def _plain_local(path: str) -> bool:
    """True if fsspec's local filesystem maps ``path`` to itself: an absolute POSIX path
    with no trailing slash (no protocol to strip, nothing to make absolute). Lets a
    local store skip that call on every object it names and writes."""
    return os.sep == "/" and path[:1] == "/" and path[-1:] != "/"


def fsync_dir(path: str) -> None:
    """fsync a local directory (makes a rename or link in it durable). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}


def _link_exclusive(tmp: str, path: str) -> None:
    """Give the written ``tmp`` the name ``path`` only if it is free (FileExistsError
    otherwise): a hard link; on a filesystem without hard links, ``O_EXCL`` create and
    a copy of the bytes (readers may then see a partial object for a moment)."""
    try:
        os.link(tmp, path)
        return
    except OSError as e:
        if isinstance(e, FileExistsError) or e.errno not in _NO_LINKS:
            raise
    with open(tmp, "rb") as src, open(path, "xb") as dst:
        dst.write(src.read())
        dst.flush()
        os.fsync(dst.fileno())


def _put_in_place(path: str, chunks: Sequence[Buffer]) -> int | None:
    """Write ``chunks`` into the existing reserved file ``path`` and fsync it (its
    name is durable already); None when the file is gone, before or while it was
    written (the caller then writes it the usual way). Raises OSError."""
    try:
        fd = os.open(path, _IN_PLACE_FLAGS)
    except FileNotFoundError:
        return None
    try:
        size = _write_all(fd, chunks)
        os.fsync(fd)
        if os.fstat(fd).st_nlink == 0:  # deleted meanwhile: these bytes have no name
            return None
    finally:
        os.close(fd)
    return size


def _makedirs_durable(parent: str) -> None:
    """Create ``parent`` and its missing ancestors, fsyncing the directory each new one
    was created in (a new directory entry is durable only once its parent is synced)."""
    missing: list[str] = []
    cur = parent
    while cur and not os.path.isdir(cur):
        missing.append(cur)
        nxt = os.path.dirname(cur)
        if nxt == cur:
            break
        cur = nxt
    if not missing:
        return
    os.makedirs(parent, exist_ok=True)
    for d in reversed(missing):
        fsync_dir(os.path.dirname(d) or "/")


_BUFFERS = (bytes, bytearray, memoryview)  # one object, not a union built per put
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_IN_PLACE_FLAGS = os.O_WRONLY | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16
_MAX_KNOWN_DIRS = 65536  # directories an ObjectStore remembers (then it forgets them all)


def _bytes_view(buf: Buffer) -> memoryview:
    """A flat byte view of ``buf`` (no copy). Raises TypeError if not contiguous."""
    m = memoryview(buf)
    return m if m.ndim == 1 and m.format == "B" else m.cast("B")


def _write_all(fd: int, chunks: Sequence[Buffer]) -> int:
    """Write ``chunks`` back to back to ``fd`` without joining them: ``os.writev`` with
    up to IOV_MAX buffers per call, a partial write resumed where it stopped. Returns
    the bytes written. Raises OSError."""
    views = [v for v in map(_bytes_view, chunks) if v.nbytes]
    size = sum(v.nbytes for v in views)
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        if n <= 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        while n:
            head = views[i]
            if n < head.nbytes:
                views[i] = head[n:]
                break
            n -= head.nbytes
            i += 1
    return size


# OS error numbers of transient failures. s3fs maps S3 "SlowDown"/"ServiceUnavailable"/
# 503 to EBUSY and "InternalError"/500 to EREMOTEIO (s3fs/errors.py).
_RETRYABLE_ERRNOS = {
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
    errno.EAGAIN,
    errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO),
}
# Codes and statuses of a store that asks for fewer requests (throttling), a subset of
# the retryable ones: S3 "503 Slow Down", AWS throttling codes, HTTP 429.
_THROTTLING_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "BandwidthLimitExceeded",
}
# S3 / AWS error codes of transient failures (AWS S3 API "Error responses").
_RETRYABLE_CODES = _THROTTLING_CODES | {
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "OperationAborted",
}
_RETRYABLE_STATUS = {429, 500, 502, 503, 504}
_NOT_RETRYABLE_TYPES: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)
# Last resort for errors that carry no code: words in the message.
_RETRYABLE_TEXT = re.compile(
    r"slow ?down|throttl|timeout|timed out|connection (?:was )?reset|reset by peer"
    r"|internalerror|serviceunavailable|service unavailable|reduce your request rate"
    r"|\b(?:500|502|503|504)\b",
    re.IGNORECASE,
)


def _cause_chain(e: BaseException) -> list[BaseException]:
    """``e`` then its ``__cause__``/``__context__`` ancestors (cycle-safe, at most 16)."""
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 16 and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ if cur.__cause__ is not None else cur.__context__
    return seen


def _aws_code(e: BaseException) -> tuple[str | None, int | None]:
    """(error code, HTTP status) of a botocore ClientError (None, None otherwise)."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return None, None
    err = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = err.get("Code")
    status = meta.get("HTTPStatusCode")
    return (str(code) if code is not None else None), (
        int(status) if isinstance(status, int | str) and str(status).isdigit() else None
    )


def _transport_error_types() -> tuple[type[BaseException], ...]:
    """Connection-level error classes of botocore and aiohttp (all retryable)."""
    types: list[type[BaseException]] = [TimeoutError, ConnectionError]
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError

        types += [HTTPClientError, BotoConnectionError]
    except ImportError:  # pragma: no cover - botocore ships with s3fs
        pass
    try:
        from aiohttp import ClientConnectionError, ClientPayloadError

        types += [ClientConnectionError, ClientPayloadError]
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


_TRANSPORT_ERRORS = _transport_error_types()


def classify(e: BaseException) -> tuple[bool, str | None]:
    """Whether ``e`` is a transient storage failure, and the S3 error code if one is found.

    Walks the cause chain (s3fs raises OSError/PermissionError with the botocore
    ClientError chained): an AWS error code or HTTP status decides first (SlowDown,
    ServiceUnavailable, InternalError, RequestTimeout, 429/5xx are retryable; other
    codes are not), then connection/timeout errors (retryable), then
    not-found/permission errors (not retryable), then OS error numbers (EBUSY,
    EREMOTEIO, ETIMEDOUT, ECONNRESET...), and last words in the message.
    """
    chain = _cause_chain(e)
    for c in chain:
        code, status = _aws_code(c)
        if code is not None or status is not None:
            numeric = int(code) if code is not None and code.isdigit() else None
            if code in _RETRYABLE_CODES or numeric in _RETRYABLE_STATUS:
                return True, code
            if status in _RETRYABLE_STATUS:
                return True, code or str(status)
            return False, code or str(status)
    for c in chain:
        if isinstance(c, RetryableStorageError):
            return True, None
        if isinstance(c, _NOT_RETRYABLE_TYPES):
            return False, None
        if isinstance(c, _TRANSPORT_ERRORS):
            return True, None
        if isinstance(c, OSError) and c.errno in _RETRYABLE_ERRNOS:
            return True, None
    return bool(_RETRYABLE_TEXT.search(f"{type(e).__name__}: {e}")), None


_THROTTLING_STATUS = {429, 503}
_THROTTLING_TEXT = re.compile(
    r"slow ?down|throttl|reduce your request rate|too many requests|\b(?:429|503)\b",
    re.IGNORECASE,
)


def is_throttling(e: BaseException) -> bool:
    """Whether ``e`` (or a cause in its chain) says the store is throttling: S3 ``503
    SlowDown``, an AWS throttling code, HTTP 429/503, EBUSY (s3fs's errno for SlowDown
    and 503, s3fs/errors.py), or such words in a message (a StorageError made by
    :func:`translate` carries the code in its text). Hedging stops on it
    (:class:`dstltree.topology.latency.HedgingPolicy`)."""
    chain = _cause_chain(e)
    for c in chain:
        code, status = _aws_code(c)
        if code is not None or status is not None:
            numeric = int(code) if code is not None and code.isdigit() else None
            return (
                code in _THROTTLING_CODES
                or numeric in _THROTTLING_STATUS
                or status in _THROTTLING_STATUS
            )
    for c in chain:
        if isinstance(c, OSError) and c.errno == errno.EBUSY:
            return True
    return any(_THROTTLING_TEXT.search(f"{type(c).__name__}: {c}") for c in chain)


def translate(op: str, path: str, e: BaseException) -> StorageError:
    """Map an fsspec/OS/s3fs/botocore error to a StorageError; transient ones (see
    :func:`classify`) to RetryableStorageError. The caller raises it ``from e``.
    A StorageError is returned unchanged."""
    if isinstance(e, StorageError):
        return e
    retryable, code = classify(e)
    text = f"{type(e).__name__}: {e}" + (f" [{code}]" if code else "")
    if not retryable and (isinstance(e, FileExistsError) or code == "PreconditionFailed"):
        return ObjectExistsError(op, path, text)
    cls = RetryableStorageError if retryable else StorageError
    return cls(op, path, text)


@dataclass(frozen=True)
class RetryPolicy:
    """How store operations are retried: at most ``max_attempts`` attempts (>= 1) in
    all; before attempt n+1 a random wait in [0, min(max_backoff, initial_backoff *
    2**n)] seconds (exponential backoff, full jitter). Only RetryableStorageError is
    retried. Raises ValueError for bad numbers."""

    max_attempts: int = 3
    initial_backoff: float = 0.05
    max_backoff: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff times must be >= 0 seconds")


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass
class StoreStats:
    """Counters of one ObjectStore (for metrics): retries and failed operations by
    operation name (``put``, ``read``, ``stat``, ``list``, ``delete``)."""

    retries: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, kind: str, op: str) -> None:
        with self._lock:
            d = self.retries if kind == "retry" else self.failures
            d[op] = d.get(op, 0) + 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"retries": dict(self.retries), "failures": dict(self.failures)}


def _innermost(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """The filesystem under wrappers that expose it as ``.fs`` (dirfs, fault injection)."""
    for _ in range(8):
        inner = getattr(fs, "fs", None)
        if not isinstance(inner, fsspec.AbstractFileSystem):
            break
        fs = inner
    return fs


def _attempt(op: str, url: str, fn: Callable[[], T], *_: object) -> T:
    """One try of ``fn``; any error leaves translated (:func:`translate`) ``from`` it."""
    try:
        return fn()
    except Exception as e:
        raise translate(op, url, e) from e


class ObjectStore:
    """Objects under one base path. Paths handed out and accepted are full URLs
    (plain absolute paths for the local filesystem).

    ``fs`` may be given to wrap the filesystem (fault injection,
    :class:`dstltree.storage.faults.FaultyFileSystem`); otherwise it is built from ``base_path`` and
    ``storage_options``. ``retry`` sets how transient failures are retried (default
    :class:`RetryPolicy`: 3 attempts); ``stats`` counts retries and failures.
    ``prefixes`` (>= 1, default DEFAULT_PREFIXES) is how many hashed prefixes new
    changelog objects are spread over (:meth:`new_object_path`); readers take paths
    as handles store them, so changing it never hides an object. ValueError for
    ``prefixes < 1``. ``reserve_objects`` (default 0): on a bare local filesystem, how
    many object files :meth:`new_object_path` keeps created ahead so that a put writes
    into an existing file with one fsync (:mod:`dstltree.storage.reserve`); call
    :meth:`close` to delete the unused ones.
    """

    def __init__(
        self,
        base_path: str,
        storage_options: dict[str, Any] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        *,
        retry: RetryPolicy | None = None,
        prefixes: int = DEFAULT_PREFIXES,
        reserve_objects: int = 0,
    ) -> None:
        if prefixes < 1:
            raise ValueError(f"prefixes must be >= 1, got {prefixes}")
        self.prefixes = prefixes
        opts = dict(storage_options or {})
        if fs is None:
            fs, root = fsspec.core.url_to_fs(base_path, **opts)
        else:
            root = fs._strip_protocol(base_path)
        self.fs: fsspec.AbstractFileSystem = fs
        self.storage_options = opts
        self.retry_policy = retry or RetryPolicy()
        self.stats = StoreStats()
        self._retrying = self._make_retrying()
        # local directories known to exist durably (created here or found): no stat
        # or mkdir per object once a directory is known
        self._dirs: set[str] = set()
        # Local paths stay plain also under a wrapper; only a bare local fs writes
        # through a temporary file (wrappers keep writes atomic themselves).
        self._local = isinstance(_innermost(fs), LocalFileSystem)
        self._bare_local = isinstance(fs, LocalFileSystem)
        self.root: str = str(root).rstrip("/") or "/"
        self.base_url = self.url(self.root)
        self._changelog_url = self.join(CHANGELOG_DIR)
        self._reserved: ObjectReservations | None = None
        if reserve_objects > 0 and self._bare_local:
            self._reserved = ObjectReservations(
                lambda n: [self._path(u) for u in self._fresh_object_paths(n)],
                self._ensure_dir,
                fsync_dir,
                reserve_objects,
            )

    def close(self) -> None:
        """Delete the object files created ahead and not handed out (idempotent); the
        store stays usable (it names objects the usual way afterwards)."""
        if self._reserved is not None:
            self._reserved.close()

    # -- retries -----------------------------------------------------------------------
    def _call(
        self,
        op: str,
        url: str,
        fn: Callable[[], T],
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        """Run ``fn`` with the retry policy; errors leave as StorageError ``from`` the
        original. The first attempt runs directly; only after a retryable failure do
        the remaining attempts go through the store's one tenacity ``Retrying`` (built
        once in the constructor), which re-raises the last attempt's error."""
        try:
            return _attempt(op, url, fn)
        except RetryableStorageError as e:
            if self.retry_policy.max_attempts == 1:
                self.stats.count("failure", op)
                raise
            self._before_retry(op, e, on_retry)
        except StorageError:
            self.stats.count("failure", op)
            raise
        p = self.retry_policy
        time.sleep(random.uniform(0, min(p.max_backoff, p.initial_backoff)))
        try:
            return self._retrying(_attempt, op, url, fn, on_retry)
        except StorageError:
            self.stats.count("failure", op)
            raise

    def _before_retry(
        self, op: str, exc: BaseException, on_retry: Callable[[BaseException], None] | None
    ) -> None:
        self.stats.count("retry", op)
        if on_retry is not None:
            on_retry(exc)

    def _before_sleep(self, state: RetryCallState) -> None:
        """tenacity's hook before a retry: the call's ``op`` and ``on_retry`` are its
        arguments (see :meth:`_call`)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            self._before_retry(state.args[0], exc, state.args[3])

    def _make_retrying(self) -> Retrying:
        """Attempts 2..max_attempts of every operation (thread-safe: tenacity keeps its
        per-call state in thread-locals). Before attempt n+1 it waits a random time in
        [0, min(max_backoff, initial_backoff * 2**(n-1))] seconds, the first of these
        waits being :meth:`_call`'s own."""
        p = self.retry_policy
        return Retrying(
            stop=stop_after_attempt(max(p.max_attempts - 1, 1)),
            wait=wait_random_exponential(multiplier=2 * p.initial_backoff, max=p.max_backoff),
            retry=retry_if_exception_type(RetryableStorageError),
            before_sleep=self._before_sleep,
            reraise=True,
        )

    # -- paths -------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """The full URL of a filesystem path (local paths stay plain)."""
        if self._local:
            if _plain_local(path):
                return path
            return str(LocalFileSystem._strip_protocol(path))
        return str(self.fs.unstrip_protocol(path))

    def _path(self, url: str) -> str:
        """The filesystem path of ``url`` (the filesystem's own rule)."""
        if self._local and _plain_local(url):
            return url
        return str(self.fs._strip_protocol(url))

    def join(self, *parts: str) -> str:
        return self.url(posixpath.join(self.root, *parts))

    def new_object_path(self) -> str:
        """A fresh changelog object URL ``<base>/changelog/<prefix>/<id>.dstl`` derived
        from a random id (never from user input); the prefix, one of ``prefixes``
        (:func:`object_prefix`), spreads objects over store partitions so that each
        stays under its request-rate limit. Every prefix lies under
        :meth:`changelog_root`, which listings and orphan cleanup walk. With
        ``reserve_objects`` the name is one whose empty file exists already."""
        if self._reserved is not None and (path := self._reserved.take()) is not None:
            return self.url(path)
        return self._fresh_object_path()

    def _fresh_object_path(self) -> str:
        return self._fresh_object_paths(1)[0]

    def _fresh_object_paths(self, n: int) -> list[str]:
        """``n`` fresh object URLs under the prefix of the first one's random id."""
        oids = [os.urandom(16).hex() for _ in range(n)]
        folder = f"{self._changelog_url}/{object_prefix(oids[0], self.prefixes)}"
        return [f"{folder}/{oid}{OBJECT_SUFFIX}" for oid in oids]

    def new_snapshot_path(self) -> str:
        """A fresh URL for a materialized-state snapshot (random id, like objects)."""
        oid = uuid.uuid4().hex
        return self.join(SNAPSHOT_DIR, oid[:2], oid + SNAPSHOT_SUFFIX)

    def changelog_root(self) -> str:
        return self.join(CHANGELOG_DIR)

    # -- writes ------------------------------------------------------------------------
    def writes_parts(self, exclusive: bool = False) -> bool:
        """Whether :meth:`put` writes the parts one after the other as given (a local
        filesystem, through a temporary file); otherwise it joins them into one bytes
        object for a single write (``PUT``)."""
        return self._local and (exclusive or self._bare_local)

    def prepare(self, parts: Sequence[Buffer] | Buffer, exclusive: bool = False) -> list[Buffer]:
        """``parts`` as :meth:`put` writes them: the buffers themselves (not copied)
        where it writes parts (:meth:`writes_parts`), else ONE bytes object. A caller
        that writes the same bytes several times (hedged attempts) prepares them once;
        :meth:`put` then copies nothing more (a single bytes part is never joined)."""
        if isinstance(parts, _BUFFERS):
            parts = [parts]
        if self.writes_parts(exclusive) or (len(parts) == 1 and type(parts[0]) is bytes):
            return list(parts)
        return [b"".join(parts)]

    def put(
        self,
        url: str,
        parts: Sequence[Buffer] | Buffer,
        *,
        on_retry: Callable[[BaseException], None] | None = None,
        exclusive: bool = False,
    ) -> int:
        """Write a whole object atomically (readers see all of it or nothing).
        Returns its size in bytes. Transient failures are retried (``on_retry`` is
        called with the error before each retry). On a local filesystem the object's
        bytes and then its directory entry are fsynced before this returns (and the
        entries of directories this store creates for it). ``exclusive``: create only
        if absent, else raise :class:`ObjectExistsError` (see the module docstring for
        which stores guarantee it; through a fault-injection wrapper it is one request
        of the wrapper's model, done on the inner filesystem).
        A retried exclusive write whose first attempt landed also raises
        ObjectExistsError: callers tell it apart by reading the object back.
        Raises StorageError."""
        chunks = self.prepare(parts, exclusive)
        path = self._path(url)
        in_place = not exclusive and self._reserved is not None and self._reserved.claim(path)

        def write() -> int:
            if in_place and (size := _put_in_place(path, chunks)) is not None:
                return size
            if self.writes_parts(exclusive):
                return self._put_local(path, chunks, exclusive)
            data = chunks[0]
            if exclusive:
                self._create(path, data)
            else:
                self.fs.pipe_file(path, data)
            return len(data)

        def once() -> int:
            if exclusive and isinstance(self.fs, FaultyFileSystem):  # done on the inner fs
                size = sum(memoryview(c).nbytes for c in chunks)
                return int(self.fs.request("put", path, size, write))
            return write()

        return self._call("put", url, once, on_retry)

    def _create(self, path: str, data: Buffer) -> None:
        """Conditional create on the innermost filesystem; a check then a write where
        the filesystem has no exclusive mode."""
        fs = _innermost(self.fs)
        try:
            fs.pipe_file(path, data, mode="create")
        except (TypeError, NotImplementedError, ValueError):
            if fs.exists(path):
                raise FileExistsError(path) from None
            fs.pipe_file(path, data)

    def _ensure_dir(self, parent: str) -> None:
        """Create ``parent`` durably (:func:`_makedirs_durable`) unless this store
        already knows it exists: no ``stat`` or ``mkdir`` per object, only for the first
        object of each directory. (Directories are made as needed, never ahead: every
        listing, the orphan sweep's included, walks what exists.)"""
        if parent in self._dirs:
            return
        if len(self._dirs) >= _MAX_KNOWN_DIRS:
            self._dirs.clear()
        _makedirs_durable(parent)
        self._dirs.add(parent)

    def _open_tmp(self, parent: str, tmp: str) -> int:
        """Create ``tmp`` in ``parent`` for writing; a directory that vanished since
        this store saw it (deleted from outside) is created again."""
        self._ensure_dir(parent)
        try:
            return os.open(tmp, _TMP_FLAGS, 0o666)
        except FileNotFoundError:
            self._dirs.discard(parent)
            self._ensure_dir(parent)
            return os.open(tmp, _TMP_FLAGS, 0o666)

    def _put_local(self, path: str, chunks: list[Buffer], exclusive: bool = False) -> int:
        """A temporary file written unbuffered (:func:`_write_all`) and fsynced, then
        renamed to ``path`` (or hard-linked when ``exclusive``: FileExistsError if the
        name is taken), then an fsync of the directory: the bytes are durable before
        the name exists, the name before this returns."""
        parent = posixpath.dirname(path)
        tmp = f"{path}.tmp-{os.urandom(4).hex()}"
        fd = self._open_tmp(parent, tmp)
        try:
            try:
                size = _write_all(fd, chunks)
                os.fsync(fd)
            finally:
                os.close(fd)
            if exclusive:
                _link_exclusive(tmp, path)
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
            fsync_dir(parent)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
        return size

    def delete(self, urls: Iterable[str]) -> list[str]:
        """Delete objects; missing ones are ignored. Returns the URLs deleted (S3's
        DELETE is idempotent, so there a missing object may be listed too). Raises
        StorageError (after retries for transient failures)."""
        done = []
        for url in urls:
            path = self._path(url)

            def once(path: str = path) -> bool:
                try:
                    self.fs.rm_file(path)
                except FileNotFoundError:
                    return False
                return True

            if self._call("delete", url, once):
                done.append(url)
        return done

    # -- reads -------------------------------------------------------------------------
    def read(self, url: str) -> bytes:
        """The whole object. Raises StorageError."""
        path = self._path(url)
        return self._call("read", url, lambda: bytes(self.fs.cat_file(path)))

    def read_range(self, url: str, offset: int, length: int) -> bytes:
        """Read up to ``length`` bytes at ``offset``: fewer if the object ends early
        (what a short read means is for the caller to say, e.g.
        :func:`dstltree.client.reader.read_exact`). Raises StorageError."""
        path = self._path(url)
        return self._call(
            "read",
            url,
            lambda: bytes(self.fs.cat_file(path, start=offset, end=offset + length)),
        )

    def size(self, url: str) -> int:
        """Object size in bytes. Raises StorageError (also for a missing object)."""
        path = self._path(url)
        return self._call("stat", url, lambda: int(self.fs.size(path)))

    def exists(self, url: str) -> bool:
        path = self._path(url)
        return self._call("stat", url, lambda: bool(self.fs.exists(path)))

    def list_files(self, prefix_url: str, suffix: str = "") -> list[str]:
        """URLs of every file below ``prefix_url`` ending in ``suffix`` (sorted)."""
        path = self._path(prefix_url)

        def once() -> list[str]:
            if not self.fs.exists(path):
                return []
            return list(self.fs.find(path))

        found = self._call("list", prefix_url, once)
        return sorted(self.url(p) for p in found if p.endswith(suffix))

    def list_info(self, prefix_url: str) -> list[ObjectInfo]:
        """Every file below ``prefix_url`` with its size and modification time (sorted
        by URL); an absent prefix lists nothing. Raises StorageError."""
        path = self._path(prefix_url)

        def once() -> dict[str, Any]:
            if not self.fs.exists(path):
                return {}
            return dict(self.fs.find(path, detail=True))

        found = self._call("list", prefix_url, once)
        out = [
            ObjectInfo(self.url(p), int(i.get("size") or 0), _mtime(i))
            for p, i in found.items()
            if i.get("type", "file") != "directory"
        ]
        return sorted(out, key=lambda o: o.url)

    def list_objects(self) -> list[str]:
        """Every changelog object under the base path (sorted URLs); reservations
        (:func:`is_reservation`: empty files created ahead) are not objects and not
        listed (:meth:`list_reservations`). Raises StorageError."""
        return [
            i.url
            for i in self.list_info(self.changelog_root())
            if i.url.endswith(OBJECT_SUFFIX) and not is_reservation(i)
        ]

    def list_reservations(self) -> list[str]:
        """Every reservation under the base path (sorted URLs): object files created
        ahead and not written yet, by this store or another one (a process that died
        leaves its own). Raises StorageError."""
        return [i.url for i in self.list_info(self.changelog_root()) if is_reservation(i)]

    def list_snapshots(self) -> list[str]:
        """Every materialized-state snapshot under the base path."""
        return self.list_files(self.join(SNAPSHOT_DIR), SNAPSHOT_SUFFIX)
