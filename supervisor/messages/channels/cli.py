"""The `cli` channel: `clawsup chat`, a REPL against the running supervisor through
the control socket. The operator's own channel: the peer is who runs the command
(or `--peer`), the account is the default one, and `--agent` may name the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
from collections.abc import AsyncGenerator

from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, OutboundMessage, ReplyTarget
from clawsup.supervisor.messages.channels import SHUTTING_DOWN, Conversations, who
from clawsup.supervisor.messages.routing import DEFAULT_ACCOUNT, Peer, Route, RouteInput

NAME = "cli"


class CliChannel:
    name = NAME

    def __init__(self, bus: MessageBus) -> None:
        self.conversations = Conversations(bus)

    async def serve(self) -> None:
        """Messages arrive through the control socket (`chat`): nothing to listen on,
        only open conversations to end when the gateway stops."""
        try:
            await asyncio.Event().wait()
        finally:
            self.conversations.close_all(SHUTTING_DOWN)

    async def send(self, out: OutboundMessage) -> None:
        await self.conversations.deliver(out)

    def watching(self, *, peer: str | None, thread: str | None) -> contextlib.AbstractContextManager[asyncio.Queue[OutboundMessage | None]]:
        """Replies to this user that no open `chat` is waiting for (the agent's
        answer to a subagent's announce, which comes when the run ends)."""
        target = ReplyTarget(channel=NAME, account_id=DEFAULT_ACCOUNT, peer=Peer.of("direct", peer or _os_user()), thread_id=thread)
        return self.conversations.watching(who(target))

    def chat(self, text: str, *, peer: str | None, agent: str | None, thread: str | None) -> AsyncGenerator[Route | OutboundMessage, None]:
        who = Peer.of("direct", peer or _os_user())
        msg = InboundMessage(
            source=RouteInput(channel=NAME, account_id=DEFAULT_ACCOUNT, peer=who, thread_id=thread),
            text=text,
            reply_to=ReplyTarget(channel=NAME, account_id=DEFAULT_ACCOUNT, peer=who, thread_id=thread, conversation=self.conversations.new_id(NAME)),
            agent_override=agent,
        )
        return self.conversations.exchange(msg)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"
