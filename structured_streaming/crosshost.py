"""The cross-host commit of a Structured Streaming batch: the bridges' notes and their
state, pure (no I/O, no threads); structured_streaming/files.py drives it.

Every host's bridge holds the state files a batch writes on it, and the driver's commit
makes all of them durable together, packed into one object (docs/structured-streaming.md,
"Several hosts"). The bridges talk through the tree (aggregator/notes.py): notes travel
over the nodes' CURVE sockets, no new channel. Bodies are msgpack maps, every field
checked (:func:`load_body`):

- ``drive {root, app, boot}``, broadcast by the bridge of the driver's host (the
  *committer*) when the driver announces a batch (at most every ``DRIVE_RENEW`` s per
  root): the other bridges learn that ``app``'s writes of ``root`` are committed there.
- ``hold {root, app, boot, cp}``, from a bridge that accepts a write of such a root and has
  not announced itself since the committer's last flush of it; answered by
  ``held {root}``. The write's ``put`` is answered only after that, so the committer
  knows every host holding files of a batch before the batch's tasks have finished, and
  so before its commit. No answer within ``HOLD_WAIT`` s: the write is persisted at once
  and waited for, as without a committer elsewhere.
- ``flush {root, gid, parts, boot, cid, cp}``, from the committer at the commit, to
  every bridge that announced itself: persist every held write of ``root`` as part of
  flush group ``gid`` of ``parts`` contributors, each with checkpoint id ``cp`` (the
  highest version any holder announced: every node routes all parts alike;
  client/batching.py FlushGroup: the node that writes them waits for all parts, one
  object), answered at once by ``flushing {cid}``
  and, once those writes are durable, by ``flushed {cid, ok, n, error}``. ``boot`` is
  the process the holder announced itself from: a bridge restarted since lost what it
  held, answers ``ok: false``, and the commit fails (Spark runs the batch again).
- The commit fails too when a holder does not answer ``flushing`` within
  ``RECEIPT_WAIT`` s (its bridge or host is gone) or ``flushed`` within the commit's
  timeout.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import msgpack

from dstltree.structured_streaming.wire import WireError

DRIVE_RENEW = 5.0  # s between two drive broadcasts of one root, at least
HOLD_WAIT = 5.0  # s a write waits for the committer's held answer
RECEIPT_WAIT = 5.0  # s the committer waits for a holder's flushing answer
REMOTE_TTL = 3600.0  # s after its last drive a remote committer is forgotten
MAX_ROOT = 4096
MAX_TEXT = 256
OPS = ("drive", "hold", "held", "flush", "flushing", "flushed")


def dump_body(op: str, **fields: Any) -> bytes:
    """The body of a note ``op`` with ``fields``."""
    return msgpack.packb({"op": op, **fields})


def load_body(body: bytes) -> dict[str, Any]:
    """A note body, checked: raises WireError(``malformed``) naming what is wrong."""
    try:
        d = msgpack.unpackb(body)
    except Exception as e:  # noqa: BLE001 - any decode failure is malformed
        raise WireError("malformed", f"note body is not msgpack: {e}") from e
    if not isinstance(d, dict) or d.get("op") not in OPS:
        raise WireError("malformed", "note body must be a map with a known 'op'")
    for key, limit in (("root", MAX_ROOT), ("app", MAX_TEXT), ("boot", 64), ("gid", 128)):
        if key in d and (not isinstance(d[key], str) or len(d[key]) > limit):
            raise WireError("malformed", f"note field {key!r}: a string of at most {limit}")
    for key in ("cid", "error"):
        if key in d and (not isinstance(d[key], str) or len(d[key]) > MAX_TEXT):
            raise WireError("malformed", f"note field {key!r}: a string of at most {MAX_TEXT}")
    for key, top in (("parts", 1 << 20), ("n", 1 << 20), ("cp", 1 << 62)):
        if key in d and (type(d[key]) is not int or not 0 <= d[key] <= top):
            raise WireError("malformed", f"note field {key!r}: an integer 0..{top}")
    required = {
        "drive": ("root", "app", "boot"),
        "hold": ("root", "app", "boot"),
        "held": ("root",),
        "flush": ("root", "gid", "parts", "boot", "cid"),
        "flushing": ("cid",),
        "flushed": ("cid", "ok"),
    }[d["op"]]
    missing = [k for k in required if k not in d]
    if missing:
        raise WireError("malformed", f"note {d['op']!r} lacks {missing}")
    if "ok" in d and not isinstance(d["ok"], bool):
        raise WireError("malformed", "note field 'ok' must be a boolean")
    return d


@dataclass
class Remote:
    """A committer on another host: its bridge's name and process, last heard (s)."""

    bridge: str
    boot: str
    seen: float


@dataclass
class Flush:
    """One holder's part of a commit, as the committer waits for it."""

    holder: str
    sent_at: float
    receipt: bool = False
    done: bool = False
    ok: bool = False
    n: int = 0
    error: str = ""


@dataclass
class CrossHost:
    """A bridge's side of the cross-host commit (module docstring): what it knows of
    committers elsewhere, whom it announced itself to, and, as a committer, which
    bridges hold files of its roots and how their flushes stand."""

    name: str
    remotes: dict[tuple[str, str], Remote] = field(default_factory=dict)  # (root, app)
    announced: dict[str, str] = field(default_factory=dict)  # root -> committer bridge
    holders: dict[str, dict[str, str]] = field(default_factory=dict)  # root -> {bridge: boot}
    hold_cps: dict[str, int] = field(default_factory=dict)  # root -> highest version held
    flushes: dict[str, Flush] = field(default_factory=dict)  # cid -> a holder's flush
    drives: dict[str, float] = field(default_factory=dict)  # root -> last broadcast

    def on_drive(self, d: dict[str, Any], frm: str, now: float) -> None:
        """A committer elsewhere drives ``d['root']``; a new process of it (``boot``)
        makes this bridge announce itself again."""
        key = (d["root"], d["app"])
        old = self.remotes.get(key)
        if old is not None and (old.bridge, old.boot) != (frm, d["boot"]):
            self.announced.pop(d["root"], None)
        self.remotes[key] = Remote(frm, d["boot"], now)

    def committer(self, root: str, app: str, now: float) -> Remote | None:
        """The committer elsewhere of ``app``'s ``root``, if one drove it lately."""
        r = self.remotes.get((root, app))
        if r is not None and now - r.seen > REMOTE_TTL:
            del self.remotes[(root, app)]
            return None
        return r

    def drive_due(self, root: str, now: float) -> bool:
        """Whether this committer's drive of ``root`` is to be broadcast now."""
        if now - self.drives.get(root, float("-inf")) < DRIVE_RENEW:
            return False
        self.drives[root] = now
        return True

    def on_hold(self, d: dict[str, Any], frm: str) -> None:
        """Bridge ``frm`` (process ``boot``) holds files of ``root`` for the next commit,
        the first of version ``cp``."""
        self.holders.setdefault(d["root"], {})[frm] = d["boot"]
        self.hold_cps[d["root"]] = max(self.hold_cps.get(d["root"], 0), int(d.get("cp", 0)))

    def commit_cp(self, root: str, own: int) -> int:
        """The checkpoint id every part of ``root``'s flush group goes with (the highest
        version held anywhere, ``own`` here): every node routes the parts alike."""
        return max(own, self.hold_cps.pop(root, 0))

    def start_commit(self, root: str, now: float) -> dict[str, tuple[str, str]]:
        """The holders of ``root`` to flush: cid -> (holder, its boot); they are
        forgotten as holders (an announcement after this is for the next commit)."""
        out: dict[str, tuple[str, str]] = {}
        for holder, boot in sorted(self.holders.pop(root, {}).items()):
            cid = secrets.token_hex(8)
            self.flushes[cid] = Flush(holder, now)
            out[cid] = (holder, boot)
        return out

    def on_flushing(self, d: dict[str, Any], frm: str) -> None:
        f = self.flushes.get(d["cid"])
        if f is not None and f.holder == frm:
            f.receipt = True

    def on_flushed(self, d: dict[str, Any], frm: str) -> None:
        f = self.flushes.get(d["cid"])
        if f is not None and f.holder == frm:
            f.receipt = f.done = True
            f.ok, f.n, f.error = d["ok"], int(d.get("n", 0)), str(d.get("error", ""))

    def commit_state(self, cids: list[str], now: float) -> tuple[bool, str]:
        """(finished, error) of a commit's flushes: finished when all are done or one
        failed; error "" when all succeeded."""
        for cid in cids:
            f = self.flushes[cid]
            if f.done and not f.ok:
                return True, f"{f.holder}: {f.error or 'flush failed'}"
            if not f.receipt and now - f.sent_at > RECEIPT_WAIT:
                return True, f"{f.holder} did not answer within {RECEIPT_WAIT} s"
        return all(self.flushes[c].done for c in cids), ""

    def end_commit(self, cids: list[str]) -> int:
        """Forget a commit's flushes; the files the holders made durable."""
        return sum(f.n for c in cids if (f := self.flushes.pop(c, None)) is not None)
