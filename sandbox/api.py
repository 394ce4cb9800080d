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

This module runs only inside a sandbox child. The supervisor never imports it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

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
