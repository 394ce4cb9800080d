"""Bench (q): a channel adapter whose "outside service" is this plugin itself. The
tool `benchchan_round_trips {n, peer}` hands the gateway `n` messages one after
another, each timed from `emit_message` to the `send` of its final reply, and
returns the times (ms). The clock runs in the sandbox, where a real adapter would
receive and deliver, so the tool call that starts the run is not in them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from clawsup.sandbox.api import hookimpl

API: Any = None
WAITING: dict[str, asyncio.Future[None]] = {}


async def send(message: dict[str, Any]) -> dict[str, Any]:
    fut = WAITING.get(message["peer"]["id"])
    if message.get("final") and fut is not None and not fut.done():
        fut.set_result(None)
    return {"delivered": True}


async def benchchan_round_trips(args: dict[str, Any]) -> list[float]:
    peer = str(args.get("peer", "bench"))
    out = []
    for i in range(int(args.get("n", 1))):
        fut = WAITING[peer] = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        await API.emit_message("benchchan", peer_id=peer, text=f"message {i}")
        await asyncio.wait_for(fut, 60)
        out.append((time.perf_counter() - t0) * 1000)
    WAITING.pop(peer, None)
    return out


@hookimpl
def clawsup_register(api) -> None:  # type: ignore[no-untyped-def]
    global API
    API = api
    api.register_tool(name="benchchan_round_trips", description="Time n round trips through channel benchchan.", handler=benchchan_round_trips)
    api.register_channel("benchchan", send)
