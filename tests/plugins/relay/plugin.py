"""A channel adapter with no outside service: what the gateway sends is recorded in
memory (read back with `relay_outbox`), what "arrives" is handed in with
`relay_inject`. It also tries to speak for channels that are not its own, and serves
HTTP routes that answer, hang, or answer badly."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from clawsup.sandbox.api import SupervisorRefused, hookimpl

API: Any = None
OUTBOX: list[dict[str, Any]] = []
_arrived: asyncio.Event | None = None


def _signal() -> asyncio.Event:
    global _arrived
    if _arrived is None:
        _arrived = asyncio.Event()
    return _arrived


async def send(message: dict[str, Any]) -> dict[str, Any]:
    """The channel's delivery: a reply that mentions "explode" fails it."""
    if "explode" in message["text"]:
        raise RuntimeError("the outside service refused the message")
    OUTBOX.append(message)
    _signal().set()
    return {"delivered": True}


async def relay_inject(args: dict[str, Any]) -> Any:
    try:
        return await API.emit_message(
            args.get("channel", "relay"),
            peer_id=args["peer"],
            text=args["text"],
            peer_kind=args.get("kind", "direct"),
            account_id=args.get("account"),
            sender_id=args.get("sender"),
            thread_id=args.get("thread"),
        )
    except SupervisorRefused as e:
        return {"refused": str(e)}


async def relay_outbox(args: dict[str, Any]) -> list[dict[str, Any]]:
    """What was delivered (to `peer`, if given); waits (bounded) until `finals` final
    replies, and `notes` messages of any kind, have come."""
    want, notes = int(args.get("finals", 0)), int(args.get("notes", 0))

    def mine() -> list[dict[str, Any]]:
        return [m for m in OUTBOX if args.get("peer") in (None, m["peer"]["id"])]

    async with asyncio.timeout(float(args.get("timeout", 30))):
        while sum(m["final"] for m in mine()) < want or len(mine()) < notes:
            _signal().clear()
            await _signal().wait()
    return mine()


async def relay_speak_for(args: dict[str, Any]) -> Any:
    return await relay_inject({"peer": "mallory", "text": "hello from elsewhere", **args})


async def relay_raw(args: dict[str, Any]) -> Any:
    """A `channel.inbound` request as the plugin writes it, past emit_message."""
    try:
        return await API.request("channel.inbound", args)
    except SupervisorRefused as e:
        return {"refused": str(e)}


def relay_die(args: dict[str, Any]) -> str:
    os._exit(9)


def hello(request: dict[str, Any]) -> dict[str, Any]:
    return {"status": 201, "headers": {"X-Relay": "yes", "Content-Type": "application/json"}, "body": json.dumps(request)}


async def slow(request: dict[str, Any]) -> str:
    await asyncio.Event().wait()
    return "never"


def webhook(request: dict[str, Any]) -> str:
    return "hooked: " + request["body"]


BAD = {
    "header": {"status": 200, "headers": {"X-Evil": "a\r\nSet-Cookie: stolen=1"}, "body": "x"},
    "framing": {"status": 200, "headers": {"Content-Length": "1"}, "body": "smuggled"},
    "status": {"status": 99, "body": "x"},
    "type": 42,
    "none": None,
    "big": "x" * (1024 * 1024 + 1),
}


def bad(request: dict[str, Any]) -> Any:
    return BAD[request["query"]["kind"]]


async def inject(request: dict[str, Any]) -> dict[str, Any]:
    """A webhook-style way in: the outside service POSTs, the plugin emits."""
    body = json.loads(request["body"])
    route = await API.emit_message("relay", peer_id=body["peer"], text=body["text"])
    return {"status": 202, "headers": {"Content-Type": "application/json"}, "body": json.dumps(route)}


@hookimpl
def clawsup_register(api: Any) -> None:
    global API
    API = api
    for fn in (relay_inject, relay_outbox, relay_speak_for, relay_raw, relay_die):
        api.register_tool(name=fn.__name__, description=fn.__name__, handler=fn)
    # Its own id: a copy of this plugin under another id serves a channel of that name.
    api.register_channel(api.plugin_id, send)
    api.register_channel("unlit", send)  # declared, never enabled by the operator
    api.register_channel("http", send)  # declared, and built in: refused
    api.register_http_route("hello", hello)
    api.register_http_route("slow", slow)
    api.register_http_route("webhook", webhook, auth="plugin")
    api.register_http_route("bad", bad)
    api.register_http_route("inject", inject)
    api.register_http_route("secret", hello)  # not in its contracts: refused
