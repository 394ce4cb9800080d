"""Local HTTP stubs that speak the Anthropic Messages API and the OpenAI chat
completions API (streamed), so that the real SDK clients (anthropic, litellm) can be
driven in tests on 127.0.0.1. Each stub answers from a script: a function from the
request's JSON to a list of content parts, and records every request."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

Part = dict[str, Any]
"""{"text": "..."} or {"tool": NAME, "args": {...}, "id": "..."} or {"status": 529}."""
Script = Callable[[dict[str, Any], int], list[Part]]


class Stub:
    def __init__(self, script: Script, usage: tuple[int, int] = (1, 5)) -> None:
        self.script = script
        self.usage = usage
        """(input, output) tokens each Anthropic answer reports."""
        self.requests: list[dict[str, Any]] = []
        self.api_keys: list[str] = []
        """The key each request carried (x-api-key or a bearer token)."""
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Stub:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/chat/completions", self._openai)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def _parts(self, body: dict[str, Any]) -> list[Part]:
        self.requests.append(body)
        return self.script(body, len(self.requests))

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        bearer = request.headers.get("Authorization", "")
        self.api_keys.append(request.headers.get("x-api-key") or bearer.removeprefix("Bearer "))
        body = await request.json()
        parts = self._parts(body)
        if parts and "status" in parts[0]:
            kind = "overloaded_error" if parts[0]["status"] == 529 else "invalid_request_error"
            return web.json_response({"type": "error", "error": {"type": kind, "message": parts[0].get("message", "stub says no")}}, status=parts[0]["status"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def ev(name: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode())

        await ev("message_start", {"message": {"id": "msg_stub", "type": "message", "role": "assistant", "model": body["model"], "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": self.usage[0], "output_tokens": 1}}})
        stop = "end_turn"
        for i, p in enumerate(parts):
            if "text" in p:
                await ev("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                for piece in _pieces(p["text"]):
                    await ev("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": piece}})
            else:
                stop = "tool_use"
                await ev("content_block_start", {"index": i, "content_block": {"type": "tool_use", "id": p.get("id", f"toolu_{i}"), "name": p["tool"], "input": {}}})
                for piece in _pieces(json.dumps(p["args"])):
                    await ev("content_block_delta", {"index": i, "delta": {"type": "input_json_delta", "partial_json": piece}})
            await ev("content_block_stop", {"index": i})
        await ev("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": self.usage[1]}})
        await ev("message_stop", {})
        await resp.write_eof()
        return resp

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        parts = self._parts(body)
        if parts and "status" in parts[0]:
            return web.json_response({"error": {"message": parts[0].get("message", "stub says no"), "type": "server_error"}}, status=parts[0]["status"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
            data = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1, "model": body["model"], "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await resp.write(f"data: {json.dumps(data)}\n\n".encode())

        await chunk({"role": "assistant", "content": ""})
        finish = "stop"
        n = 0
        for p in parts:
            if "text" in p:
                for piece in _pieces(p["text"]):
                    await chunk({"content": piece})
            else:
                finish = "tool_calls"
                args = json.dumps(p["args"])
                half = len(args) // 2
                await chunk({"tool_calls": [{"index": n, "id": p.get("id", f"call_{n}"), "type": "function", "function": {"name": p["tool"], "arguments": args[:half]}}]})
                await chunk({"tool_calls": [{"index": n, "function": {"arguments": args[half:]}}]})
                n += 1
        await chunk({}, finish)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
