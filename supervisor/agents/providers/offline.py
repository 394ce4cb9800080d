"""The `offline` provider: no key, no network, deterministic. It follows explicit
instructions (`/tool NAME {json}` calls that tool, `/sleep N` takes N seconds,
`/system` shows the turn's system prompt) and
otherwise answers briefly, naming the agent, the session and the tools it could call. It is what `clawsup start`
and `clawsup chat` run on a fresh machine, and what the tests drive.

It counts tokens the usual rough way, a token per 4 characters of what it read and
wrote, so that accounting (a subagent run's statistics line) shows offline too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from clawsup.sandbox.agent_loop import AssistantMessage, Message, ToolResult, UserMessage, message_json
from clawsup.supervisor.tools.spec import ToolSpec
from clawsup.supervisor.agents.providers import ModelReply, TextSink, ToolCall, TurnContext, Usage

NAME = "offline"


class OfflineProvider:
    name = NAME

    async def complete(self, ctx: TurnContext, messages: Sequence[Message], tools: list[ToolSpec], on_text: TextSink | None = None) -> ModelReply:
        reply = await self._answer(ctx, messages, tools, on_text)
        read = len(ctx.system) + sum(len(json.dumps(message_json(m))) for m in messages) + sum(len(t.name) + len(t.description) for t in tools)
        wrote = len(reply.text) + sum(len(c.name) + len(json.dumps(c.args)) for c in reply.tool_calls)
        reply.usage = Usage(-(-read // 4), -(-wrote // 4))
        return reply

    async def _answer(self, ctx: TurnContext, messages: Sequence[Message], tools: list[ToolSpec], on_text: TextSink | None) -> ModelReply:
        last = messages[-1] if messages else UserMessage("")
        if isinstance(last, ToolResult):
            results: list[ToolResult] = []
            for m in reversed(messages):
                if not isinstance(m, ToolResult):
                    break
                results.insert(0, m)
            lines = [f"{r.name} {'failed' if r.is_error else 'returned'}: {r.content}" for r in results]
            return await _say("\n".join(lines), on_text)
        if isinstance(last, UserMessage) and last.kind == "warning":
            return await _say(f"stopping: {last.text}", on_text)
        text = last.text.strip()
        slept = await sleep_turn(text, ctx.agent_id, ctx.session_key, ctx.notify)
        if slept is not None:
            return await _say(slept, on_text)
        if text == "/system":
            # What the turn was told before the conversation: the gateway's words and
            # whatever plugins' before_agent_start hooks prepended.
            return await _say(f"system prompt:\n{ctx.system}", on_text)
        if text.startswith("/tool"):
            parts = text.split(None, 2)
            if len(parts) < 2:
                return await _say("usage: /tool NAME {json arguments}", on_text)
            try:
                args = json.loads(parts[2]) if len(parts) > 2 else {}
            except json.JSONDecodeError as e:
                return await _say(f"those arguments are not JSON ({e.msg}); usage: /tool NAME {{json}}", on_text)
            if not isinstance(args, dict):
                return await _say("the arguments must be a JSON object", on_text)
            n = sum(1 for m in messages if isinstance(m, AssistantMessage) and m.tool_calls)
            return ModelReply(tool_calls=[ToolCall(id=f"offline-{n + 1}", name=parts[1], args=args)])
        names = ", ".join(t.name for t in tools) or "none"
        return await _say(
            f"[{ctx.agent_id}] received in {ctx.session_key}: {text}\n"
            f"(offline model; tools this turn: {names}; `/tool NAME {{json}}` calls one, `/sleep N` takes N seconds)",
            on_text,
        )


async def sleep_turn(text: str, agent_id: str, session_key: str, notify: TextSink | None) -> str | None:
    """`/sleep N`: a slow turn on request, to watch per-session order, concurrency
    and /stop. The answer, or None when `text` is not that command."""
    if not text.startswith("/sleep"):
        return None
    try:
        seconds = min(float(text.split()[1]), 3600.0)
    except (IndexError, ValueError):
        return "usage: /sleep SECONDS"
    if notify is not None:
        await notify(f"working for {seconds:g} s…")
    await asyncio.sleep(seconds)
    return f"[{agent_id}] slept {seconds:g} s in {session_key}"


async def _say(text: str, on_text: TextSink | None) -> ModelReply:
    if on_text is not None:
        await on_text(text)
    return ModelReply(text=text)
