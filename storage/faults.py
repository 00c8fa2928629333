"""Fault injection for the DFS boundary: a wrapping fsspec filesystem.

:class:`FaultyFileSystem` wraps any fsspec filesystem and, per request, adds

- a latency drawn from a named latency model of ``topology.latency`` (inverse CDF of
  a percentile table, e.g. ``flip158-s3`` = FLIP-158 "DFS write latency"), which
  includes the size-proportional transfer time ``(size - reference) / bandwidth`` of
  the model (size = bytes written or read; 0 for metadata requests and deletes);
- errors by kind, with probabilities per request: ``throttle`` (an S3 503 SlowDown,
  raised the way s3fs raises it: OSError(EBUSY) with the botocore ClientError
  chained), ``error500`` (S3 500 InternalError, OSError(EREMOTEIO)), ``timeout``
  (TimeoutError after ``timeout_s``) and ``reset`` (ConnectionResetError);
- stalls: with probability ``stall`` a request hangs for ``stall_s`` seconds first,
  then completes normally (what request hedging is for);
- ambiguous answers: with probability ``lost_reply`` a request *lands* (the write is
  done, the conditional create made) and its reply is lost: the caller gets a
  ConnectionResetError, as when a connection drops after the store acted, and its
  retry finds the object there (Jepsen's "indeterminate" writes).

All times are multiplied by ``scale`` (0 switches every wait off) so tests and
benchmarks run fast. Decisions come from one ``random.Random(seed)``, drawn in request
order: the same sequence of requests gives the same latencies and faults. Failed
writes write nothing. Writes to a local inner filesystem stay atomic (temporary file,
then rename).

Use it directly, ``ObjectStore(base, fs=FaultyFileSystem(inner, "flip158-s3,scale=0.1"))``,
from a spec (``FaultSpec.parse(text).wrap(inner)``), or as the chained protocol
``faulty::s3://bucket/prefix`` with
``storage_options={"faulty": {"spec": "..."}, "s3": {...}}``. The protocol is known to
fsspec in every process through the ``fsspec.specs`` entry point of this package
(pyproject.toml); fsspec imports this module when the protocol is first used.

The spec string (CLI flag ``--dfs-faults``)::

    MODEL[,throttle=P][,error500=P][,timeout=P][,reset=P][,stall=P][,lost_reply=P][,stall_s=S]
         [,timeout_s=S][,scale=F][,seed=N][,ops=put+get+meta+delete]

MODEL is a latency model name (``flip158-s3``, ``flip158-s3-hedged``, ``local``) or
``none`` (no latency); P are probabilities per request in [0, 1] whose sum is at most
1; S are seconds before scaling; ``ops`` names the request kinds that get faults and
latency (default all).
"""

from __future__ import annotations

import errno
import os
import random
import threading
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

import fsspec
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.implementations.local import LocalFileSystem

from dstltree.topology.latency import LatencyModel, get_model

__all__ = [
    "FAULT_KINDS",
    "OPS",
    "FaultEvent",
    "FaultSpec",
    "FaultyFileSystem",
]

FAULT_KINDS = ("throttle", "error500", "timeout", "reset", "stall", "lost_reply")
OPS = ("put", "get", "meta", "delete")
NO_MODEL = "none"


@dataclass(frozen=True)
class FaultSpec:
    """What a :class:`FaultyFileSystem` injects. Probabilities are per request; times in
    seconds before ``scale``. Raises ValueError for out-of-range values or an unknown
    latency model."""

    model: str = NO_MODEL
    throttle: float = 0.0
    error500: float = 0.0
    timeout: float = 0.0
    reset: float = 0.0
    stall: float = 0.0
    lost_reply: float = 0.0
    stall_s: float = 5.0
    timeout_s: float = 2.0
    scale: float = 1.0
    seed: int = 0
    ops: tuple[str, ...] = OPS

    def __post_init__(self) -> None:
        for kind in FAULT_KINDS:
            p = getattr(self, kind)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"fault rate {kind}={p} must be in [0, 1]")
        total = sum(getattr(self, k) for k in FAULT_KINDS)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {total:g} > 1")
        for name in ("stall_s", "timeout_s", "scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        bad = [o for o in self.ops if o not in OPS]
        if bad or not self.ops:
            raise ValueError(f"ops must be a '+'-joined subset of {'+'.join(OPS)}, got {bad}")
        if self.model != NO_MODEL:
            get_model(self.model)  # ValueError naming the known models

    # -- parsing -------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse ``MODEL[,key=value...]`` (see the module docstring). Raises ValueError
        naming the bad key or value and listing the known keys."""
        items = [t.strip() for t in text.split(",")]
        if not items or not items[0] or "=" in items[0]:
            raise ValueError(f"--dfs-faults {text!r}: must start with a latency model name")
        known = {f.name: f for f in fields(cls) if f.name != "model"}
        kwargs: dict[str, Any] = {"model": items[0]}
        for item in items[1:]:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(
                    f"--dfs-faults {text!r}: unknown or malformed key {key!r}; "
                    f"known keys: {', '.join(known)}"
                )
            try:
                kwargs[key] = _convert(key, value.strip())
            except ValueError as e:
                raise ValueError(f"--dfs-faults {text!r}: bad value for {key}: {e}") from None
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"--dfs-faults {text!r}: {e}") from None

    def __str__(self) -> str:
        default = FaultSpec()
        parts = [self.model]
        for k, v in asdict(self).items():
            if k != "model" and v != getattr(default, k):
                parts.append(f"{k}={'+'.join(v) if k == 'ops' else f'{v:g}'}")
        return ",".join(parts)

    # -- use -----------------------------------------------------------------------------
    def latency_model(self) -> LatencyModel | None:
        """The model with ``scale`` applied (None for ``none`` or ``scale=0``)."""
        if self.model == NO_MODEL or self.scale == 0:
            return None
        base = get_model(self.model)
        return base if self.scale == 1 else base.scaled(self.scale)

    def with_seed(self, seed: int) -> FaultSpec:
        return replace(self, seed=seed)

    def wrap(self, fs: fsspec.AbstractFileSystem) -> FaultyFileSystem:
        """A FaultyFileSystem over ``fs`` with this spec."""
        return FaultyFileSystem(fs, self)


def _convert(key: str, value: str) -> Any:
    if key == "seed":
        return int(value)
    if key == "ops":
        return tuple(v for v in value.split("+") if v)
    return float(value)


@dataclass(frozen=True)
class FaultEvent:
    """One request seen by the wrapper: sequence number, kind of request, path, the
    injected fault (None if none) and the latency added in seconds."""

    seq: int
    op: str
    path: str
    fault: str | None
    delay_s: float


@dataclass(frozen=True)
class _Decision:
    seq: int
    fault: str | None
    rng: random.Random


def _landed(d: _Decision, path: str) -> None:
    """Raise the lost reply of a request that landed, if ``d`` says so."""
    if d.fault == "lost_reply":
        raise ConnectionResetError(
            errno.ECONNRESET, f"Connection reset by peer after the request landed {path}"
        )


def _client_error(code: str, status: int, message: str, operation: str) -> OSError:
    """The error s3fs raises for an S3 error response (botocore ClientError chained)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    boto = ClientError(
        {
            "Error": {"Code": code, "Message": f"{message} (injected)"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )
    err = translate_boto_error(boto)
    return err if isinstance(err, OSError) else OSError(errno.EIO, str(err))


#: the kinds of request a request log names (class FaultyFileSystem)
REQUEST_KINDS = ("put", "get", "head", "list", "delete")
_REQUEST_KIND = {"put": "put", "get": "get", "meta": "head", "delete": "delete"}

_S3_OPERATION = {
    "put": "PutObject",
    "get": "GetObject",
    "meta": "HeadObject",
    "delete": "DeleteObject",
}


class FaultyFileSystem(ChainedFileSystem):
    """Wraps ``fs`` (any fsspec filesystem) and injects latency, errors and stalls per
    :class:`FaultSpec` (or a spec string). Thread-safe.

    Requests and their kinds: ``pipe_file`` (put), ``cat_file`` (get), ``info``,
    ``size``, ``exists``, ``ls``, ``find`` (meta), ``rm_file``, ``rm`` (delete).
    ``makedirs``, ``mkdir``, ``mv`` and ``open`` pass through untouched.

    ``fs`` may instead be given as ``target_protocol`` + ``target_options`` (fsspec
    chaining). ``sleep`` replaces the wait (seconds) for tests. ``release()`` ends every
    current and future wait at once (teardown).

    ``request_log``: a file that every request is appended to as one line
    ``<kind>\t<path>``, kind as an object store names it (:data:`REQUEST_KINDS`:
    ``put``, ``get``, ``head`` for ``info``/``size``/``exists``, ``list`` for
    ``ls``/``find``, ``delete``), injected failures included (each try is a request).
    Every process that opens the same URL with the same storage options appends to the
    same file (one ``write`` per line, ``O_APPEND``), so the requests of a whole tree
    can be counted (``dstl bench structured-streaming``).
    """

    protocol: ClassVar[str] = "faulty"
    cachable = False

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem | None = None,
        spec: FaultSpec | str | None = None,
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fo: str | None = None,
        sleep: Callable[[float], None] | None = None,
        request_log: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._request_log = (
            os.open(request_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if request_log
            else None
        )
        if self._request_log is not None:
            weakref.finalize(self, os.close, self._request_log)
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "file", **(target_options or {}))
        self.fs: fsspec.AbstractFileSystem = fs
        self.spec = FaultSpec.parse(spec) if isinstance(spec, str) else (spec or FaultSpec())
        self.model = self.spec.latency_model()
        self._rng = random.Random(self.spec.seed)
        self._lock = threading.Lock()
        self._seq = 0
        self._forced: dict[str, deque[str | None]] = {op: deque() for op in OPS}
        self._wake = threading.Event()
        self._sleep = sleep
        self.counts: Counter[str] = Counter()
        self.events: deque[FaultEvent] = deque(maxlen=100_000)
        # Paths as the inner filesystem sees them (URLs keep the inner protocol).
        self.__dict__["_strip_protocol"] = fs._strip_protocol

    # -- control -------------------------------------------------------------------------
    def inject(self, op: str, fault: str | None, times: int = 1) -> None:
        """Force the next ``times`` requests of kind ``op`` (put, get, meta, delete) to
        get ``fault`` (a FAULT_KINDS entry, or None for none), whatever the rates.
        Raises ValueError for an unknown op or fault."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
        if fault is not None and fault not in FAULT_KINDS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._forced[op].extend([fault] * times)

    def release(self) -> None:
        """End every pending and future wait immediately (stalls, latencies)."""
        self._wake.set()

    def unstrip_protocol(self, name: str) -> str:
        return str(self.fs.unstrip_protocol(name))

    # -- injection -----------------------------------------------------------------------
    def _decide(self, op: str) -> _Decision:
        with self._lock:
            self._seq += 1
            u = self._rng.random()
            call_rng = random.Random(self._rng.getrandbits(64))
            forced = self._forced[op]
            if forced:
                fault = forced.popleft()
            elif op not in self.spec.ops:
                fault = None
            else:
                fault = None
                acc = 0.0
                for kind in FAULT_KINDS:
                    acc += getattr(self.spec, kind)
                    if u < acc:
                        fault = kind
                        break
            return _Decision(self._seq, fault, call_rng)

    def _wait(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self._wake.wait(seconds)

    def _latency(self, op: str, d: _Decision, size: int) -> float:
        if self.model is None or op not in self.spec.ops:
            return 0.0
        return float(self.model.sample(d.rng, max(size, 0)))

    def _before(self, op: str, path: str, size: int | None) -> tuple[_Decision, float]:
        """Decide, stall and raise injected errors. Returns the decision and the time
        waited so far (seconds)."""
        d = self._decide(op)
        waited = 0.0
        scale = self.spec.scale
        if d.fault == "stall":
            waited += self.spec.stall_s * scale
            self._wait(self.spec.stall_s * scale)
        elif d.fault is not None and d.fault != "lost_reply":  # that one lands first
            delay = (
                self.spec.timeout_s * scale
                if d.fault == "timeout"
                else self._latency(op, d, size or 0)
            )
            self._record(op, path, d, delay)
            self._wait(delay)
            raise self._error(op, path, d.fault)
        return d, waited

    def _record(self, op: str, path: str, d: _Decision, delay: float) -> None:
        with self._lock:
            self.counts[op] += 1
            if d.fault is not None:
                self.counts[d.fault] += 1
            self.events.append(FaultEvent(d.seq, op, path, d.fault, delay))

    def _error(self, op: str, path: str, fault: str) -> BaseException:
        operation = _S3_OPERATION[op]
        if fault == "throttle":
            return _client_error("SlowDown", 503, "Please reduce your request rate.", operation)
        if fault == "error500":
            return _client_error(
                "InternalError", 500, "We encountered an internal error.", operation
            )
        if fault == "timeout":
            return TimeoutError(errno.ETIMEDOUT, f"{operation} {path} timed out (injected)")
        return ConnectionResetError(errno.ECONNRESET, f"Connection reset by peer (injected) {path}")

    def _log_request(self, op: str, path: str, kind: str | None) -> None:
        if self._request_log is not None:
            line = f"{kind or _REQUEST_KIND[op]}\t{path}\n".encode(errors="replace")
            os.write(self._request_log, line)

    def _run(
        self,
        op: str,
        path: str,
        size: int | None,
        fn: Callable[[], Any],
        kind: str | None = None,
    ) -> Any:
        self._log_request(op, path, kind)
        d, waited = self._before(op, path, size)
        if op == "get":  # the size is known once read
            result = fn()
            delay = self._latency(op, d, len(result) if isinstance(result, bytes) else 0)
            self._record(op, path, d, waited + delay)
            self._wait(delay)
            _landed(d, path)
            return result
        delay = self._latency(op, d, size or 0)
        self._record(op, path, d, waited + delay)
        self._wait(delay)
        result = fn()
        _landed(d, path)
        return result

    # -- requests ------------------------------------------------------------------------
    def request(self, op: str, path: str, size: int, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` as one request of kind ``op`` (``put``, ``get``, ``meta`` or
        ``delete``; ``size`` bytes) with this wrapper's latency, faults and stalls: for
        a request the wrapper cannot express as a filesystem call of its own (a
        conditional create done on the inner filesystem). Returns what ``fn`` returns;
        raises the injected error or ``fn``'s."""
        if op not in OPS:
            raise ValueError(f"request kind {op!r} not one of {OPS}")
        return self._run(op, path, size, fn)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        data = bytes(value)
        self._run("put", path, len(data), lambda: self._inner_put(path, data, **kwargs))

    def _inner_put(self, path: str, data: bytes, **kwargs: Any) -> None:
        if not isinstance(self.fs, LocalFileSystem):
            self.fs.pipe_file(path, data, **kwargs)
            return
        self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm_file(tmp)
            raise

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        size = end - start if start is not None and end is not None else None
        return bytes(
            self._run("get", path, size, lambda: self.fs.cat_file(path, start, end, **kwargs))
        )

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return dict(self._run("meta", path, 0, lambda: self.fs.info(path, **kwargs)))

    def size(self, path: str) -> int:
        return int(self._run("meta", path, 0, lambda: self.fs.size(path)))

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(self._run("meta", path, 0, lambda: self.fs.exists(path, **kwargs)))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        listed = self._run(
            "meta", path, 0, lambda: self.fs.ls(path, detail=detail, **kwargs), "list"
        )
        return list(listed)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        return self._run(
            "meta",
            path,
            0,
            lambda: self.fs.find(
                path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs
            ),
            "list",
        )

    def rm_file(self, path: str) -> None:
        self._run("delete", path, 0, lambda: self.fs.rm_file(path))

    def rm(
        self, path: str | Iterable[str], recursive: bool = False, maxdepth: int | None = None
    ) -> None:
        shown = path if isinstance(path, str) else ",".join(path)
        self._run("delete", shown, 0, lambda: self.fs.rm(path, recursive, maxdepth))

    # -- pass-through --------------------------------------------------------------------
    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(path, exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.fs.mkdir(path, create_parents=create_parents, **kwargs)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        self.fs.mv(path1, path2, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return self.fs.open(path, mode, **kwargs)
