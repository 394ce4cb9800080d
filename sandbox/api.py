"""The plugin authoring API. Public: third parties write plugins against exactly
this, so it changes only with a version bump (`API_VERSION`).

A plugin's entry module defines one pluggy hook implementation:

    from clawsup.sandbox.api import hookimpl

    @hookimpl
    def clawsup_register(api):
        api.register_tool(
            name="echo",
            description="Repeat the text back.",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            handler=lambda args: args["text"],
        )

The handler receives `args: dict` and returns a `str` or any JSON-able value; it may
be sync (run in a worker thread) or async (run on the host's event loop). An
exception in it becomes a tool error carrying its message, and the child lives on;
raise `ToolError` for failures that are not bugs (no traceback is logged).

Beyond tools a plugin may offer hooks (`on`), slash commands (`register_command`),
background services (`register_service`), channels (`register_channel`, then
`emit_message`) and HTTP routes (`register_http_route`). Each must be declared in
the manifest's `contracts` (`hooks`, `commands`, `services`, `channels`,
`httpRoutes`); the supervisor refuses the rest, and reaches each one it accepts over
gRPC with a deadline. Handlers take one dict and may be sync or async, as a tool's.

This module runs only inside a sandbox child. The supervisor never imports it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from clawsup.sandbox import offers as _offers
from clawsup.sandbox.offers import HttpAuth, OfferKind

API_VERSION = 1
PROJECT_NAME = "clawsup"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

JSONValue = Any
Handler = Callable[[dict[str, Any]], "JSONValue | Awaitable[JSONValue]"]


class PluginSpec:
    """The hooks a plugin may implement."""

    @hookspec
    def clawsup_register(self, api: PluginApi) -> None:
        """Called once at start-up, before the host reports ready. Register tools here."""


@dataclass(frozen=True, kw_only=True)
class Offer:
    """One offer beyond tools (sandbox/offers.py names the kinds). `handler` answers
    its calls; a service has `start` as its handler and `stop` beside it."""

    kind: OfferKind
    name: str
    handler: Handler
    is_async: bool
    priority: int = 0
    description: str = ""
    accepts_args: bool = False
    owner_only: bool = True
    auth: HttpAuth = "gateway"
    stop: Callable[[], Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Handler
    is_async: bool


class ToolError(Exception):
    """Raise this from a handler for an expected failure (a bad argument, a missing
    file): its message goes to the caller as the tool's error, and no traceback is
    logged. Any other exception is treated as a bug in the handler."""


class SupervisorRefused(Exception):
    """The supervisor answered a request from this plugin with a refusal."""


@dataclass(kw_only=True)
class PluginApi:
    """Handed to `clawsup_register`. Created by the host for the one plugin it loads;
    lives as long as the child."""

    plugin_id: str
    """The manifest's `id`."""
    config: dict[str, Any]
    """This plugin's config from the operator's clawsup.json, already checked against
    the manifest's `configSchema`."""
    workspace: Path
    """The plugin's own writable directory (also the process's working directory)."""
    tools: dict[str, Tool] = field(default_factory=dict)
    offers: dict[tuple[str, str], Offer] = field(default_factory=dict)
    """(kind, name) -> what the plugin offers beyond tools."""
    not_served: dict[str, Tool] = field(default_factory=dict)
    """Registered, but outside what the supervisor allowed on the start gate: still
    described (so that the supervisor logs the refusal), never invoked."""
    _outbox: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None
    _post: Callable[[str, dict[str, Any]], None] | None = None

    def register_tool(
        self,
        *,
        name: str,
        description: str,
        handler: Handler,
        input_schema: dict[str, Any] | None = None,
    ) -> None:
        """Offer a tool. The supervisor accepts it only if the manifest's
        `contracts.tools` names it and no core tool or other plugin holds the name."""
        if not callable(handler):
            raise TypeError(f"register_tool({name!r}): handler must be callable")
        if name in self.tools:
            raise ValueError(f"register_tool({name!r}): already registered by this plugin")
        schema = input_schema if input_schema is not None else {"type": "object", "properties": {}}
        self.tools[name] = Tool(
            name=name,
            description=description,
            input_schema=schema,
            handler=handler,
            is_async=inspect.iscoroutinefunction(handler),
        )

    def on(self, name: str, handler: Handler, priority: int = 0) -> None:
        """Run `handler(event)` at one of the gateway's hooks (sandbox/offers.py
        `HOOKS`). A modifying hook may answer with a dict: `before_tool_call`
        `{"block": True, "blockReason": "..."}` or `{"params": {...}}`;
        `message_sending` `{"content": "..."}` or `{"cancel": True}`;
        `before_agent_start` `{"prependContext": "..."}`. Anything else, or None,
        changes nothing. Higher `priority` runs first."""
        if name not in _offers.HOOKS:
            raise ValueError(f"on({name!r}): no such hook; the hooks are {sorted(_offers.HOOKS)}")
        if not isinstance(priority, int) or isinstance(priority, bool) or not -1000 <= priority <= 1000:
            raise ValueError(f"on({name!r}): priority must be an int from -1000 to 1000")
        self._offer(_made("hook", name, handler, priority=priority))

    def register_command(
        self, name: str, description: str, handler: Handler, accepts_args: bool = False, owner_only: bool = True
    ) -> None:
        """`/name` from any channel runs `handler({"args", "channel", "senderId",
        "isOwner", ...})` without the model, and its answer (text) is the reply.
        `owner_only` commands answer only the channel's owners (`channels.<id>.owners`)."""
        _check_name(name, _offers.COMMAND_NAME_PATTERN, "register_command")
        if name in _offers.BUILTIN_COMMANDS:
            raise ValueError(f"register_command({name!r}): /{name} belongs to the gateway")
        self._offer(_made("command", name, handler, description=description, accepts_args=accepts_args, owner_only=owner_only))

    def register_service(self, id: str, start: Callable[[], Any], stop: Callable[[], Any] | None = None) -> None:
        """A long-running task in the sandbox, started by the supervisor once the
        plugin is ready. `start()` may run for the sandbox's life (an async loop) or
        set up and return; if it raises, the sandbox restarts with its backoff.
        `stop()` is called at shutdown, within a deadline."""
        _check_name(id, _offers.SERVICE_ID_PATTERN, "register_service")
        if stop is not None and not callable(stop):
            raise TypeError(f"register_service({id!r}): stop must be callable")
        self._offer(_made("service", id, lambda _payload: start(), stop=stop, is_async=inspect.iscoroutinefunction(start)))

    def register_channel(self, id: str, send: Handler) -> None:
        """Be the adapter of channel `id`: `send(message)` delivers one reply
        (`{"peer": {"kind", "id"}, "accountId", "threadId", "text", ...}`), and
        `emit_message(...)` hands the gateway what the outside service sent."""
        _check_name(id, _offers.CHANNEL_ID_PATTERN, "register_channel")
        self._offer(_made("channel", id, send))

    async def emit_message(
        self,
        channel: str,
        *,
        peer_id: str,
        text: str,
        peer_kind: str = "direct",
        account_id: str | None = None,
        sender_id: str | None = None,
        thread_id: str | None = None,
    ) -> dict[str, Any]:
        """Put one inbound message of `channel` on the gateway's bus. Returns the
        route (`{"sessionKey": ..., "agentId": ...}`) once it is in its session; the
        answer comes back through the channel's `send`. The supervisor refuses a
        channel this plugin does not serve."""
        payload = {"channel": channel, "peerKind": peer_kind, "peerId": peer_id, "text": text, "accountId": account_id, "senderId": sender_id, "threadId": thread_id}
        return await self.request("channel.inbound", payload)

    def register_http_route(self, path: str, handler: Handler, auth: HttpAuth = "gateway") -> None:
        """Serve `/plugins/<id>/<path>` on the gateway's HTTP server:
        `handler({"method", "path", "query", "headers", "body"})` answers
        `{"status": 200, "headers": {...}, "body": "..."}` (or a str, as a 200).
        `auth="gateway"` requires the gateway's token; `"plugin"` leaves it to the
        handler, and works only where the operator allows it."""
        if not _offers.valid_route(path):
            raise ValueError(f"register_http_route({path!r}): a path is plain segments (letters, digits, _ . ~ -) joined by /")
        if auth not in ("gateway", "plugin"):
            raise ValueError(f"register_http_route({path!r}): auth must be 'gateway' or 'plugin'")
        self._offer(_made("http_route", path, handler, auth=auth))

    def _offer(self, offer: Offer) -> None:
        if (offer.kind, offer.name) in self.offers:
            raise ValueError(f"{offer.kind} {offer.name!r} is already registered by this plugin")
        self.offers[(offer.kind, offer.name)] = offer

    async def request(self, method: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Ask the supervisor for something over the child's stream. Raises
        `SupervisorRefused` with the supervisor's reason if it says no."""
        if self._outbox is None:
            raise RuntimeError("the supervisor stream is not open yet; call request() from a handler")
        return await self._outbox(method, payload or {})

    def log(self, message: str, level: str = "info") -> None:
        """Write one line to this sandbox's log through the supervisor, tagged with a
        level. Never blocks and never raises; safe from sync handlers (worker threads)
        and async ones alike."""
        if self._post is None:
            print(f"[{level}] {message}", flush=True)
            return
        self._post("log", {"level": level, "message": message})


def _check_name(name: str, pattern: str, where: str) -> None:
    if not isinstance(name, str) or re.fullmatch(pattern, name) is None:
        raise ValueError(f"{where}({name!r}): the name must match {pattern}")


def _made(kind: OfferKind, name: str, handler: Handler, *, is_async: bool | None = None, **kw: Any) -> Offer:
    if not callable(handler):
        raise TypeError(f"{kind} {name!r}: handler must be callable")
    return Offer(kind=kind, name=name, handler=handler, is_async=inspect.iscoroutinefunction(handler) if is_async is None else is_async, **kw)
