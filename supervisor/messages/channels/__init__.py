"""Channel adapters: where messages come from and replies go back to.

An adapter is the only source of a message's identity (channel, account, peer,
guild, roles, team, thread): it takes them from its transport, never from the
message's text or a tool's arguments. The interface below is what plugin channels
will implement.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Iterator
from typing import Protocol

from loguru import logger

from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, OutboundMessage, ReplyTarget
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.messages.routing import Route


class Channel(Protocol):
    name: str

    async def serve(self) -> None:
        """Receive messages until cancelled (a channel with nothing to listen on
        may simply wait)."""
        ...

    async def send(self, out: OutboundMessage) -> None:
        """Deliver one reply or progress note to `out.target`."""
        ...


SHUTTING_DOWN = "the gateway is shutting down; the message is in its session, but its turn did not finish"
WATCH_BACKLOG = 100
"""Replies a `watch` stream may have waiting (its client reads too slowly); past it
the oldest is dropped, with a warning: they are in the session anyway."""


class Conversations:
    """The replies a channel still owes to open requests (an HTTP stream, a CLI
    connection), by conversation id. Replies for a conversation that went away are
    dropped: they are in the session anyway."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self._open: dict[str, asyncio.Queue[OutboundMessage | None]] = {}
        self._watchers: dict[str, set[asyncio.Queue[OutboundMessage | None]]] = {}
        """Who -> queues of open `watch` streams: replies nobody asked for in this
        conversation (a subagent's announce, answered) go there."""
        self._ids = itertools.count(1)
        self._closed = ""

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    async def deliver(self, out: OutboundMessage) -> None:
        q = self._open.get(out.target.conversation)
        if q is not None:
            q.put_nowait(out)
            out.settle("delivered to the request that asked")
        elif not out.progress:
            watchers = self._watchers.get(who(out.target), ())
            for w in watchers:
                _put_dropping_oldest(w, out)
            if watchers:
                out.settle(f"delivered to {len(watchers)} watching client(s)")
            else:
                out.settle(ClawsupError(f"no client of {who(out.target)} was watching; the reply is kept in session {out.session_key}"))

    @contextlib.contextmanager
    def watching(self, key: str) -> Iterator[asyncio.Queue[OutboundMessage | None]]:
        """Replies for `key` (see `who`) whose conversation has ended arrive on the
        queue while inside; None when the channel closes."""
        if self._closed:
            raise ClawsupError(self._closed)
        q: asyncio.Queue[OutboundMessage | None] = asyncio.Queue(WATCH_BACKLOG)
        self._watchers.setdefault(key, set()).add(q)
        try:
            yield q
        finally:
            # Forget the key with its last watcher: users come and go, the dict must not grow.
            left = self._watchers.get(key)
            if left is not None:
                left.discard(q)
                if not left:
                    del self._watchers[key]

    async def exchange(self, msg: InboundMessage) -> AsyncGenerator[Route | OutboundMessage, None]:
        """Hand `msg` to the bus, yield its route once it is in its session (the
        acknowledgement), then its progress notes and replies up to the final one.
        Raises the refusal if it was not accepted: `Busy` (never waited for) when the
        gateway or the session is full, before anything of it was kept."""
        if self._closed:
            raise ClawsupError(self._closed)
        q: asyncio.Queue[OutboundMessage | None] = asyncio.Queue()
        conv = msg.reply_to.conversation
        self._open[conv] = q
        try:
            await self.bus.submit(msg)
            yield await msg.accepted
            while True:
                out = await q.get()
                if out is None:
                    raise ClawsupError(self._closed)
                yield out
                if out.final:
                    return
        finally:
            self._open.pop(conv, None)

    def close_all(self, reason: str) -> None:
        """End every open conversation now (the gateway is stopping): each gets
        `reason` as an error instead of a reply that will not come."""
        self._closed = reason
        for q in (*self._open.values(), *(w for ws in self._watchers.values() for w in ws)):
            _put_dropping_oldest(q, None)


def _put_dropping_oldest(q: asyncio.Queue[OutboundMessage | None], item: OutboundMessage | None) -> None:
    if q.full():
        dropped = q.get_nowait()
        if dropped is not None:
            logger.warning("a watch stream for {} reads too slowly; a reply in {} was not sent to it", who(dropped.target), dropped.session_key)
    q.put_nowait(item)


def who(target: ReplyTarget) -> str:
    """A channel user, as a watch is keyed: account, peer and thread."""
    return f"{target.account_id}|{target.peer.kind}:{target.peer.id}|{target.thread_id or ''}"
