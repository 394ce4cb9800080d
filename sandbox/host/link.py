"""The child's end of the long-lived `Connect` stream: requests from the plugin to the
supervisor, and the supervisor's replies."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from clawsup.v1 import host_pb2 as pb

from clawsup.sandbox.api import SupervisorRefused

# Bounded: a plugin that logs faster than the supervisor reads loses lines (counted),
# it does not grow the child without end.
OUTBOX_SIZE = 1024
REQUEST_TIMEOUT_S = 10.0


class SupervisorLink:
    """Created by the host server at start, before the plugin loads, so that
    `api.log` works from the first line; lives as long as the child. Messages posted
    before the supervisor opens the stream wait in the bounded outbox."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._outbox: asyncio.Queue[pb.HostMessage] = asyncio.Queue(OUTBOX_SIZE)
        self._pending: dict[int, asyncio.Future[pb.SupervisorReply]] = {}
        self._ids = itertools.count(1)
        self.dropped = 0

    async def request(self, method: str, payload: dict[str, Any], *, timeout: float | None = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        """`timeout=None` for requests whose length the supervisor bounds (a
        subagent's model and tool calls, which its run timeout covers)."""
        rid = next(self._ids)
        fut: asyncio.Future[pb.SupervisorReply] = self._loop.create_future()
        self._pending[rid] = fut
        try:
            msg = pb.HostMessage(request=pb.HostRequest(id=rid, method=method, payload_json=json.dumps(payload)))
            async with asyncio.timeout(timeout):
                await self._outbox.put(msg)
                reply = await fut
        finally:
            self._pending.pop(rid, None)
        if not reply.ok:
            raise SupervisorRefused(reply.error)
        return json.loads(reply.payload_json) if reply.payload_json else {}

    def post(self, method: str, payload: dict[str, Any]) -> None:
        """Fire and forget, from any thread."""
        msg = pb.HostMessage(request=pb.HostRequest(id=0, method=method, payload_json=json.dumps(payload)))
        self._loop.call_soon_threadsafe(self._put_or_drop, msg)

    def _put_or_drop(self, msg: pb.HostMessage) -> None:
        try:
            self._outbox.put_nowait(msg)
        except asyncio.QueueFull:
            self.dropped += 1

    async def serve(self, request_iterator: AsyncIterator[pb.SupervisorMessage], context: grpc.aio.ServicerContext) -> None:
        """Runs as the body of the `Connect` RPC, for as long as the supervisor keeps
        the stream open. A writer task drains the outbox; this coroutine reads replies."""

        async def write_outbox() -> None:
            while True:
                await context.write(await self._outbox.get())

        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(write_outbox())
            async for msg in request_iterator:
                if msg.HasField("reply"):
                    fut = self._pending.get(msg.reply.id)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.reply)
            # The supervisor closed its side: the stream is over.
            writer.cancel()
