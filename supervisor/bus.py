"""The message bus: what channels put in, what they get back.

Two bounded asyncio queues. A channel that finds `inbound` full waits (backpressure
reaches it, and through it the sender); replies and progress notes leave through
`outbound`, each addressed to where its message came from.

Created by the gateway; shared by the channels and the dispatcher.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from supervisor.routing import Peer, Route, RouteInput


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
    agent_override: str | None = None
    """Only the operator's own channel (the CLI) may name the agent."""
    role: str = "user"
    """`system` for what the gateway itself tells a session (a subagent's announce)."""
    route: Route | None = None
    """Set by the gateway for its own messages: the session they belong to, as
    routed when the work was handed off (routing is not asked again)."""
    id: str = field(default_factory=lambda: f"m-{uuid.uuid4().hex[:16]}")
    """Unique across restarts: a session file outlives the supervisor."""
    accepted: asyncio.Future[Route] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """Resolved once the message is in its session (durably, per the fsync policy);
    failed if it was refused."""


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


class MessageBus:
    def __init__(self, inbound_capacity: int = 1000, outbound_capacity: int = 1000) -> None:
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue(inbound_capacity)
        self.outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue(outbound_capacity)
