"""The plugins' slash commands: `/name [args]` from any channel, answered by the
plugin that registered `name` (sandbox/api.py `register_command`), in its sandbox,
without the model.

A message is a command when it reads `/name ...` and `name` is `help` or
`commands` (the gateway's own list) or a command some plugin holds or declares in
its manifest's `contracts.commands`; any other `/x` goes to the agent as before.
`/stop` never gets here: the bus takes it first (supervisor/messages/bus.py), and no
plugin may hold one of the gateway's names (sandbox/offers.py BUILTIN_COMMANDS).

Running one (`run`): a command that takes no arguments refuses them, an owner-only
one refuses whoever the owner rule (supervisor/messages/owners.py) says is not an
owner, each with a sentence saying why; otherwise the plugin gets one call with the
plugin's `commandTimeoutSeconds` as its deadline. A command whose plugin is down
answers at once, naming the plugin. Every outcome is text for the sender.

The session lanes (supervisor/messages/lanes.py) run a command in its session's
turn, so that the session's order holds and `/stop` cancels a command that hangs.
Created by the gateway with the sandbox manager and the owners; one per supervisor.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from loguru import logger

from clawsup.sandbox.offers import BUILTIN_COMMANDS, COMMAND_NAME_PATTERN
from clawsup.supervisor.errors import OfferFailed
from clawsup.supervisor.messages.bus import STOP_COMMAND, InboundMessage
from clawsup.supervisor.messages.owners import Owners
from clawsup.supervisor.messages.routing import Route
from clawsup.supervisor.names import owner_label
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.registry import Kind, Registration

if TYPE_CHECKING:
    from clawsup.supervisor.sandboxes.manager import Sandboxes
    from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

HELP_NAMES = frozenset({"help", "commands"})
"""The gateway's own list of commands (reserved: no plugin may take them)."""
MAX_ANSWER_CHARS = 32_000
"""A command's answer past this is cut, and says so: it is stored and sent whole."""

Outcome = Literal["answered", "refused", "failed", "listed"]
"""How a command ended, as its session record says."""


@dataclass(frozen=True)
class Invocation:
    """`/name args`, as parsed from a message."""

    name: str
    args: str


@dataclass(frozen=True)
class CommandAnswer:
    text: str
    outcome: Outcome
    plugin: str | None = None
    """The plugin that holds (or declares) the command; None for `/help`."""


class Commands:
    """Parses and runs the plugins' commands (see above). Made by the gateway with
    the sandbox manager (who holds each command, and its sandbox) and the owners;
    used by the session lanes; lives as long as the gateway."""

    def __init__(self, sandboxes: Sandboxes, owners: Owners) -> None:
        self._sandboxes = sandboxes
        self._owners = owners

    def parse(self, msg: InboundMessage) -> Invocation | None:
        """The command `msg` asks for; None when it is for the agent (not a command,
        or one no plugin holds or declares)."""
        text = msg.text.strip()
        if msg.role != "user" or not text.startswith("/") or text[1:2].isspace() or len(text) == 1:
            return None
        head, *rest = text[1:].split(maxsplit=1)
        name = head.lower()
        args = rest[0].strip() if rest else ""
        if name in HELP_NAMES:
            return Invocation(name, args)
        if name in BUILTIN_COMMANDS or re.fullmatch(COMMAND_NAME_PATTERN, name) is None:
            return None
        if self._registered(name) is None and not self._declaring(name):
            return None
        return Invocation(name, args)

    async def run(self, inv: Invocation, msg: InboundMessage, route: Route) -> CommandAnswer:
        owner = self._owners.is_owner(msg)
        if inv.name in HELP_NAMES:
            return CommandAnswer(self._help(owner), "listed")
        reg = self._registered(inv.name)
        sb = self._sandboxes.sandboxes.get(reg.sandbox_id) if reg is not None and reg.sandbox_id is not None else None
        if reg is None or reg.offer is None or sb is None:
            return self._unavailable(inv.name)
        spec, plugin = reg.offer, reg.owner
        if spec.owner_only and not owner:
            logger.info("{}: /{} refused: owner-only, and {} is not an owner", route.session_key, inv.name, _sender(msg))
            return CommandAnswer(
                f"/{inv.name} is for this gateway's owners only ({owner_label(plugin)} made it owner-only), and you are not one here. {self._how_to_own(msg)}",
                "refused",
                plugin,
            )
        if inv.args and not spec.accepts_args:
            return CommandAnswer(f"/{inv.name} takes no arguments; send /{inv.name} alone.", "refused", plugin)
        payload: dict[str, Any] = {
            "args": inv.args,
            "channel": msg.reply_to.channel,
            "accountId": route.account_id,
            "peerKind": msg.source.peer.kind,
            "peerId": msg.source.peer.id,
            "senderId": _sender(msg),
            "isOwner": owner,
            "sessionKey": route.session_key,
            "agentId": route.agent_id,
        }
        try:
            value = await sb.call_offer("command", inv.name, payload, sb.plan.offers.command_timeout_s)
        except OfferFailed as e:
            logger.warning("{}: /{}: {}", route.session_key, inv.name, e)
            return CommandAnswer(f"error: {e}", "failed", plugin)
        return CommandAnswer(_text(inv.name, value), "answered", plugin)

    # -- what is offered ---------------------------------------------------------

    def _registered(self, name: str) -> Registration | None:
        return self._sandboxes.registry.get(Kind.COMMAND, name)

    def _declaring(self, name: str) -> list[SupervisedSandbox]:
        """The sandboxes whose manifest declares `name`: it is theirs even while they
        are down (its registration is withdrawn then)."""
        return [sb for sb in self._sandboxes.sandboxes.values() if name in sb.plan.offers.declares("command")]

    def _unavailable(self, name: str) -> CommandAnswer:
        """A command declared by a plugin that does not hold it now: said at once."""
        for sb in self._declaring(name):
            who = owner_label(sb.plan.plugin_id)
            state = sb.lc.state
            if state is not SandboxState.READY:
                return CommandAnswer(
                    f"error: /{name} belongs to {who}, which is down ({state.value}); try again once it is back (`clawsup status`).",
                    "failed",
                    sb.plan.plugin_id,
                )
            return CommandAnswer(
                f"error: {who} declares /{name} but does not offer it (see `clawsup plugins show`).", "failed", sb.plan.plugin_id
            )
        return CommandAnswer(f"error: no plugin offers /{name} any more.", "failed")

    def _help(self, owner: bool) -> str:
        lines = [
            "Commands:",
            f"{STOP_COMMAND}: stop this session's turn in flight",
            "/help (or /commands): this list",
        ]
        held = set()
        for reg in self._sandboxes.registry.of_kind(Kind.COMMAND):
            held.add(reg.name)
            spec = reg.offer
            if spec is None or (spec.owner_only and not owner):
                continue
            about = " ".join(spec.description.split()) or "(no description)"
            lines.append(f"/{reg.name}{' [args]' if spec.accepts_args else ''}: {about} ({owner_label(reg.owner)}{', owners only' if spec.owner_only else ''})")
        if owner:
            # Whether a down plugin's command is owner-only is unknown until it is
            # back: only owners hear of them.
            down = sorted(
                f"/{name} ({owner_label(sb.plan.plugin_id)}, {sb.lc.state.value})"
                for sb in self._sandboxes.sandboxes.values()
                for name in sb.plan.offers.declares("command")
                if name not in held
            )
            if down:
                lines.append("Not available now: " + ", ".join(down))
        return "\n".join(lines)

    def _how_to_own(self, msg: InboundMessage) -> str:
        channel = msg.reply_to.channel
        pair = f'"{channel}:{msg.source.peer.id}"'
        if channel not in self._owners.by_channel:
            return f"An operator can name you an owner in tools.owners ({pair})."
        return f"An operator can name you an owner in channels.{channel}.owners (your sender id) or tools.owners ({pair})."


def _sender(msg: InboundMessage) -> str | None:
    """Who wrote: the channel's sender, or the peer of a direct conversation."""
    if msg.sender_id is not None:
        return msg.sender_id
    return msg.source.peer.id if msg.source.peer.kind == "direct" else None


def _text(name: str, value: Any) -> str:
    """A command's answer as text: a string as it is, OpenClaw's `{"text": ...}` as
    its text, anything else as JSON."""
    if isinstance(value, dict) and set(value) == {"text"} and isinstance(value["text"], str):
        value = value["text"]
    if value is None or value == "":
        return f"/{name} answered nothing."
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_ANSWER_CHARS:
        text = f"{text[:MAX_ANSWER_CHARS]}\n[cut: the answer has {len(text)} characters; {MAX_ANSWER_CHARS} are shown]"
    return text
