"""A second job on the public API, unlike the demo: per-user sessions over generated
JSON-lines and CSV files. Per user it keeps a count (value state), counts per page (map
state) and the last three pages (list state), and emits one row per event
``{"user", "seq", "page"}`` where ``seq`` counts the user's events (1, 2, ...).

``expected(files)`` computes the same from the files in Python, for the checks: every
user's state, and that the sink holds ``seq`` 1..n exactly once per user.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from dstltree.sparkplug import KeyedProcessFunction

PAGES = ["home", "search", "cart", "pay", "help"]


class Sessions(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count")
        self.pages = ctx.map_state("pages")
        self.recent = ctx.list_state("recent")

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        n = (self.count.get() or 0) + 1
        self.count.set(n)
        page = record["page"]
        self.pages.put(page, (self.pages.get(page) or 0) + 1)
        recent = self.recent.get()[-2:] + [page]
        self.recent.clear()
        for p in recent:
            self.recent.add(p)
        out.emit({"user": key, "seq": n, "page": page})


def user_of(i: int, rng: random.Random) -> str | None:
    """Mostly named users, some events without a user (the null key)."""
    return None if rng.random() < 0.05 else f"u{rng.randrange(40):02d}"


def write_files(
    root: Path, files: int, per_file: int, seed: int, start: int = 0, fmt: str = "json"
) -> None:
    """``files`` files ``events-<n>.<fmt>`` (json lines or csv) of ``per_file`` events,
    written under a temporary name and renamed (they appear complete). csv cannot tell
    a null user from an empty one: csv files name users only."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(start, start + files):
        rows = [{"user": user_of(i, rng), "page": rng.choice(PAGES)} for i in range(per_file)]
        tmp, final = root / f".events-{n:04d}.tmp", root / f"events-{n:04d}.{fmt}"
        if fmt == "json":
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            lines = ["user,page"] + [f"{r['user'] or 'anon'},{r['page']}" for r in rows]
            tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(final)


class Feeder(threading.Thread):
    """The input of a test that must not run dry however slowly a busy machine runs its
    steps: one file of ``per_file`` events (seed ``seed + n`` for file ``n``) at once,
    then one every ``every`` seconds, until :meth:`finish` writes the ``_SUCCESS``
    marker after the last one (the source's listing that sees it is complete)."""

    def __init__(self, root: Path, per_file: int, every: float, seed: int) -> None:
        super().__init__(name="input-feeder", daemon=True)
        self.root, self.per_file, self.every, self.seed = root, per_file, every, seed
        self.files = 0
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            n = self.files
            write_files(self.root, 1, self.per_file, seed=self.seed + n, start=n)
            self.files = n + 1
            if self._done.wait(self.every):
                return

    def finish(self, timeout: float = 30.0) -> None:
        """Stop writing and end the input; RuntimeError if the feeder does not stop."""
        self._done.set()
        self.join(timeout)
        if self.is_alive():
            raise RuntimeError(f"the input feeder did not stop within {timeout} s")
        (self.root / "_SUCCESS").touch()


def read_events(root: Path) -> list[dict[str, Any]]:
    """Every event of the files under ``root``, file by file in name order."""
    out: list[dict[str, Any]] = []
    for f in sorted(root.glob("events-*")):
        if f.suffix == ".json":
            out += [json.loads(line) for line in f.read_text().splitlines()]
        else:
            lines = f.read_text().splitlines()[1:]
            out += [dict(zip(["user", "page"], line.split(","), strict=True)) for line in lines]
    return out


def expected(events: list[dict[str, Any]]) -> dict[str, dict[Any, Any]]:
    """state name -> user -> value, as the job must end. ``recent`` is only checked as
    a set of the user's pages (the order across files depends on arrival)."""
    count: Counter[Any] = Counter()
    pages: dict[Any, Counter[str]] = defaultdict(Counter)
    for e in events:
        count[e["user"]] += 1
        pages[e["user"]][e["page"]] += 1
    return {"count": dict(count), "pages": {u: dict(c) for u, c in pages.items()}}
