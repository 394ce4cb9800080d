"""Lifecycle hooks' observer, well and badly behaved (tests/test_plugin_lifecycle_hooks.py).

Every hook's event is kept in memory, where the `watcher_seen` tool shows it, and
appended as a JSON line to `events.jsonl` in the plugin's workspace (its cwd, which
the test reads from the host, also after the gateway stopped).

- `gateway_stop` writes `gateway_stop` (the event, this child's pid and the time) before it
  answers; with the plugin config `hangStop` it then never answers.
- `before_agent_start` never answers a prompt that says "hang-start" and raises on
  one that says "raise-start"; `message_sending` never answers a reply that says
  "hang-send". Otherwise both leave the turn as it is.
- `watcher_crash` ends the sandbox at once (exit 1), mid-call.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from clawsup.sandbox.api import hookimpl

HANG_S = 3600
SEEN: list[dict] = []
OBSERVED = ("subagent_spawned", "subagent_ended", "session_end", "gateway_start", "agent_end")


@hookimpl
def clawsup_register(api) -> None:
    here = Path.cwd()

    def keep(hook: str, event: dict) -> None:
        record = {"hook": hook, **event}
        SEEN.append(record)
        with (here / "events.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")

    def observer(hook: str) -> Callable[[dict], None]:
        def observe(event: dict) -> None:
            keep(hook, event)

        return observe

    async def gateway_stop(event: dict) -> None:
        keep("gateway_stop", event)
        # Wall time, so the test can order it against the supervisor's log; the
        # log line below reaches that log through a pipe, later.
        (here / "gateway_stop").write_text(json.dumps({"event": event, "pid": os.getpid(), "at": time.time()}))
        api.log("watcher: heard gateway_stop")
        if api.config.get("hangStop"):
            await asyncio.sleep(HANG_S)

    async def before_agent_start(event: dict) -> None:
        keep("before_agent_start", event)
        prompt = str(event.get("prompt", ""))
        if "hang-start" in prompt:
            await asyncio.sleep(HANG_S)
        if "raise-start" in prompt:
            raise RuntimeError("before_agent_start raised on purpose")

    async def message_sending(event: dict) -> None:
        keep("message_sending", event)
        if "hang-send" in str(event.get("content", "")):
            await asyncio.sleep(HANG_S)

    def seen(args: dict) -> list:
        hook = args.get("hook")
        return [e for e in SEEN if hook is None or e["hook"] == hook]

    def crash(args: dict) -> str:
        os._exit(1)

    api.register_tool(
        name="watcher_seen",
        description="What the hooks saw (of one hook, if named).",
        input_schema={"type": "object", "properties": {"hook": {"type": "string"}}},
        handler=seen,
    )
    api.register_tool(name="watcher_crash", description="End this sandbox at once.", input_schema={"type": "object", "properties": {}}, handler=crash)
    for hook in OBSERVED:
        api.on(hook, observer(hook))
    api.on("gateway_stop", gateway_stop)
    api.on("before_agent_start", before_agent_start)
    api.on("message_sending", message_sending)
