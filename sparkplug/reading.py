"""The source-reader half of a task: the splits assigned to it, read from their offsets
one record at a time, and the split states recorded at each checkpoint barrier
(FLIP-27 source reader; offsets as in dstltree.sparkplug.sources.base)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from dstltree.sparkplug.pipeline import RecordError
from dstltree.sparkplug.sources.base import Record, SourceError, SplitReader, SplitState

#: emit(record, split location, row index in the split)
Emit = Callable[[Record, str, int], None]


class SplitQueue:
    """The splits assigned to one reader in this attempt, in assignment order. The
    split being read has ``offset`` = records consumed; finished splits are kept so
    that each barrier reports them finished."""

    def __init__(self, reader: SplitReader) -> None:
        self.reader = reader
        self.queue: deque[SplitState] = deque()
        self.finished: list[SplitState] = []
        self._current: SplitState | None = None
        self._records: Iterator[Record] | None = None
        self._offset = 0
        self.consumed = 0  # records read by this queue, all splits

    def assign(self, states: tuple[SplitState, ...]) -> None:
        """Add assigned splits (each is read from its state's offset)."""
        self.queue.extend(s for s in states if not s.finished)
        self.finished.extend(s for s in states if s.finished)

    @property
    def idle(self) -> bool:
        """No split to read."""
        return self._current is None and not self.queue

    def states(self) -> tuple[SplitState, ...]:
        """The state of every split of this reader now (for a barrier)."""
        out = list(self.finished)
        if self._current is not None:
            out.append(SplitState(self._current.split, self._offset))
        out.extend(self.queue)
        return tuple(out)

    def read(self, limit: int, emit: Emit) -> list[str]:
        """Read up to ``limit`` records, calling ``emit`` for each; returns the ids of the
        splits finished meanwhile. Raises SourceError / RecordError naming the split's
        location and the row."""
        done: list[str] = []
        while limit > 0:
            if self._current is None and not self._next():
                break
            assert self._current is not None and self._records is not None
            location = self._current.split.location or self._current.split.id
            record = self._pull(location)
            if record is None:
                self.finished.append(SplitState(self._current.split, self._offset, True))
                done.append(self._current.split.id)
                self._current = self._records = None
                continue
            emit(record, location, self._offset)
            self._offset += 1
            self.consumed += 1
            limit -= 1
        return done

    def _next(self) -> bool:
        if not self.queue:
            return False
        state = self.queue.popleft()
        self._current, self._offset = state, state.offset
        self._records = iter(self.reader.read(state.split, state.offset))
        return True

    def _pull(self, location: str) -> Record | None:
        assert self._records is not None
        try:
            return next(self._records)
        except StopIteration:
            return None
        except SourceError:
            raise
        except Exception as e:  # noqa: BLE001 - a reader's failure names the row
            raise SourceError(location, f"{type(e).__name__}: {e}", self._offset) from e


def record_error(location: str, row: int, error: Exception) -> RecordError:
    """A RecordError for a failure of a step, the key selector or the key's type."""
    detail = f"missing column {error}" if isinstance(error, KeyError) else str(error)
    return RecordError(location, row, f"{type(error).__name__}: {detail}")
