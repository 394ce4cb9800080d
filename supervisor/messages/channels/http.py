"""The `http` channel: a local endpoint for other programs on this machine.

    POST /v1/messages           Authorization: Bearer <channels.http.token>
    {"text": "...", "peer": {"kind": "direct", "id": "alice"},
     "accountId": "...", "parentPeer": {...}, "guildId": "...", "roles": [...],
     "teamId": "...", "threadId": "..."}

answers with server-sent events: `ack` (the route: agentId, matchedBy, sessionKey,
…) once the message is in its session, then `progress` notes, then `reply`. A refused
message gets `error`. A message refused because the session or the gateway is full
gets no stream but `429 Too Many Requests`, a `Retry-After` header (seconds) and
`{"error": "...", "code": "session_busy" | "gateway_busy", "retryAfterSeconds": N}`;
nothing of it was kept, so sending it again later is safe. The identity fields come from the request envelope, which the
bearer token vouches for; the channel name is always `http`. Loopback only.

    GET /v1/events?peerId=alice[&peerKind=direct][&accountId=…][&threadId=…]

stays open and sends `reply` events for that user that no open POST is waiting for:
the agent's answer to a subagent's announce, which comes when the run ends. It opens
with `ready`, and a comment every KEEPALIVE_S finds a client that went away.

    ANY /plugins/<plugin id>/<path>

is a plugin's HTTP route (supervisor/messages/http_routes.py), under the same body
cap and connection bound, looked up when the request comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from pathlib import Path
from typing import Any

from aiohttp import web
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.messages.bus import Busy, InboundMessage, MessageBus, OutboundMessage, ReplyTarget
from clawsup.supervisor.messages.channels import SHUTTING_DOWN, Conversations, who
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.messages.http_routes import PREFIX, PluginRoutes
from clawsup.supervisor.messages.routing import Peer, Route, RouteInput, norm_account

NAME = "http"
MAX_BODY = 1024 * 1024
KEEPALIVE_S = 15.0


class _Refused(asyncio.Protocol):
    """A connection past `channels.http.maxConnections`: closed as it comes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.WriteTransport):
            transport.abort()
        else:
            transport.close()


class _PeerIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str = Field(pattern=r"^(?i:direct|dm|group|channel)$")
    id: str = Field(min_length=1, max_length=512)


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)
    text: str = Field(min_length=1, max_length=100_000)
    peer: _PeerIn
    account_id: str | None = None
    parent_peer: _PeerIn | None = None
    guild_id: str | None = None
    roles: list[str] = Field(default_factory=list)
    team_id: str | None = None
    thread_id: str | None = None


class HttpChannel:
    name = NAME

    def __init__(
        self,
        bus: MessageBus,
        *,
        host: str,
        port: int,
        token: str,
        account_id: str,
        port_file: Path,
        max_connections: int = 256,
        routes: PluginRoutes | None = None,
    ) -> None:
        """`routes`: the plugins' HTTP routes, served under /plugins/ (none without)."""
        self.conversations = Conversations(bus)
        self._routes = routes
        self._max_connections = max_connections
        self._host, self._port, self._token = host, port, token.encode()
        self._account = account_id
        self._port_file = port_file
        self.port: int | None = None
        self.started = asyncio.Event()

    async def send(self, out: OutboundMessage) -> None:
        await self.conversations.deliver(out)

    async def serve(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/v1/messages", self._message)
        app.router.add_get("/v1/events", self._events)
        if self._routes is not None:
            # One route for all of them, added before the app is frozen: plugins'
            # routes come and go while it serves.
            app.router.add_route("*", PREFIX + "/{plugin}/{tail:.*}", self._plugin_route)
        # Open streams are ended by close_all below; what is left gets a short grace.
        # An idle keep-alive connection is closed after KEEPALIVE_S, not aiohttp's hour.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=KEEPALIVE_S)
        await runner.setup()
        server = runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            # Anyone on the machine may connect before any token is asked: past the
            # cap a connection is closed at once, so that idle ones cannot take the
            # descriptors the gateway needs for its sandboxes
            # (tests/test_hostile_bounds.py).
            if len(server.connections) >= self._max_connections:
                return _Refused()
            return server()

        try:
            listener = await asyncio.get_running_loop().create_server(protocol, self._host, self._port)
        except OSError as e:
            await runner.cleanup()
            raise ClawsupError(f"channels.http: cannot listen on {self._host}:{self._port}: {e.strerror or e}") from None
        try:
            self.port = listener.sockets[0].getsockname()[1]
            self._port_file.write_text(f"{self.port}\n")
            logger.info("http channel on http://{}:{}/v1/messages", self._host, self.port)
            self.started.set()
            await asyncio.Event().wait()  # until cancelled
        finally:
            listener.close()
            self.conversations.close_all(SHUTTING_DOWN)
            await runner.cleanup()

    def _authorized(self, request: web.Request) -> bool:
        got = request.headers.get("Authorization", "")
        return got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), self._token)

    async def _plugin_route(self, request: web.Request) -> web.StreamResponse:
        assert self._routes is not None
        return await self._routes.handle(request, authorized=self._authorized(request))

    async def _message(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        try:
            body = MessageIn.model_validate_json(await request.read())
        except ValidationError as e:
            return web.json_response({"error": format_validation_error(e)}, status=400)
        peer = Peer.of(body.peer.kind, body.peer.id)
        account = norm_account(body.account_id or self._account)
        msg = InboundMessage(
            source=RouteInput(
                channel=NAME,
                account_id=account,
                peer=peer,
                parent_peer=Peer.of(body.parent_peer.kind, body.parent_peer.id) if body.parent_peer else None,
                guild_id=body.guild_id,
                member_role_ids=tuple(body.roles),
                team_id=body.team_id,
                thread_id=body.thread_id,
            ),
            text=body.text,
            reply_to=ReplyTarget(channel=NAME, account_id=account, peer=peer, thread_id=body.thread_id, conversation=self.conversations.new_id(NAME)),
        )
        # The stream opens with the acknowledgement, so that a busy refusal, which
        # comes before it, can still be a status code a client's retry logic knows.
        resp: web.StreamResponse | None = None
        try:
            # Closed here, not when collected: a client gone mid-stream must not leave
            # its conversation open.
            async with contextlib.aclosing(self.conversations.exchange(msg)) as items:
                async for item in items:
                    if resp is None:
                        resp = await _open_stream(request)
                    if isinstance(item, Route):
                        await _event(resp, "ack", {"messageId": msg.id, **item.to_json()})
                    else:
                        await _event(resp, "progress" if item.progress else "reply", {"text": item.text, "sessionKey": item.session_key, "inReplyTo": item.in_reply_to})
        except Busy as e:
            if resp is None:
                return web.json_response(
                    {"error": str(e), "code": e.code, "retryAfterSeconds": e.retry_after_s}, status=429, headers={"Retry-After": str(e.retry_after_s)}
                )
            await _event(resp, "error", {"code": e.code, "message": str(e)})
        except ClawsupError as e:
            if resp is None:
                resp = await _open_stream(request)
            await _event(resp, "error", {"code": e.code, "message": str(e)})
        except ConnectionResetError:
            return resp or web.Response(status=499)
        assert resp is not None
        await resp.write_eof()
        return resp

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        q = request.query
        kind, peer_id = q.get("peerKind", "direct"), q.get("peerId", "").strip()
        if not peer_id or kind.lower() not in ("direct", "dm", "group", "channel"):
            return web.json_response({"error": "peerId (required) and peerKind (direct, group or channel) name whose replies to send"}, status=400)
        target = ReplyTarget(channel=NAME, account_id=norm_account(q.get("accountId") or self._account), peer=Peer.of(kind, peer_id), thread_id=q.get("threadId"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            with self.conversations.watching(who(target)) as replies:
                await _event(resp, "ready", {})
                while True:
                    try:
                        async with asyncio.timeout(KEEPALIVE_S):
                            out = await replies.get()
                    except TimeoutError:
                        await resp.write(b": keepalive\n\n")
                        continue
                    if out is None:
                        break
                    await _event(resp, "reply", {"text": out.text, "sessionKey": out.session_key, "agentId": out.agent_id, "inReplyTo": out.in_reply_to})
        except (ClawsupError, ConnectionResetError):
            return resp
        await resp.write_eof()
        return resp


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _event(resp: web.StreamResponse, name: str, data: dict[str, Any]) -> None:
    await resp.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
