"""What a child may ask of the supervisor over its `Connect` stream, and the judge of
each request. A method not in `ALLOWED` is refused with a reason the plugin sees.

Later layers add methods here (a channel delivering an inbound message, a subagent
asking the model), each checked against what that sandbox is allowed to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawsup.v1 import host_pb2 as pb
from supervisor.sandbox_log import SandboxLog

LOG_LEVELS = frozenset({"debug", "info", "warning", "error"})
MAX_LOG_MESSAGE = 8 * 1024


@dataclass(frozen=True, kw_only=True)
class Requester:
    sandbox_id: str
    plugin_id: str
    log: SandboxLog


def _log(who: Requester, payload: dict[str, Any]) -> dict[str, Any]:
    level = payload.get("level", "info")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {sorted(LOG_LEVELS)}, not {level!r}")
    message = str(payload.get("message", ""))[:MAX_LOG_MESSAGE]
    for line in message.splitlines() or [""]:
        who.log.write("plugin", f"{level.upper()} {line}")
    who.log.flush()
    return {}


ALLOWED: dict[str, Callable[[Requester, dict[str, Any]], dict[str, Any]]] = {"log": _log}


def answer(who: Requester, req: pb.HostRequest) -> pb.SupervisorMessage | None:
    """Handle one request. Returns the reply, or None for fire-and-forget (id 0)."""
    handler = ALLOWED.get(req.method)
    try:
        if handler is None:
            raise PermissionError(f"plugin {who.plugin_id!r} is not allowed to call {req.method!r}; allowed: {sorted(ALLOWED)}")
        payload = json.loads(req.payload_json) if req.payload_json else {}
        if not isinstance(payload, dict):
            raise ValueError("payload must be a JSON object")
        result = handler(who, payload)
        reply = pb.SupervisorReply(id=req.id, ok=True, payload_json=json.dumps(result))
    except (PermissionError, ValueError) as e:
        who.log.event(f"refused request {req.method!r} from the plugin: {e}")
        reply = pb.SupervisorReply(id=req.id, ok=False, error=str(e))
    return pb.SupervisorMessage(reply=reply) if req.id else None
