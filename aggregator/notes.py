"""Routing of notes between the tree's clients: pure, no I/O, no clock.

A note (client/wire.py :class:`~dstltree.client.wire.Note`) is a small message from one
client of the tree (a host's bridge) to another, or to all: the cross-host channel of
the Structured Streaming commit (docs/structured-streaming.md, "Several hosts"). It
travels over the nodes' own authenticated sockets, never a new channel:

- A node delivers a note to its own clients named ``to`` (every client for
  ``BROADCAST``, never back to the sender); a client is known by name once it sent any
  note (``to == ""`` only subscribes), for ``lease`` seconds after its last one.
- Coming from below (a client, or a child node), a note goes to every child except the
  one it came from, and up to the parent; coming from the parent, to every child. So in
  a tree every node sees a note once.
- Each node learns where a sender is (a client here, a child, or upstream); a note to
  a name it learned goes that way only, not everywhere. Learned routes expire after
  ``lease`` seconds, and at most ``MAX_ROUTES`` names are remembered.

Notes are best effort: a note lost on a re-homed path, a dead node or a full queue is
not retried here; whoever needs an answer waits for it with a timeout.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from dstltree.client.wire import BROADCAST, Note

MAX_ROUTES = 4096  # sender names whose direction is remembered
MAX_CLIENTS = 256  # named clients of one node
UP = b""  # the direction "upstream" among child identities


@dataclass(frozen=True)
class NoteRoutes:
    """Where one note goes: ``clients`` (ROUTER identities of this node's own clients),
    ``children`` (ROUTER identities of child nodes), ``up`` (to the parent)."""

    clients: tuple[bytes, ...] = ()
    children: tuple[bytes, ...] = ()
    up: bool = False


class NoteRouter:
    """This node's table of named clients and learned directions."""

    def __init__(self, lease: float) -> None:
        self.lease = lease
        self._clients: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._routes: OrderedDict[str, tuple[bytes, float]] = OrderedDict()  # name -> dir

    def route(
        self,
        note: Note,
        source: bytes | None,
        from_child: bool,
        children: list[bytes],
        has_parent: bool,
        now: float,
    ) -> NoteRoutes:
        """Where ``note`` goes; ``source`` is the ROUTER identity it came from (None:
        from the parent), ``from_child`` whether that is a child node (else a client),
        ``children`` the child nodes' identities. Learns the sender's direction."""
        self._expire(now)
        if source is None:
            self._learn(self._routes, note.frm, UP, now)
        elif from_child:
            self._learn(self._routes, note.frm, source, now)
        else:
            self._learn(self._clients, note.frm, source, now)
            self._routes.pop(note.frm, None)
        if note.to == "":
            return NoteRoutes()
        if note.to != BROADCAST:
            if (client := self._clients.get(note.to)) is not None:
                return NoteRoutes(clients=(client[0],))
            way = self._routes.get(note.to)
            if way is not None and way[0] == UP and source is not None and has_parent:
                return NoteRoutes(up=True)
            if way is not None and way[0] != UP and way[0] != source and way[0] in children:
                return NoteRoutes(children=(way[0],))
        clients = tuple(
            i for name, (i, _) in self._clients.items() if i != source and name != note.frm
        )
        if note.to != BROADCAST:
            clients = ()  # not a client here: only the paths on
        down = tuple(c for c in children if c != source)
        return NoteRoutes(clients, down, up=source is not None and has_parent)

    def clients(self) -> int:
        return len(self._clients)

    def _learn(
        self, table: OrderedDict[str, tuple[bytes, float]], name: str, way: bytes, now: float
    ) -> None:
        table.pop(name, None)
        table[name] = (way, now)
        bound = MAX_CLIENTS if table is self._clients else MAX_ROUTES
        while len(table) > bound:
            table.popitem(last=False)

    def _expire(self, now: float) -> None:
        for table in (self._clients, self._routes):
            while table and now - next(iter(table.values()))[1] > self.lease:
                table.popitem(last=False)
