"""A single-process stand-in for the runtime around a source: one enumerator, readers
that consume their assigned splits a few records at a time, checkpoints (enumerator
snapshot + readers' split states) and restores. Assignments reach readers at once, so
they are ordered with checkpoints as dstltree.sparkplug.sources.base requires."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from dstltree.sparkplug.sources import (
    EnumeratorState,
    Record,
    Source,
    SplitEnumerator,
    SplitReader,
    SplitState,
)


@dataclass
class SimReader:
    """One task's reader: the split states assigned in this attempt (current offsets),
    the queue of unfinished ones, the open iterator of the first."""

    reader: SplitReader
    states: dict[str, SplitState] = field(default_factory=dict)
    queue: list[str] = field(default_factory=list)
    current: Iterator[Record] | None = None

    def give(self, states: list[SplitState]) -> None:
        for s in states:
            self.states[s.split.id] = s
            self.queue.append(s.split.id)

    def step(self, n: int, enumerator: SplitEnumerator, out: list[Record]) -> None:
        """Consumes up to ``n`` records into ``out``; reports finished splits."""
        while n > 0 and self.queue:
            sid = self.queue[0]
            state = self.states[sid]
            if self.current is None:
                self.current = self.reader.read(state.split, state.offset)
            rec = next(self.current, None)
            if rec is None:
                self.states[sid] = replace(state, finished=True)
                self.queue.pop(0)
                self.current = None
                enumerator.finish([sid])
                continue
            out.append(rec)
            self.states[sid] = replace(state, offset=state.offset + 1)
            n -= 1


@dataclass
class Checkpoint:
    enumerator: EnumeratorState
    readers: list[SplitState]
    output: list[Record]

    def restored(self) -> EnumeratorState:
        return self.enumerator.resumed(self.readers)


class SourceDriver:
    """Drives ``source`` with ``parallelism`` readers, from ``restored`` if given."""

    def __init__(
        self, source: Source, parallelism: int, restored: EnumeratorState | None = None
    ) -> None:
        self.enumerator = source.create_enumerator(restored)
        self.readers = [SimReader(source.create_reader()) for _ in range(parallelism)]
        self.output: list[Record] = []

    def poll(self) -> None:
        """Discovers and hands out every pending split."""
        self.enumerator.discover()
        for reader, states in self.enumerator.assign(range(len(self.readers))).items():
            self.readers[reader].give(states)

    def step(self, reader: int, n: int) -> None:
        self.readers[reader].step(n, self.enumerator, self.output)

    def checkpoint(self) -> Checkpoint:
        snap = self.enumerator.snapshot()
        states = [s for r in self.readers for s in r.states.values()]
        return Checkpoint(snap, states, list(self.output))

    def run_to_end(self, max_rounds: int = 10_000) -> None:
        for _ in range(max_rounds):
            self.poll()
            if self.enumerator.is_finished():
                return
            for i in range(len(self.readers)):
                self.step(i, 7)
        raise AssertionError("source did not finish")
