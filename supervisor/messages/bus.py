"""The message bus: what channels put in, what they get back.

Channels hand a message in with `submit`, which never waits for room: past the
gateway's bound (`bus.inboundCapacity` messages held, that is handed in and not yet
answered) it refuses at once with `GatewayBusy`, and the channel tells its sender to
retry (HTTP 429 with `Retry-After`; a `gateway_busy` error on the cli). The session
lanes (`lanes.py`) `release` each message when its turn has ended or it was refused,
so the count is what the gateway holds, not what one queue holds. `/stop` goes through
its own small queue and is never refused: it must reach a session that is busy.

Replies and progress notes leave through `outbound`, each addressed to where its
message came from.

Created by the gateway; shared by the channels and the session lanes.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from clawsup.supervisor.errors import ClawsupError, ErrorCode
from clawsup.supervisor.messages.routing import Peer, Route, RouteInput

STOP_COMMAND = "/stop"
STOP_QUEUE = 64
"""`/stop`s waiting for the session lanes. Each is handled at once (it cancels, it does
not queue behind a turn), so this fills only in a burst; a channel then waits for
room rather than refuse a `/stop`."""
MessageRole = Literal["user", "system"]
"""Who speaks in a session: a channel's sender, or the gateway itself."""
RETRY_AFTER_S = 2
"""What a busy answer tells the sender to wait before trying again (seconds)."""


class Busy(ClawsupError):
    """A message refused for want of room; nothing of it was kept. The sender may
    retry after `retry_after_s`."""

    code: ClassVar[ErrorCode] = "busy"

    def __init__(self, message: str, retry_after_s: int = RETRY_AFTER_S) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class SessionBusy(Busy):
    """The session already holds a turn and `bus.sessionQueue` messages behind it."""

    code = "session_busy"


class GatewayBusy(Busy):
    """The gateway already holds `bus.inboundCapacity` messages."""

    code = "gateway_busy"


@dataclass(frozen=True, kw_only=True)
class ReplyTarget:
    """Where a reply goes: the originating channel, account, peer and thread, and the
    channel's own handle on the conversation (an HTTP stream, a CLI connection)."""

    channel: str
    account_id: str
    peer: Peer
    thread_id: str | None = None
    conversation: str = ""


@dataclass(kw_only=True)
class InboundMessage:
    source: RouteInput
    """Identity, exactly as the channel adapter saw it."""
    text: str
    reply_to: ReplyTarget
    sender_id: str | None = None
    """Who wrote it, where the channel tells a sender apart from the peer (a group
    member); a plugin channel's word, checked against `channels.<id>.owners`."""
    by_plugin: bool = False
    """Brought by a plugin's channel adapter: counted against the plugin channels'
    share of the gateway's bound (`MessageBus.submit`)."""
    agent_override: str | None = None
    """Only the operator's own channel (the CLI) may name the agent."""
    role: MessageRole = "user"
    """`system` for what the gateway itself tells a session (a subagent's announce)."""
    route: Route | None = None
    """Set by the gateway for its own messages: the session they belong to, as
    routed when the work was handed off (routing is not asked again)."""
    id: str = field(default_factory=lambda: f"m-{uuid.uuid4().hex[:16]}")
    """Unique across restarts: a session file outlives the supervisor."""
    accepted: asyncio.Future[Route] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """Resolved once the message is in its session (durably, per the fsync policy);
    failed if it was refused."""
    held: bool = False
    """Counted against the gateway's bound (it came through `submit`) until released."""
    owner: bool | None = None
    """Set by the gateway for its own messages: whether the turn speaks for an owner
    (a cron job's run: whether its creator was one). None: the channel's word."""
    context: str = ""
    """Set by the gateway for its own messages: instructions for this turn's system
    prompt, never stored in the session (the heartbeat's)."""
    outcome: asyncio.Future[TurnOutcome] | None = None
    """Set by whoever waits for the turn itself (a cron run): the lanes resolve it
    when the turn ends and send nothing; the waiter delivers the reply."""

    def is_stop(self) -> bool:
        # A cron job's message is never a /stop: its text is the job's, not the
        # session's user's, and must not cancel that user's turn.
        return self.role == "user" and self.outcome is None and self.text.strip() == STOP_COMMAND


@dataclass(frozen=True, kw_only=True)
class TurnOutcome:
    """How a turn ended, for a message with an `outcome` future."""

    text: str
    """The answer as the `message_sending` hooks left it ("" when stopped or withheld)."""
    record: dict[str, Any]
    """What the session kept beside the answer (`turnUsage`, ...)."""
    stopped: str = ""
    """Why the turn was stopped before it answered; "" if it answered."""
    withheld: bool = False
    """A `message_sending` hook cancelled the answer: there is nothing to deliver."""
    failed: bool = False
    """The turn failed (the text says how)."""


@dataclass(frozen=True, kw_only=True)
class OutboundMessage:
    target: ReplyTarget
    text: str
    session_key: str
    agent_id: str
    in_reply_to: str
    progress: bool = False
    """A note while the turn runs ("working…"), not the answer."""
    final: bool = True
    """The last message for `in_reply_to`."""
    delivered: asyncio.Future[str] | None = field(default=None, compare=False)
    """For a sender that must know (a cron job's reply): resolved with what became
    of the message ("delivered to 1 client"), or failed with why it was not."""

    def settle(self, what: str | BaseException) -> None:
        """Say what became of this message, once; a no-op without a `delivered`."""
        fut = self.delivered
        if fut is None or fut.done():
            return
        if isinstance(what, BaseException):
            fut.set_exception(what)
        else:
            fut.set_result(what)


class MessageBus:
    def __init__(self, inbound_capacity: int = 1000, outbound_capacity: int = 1000) -> None:
        self.capacity = inbound_capacity
        self.held = 0
        """Messages handed in through `submit` and not yet released."""
        # A plugin's channel speaks for people the operator never met: one may hold a
        # quarter of the capacity, and all of them half, so that a flood from one
        # cannot make the gateway busy for the cli, the http channel or the others.
        self.plugin_share = max(1, inbound_capacity // 4)
        self.plugins_share = max(1, inbound_capacity // 2)
        self._held_by: dict[str, int] = {}
        # Not bounded by its size: `submit` admits at most `capacity` channel
        # messages; the gateway's own (a subagent's report, put here directly) are
        # bounded by the subagent limits, and must not be refused.
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.stops: asyncio.Queue[InboundMessage] = asyncio.Queue(STOP_QUEUE)
        self.outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue(outbound_capacity)

    async def submit(self, msg: InboundMessage) -> None:
        """Hand a channel's message in. Raises GatewayBusy, at once, when the gateway
        holds its capacity; only a `/stop` may wait (briefly) for room."""
        if msg.is_stop():
            await self.stops.put(msg)
            return
        if self.held >= self.capacity:
            raise GatewayBusy(
                f"the gateway is busy: it holds {self.held} messages not yet answered (bus.inboundCapacity is {self.capacity}); nothing was kept, try again in {RETRY_AFTER_S} s"
            )
        channel = msg.reply_to.channel
        if msg.by_plugin:
            mine, plugins = self._held_by.get(channel, 0), sum(self._held_by.values())
            if mine >= self.plugin_share or plugins >= self.plugins_share:
                raise GatewayBusy(
                    f"channel {channel!r} holds {mine} messages not yet answered, and plugin channels {plugins}: its share of bus.inboundCapacity "
                    f"({self.plugin_share}, and {self.plugins_share} for all plugin channels) is full; nothing was kept, try again in {RETRY_AFTER_S} s"
                )
            self._held_by[channel] = mine + 1
        self.held += 1
        msg.held = True
        self.inbound.put_nowait(msg)

    def release(self, msg: InboundMessage) -> None:
        """The message's turn has ended, or it was refused: it no longer counts."""
        if msg.held:
            msg.held = False
            self.held -= 1
            channel = msg.reply_to.channel
            if channel in self._held_by:
                self._held_by[channel] -= 1
                if not self._held_by[channel]:
                    del self._held_by[channel]  # channels come and go: the dict must not grow
