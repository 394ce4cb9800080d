"""What a child may ask of the supervisor over its `Connect` stream, and the judge of
each request. Every child may `log`. A sandbox may be given more (`Requester.services`:
a subagent run's `model.complete`, `tool.call`, `runs.wait`, see
supervisor/agents/run_services.py; an MCP server's `mcp.tools_changed` and
`mcp.server_exited`, see supervisor/sandboxes/supervised.py), each answered by code
that knows who that sandbox is. Any other method is refused with a reason the child
sees. `serve` answers one incarnation's stream for as long as the child lives.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.sandboxes.host_client import CallAborted, ChildReply, ChildRequest, ChildStream, HostMisbehaved, HostUnreachable
from clawsup.supervisor.sandboxes.incarnation import Incarnation
from clawsup.supervisor.sandboxes.log import SandboxLog

Service = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

LOG_LEVELS = frozenset({"debug", "info", "warning", "error"})
MAX_LOG_MESSAGE = 8 * 1024
# Service requests (a subagent's model and tool calls) one child may have in flight;
# past this its stream waits, not our memory.
MAX_SERVICE_REQUESTS = 8

MCP_TOOLS_CHANGED = "mcp.tools_changed"
"""An MCP host's server changed its tool list (`notifications/tools/list_changed`)
and the host has listed it again: the supervisor Describes again and swaps."""
MCP_SERVER_EXITED = "mcp.server_exited"
"""An MCP host's server ended (`{"message": "MCP server 'time' was killed by
SIGKILL"}`); the host exits next, and the message is its death's reason."""
# A child's words in a reason that callers, `status` and the log repeat.
MAX_NOTE_CHARS = 500
_NOT_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]+")


@dataclass(frozen=True, kw_only=True)
class Requester:
    sandbox_id: str
    plugin_id: str
    log: SandboxLog
    services: Mapping[str, Service] = field(default_factory=dict)
    """Slow methods this sandbox may call, answered concurrently (see
    `answer_service`); bound to its identity by whoever made the sandbox."""


def _log(who: Requester, payload: dict[str, Any]) -> dict[str, Any]:
    level = payload.get("level", "info")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {sorted(LOG_LEVELS)}, not {level!r}")
    message = str(payload.get("message", ""))[:MAX_LOG_MESSAGE]
    # A message of several lines becomes several log lines, each tagged; any other
    # line break or control character (a CR, U+2028) is shown escaped by the log,
    # so that the plugin cannot pass one of its lines off as the supervisor's.
    for line in message.removesuffix("\n").split("\n"):
        text = line.removesuffix("\r")  # a CRLF ending is no forgery
        who.log.write("plugin", f"{level.upper()} {text}")
    who.log.flush()
    return {}


def one_line(text: str, limit: int = MAX_NOTE_CHARS) -> str:
    """A child's text as one clean line of at most `limit` characters: every control
    character, line break, bidi control and lone surrogate becomes a space."""
    line = " ".join(_NOT_ONE_LINE.sub(" ", text[: limit * 2]).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


ALLOWED: dict[str, Callable[[Requester, dict[str, Any]], dict[str, Any]]] = {"log": _log}


def answer(who: Requester, req: ChildRequest) -> ChildReply | None:
    """Handle one quick request inline. Returns the reply, or None for
    fire-and-forget (id 0)."""
    handler = ALLOWED.get(req.method)
    try:
        if handler is None:
            allowed = sorted({*ALLOWED, *who.services})
            raise PermissionError(f"plugin {who.plugin_id!r} is not allowed to call {req.method!r}; allowed: {allowed}")
        result = handler(who, _payload(req))
        reply = ChildReply(id=req.id, ok=True, payload_json=json.dumps(result))
    except (PermissionError, ValueError) as e:
        who.log.event(f"refused request {req.method!r} from the plugin: {e}")
        reply = ChildReply(id=req.id, ok=False, error=str(e))
    return reply if req.id else None


async def answer_service(who: Requester, req: ChildRequest) -> ChildReply:
    """Handle one of the sandbox's services (a model call may take a minute). A
    refusal or a failure is the child's to see; a bug is logged and the child told
    no more than that."""
    try:
        result = await who.services[req.method](_payload(req))
        return ChildReply(id=req.id, ok=True, payload_json=json.dumps(result))
    except (ClawsupError, PermissionError, ValueError) as e:
        who.log.event(f"refused request {req.method!r}: {e}")
        return ChildReply(id=req.id, ok=False, error=str(e))
    except Exception as e:
        logger.exception("{}: answering {!r} failed", who.sandbox_id, req.method)
        return ChildReply(id=req.id, ok=False, error=f"the supervisor failed to answer {req.method!r} ({type(e).__name__}); see its log")


def _payload(req: ChildRequest) -> dict[str, Any]:
    try:
        payload = json.loads(req.payload_json) if req.payload_json else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"payload is not JSON: {e.msg}") from None
    if not isinstance(payload, dict):
        raise ValueError("payload must be a JSON object")
    return payload


async def serve(inc: Incarnation, who: Requester) -> None:
    """Answers the child's requests for as long as it lives. Quick ones (`log`)
    are answered inline; services (a model call) each in a task of this
    stream's group, at most MAX_SERVICE_REQUESTS at once, so a child that floods
    us waits on its own stream, not on our memory. The child's death ends the
    group, and with it every service call it still had running."""
    assert inc.client is not None
    slots = asyncio.Semaphore(MAX_SERVICE_REQUESTS)
    stream: ChildStream | None = None

    async def service(req: ChildRequest) -> None:
        assert stream is not None
        try:
            await stream.reply(await answer_service(who, req))
        finally:
            slots.release()

    try:
        stream = await inc.client.connect()
        async with asyncio.TaskGroup() as tg:
            async for req in stream.requests():
                if req.method in who.services and req.id:
                    await slots.acquire()
                    tg.create_task(service(req), name=f"{who.sandbox_id} {req.method}")
                elif (reply := answer(who, req)) is not None:
                    await stream.reply(reply)
    except* (HostUnreachable, HostMisbehaved, CallAborted) as eg:
        # The stream ends when the child dies; the exit watcher reports that. A
        # stream that fails while the child lives is worth a line.
        if not inc.died.done():
            who.log.event(f"child stream closed: {eg.exceptions[0]}")
    finally:
        if stream is not None:
            stream.close()
