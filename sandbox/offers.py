"""What a plugin may offer beyond tools, named once for both sides: the offer kinds
that travel in `Describe` (host.proto `Offer`), and the hooks with how each runs.

Shared, stdlib only: the host checks a plugin's `api.on(name, ...)` against it, and
the supervisor the manifest's `contracts.hooks` and each hook's answer.
"""

from __future__ import annotations

import re
from typing import Final, Literal

OfferKind = Literal["hook", "command", "service", "channel", "http_route"]
OFFER_KINDS: Final = ("hook", "command", "service", "channel", "http_route")

GATE_HOOKS: Final = frozenset({"before_tool_call"})
"""May refuse what they guard. One that errors, overruns, or whose plugin is down
refuses the call (fails closed) unless the operator set `failOpen` for that plugin."""
MODIFYING_HOOKS: Final = frozenset({"before_tool_call", "message_sending", "before_agent_start"})
"""Run one after another, higher priority first; each sees what the one before made."""
OBSERVING_HOOKS: Final = frozenset(
    {
        "after_tool_call",
        "message_received",
        "agent_end",
        "session_start",
        "session_end",
        "subagent_spawned",
        "subagent_ended",
        "gateway_start",
        "gateway_stop",
    }
)
"""Run in parallel, in the background: they never hold up what they observe."""
HOOKS: Final = MODIFYING_HOOKS | OBSERVING_HOOKS

CONTENT_HOOKS: Final = frozenset({"before_tool_call", "after_tool_call", "message_received", "message_sending", "before_agent_start", "agent_end"})
"""Hooks that see what others wrote: another plugin's tool arguments and results, or
a session's text. A plugin gets these only where the operator lists them in
`plugins.entries.<id>.hooks.allow`; ungranted, the tool hooks see the plugin's own
tools alone, and the message and agent hooks are refused."""

COMMAND_NAME_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,31}$"
CHANNEL_ID_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,31}$"
SERVICE_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
HTTP_ROUTE_PATTERN: Final = r"^[A-Za-z0-9_.~-]+(/[A-Za-z0-9_.~-]+)*$"
"""A route's path below /plugins/<plugin id>/: plain segments, no `..`, no empty one."""
HttpAuth = Literal["gateway", "plugin"]

BUILTIN_COMMANDS: Final = frozenset({"stop", "new", "reset", "help", "status", "commands"})
"""The gateway's own slash commands: no plugin may take their names, so that `/stop`
always reaches the gateway whatever a plugin registers."""


def valid_route(path: str) -> bool:
    return re.fullmatch(HTTP_ROUTE_PATTERN, path) is not None and ".." not in path.split("/") and "." not in path.split("/")
