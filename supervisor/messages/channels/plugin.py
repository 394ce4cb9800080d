"""Plugin channels: a channel adapter (Telegram, Discord, ...) that runs in a
plugin's sandbox, for a channel id its manifest declares (`contracts.channels`) and
the operator enabled (`channels.<id>` in the config).

Inbound, the plugin's host asks `channel.inbound` over its stream
(`api.emit_message`); `inbound_services` answers it for one sandbox. The channel is
never the plugin's word: a message for a channel this plugin does not hold a
registration for right now (`http`, `cli`, another plugin's, one the operator did
not enable) is refused, and the refusal is in the sandbox's log. Account, peer,
sender and thread are what the plugin reports; whether the sender is an owner is the
operator's config (supervisor/messages/owners.py).

Outbound, `PluginChannel` is the gateway's `Channel` for one configured id: replies
wait in its own bounded queue and are handed, one at a time, to whichever plugin
serves the id at that moment (`sb.call_offer("channel", ...)`, with the plugin's
command deadline). A plugin that is down, hangs or raises costs the delivery (said
in both logs), never the session: the reply is in the session already. Its own queue
is why a hanging plugin holds up only its channel, not the gateway's outbound pump.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.errors import ClawsupError, OfferFailed
from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, OutboundMessage, ReplyTarget
from clawsup.supervisor.messages.routing import Peer, RouteInput, norm_account
from clawsup.supervisor.names import owner_label
from clawsup.supervisor.sandboxes.child_requests import Service
from clawsup.supervisor.sandboxes.registry import Kind, Registry

if TYPE_CHECKING:
    from clawsup.supervisor.sandboxes.plans import SandboxPlan
    from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

CHANNEL_INBOUND = "channel.inbound"
"""The stream request of `api.emit_message` (sandbox/api.py)."""
BUILTIN_CHANNELS = frozenset({"cli", "http"})
MAX_TEXT = 100_000
"""As the http channel's: one message, not a file."""
MAX_ID = 512
DELIVERY_BACKLOG = 1000
"""Replies one plugin channel may have waiting for its plugin; past it the oldest is
dropped, with a warning (it is in its session)."""
_ID = re.compile(r"[^\x00-\x1f\x7f]+")


class PluginSandboxes(Protocol):
    """Who serves what now, and the sandboxes by id (the sandbox manager)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def sandboxes(self) -> Mapping[str, SupervisedSandbox]: ...


def _an_id(v: str | None) -> str | None:
    if v is not None and (_ID.fullmatch(v) is None or not v.strip()):
        raise ValueError("must be a non-blank string without control characters")
    return v


class InboundIn(BaseModel):
    """`channel.inbound`'s payload, as `api.emit_message` sends it. The channel was
    judged before; there is no owner flag to send."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)
    channel: str
    peer_kind: str = Field(default="direct", pattern=r"^(?i:direct|dm|group|channel)$")
    peer_id: str = Field(min_length=1, max_length=MAX_ID)
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    account_id: str | None = Field(default=None, max_length=MAX_ID)
    sender_id: str | None = Field(default=None, max_length=MAX_ID)
    thread_id: str | None = Field(default=None, max_length=MAX_ID)

    _ids = field_validator("peer_id", "account_id", "sender_id", "thread_id")(_an_id)


def inbound_services(bus: MessageBus, sandboxes: PluginSandboxes, plan: SandboxPlan) -> dict[str, Service]:
    """The stream requests a plugin's sandbox may make for its channels, bound to
    that plugin (`SandboxManager.add(plan, services=...)`); none for other sandboxes."""
    if plan.role != "plugin":
        return {}

    async def inbound(payload: dict[str, Any]) -> dict[str, Any]:
        channel = payload.get("channel")
        why = _not_yours(sandboxes.registry, plan, channel)
        if why is not None:
            raise PermissionError(why)
        assert isinstance(channel, str)
        try:
            body = InboundIn.model_validate(payload)
        except ValidationError as e:
            raise ValueError(f"a message for channel {channel!r}: {format_validation_error(e)}") from None
        peer = Peer.of(body.peer_kind, body.peer_id)
        account = norm_account(body.account_id)
        msg = InboundMessage(
            source=RouteInput(channel=channel, account_id=account, peer=peer, thread_id=body.thread_id),
            text=body.text,
            reply_to=ReplyTarget(channel=channel, account_id=account, peer=peer, thread_id=body.thread_id),
            sender_id=body.sender_id,
            by_plugin=True,
        )
        await bus.submit(msg)  # Busy: the plugin is told why and when to retry
        route = await msg.accepted
        return {"messageId": msg.id, **route.to_json()}

    return {CHANNEL_INBOUND: inbound}


def _not_yours(registry: Registry, plan: SandboxPlan, channel: object) -> str | None:
    """Why this plugin may not speak for `channel`; None if it holds it now."""
    who = owner_label(plan.plugin_id)
    if not isinstance(channel, str):
        return f"{who} sent a message without a channel id"
    shown = channel[:64]
    if channel in BUILTIN_CHANNELS:
        return f"{who} may not speak for channel {shown!r}: it is built in"
    reg = registry.get(Kind.CHANNEL, channel)
    if reg is not None and reg.owner == plan.plugin_id and reg.sandbox_id == plan.sandbox_id:
        return None
    if reg is not None:
        return f"{who} may not speak for channel {shown!r}: {owner_label(reg.owner)} serves it"
    return (
        f"{who} may not speak for channel {shown!r}: it holds no such channel "
        f"(its manifest must declare it in contracts.channels, the operator enable it as channels.{shown}, and the plugin register it)"
    )


class PluginChannel:
    """The gateway's channel `name`, served by a plugin. Created by
    `channels_from_config` for each enabled `channels.<id>`; owned by `Messaging`,
    whose task group runs `serve()` (the deliveries) until the gateway stops."""

    def __init__(self, name: str, sandboxes: PluginSandboxes, *, backlog: int = DELIVERY_BACKLOG) -> None:
        self.name = name
        self._sandboxes = sandboxes
        self._waiting: asyncio.Queue[OutboundMessage] = asyncio.Queue(backlog)

    async def send(self, out: OutboundMessage) -> None:
        """Queue the reply for delivery; never waits (the lanes' pump calls this)."""
        if self._waiting.full():
            self._undeliverable(self._waiting.get_nowait(), f"{self._waiting.maxsize} replies were waiting for its plugin", None)
        self._waiting.put_nowait(out)

    async def serve(self) -> None:
        """Deliver the replies in order, until cancelled. Raises nothing else: a
        plugin's failure is never the gateway's."""
        while True:
            out = await self._waiting.get()
            try:
                await self._deliver(out)
            except Exception as e:  # a bug here must cost this reply only
                logger.exception("channel {}: delivering a reply failed", self.name)
                self._undeliverable(out, f"the supervisor failed ({type(e).__name__}); see its log", None)

    async def _deliver(self, out: OutboundMessage) -> None:
        reg = self._sandboxes.registry.get(Kind.CHANNEL, self.name)
        sb = self._sandboxes.sandboxes.get(reg.sandbox_id) if reg is not None and reg.sandbox_id is not None else None
        if sb is None:
            self._undeliverable(out, "no plugin serves it now", self._declaring())
            return
        t = out.target
        payload = {
            "peer": {"kind": t.peer.kind, "id": t.peer.id},
            "accountId": t.account_id,
            "threadId": t.thread_id,
            "text": out.text,
            "sessionKey": out.session_key,
            "agentId": out.agent_id,
            "inReplyTo": out.in_reply_to,
            "progress": out.progress,
            "final": out.final,
        }
        try:
            await sb.call_offer("channel", self.name, payload, sb.plan.offers.command_timeout_s)
        except OfferFailed as e:
            self._undeliverable(out, str(e), sb)
        else:
            out.settle(f"handed to plugin {sb.id}'s channel {self.name!r}")

    def _declaring(self) -> SupervisedSandbox | None:
        """The plugin whose manifest declares this channel (it is down, or refused
        it), for its log."""
        for sb in self._sandboxes.sandboxes.values():
            if sb.plan.role == "plugin" and self.name in sb.plan.offers.declares("channel"):
                return sb
        return None

    def _undeliverable(self, out: OutboundMessage, why: str, sb: SupervisedSandbox | None) -> None:
        what = "a progress note" if out.progress else "a reply"
        said = f"channel {self.name!r}: {what} to {out.target.peer.kind}:{out.target.peer.id} in session {out.session_key} (in reply to {out.in_reply_to}) was not delivered ({why}); it is kept in the session"
        logger.warning("{}", said)
        out.settle(ClawsupError(f"channel {self.name!r}: {why}"))
        if sb is not None:
            sb.log.event(said)
