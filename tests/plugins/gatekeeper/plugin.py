"""A gate and observers, well and badly behaved (tests/test_plugin_hooks.py).

The gate (`before_tool_call`) acts on the words in a call's `text` argument:
"forbidden" blocks, "badrewrite" changes the arguments into ones the tool refuses,
"rewrite" changes them, "chain" appends "+gatekeeper", "hang" never answers,
"raise" raises, "crash" ends the sandbox mid-call, "nonsense" answers a list. The
observers keep each event in memory, where the `gk_seen` tool shows them; one whose
event mentions "observer-hang" never answers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable

from clawsup.sandbox.api import hookimpl

SEEN: list[dict] = []
OBSERVED = ("after_tool_call", "agent_end", "message_received", "gateway_start", "session_start", "subagent_spawned")


async def gate(event: dict) -> dict | list | None:
    text = event.get("params", {}).get("text")
    if not isinstance(text, str):
        return None
    SEEN.append({"hook": "before_tool_call", "toolName": event.get("toolName"), "text": text})
    if "forbidden" in text:
        return {"block": True, "blockReason": "no forbidden words"}
    if "badrewrite" in text:
        return {"params": {"text": 42}}
    if "rewrite" in text:
        return {"params": {**event["params"], "text": text.replace("rewrite", "rewritten by gatekeeper")}}
    if "chain" in text:
        return {"params": {**event["params"], "text": text + "+gatekeeper"}}
    if "hang" in text:
        await asyncio.sleep(3600)
    if "raise" in text:
        raise RuntimeError("gate raised on purpose")
    if "crash" in text:
        os._exit(1)
    if "nonsense" in text:
        return [1, 2, 3]
    return None


def observer(hook: str) -> Callable[[dict], Awaitable[None]]:
    async def observe(event: dict) -> None:
        SEEN.append({"hook": hook, **event})
        if "observer-hang" in json.dumps(event):
            await asyncio.sleep(3600)

    return observe


@hookimpl
def clawsup_register(api) -> None:
    priority = int(api.config.get("priority", 0))

    def gk_echo(args: dict) -> str:
        return str(args.get("text", ""))

    def gk_seen(args: dict) -> list:
        hook = args.get("hook")
        return [e for e in SEEN if hook is None or e["hook"] == hook]

    def before_agent_start(event: dict) -> dict:
        return {"prependContext": f"context from gatekeeper (priority {priority})"}

    def message_sending(event: dict) -> dict | None:
        content = event.get("content", "")
        if "cancel-me" in content:
            return {"cancel": True}
        if "shout" in content:
            return {"content": content.upper()}
        return None

    api.register_tool(
        name="gk_echo",
        description="Repeat the text.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        handler=gk_echo,
    )
    api.register_tool(
        name="gk_seen",
        description="What the observers saw (of one hook, if named).",
        input_schema={"type": "object", "properties": {"hook": {"type": "string"}}},
        handler=gk_seen,
    )
    api.on("before_tool_call", gate, priority=priority)
    api.on("before_agent_start", before_agent_start, priority=priority)
    api.on("message_sending", message_sending, priority=priority)
    for hook in OBSERVED:
        api.on(hook, observer(hook))
